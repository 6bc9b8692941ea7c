"""The pace of a long run (training, its corpus, the bench's served columns): time spent and an estimate
of what is left, from the mean pace so far, in one form for every progress line."""

from __future__ import annotations

import time


def eta(done: int, total: int, t0: float) -> str:
    """Elapsed seconds since ``t0`` (a ``time.perf_counter()``) and an estimate of those left."""
    spent = time.perf_counter() - t0
    return f"{spent:.0f} s spent, about {spent / max(done, 1) * (total - done):.0f} s left"
