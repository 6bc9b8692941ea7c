"""Intervals over conversations: a conversation's rounds depend on each other, so the bootstrap resamples
whole conversations, and a paired difference resamples the same conversations for both columns."""

from __future__ import annotations

import numpy as np

from ...bootstrap import percentile_interval, resample


def resampled_means(per_conv: list[tuple[int, int]], idx: np.ndarray) -> np.ndarray:
    """Pooled mean accepted (sum accepted / rounds) of each resample of conversations."""
    acc = np.array([a for a, _ in per_conv], dtype=float)[idx].sum(axis=1)
    n = np.array([k for _, k in per_conv], dtype=float)[idx].sum(axis=1)
    return np.where(n > 0, acc / np.maximum(n, 1), 0.0)


def bootstrap_mean(per_conv: list[tuple[int, int]]) -> tuple[float, float]:
    """95% percentile interval of the pooled mean accepted, resampling conversations."""
    return percentile_interval(resampled_means(per_conv, resample(len(per_conv))))


def paired_difference(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> dict:
    """Mean accepted of a minus b on the same conversations, with a 95% interval from resampling the
    conversations once for both (each conversation is its own pair)."""
    idx = resample(len(a))
    d = resampled_means(a, idx) - resampled_means(b, idx)
    point = resampled_means(a, np.arange(len(a))[None])[0] - resampled_means(b, np.arange(len(b))[None])[0]
    lo, hi = percentile_interval(d)
    return {"difference": float(point), "ci95": [lo, hi], "told_apart": bool(lo > 0 or hi < 0)}
