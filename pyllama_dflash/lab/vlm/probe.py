"""How much of a scene's shape the projector's rows keep: a classifier read off the rows, no target.

The target can only name what the rows carry. A kernel ridge classifier (an RBF kernel over the rows,
flattened and standardised; its width and ridge from a first sweep at 9 rows, docs/trained-target.md)
learns the shape from images of the training seeds and is scored on the judge's held-out images, at
each image size and for several counts of training seeds. It bounds from below what a reader of the
rows can get: where it names the shape of held-out images, a target that does not has not learnt to.
The rows come from mtmd on a real build, as the target's do (imagerows.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from .corpus import Image
from .imagerows import encode_images
from .judge import held_out_images
from .scenes import SHAPES, SIDE_FOR_ROWS, all_scenes

GAMMA = 1.0  # times 1 / the feature count: the kernel's width
RIDGE = 0.1
HELD_OUT_PER_SCENE = 2


def _features(rows: Iterable[np.ndarray]) -> np.ndarray:
    return np.array([r.reshape(-1) for r in rows], np.float64)


def kernel_ridge_accuracy(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """Held-out accuracy of an RBF kernel ridge classifier (one-hot targets) trained on ``x``, ``y``."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, x_test = (x - mean) / std, (x_test - mean) / std
    gamma = GAMMA / x.shape[1]
    sq = (x**2).sum(1)

    def kernel(a: np.ndarray) -> np.ndarray:
        return np.exp(-gamma * np.maximum((a**2).sum(1)[:, None] + sq[None] - 2 * a @ x.T, 0))

    weights = np.linalg.solve(kernel(x) + RIDGE * np.eye(len(x)), np.eye(len(SHAPES))[y])
    predicted = (kernel(x_test) @ weights).argmax(1)
    return float(np.mean(predicted == y_test))


def shape_probe(
    target: Path, mmproj: Path, rows: int, seed_counts: Iterable[int], log: Callable[[str], None] = print
) -> dict[str, float]:
    """``{str(seeds): held-out shape accuracy}`` at ``rows`` rows, trained on every scene at each of the
    first ``seeds`` training seeds; the same held-out images (``HELD_OUT_PER_SCENE`` of each scene) for all."""
    scenes, side = all_scenes(), SIDE_FOR_ROWS[rows]
    counts = sorted(set(seed_counts))
    train = [Image(s, side, seed) for seed in range(counts[-1]) for s in scenes]
    held = held_out_images(len(scenes) * HELD_OUT_PER_SCENE, rows)  # the judge's, each scene in turn
    encoded = encode_images(target, mmproj, train + held, log=log)
    x_all = _features(encoded[im.key][0] for im in train)
    y_all = np.array([SHAPES.index(im.scene.shape) for im in train])
    x_test = _features(encoded[im.key][0] for im in held)
    y_test = np.array([SHAPES.index(im.scene.shape) for im in held])
    out = {}
    for n in counts:
        first = n * len(scenes)  # train is ordered seed by seed
        out[str(n)] = kernel_ridge_accuracy(x_all[:first], y_all[:first], x_test, y_test)
        log(f"{rows} rows, {n} training seeds: held-out shape accuracy {out[str(n)]:.3f}")
    return out
