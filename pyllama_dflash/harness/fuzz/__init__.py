"""A hypothesis fuzzer of image/text schedules for the DFlash draft.

The command alone (``__main__``: ``python -m pyllama_dflash.harness.fuzz``); the schedules' format,
strategy, invariant, search and child processes are the engine's (``pyllama_dflash.harness.engine``:
``schedule``, ``strategy``, ``invariant``, ``execute``, ``reference``, ``search``, ``minimize``,
``run_schedule``, ``schedule_runner``), which ``repro --schedule`` and ``mutate`` use too. A
shrunk failing schedule replays with ``python -m pyllama_dflash.harness.repro --schedule FILE``.
"""
