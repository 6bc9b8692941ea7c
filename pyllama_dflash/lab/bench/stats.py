"""Summaries for noisy machines: medians and spreads (their intervals: ``bootstrap.median_interval``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary(samples: Sequence[float]) -> dict:
    xs = sorted(samples)
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
    }
