"""The stages that make the trained target, each a function the command runs and logs.

``pool``: draw the training conversations and encode their images through mtmd; ``target``:
train the core on them and write the GGUF and its record. Every draw is seeded, so one command
rebuilds the same pool; training on a CPU is deterministic up to XLA's reduction order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import CoreConfig
from .corpus import Rendered, draw_conversation, render
from .imagerows import encode_images
from .prose import Paragraph, all_paragraphs
from .train import Recipe

HELD_OUT_IMAGE_SEEDS = tuple(range(1000, 1100))  # a training image's seed is below these


@dataclass(frozen=True)
class PoolSpec:
    """How many conversations of each kind, and the image sizes (rows: share) they draw from."""

    prose: int = 4000
    caption: int = 3000
    mixed: int = 1500
    caption_rows: tuple[tuple[int, float], ...] = ((9, 0.45), (64, 0.45), (256, 0.10))
    mixed_rows: tuple[tuple[int, float], ...] = ((9, 0.5), (64, 0.5))
    seed: int = 0
    image_seeds: int = 8  # renderings of each scene at each size: a training image's seed is below this
    docstring_files: int | None = None  # None: every standard-library file (a smoke run passes a few)


def _rows(rng: np.random.Generator, shares: tuple[tuple[int, float], ...]) -> int:
    sizes, p = zip(*shares, strict=True)
    return int(rng.choice(sizes, p=np.array(p) / sum(p)))


def draw_pool(spec: PoolSpec, paragraphs: list[Paragraph]) -> list[list]:
    rng = np.random.default_rng([spec.seed, 62])
    seeds = tuple(range(spec.image_seeds))
    pool = []
    for kind, count, shares in (
        ("prose", spec.prose, spec.caption_rows),
        ("caption", spec.caption, spec.caption_rows),
        ("mixed", spec.mixed, spec.mixed_rows),
    ):
        for _ in range(count):
            pool.append(draw_conversation(kind, rng, paragraphs, _rows(rng, shares), seeds))
    return pool


def build_pool(
    spec: PoolSpec, target: Path, mmproj: Path, log: Callable[[str], None] = print
) -> tuple[list[Rendered], dict[tuple, np.ndarray]]:
    """The rendered pool and the rows of each of its images, from mtmd on ``target`` + ``mmproj``."""
    paragraphs = [p for p in all_paragraphs(spec.docstring_files) if not p.held_out]
    log(f"{len(paragraphs)} training paragraphs, {sum(len(p.text) for p in paragraphs)} characters")
    conversations = draw_pool(spec, paragraphs)
    images = [t.image for conv in conversations for t in conv if t.image is not None]
    encoded = encode_images(target, mmproj, images, log=log)
    grid = {side: (nx, ny) for (_c, _s, _p, side, _seed), (_r, nx, ny) in encoded.items()}
    rows_of = {key: rows for key, (rows, _nx, _ny) in encoded.items()}
    log(f"{len(conversations)} conversations, {len(rows_of)} distinct images")
    return [render(conv, grid) for conv in conversations], rows_of


def train_core(
    cfg: CoreConfig,
    pool: list[Rendered],
    rows_of: dict[tuple, np.ndarray],
    recipe: Recipe,
    log: Callable[[str], None] = print,
    checkpoint=None,
    init: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    from .train import pack, train

    packed = pack(pool, rows_of, recipe.length)
    n_rows, n_reply = len(packed.tokens), int(packed.weight.sum())
    log(f"packed {len(pool)} conversations into {n_rows} rows of {recipe.length}; {n_reply} reply tokens")
    return train(cfg, packed, recipe, log=log, checkpoint=checkpoint, init=init)


@dataclass(frozen=True)
class Phase:
    """One run of training: its pool and its recipe, started from the previous phase's weights."""

    name: str
    pool: PoolSpec
    recipe: Recipe


# Why two: after the first phase the target names the colour of a held-out image (97-100%) but its shape
# and place near chance (50-60%, 30 images of each size: `between_phases` in its record); a second phase heavy
# in captions, at a lower peak rate, teaches both without unlearning the prose.
PHASES = (
    Phase("language", PoolSpec(), Recipe()),
    Phase("captions", PoolSpec(prose=1500, caption=6000, mixed=1500), Recipe(steps=600, lr=1e-3, lr_final=1e-4)),
)
SMOKE_POOL = PoolSpec(prose=24, caption=24, mixed=8, docstring_files=20)
SMOKE_RECIPE = Recipe(steps=3, batch=4, length=256, warmup=1)
SMOKE_PHASES = (
    Phase("language", SMOKE_POOL, SMOKE_RECIPE),
    Phase(
        "captions",
        PoolSpec(prose=8, caption=32, mixed=8, docstring_files=20),
        Recipe(steps=2, batch=4, length=256, warmup=1),
    ),
)
