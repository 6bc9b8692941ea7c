"""A hypothesis fuzzer of image/text schedules for the DFlash draft (issue 6).

``schedule`` (the JSON format and its validity rules), ``strategy`` (hypothesis strategies),
``invariant`` (what ``full`` must keep after every call), ``execute`` (one schedule on the
loaded variant), ``search`` (the hypothesis loop in one process), ``minimize`` (a greedy pass on
the shrunk schedule's steps), ``child``/``runner`` (one child process per variant), ``__main__``
(``python -m pyllama_dflash.fuzz``). A shrunk failing schedule replays with
``python -m pyllama_dflash.repro --schedule FILE``.
"""
