"""The engine below the commands: work on the variants' builds, run in child processes.

``repro``, ``fuzz``, ``bench`` and ``mutate`` are commands on top of it; none imports another.
"""
