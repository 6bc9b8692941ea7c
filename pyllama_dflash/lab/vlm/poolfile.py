"""The training pool on disk: every conversation's rows and every image's rows, in one ``.npz``.

What ``vlm corpus`` writes and ``vlm target --corpus`` reads, so that the pool (drawn, rendered and its
images encoded through mtmd) is made once and the training can run again on exactly it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...files import atomic_path
from .corpus import Image, Rendered
from .scenes import Scene


def save_pool(path: Path, pool: list[Rendered], rows_of: dict[tuple, np.ndarray], meta: dict) -> None:
    keys = sorted(rows_of)
    key_index = {k: i for i, k in enumerate(keys)}
    lengths = [r.n for r in pool]
    images = [(c, first, key_index[im.key]) for c, r in enumerate(pool) for first, im in r.image_rows]
    arrays = {
        "conv_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "tokens": np.concatenate([r.tokens for r in pool]),
        "pos": np.concatenate([r.pos for r in pool], axis=1),
        "weight": np.concatenate([r.weight for r in pool]),
        "images": np.array(images, dtype=np.int64).reshape(-1, 3),
        "row_offsets": np.concatenate([[0], np.cumsum([len(rows_of[k]) for k in keys])]).astype(np.int64),
        "rows": np.concatenate([rows_of[k] for k in keys]) if keys else np.zeros((0, 1), np.float32),
        "keys": np.array(json.dumps([list(k) for k in keys])),
        "meta": np.array(json.dumps(meta)),
    }
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_pool(path: Path) -> tuple[list[Rendered], dict[tuple, np.ndarray], dict]:
    z = np.load(Path(path))
    keys = [tuple(k) for k in json.loads(str(z["keys"]))]
    ro = z["row_offsets"]
    rows_of = {k: z["rows"][ro[i] : ro[i + 1]] for i, k in enumerate(keys)}
    off = z["conv_offsets"]
    by_conv: dict[int, list] = {}
    for c, first, ki in z["images"].tolist():
        colour, shape, place, side, seed = keys[ki]
        by_conv.setdefault(c, []).append((first, Image(Scene(colour, shape, place), side, seed)))
    pool = [
        Rendered(z["tokens"][a:b], by_conv.get(c, []), z["pos"][:, a:b], z["weight"][a:b])
        for c, (a, b) in enumerate(zip(off[:-1], off[1:], strict=True))
    ]
    return pool, rows_of, json.loads(str(z["meta"]))
