"""The engine below the commands: work on the variants' builds, run in child processes.

``repro``, ``fuzz``, ``bench``, ``mutate`` and ``soak`` are commands on top of it; none imports
another (tests/test_layout.py checks it). The scenario matrix: ``matrix`` (jobs, tables, drift
references, tie proofs) and ``ctest_row`` (the series' C++ test under ctest as row C1). The
schedules: ``schedule`` (the JSON format and its validity rules), ``strategy`` (hypothesis
strategies), ``invariant`` (what ``full`` must keep after every call), ``execute`` (one schedule
on the loaded variant), ``reference`` (the drift oracle's long-lived baseline reference),
``search`` (the hypothesis loop in one process), ``minimize`` (a greedy pass on the shrunk
schedule's steps), ``run_schedule`` and ``schedule_runner`` (one child process per variant, its
two sides).
"""
