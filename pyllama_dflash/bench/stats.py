"""Summaries for noisy machines: medians, spreads, and a bootstrap interval for a ratio."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np


def summary(samples: Sequence[float]) -> dict:
    xs = sorted(samples)
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
    }


def bootstrap_median(
    samples: Sequence[float], n_boot: int = 5000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median."""
    xs = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(xs, size=(n_boot, xs.size), replace=True), axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)
