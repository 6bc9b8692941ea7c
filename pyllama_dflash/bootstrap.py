"""The one bootstrap: resampled indices and percentile intervals, for every interval the project reports.

Acceptance resamples whole conversations (their rounds depend on each other) and the bench resamples
paired timings; both draw the indices here, so a figure's interval means the same on every page.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_BOOT = 2000
LEVEL = 0.95


def resample(n: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """``n_boot`` draws of ``n`` indices with replacement, one row a draw; seeded, so reruns agree."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central ``level`` interval of resampled statistics."""
    lo, hi = np.quantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def median_interval(samples: Sequence[float], level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``samples``."""
    xs = np.asarray(samples, dtype=float)
    return percentile_interval(np.median(xs[resample(xs.size, seed=seed)], axis=1), level)
