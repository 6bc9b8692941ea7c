"""Deterministic tiny GGUF models (qwen35 targets, dflash-family drafts, qwen2vl projector).

Small enough (<1 MB each, written in milliseconds) to run llama.cpp's DFlash +
mtmd path on a CPU in CI with no download. Weights are random but seeded: the
same arguments give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._gguf import ENV_VAR, GgufUnavailable, gguf_module
from ._vocab import tokenize_test_vocab
from .config import TinyConfig
from .draft import write_draft
from .drafters import DFLASH, DRAFTERS, Drafter, drafter
from .mmproj import image_grid, write_mmproj
from .target import TARGET_KINDS, target_filename, write_target

__all__ = [
    "DFLASH",
    "DRAFTERS",
    "ENV_VAR",
    "TARGET_KINDS",
    "Drafter",
    "GgufUnavailable",
    "TinyConfig",
    "TinyModels",
    "draft_filename",
    "drafter",
    "gguf_module",
    "target_filename",
    "image_grid",
    "tokenize_test_vocab",
    "write_draft",
    "write_mmproj",
    "write_models",
    "write_target",
]


@dataclass(frozen=True)
class TinyModels:
    target: Path
    draft: Path
    mmproj: Path
    config: TinyConfig
    seed: int
    twin: bool  # the draft is the reconverted twin: M-RoPE (rope.dimension_sections)
    draft_swa: int | None
    written: tuple[str, ...]  # which of target/draft/mmproj this call (re)wrote
    form: Drafter = DFLASH
    image_rows: bool = False  # the draft is marked as trained with image rows (draft.IMAGE_ROWS_KEY)

    @property
    def spec_type(self) -> str:
        """The --spec-type the draft runs under (llama-server: draft-dflash or draft-dspark)."""
        return self.form.spec_type

    @property
    def drafter(self) -> str:
        return self.form.name

    @property
    def n_embd(self) -> int:
        return self.config.n_embd

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    @property
    def bos_id(self) -> int:
        return self.config.bos_id

    @property
    def eos_id(self) -> int:
        return self.config.eos_id

    @property
    def eog_ids(self) -> tuple[int, ...]:
        return self.config.eog_ids

    @property
    def mask_id(self) -> int:
        return self.config.mask_id

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def n_draft_max(self) -> int:
        # DFlash drafts [id_last, mask * (block_size-1)] and yields at most block_size-1 tokens;
        # an anchor-first DSpark block yields block_size
        return self.form.n_draft_max(self.config.block_size)

    @property
    def n_layer_target(self) -> int:
        return self.config.n_layer

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    @property
    def n_ctx_train(self) -> int:
        return self.config.n_ctx

    def server_args(self, *, spec: bool = True, n_ctx: int | None = None) -> list[str]:
        """llama-server model flags seen to work with b11434 (add host/port/threads/batch).

        `--no-warmup` also turns off the mmproj warmup (server passes params.warmup
        to mtmd), which would otherwise encode a 1288x1288 image. The chat template
        comes from the target GGUF, so no --chat-template flag is needed.
        """
        n_ctx = self.n_ctx_train if n_ctx is None else n_ctx
        args = ["-m", str(self.target), "--mmproj", str(self.mmproj), "-c", str(n_ctx), "--no-warmup"]
        if spec:
            args += [
                "-md",
                str(self.draft),
                "--spec-type",
                self.form.spec_type,
                "--spec-draft-n-max",
                str(self.n_draft_max),
            ]
        return args


def draft_filename(twin: bool = False, swa: int | None = None, form: Drafter = DFLASH, image_rows: bool = False) -> str:
    parts = [f"tiny-{form.name}"]
    if twin:
        parts.append("twin")
    if swa is not None:
        parts.append(f"swa{swa}")
    if image_rows:
        parts.append("image-rows")
    return "-".join(parts) + ".gguf"


def write_models(
    out_dir: Path,
    *,
    seed: int = 0,
    twin: bool = False,
    draft_swa: int | None = None,
    form: Drafter = DFLASH,
    target_kind: str = "dense",
    config: TinyConfig | None = None,
    gguf_tree: Path | None = None,
    image_rows: bool = False,
) -> TinyModels:
    """Write (or reuse) the three tiny GGUFs in `out_dir`.

    Files already present with the same generator fingerprint are left
    untouched; others are written to a temp file and renamed into place.
    Draft forms and target kinds get distinct names, so one directory can hold them all; so do
    drafts marked as trained with image rows (``image_rows``, tiny.draft.IMAGE_ROWS_KEY).
    """
    cfg = config or TinyConfig()
    cfg.validate()
    out = Path(out_dir)
    g = gguf_module(gguf_tree)
    target = out / target_filename(target_kind)
    draft = out / draft_filename(twin, draft_swa, form, image_rows)
    mmproj = out / "tiny-mmproj-qwen2vl.gguf"
    written = []
    if write_target(target, cfg, seed=seed, kind=target_kind, gguf=g):
        written.append("target")
    if write_draft(draft, cfg, seed=seed, mrope=twin, swa=draft_swa, form=form, gguf=g, image_rows=image_rows):
        written.append("draft")
    if write_mmproj(mmproj, cfg, seed=seed, gguf=g):
        written.append("mmproj")
    return TinyModels(
        target=target,
        draft=draft,
        mmproj=mmproj,
        config=cfg,
        seed=seed,
        twin=twin,
        draft_swa=draft_swa,
        written=tuple(written),
        form=form,
        image_rows=image_rows,
    )
