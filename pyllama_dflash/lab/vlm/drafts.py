"""DFlash drafts for the trained target, trained with the project's draft pipeline (draftmodel/).

The target runs through llama.cpp (baseline's build) over seeded conversations and writes its own
replies greedily, each ended by ``<|im_end|>``; the draft learns from the target's features of every
row, as ``pyllama-dflash train`` does for the tiny targets. Two drafts, by what they were trained on:

- ``text``: prose conversations only, long enough (several turns of whole paragraphs) that the
  distances a served conversation reaches, images included, lie inside what it was trained on;
- ``images``: the bench's shape (text, an image, text, a second image), an image in every image
  turn, of 64, 256 or 1024 rows in equal shares, the image rows in the draft's context.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...files import atomic_write_json, sha256_file
from ...harness.tiny import TinyConfig, write_draft
from ..acceptance.stats import bootstrap_mean
from ..draftmodel.corpus import Collector, Conversation
from ..draftmodel.corpus import Turn as CorpusTurn
from ..draftmodel.evaluate import accepted_per_round
from ..draftmodel.train import Recipe, train
from ..draftmodel.weights import load_draft
from .config import CoreConfig
from .corpus import MIXED_REPLY, caption_turn, prose_turn
from .corpus import Image as SceneImage
from .prose import Paragraph, all_paragraphs
from .scenes import SIDE_FOR_ROWS, draw_scene
from .vocab import IM_END, VOCAB
from .weights import read_target

BLOCK_SIZE = 8  # the noise block: the anchor and 7 masks, so a round drafts up to 7 tokens
FEATURE_LAYERS = (1, 3, 5)  # the inputs of the core's attention layers


class TrainedOn(enum.Enum):
    TEXT = "text"
    IMAGES = "images"


def trained_on(draft: Any) -> TrainedOn:
    """What a draft was trained on, as its file says (a path, or a GGUFReader already open on it): IMAGES
    where it carries the image-rows key."""
    from ...harness.tiny._gguf import gguf_module
    from ...product.upgrade.draft import IMAGE_ROWS_KEY

    reader = draft if hasattr(draft, "get_field") else gguf_module().GGUFReader(Path(draft))
    field = reader.get_field(IMAGE_ROWS_KEY)
    return TrainedOn.IMAGES if field is not None and bool(field.contents()) else TrainedOn.TEXT


def draft_config(core: CoreConfig, feature_layers: tuple[int, ...] = FEATURE_LAYERS) -> TinyConfig:
    """The draft's sizes in the tiny generator's terms: the target's width and heads, one layer."""
    return TinyConfig(
        n_vocab=VOCAB.n_vocab,
        n_embd=core.n_embd,
        n_ff=core.n_ff,
        n_head=core.n_head,
        n_head_kv=core.n_head_kv,
        head_dim=core.head_dim,
        n_ctx=core.n_ctx,
        rms_eps=core.rms_eps,
        w_std=0.05,
        n_layer=core.n_layer,
        full_attention_interval=core.full_attention_interval,
        rope_sections=core.rope_sections,
        draft_n_layer=1,
        target_layer_ids=tuple(il for il in feature_layers if il < core.n_layer),
        block_size=BLOCK_SIZE,
    )


def write_untrained_draft(path: Path, core: CoreConfig, *, trained=None, image_rows: bool = False) -> bool:
    return write_draft(
        path,
        draft_config(core),
        trained=trained,
        image_rows=image_rows,
        vocab=("vlm-char", VOCAB.add_to_gguf),
    )


@dataclass(frozen=True)
class VlmModels:
    """What the draft pipeline and llama-server take: the target, its projector and a draft."""

    target: Path
    mmproj: Path
    draft: Path


def draw_turns(
    kind: TrainedOn, rng: np.random.Generator, paragraphs: list[Paragraph], n_prose: int, rows: int | None = None
) -> list:
    """One conversation's turns (corpus.Turn), before the target writes the replies; an image conversation's
    images are of ``rows`` rows (None: 64, 256 or 1024, drawn)."""
    if kind is TrainedOn.TEXT:
        return [prose_turn(paragraphs[int(rng.integers(len(paragraphs)))]) for _ in range(n_prose)]
    drawn = int(rng.choice((64, 256, 1024)))
    rows = rows or drawn
    turns = []
    for k in range(4):
        if k % 2 == 0:
            p = paragraphs[int(rng.integers(len(paragraphs)))]
            turns.append(prose_turn(Paragraph(p.subject, p.text[: MIXED_REPLY * 2])))
        else:
            turns.append(caption_turn(SceneImage(draw_scene(rng), SIDE_FOR_ROWS[rows], int(rng.integers(1 << 30)))))
    return turns


def collect(
    models: VlmModels,
    conversations: list[list],
    *,
    n_ctx: int,
    reply_limit: int,
    stop_at_end: bool = True,
    log: Callable[[str], None] = print,
) -> list[Conversation]:
    """Run each conversation through the target (llama.cpp), which writes the replies itself."""
    out = []
    with Collector(models, n_ctx=n_ctx, stop=IM_END if stop_at_end else None) as collector:
        collector.between_turns = "\n"
        for k, turns in enumerate(conversations):
            corpus_turns = [
                CorpusTurn(t.user, (t.image.pixels(),) if t.image is not None else (), reply_limit) for t in turns
            ]
            out.append(collector.run(corpus_turns))
            if (k + 1) % 20 == 0:
                log(f"collected {k + 1} of {len(conversations)} conversations ({len(out[-1].tokens)} rows)")
    return out


@dataclass(frozen=True)
class DraftPlan:
    """How many conversations, how long, and how the draft is trained on them."""

    train: int
    held_out: int
    prose_turns: int  # a text conversation's turns
    recipe: Recipe
    reply_limit: int = 400  # generated rows a reply may take before it is cut
    stop_at_end: bool = True  # a reply ends at <|im_end|> (a toy target may write it first: the smoke does not)


# Every block sees its whole context, as llama.cpp's draft does: trained on a window of the latest 256
# rows, a draft kept 0.60 tokens a round of 3 when served that window and 0.37 when served every row
# before it (the far rows dilute its attention). About 1.5 s a step on 2 cores.
RECIPE = Recipe(steps=1200, seqs_per_step=8, anchors_per_seq=32, lr=3e-3, lr_final=3e-4)
# the target's prose replies run about 200 characters, so a text conversation of twelve turns reaches about
# 3,000 rows: past what the bench's conversation with two 1024-row images reaches when every row is in the
# draft's context (about 2,700)
PLANS = {
    # trained at n_max 3's block (4 rows) and n_max 7's (8), each block drawing one: on blocks of 8 alone
    # the text draft kept 1.05 tokens a round of 3 (its record before this recipe)
    TrainedOn.TEXT: DraftPlan(train=40, held_out=24, prose_turns=12, recipe=replace(RECIPE, block_lengths=(4, 8))),
    # its captions are learnt sooner: 900 steps (18 minutes) reached a loss the text-trained draft's 1,200 did not
    TrainedOn.IMAGES: DraftPlan(train=64, held_out=24, prose_turns=0, recipe=replace(RECIPE, steps=900)),
}
SMOKE_PLAN = DraftPlan(
    train=3,
    held_out=2,
    prose_turns=2,
    recipe=Recipe(steps=2, seqs_per_step=2, anchors_per_seq=4, block_lengths=(4, 8)),
    reply_limit=24,
    stop_at_end=False,
)


def draft_file(kind: TrainedOn) -> str:
    return f"vlm-dflash-{kind.value}.gguf"


def _corpus(
    target: Path, mmproj: Path, draft: Path, kind: TrainedOn, plan: DraftPlan, smoke: bool, log: Callable[[str], None]
) -> tuple[list[Conversation], list[Conversation]]:
    """The training and held-out conversations, run through the target (held-out prose only in the second)."""
    core, _params = read_target(target)
    paragraphs = all_paragraphs(limit_files=20 if smoke else None)
    train_p = [p for p in paragraphs if not p.held_out]
    held_p = [p for p in paragraphs if p.held_out] or train_p
    rng = np.random.default_rng([11, 59, 0 if kind is TrainedOn.TEXT else 1])
    turns = [draw_turns(kind, rng, train_p, plan.prose_turns) for _ in range(plan.train)]
    turns += [draw_turns(kind, rng, held_p, plan.prose_turns) for _ in range(plan.held_out)]
    convs = collect(
        VlmModels(target, mmproj, draft),
        turns,
        n_ctx=core.n_ctx,
        reply_limit=plan.reply_limit,
        stop_at_end=plan.stop_at_end,
        log=log,
    )
    train_c = [c for c in convs[: plan.train] if np.any(c.generated[BLOCK_SIZE:])]
    if not train_c:
        raise RuntimeError(f"{target}: no training conversation has a reply of {BLOCK_SIZE} rows")
    return train_c, convs[plan.train :]


def make_draft(
    target: Path,
    mmproj: Path,
    out: Path,
    kind: TrainedOn,
    *,
    smoke: bool = False,
    steps: int = 0,
    log: Callable[[str], None] = print,
) -> dict:
    """Collect, train, write and judge one draft; returns its record (also written beside it)."""
    plan = SMOKE_PLAN if smoke else PLANS[kind]
    if steps:
        plan = replace(plan, recipe=replace(plan.recipe, steps=steps))
    core, _params = read_target(target)
    started = time.monotonic()
    path, untrained = out / draft_file(kind), out / f"vlm-dflash-{kind.value}-untrained.gguf"
    write_untrained_draft(untrained, core)
    train_c, held_c = _corpus(target, mmproj, untrained, kind, plan, smoke, log)
    corpus_seconds = round(time.monotonic() - started, 1)
    rows_max = int(max(len(c.tokens) for c in train_c))
    log(f"{kind.value}: {len(train_c)} training conversations, up to {rows_max} rows")
    recipe = replace(plan.recipe, seqs_per_step=min(plan.recipe.seqs_per_step, len(train_c)))
    params, summary = train(load_draft(untrained, target), train_c, recipe, log=log)
    write_untrained_draft(path, core, trained=params, image_rows=kind is TrainedOn.IMAGES)
    untrained.unlink()
    accepted = held_out_acceptance(load_draft(path, target), held_c)
    record = {
        "file": path.name,
        "sha256": sha256_file(path),
        "trained_on": kind.value,
        "target": target.name,
        "target_sha256": sha256_file(target),
        "block_size": BLOCK_SIZE,
        "feature_layers": list(draft_config(core).target_layer_ids),
        "corpus": {
            "train": len(train_c),
            "held_out": len(held_c),
            "prose_turns": plan.prose_turns,
            "image_rows": sorted({r for c in train_c + held_c for r in _image_row_counts(c)}),
            "an_image_in_every_image_turn": kind is TrainedOn.IMAGES,
            "rows_max": rows_max,
        },
        "positions_covered": [0, rows_max - 1],
        "recipe": asdict(recipe),
        "history": summary["history"],
        "held_out_mean_accepted": accepted["3"]["mean"],
        "held_out_accepted_by_n_max": accepted,
        "corpus_seconds": corpus_seconds,
        "train_seconds": summary["seconds"],
        "seconds": round(time.monotonic() - started, 1),
        "command": f"pyllama-dflash vlm drafts --trained-on {kind.value} --out {out}"
        + (f" --steps {steps}" if steps else ""),
    }
    atomic_write_json(path.with_suffix(".json"), record)
    return record


def held_out_acceptance(w, held: list[Conversation]) -> dict[str, dict]:
    """Accepted tokens a round of n_max 3 and of the whole block, pooled over the held-out conversations,
    with a 95% interval from resampling them."""
    w = w.float64()
    out = {}
    for n_max in (3, BLOCK_SIZE - 1):
        per_conv = [(sum(r), len(r)) for r in (accepted_per_round(w, c, n_max) for c in held)]
        lo, hi = bootstrap_mean(per_conv)
        mean = sum(a for a, _ in per_conv) / max(1, sum(k for _, k in per_conv))
        out[str(n_max)] = {
            "mean": round(mean, 4),
            "ci95": [round(lo, 4), round(hi, 4)],
            "rounds": sum(k for _, k in per_conv),
        }
    return out


def _image_row_counts(conv: Conversation) -> list[int]:
    """The row count of each image of a conversation (runs of -1 tokens)."""
    out, run = [], 0
    for t in [*conv.tokens.tolist(), 0]:
        if t < 0:
            run += 1
        elif run:
            out.append(run)
            run = 0
    return out
