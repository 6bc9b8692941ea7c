"""The docs' tables of figures and the records they are written from.

Every table of measured figures in the docs is what a measuring command's ``--markdown`` writes from its
JSON record; this module holds what those commands share: the record's provenance, the line that says it,
and the table. ``records.py`` finds the command of a committed record.
"""

from __future__ import annotations

import datetime as dt
import os
import platform

PROVENANCE = ("date", "machine", "llama_cpp")  # the keys provenance() gives a record


def _simd() -> str | None:
    """The widest x86 vector extension the CPU reports (what a native build rounds with), or None."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        return None
    return next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), None)


def provenance(manifest) -> dict:
    """When, where and on which build a record was measured: the day, the machine, and llama.cpp's release,
    commit and backend from a build's manifest."""
    source = manifest.data["source"]
    return {
        "date": dt.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "simd": _simd(),
            "load": list(os.getloadavg()),  # 1, 5 and 15 minutes, when the record began
        },
        "llama_cpp": {
            "release": source.get("release"),
            "commit": source["provenance"].get("commit"),
            "backend": manifest.backend,
        },
    }


def heading(record: dict) -> str:
    """The line above a record's tables: when and where it was measured."""
    m, lc = record["machine"], record["llama_cpp"]
    simd = f" with {m['simd']}" if m.get("simd") else ""
    load = f", load average {m['load'][0]:.2f} at the start" if m.get("load") else ""
    return (
        f"Measured {record['date']} on {m['cpus']} cores ({m['machine']}{simd}, Python {m['python']}{load}), "
        f"llama.cpp {lc['release']} ({(lc['commit'] or '')[:7]}), {lc['backend']} build."
    )


BUSY_LOAD_PER_CORE = 0.25  # a 1-minute load average above this share of the cores means others are running


def busy_warning() -> str | None:
    """A warning when something else is running: timings then spread wider, though the ratios measure both
    sides interleaved."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load <= BUSY_LOAD_PER_CORE * cpus:
        return None
    return (
        f"the machine is busy (load average {load:.2f} over the last minute on {cpus} cores): "
        "the ratios interleave both sides, but their intervals widen; a quiet machine gives the figures to record"
    )


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
