"""The model files and images a scenario runs on: the tiny generated ones, or real ones."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import numpy as np

from ...codec import Coded
from ...paths import cache_root
from .. import tiny
from ..tiny import image as tiny_image_module

MTP_SPEC_TYPE = "draft-mtp"  # the --spec-type of the target's own MTP head (no draft file)

# pixel sizes the tiny qwen2vl projector turns into these grids (28 px per merged token)
SMALL_IMAGE_PX = 84  # 3 x 3 = 9 tokens, 3 positions
LARGE_IMAGE_PX = 168  # 6 x 6 = 36 tokens (more than n_batch), 6 positions
WIDE_IMAGE_PX = (308, 84)  # 11 x 3 = 33 tokens: with n_batch 16 the last sub-batch is one row
TINY_IMAGE_PX = 28  # 1 x 1 = 1 token, one position, with the projector's image_min_tokens at 1
LONG_IMAGE_PX = (336, 84)  # 12 x 3 = 36 tokens: a 12-position hole, three times a draft n_ubatch of 4
SWA_WINDOW = 4  # the sliding-window draft's window: smaller than the large image's hole


class DraftKind(str, Enum):
    """The draft file a scenario runs on: the legacy draft, its reconverted twin (M-RoPE: its own twin),
    or the legacy draft with a sliding window."""

    PLAIN = "plain"
    TWIN = "twin"
    SWA = "swa"


DRAFT_KINDS = tuple(k.value for k in DraftKind)


@dataclass(frozen=True)
class ModelSet(Coded):
    target: Path
    draft: Path
    mmproj: Path | None
    # alternative drafts for the control scenarios (None when not available, e.g. real models).
    # twin is the plain draft's reconverted twin (and S9's M-RoPE draft): the same tensors with the
    # rope.dimension_sections that llama.cpp's converter now writes (the drift oracle's reference)
    twin: Path | None = None
    draft_swa: Path | None = None
    swa_window: int | None = None
    image_files: tuple[Path, ...] = ()  # real images, encoded files (PNG/JPEG) read by mtmd
    real: bool = False
    swa_twin: Path | None = None  # the sliding-window draft's reconverted twin
    # the --spec-type the draft runs under (None: what llama-server detects from the draft file),
    # and for the tiny models which drafter and target kind these are (tiny.drafters, tiny.target)
    spec_type: str | None = None
    drafter: str = tiny.DFLASH.name
    target_kind: str = "dense"
    # every draft of the set carries the key of a draft trained with image rows (tiny.draft.IMAGE_ROWS_KEY):
    # an as-trained variant gives it every row at positions of its own, and is judged as a definition fix
    image_rows: bool = False

    def with_draft(self, draft: Path) -> ModelSet:
        return replace(self, draft=draft)

    @property
    def target_head(self) -> bool:
        """The draft is the target's own MTP head (``draft-mtp``): it drafts in the target's context, at the
        target's positions, with no positions of its own on any variant."""
        return self.spec_type == MTP_SPEC_TYPE

    def draft_for(self, kind: DraftKind | str, *, twin: bool = False) -> Path | None:
        """The draft of a kind, or with twin its reconverted twin (the twin is its own). None where the
        set has no such file."""
        if kind not in DRAFT_KINDS:
            raise ValueError(f"unknown draft kind {kind!r} (known: {', '.join(DRAFT_KINDS)})")
        if kind == DraftKind.TWIN:
            return self.twin
        if kind == DraftKind.SWA:
            return self.swa_twin if twin else self.draft_swa
        return self.twin if twin else self.draft


def tiny_models(
    out_dir: Path | None = None,
    seed: int = 0,
    drafter: str = tiny.DFLASH.name,
    target: str = "dense",
    *,
    image_rows: bool = False,
) -> ModelSet:
    """Write (or reuse) a tiny target of a kind (dense | moe), the drafts of one drafter (plain,
    M-RoPE, sliding-window, and the sliding-window draft's M-RoPE twin) and the projector; with
    ``image_rows`` every draft marked as trained with image rows."""
    out = Path(out_dir) if out_dir else cache_root() / "tiny" / f"seed{seed}"
    form = tiny.drafter(drafter)

    def write(**kw):
        return tiny.write_models(out, seed=seed, form=form, target_kind=target, image_rows=image_rows, **kw)

    plain = write()
    mrope = write(twin=True)
    swa = write(draft_swa=SWA_WINDOW)
    swa_mrope = write(twin=True, draft_swa=SWA_WINDOW)
    return ModelSet(
        plain.target,
        plain.draft,
        plain.mmproj,
        mrope.draft,
        swa.draft,
        SWA_WINDOW,
        swa_twin=swa_mrope.draft,
        spec_type=form.spec_type,
        drafter=form.name,
        target_kind=target,
        image_rows=image_rows,
    )


def bench_pair_models(out_dir: Path | None = None, seed: int = 0) -> ModelSet:
    """The bench pair (tiny/bench_pair.py): the tiny target's architecture at a size whose decode is
    memory-bound on a CPU, its DFlash draft (untrained), its projector and the draft's reconverted twin,
    written into the cache on first use."""
    from pyllama_dflash.harness.tiny.bench_pair import BENCH_PAIR

    out = Path(out_dir) if out_dir else cache_root() / "bench-pair" / f"seed{seed}"
    plain = tiny.write_models(out, seed=seed, config=BENCH_PAIR)
    twin = tiny.write_models(out, seed=seed, config=BENCH_PAIR, twin=True)
    return ModelSet(plain.target, plain.draft, plain.mmproj, twin.draft)


IMAGE_ROWS_CASE = "+image-rows"  # the suffix of a case whose drafts are marked as trained with image rows


def case_name(models: ModelSet) -> str:
    """``<drafter>/<target kind>``, with IMAGE_ROWS_CASE for drafts marked as trained with image rows:
    which models a scenario runs on, a table of the matrix."""
    return f"{models.drafter}/{models.target_kind}" + (IMAGE_ROWS_CASE if models.image_rows else "")


SIBLINGS = ("mtp", "eagle3")  # the drafters that keep a memory of the conversation but are not DFlash's


def sibling_models(sibling: str, out_dir: Path | None = None, seed: int = 0) -> ModelSet:
    """The tiny models of a sibling drafter, to measure what MTP and EAGLE3 do after an image:

    - ``mtp``: the dense target with a Qwen3.5 MTP head (its own file, the trunk byte for byte the
      dense target's), drafting with ``--spec-type draft-mtp`` over its own head;
    - ``eagle3``: the dense target and a tiny EAGLE3 draft (``--spec-type draft-eagle3``).

    Neither has a reconverted twin: an EAGLE3 draft's rope is always the plain one, and the MTP head is
    the target's own (M-RoPE already)."""
    from pyllama_dflash.harness.tiny.eagle3 import FILENAME as EAGLE3_FILE
    from pyllama_dflash.harness.tiny.eagle3 import write_eagle3
    from pyllama_dflash.harness.tiny.target import write_target

    if sibling not in SIBLINGS:
        raise ValueError(f"unknown sibling drafter {sibling!r} (known: {', '.join(SIBLINGS)})")
    out = Path(out_dir) if out_dir else cache_root() / "tiny" / f"seed{seed}"
    base = tiny.write_models(out, seed=seed)
    g = tiny.gguf_module()
    if sibling == "mtp":
        target = out / tiny.target_filename("dense", mtp=True)
        write_target(target, base.config, seed=seed, mtp=True, gguf=g)
        return ModelSet(target, target, base.mmproj, spec_type=MTP_SPEC_TYPE, drafter="mtp", target_kind="dense")
    draft = out / EAGLE3_FILE
    write_eagle3(draft, base.config, seed=seed, gguf=g)
    return ModelSet(base.target, draft, base.mmproj, spec_type="draft-eagle3", drafter="eagle3", target_kind="dense")


def for_schedule(models: ModelSet, drafter: str | None, target: str | None) -> ModelSet:
    """The models a schedule that names a tiny drafter or target kind runs on: those tiny models,
    from the folder of the tiny ones given; the given models themselves when it names neither."""
    if (drafter or models.drafter) == models.drafter and (target or models.target_kind) == models.target_kind:
        return models
    if models.real:
        raise ValueError("a schedule that names a tiny drafter or target runs on the tiny models, not on real ones")
    return tiny_models(
        models.target.parent,
        drafter=drafter or models.drafter,
        target=target or models.target_kind,
        image_rows=models.image_rows,
    )


def small_image(seed: int = 0) -> np.ndarray:
    return tiny_image_module.rgb(SMALL_IMAGE_PX, SMALL_IMAGE_PX, seed)


def large_image(seed: int = 0) -> np.ndarray:
    return tiny_image_module.rgb(LARGE_IMAGE_PX, LARGE_IMAGE_PX, seed)


def wide_image(seed: int = 0) -> np.ndarray:
    return tiny_image_module.rgb(*WIDE_IMAGE_PX, seed)


def tiny_image(seed: int = 0) -> np.ndarray:
    return tiny_image_module.rgb(TINY_IMAGE_PX, TINY_IMAGE_PX, seed)


def long_image(seed: int = 0) -> np.ndarray:
    return tiny_image_module.rgb(*LONG_IMAGE_PX, seed)
