"""The rows an image becomes: what the tiny projector makes of it through mtmd, on a real build.

The target is trained on exactly the rows llama.cpp feeds it, so they come from mtmd itself
(``mtmd_encode_chunk``), never from a re-implementation of the vision tower. The projector is the
project's random ``qwen2vl_merger`` (tiny/mmproj.py) at the target's width, frozen: training
teaches the target to read it, as a real VLM's language model reads its own tower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ...harness.tiny import TinyConfig, write_mmproj
from .config import CoreConfig
from .corpus import Image

MMPROJ_SEED = 0


def mmproj_config(cfg: CoreConfig) -> TinyConfig:
    return TinyConfig(n_embd=cfg.n_embd)


def write_projector(path: Path, cfg: CoreConfig) -> Path:
    write_mmproj(path, mmproj_config(cfg), seed=MMPROJ_SEED)
    return path


def encode_images(
    target: Path,
    mmproj: Path,
    images: Iterable[Image],
    *,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[tuple, tuple[np.ndarray, int, int]]:
    """``{image.key: (rows [nx * ny, E], nx, ny)}`` for each distinct image, through mtmd (on the
    build this process loaded)."""
    from pyllama_dflash.product import api

    out: dict[tuple, tuple[np.ndarray, int, int]] = {}
    todo = {im.key: im for im in images}
    with api.Model(target) as model, api.Projector(mmproj, model) as proj:
        for k, (key, image) in enumerate(todo.items()):
            with proj.tokenize(proj.marker, [image.pixels()]) as chunks:
                (chunk,) = [c for c in chunks if c.type == "image"]
                out[key] = (proj.encode(chunk), chunk.nx, chunk.ny)
            if (k + 1) % 200 == 0:
                log(f"encoded {k + 1} of {len(todo)} images")
    return out
