"""Tiny `dflash` draft matching the tiny target.

By default it has no `rope.dimension_sections`, like published DFlash GGUFs: the
draft is then NEOX and its memory demands consecutive positions (Y = X + 1),
which is what the image hole breaks. `mrope=True` adds degenerate sections
[head_dim/2, 0, 0, 0]: the draft turns M-RoPE and accepts forward jumps (the
control case). `swa=N` adds b11434's optional interleaved sliding window
(`dflash.attention.sliding_window` + `dflash.attention.sliding_window_pattern`,
one bool per draft layer, all True here). `image_rows=True` adds the key that marks a draft trained
with the target's image rows in its context (IMAGE_ROWS_KEY): patch 0008 then gives it every row at
positions of its own, and any other draft what a draft trained on text was trained for.

No token_embd/output: the draft borrows them from the target via `ctx_other`, except a draft
with a reduced vocabulary, which ships its own output head (see drafters.py for every form).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...product.upgrade.draft import IMAGE_ROWS_KEY
from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import SPECIALS, TinyConfig, fingerprint
from .drafters import (
    CONV_GROUP,
    CONV_KERNEL,
    DFLASH,
    MARKOV_RANK,
    SELECTOR_RANK,
    SELECTOR_TOP_K,
    Drafter,
)

ARCH = "dflash"
STREAM = 2
FORM_STREAM = 5  # the tensors a drafter adds to the plain draft's: drawn apart, so the shared ones stay equal


def build_draft(
    w: Any,
    cfg: TinyConfig,
    seed: int,
    *,
    mrope: bool = False,
    swa: int | None = None,
    form: Drafter = DFLASH,
    image_rows: bool = False,
    vocab: Callable[[Any], None] | None = None,
) -> None:
    """``vocab`` writes the tokenizer keys (default: the tiny models' ``test`` vocabulary); a draft's
    vocabulary must be its target's."""
    cfg.validate()
    w.add_name(f"pyllama-dflash tiny {form.name} draft")
    add_text_hparams(w, cfg, cfg.draft_n_layer)
    if mrope:
        w.add_rope_dimension_sections([cfg.head_dim // 2, 0, 0, 0])
    if swa is not None:
        if swa <= 0:
            raise ValueError("swa must be a positive window size")
        w.add_sliding_window(swa)
        w.add_sliding_window_pattern([True] * cfg.draft_n_layer)
    w.add_target_layers(list(cfg.target_layer_ids))
    w.add_block_size(cfg.block_size)
    w.add_causal_attention(form.causal)
    _add_form_keys(w, form, image_rows)
    if vocab is None:
        add_test_vocab(w, cfg, chat_template=False)
    else:
        vocab(w)

    rng = Weights(seed, STREAM)
    E, F = cfg.n_embd, cfg.n_ff

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(name, rng.ggml(ne, std))

    t("fc.weight", (E * len(cfg.target_layer_ids), E))
    w.add_tensor("enc.output_norm.weight", rng.norm(E))
    w.add_tensor("output_norm.weight", rng.norm(E))
    q_dim = cfg.n_head * cfg.head_dim
    kv_dim = cfg.n_head_kv * cfg.head_dim
    for il in range(cfg.draft_n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", rng.norm(E))
        t(p + "attn_q.weight", (E, q_dim))
        t(p + "attn_k.weight", (E, kv_dim))
        t(p + "attn_v.weight", (E, kv_dim))
        t(p + "attn_output.weight", (q_dim, E))
        w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
        w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
        w.add_tensor(p + "ffn_norm.weight", rng.norm(E))
        t(p + "ffn_gate.weight", (E, F))
        t(p + "ffn_up.weight", (E, F))
        t(p + "ffn_down.weight", (F, E))
    _add_form_tensors(w, cfg, seed, form)


def _add_form_keys(w: Any, form: Drafter, image_rows: bool) -> None:
    """The keys a drafter adds to the plain draft's, and the image-rows key where asked."""
    if image_rows:
        w.add_bool(IMAGE_ROWS_KEY, True)
    if form.selector:
        w.add_conv_kernel_size(CONV_KERNEL)
        w.add_conv_group_size(CONV_GROUP)
        w.add_selector_rank(SELECTOR_RANK)
        w.add_selector_top_k(SELECTOR_TOP_K)
    if form.markov:
        if form.sample_from_anchor is not None:
            w.add_sample_from_anchor(form.sample_from_anchor)
        w.add_has_confidence_head(form.confidence)


def _add_form_tensors(w: Any, cfg: TinyConfig, seed: int, form: Drafter) -> None:
    """The tensors src/models/dflash.cpp loads for a drafter beyond the plain draft's (shapes in ne order)."""
    rng = Weights(seed, FORM_STREAM)
    E, V = cfg.n_embd, cfg.n_vocab

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(name, rng.ggml(ne, std))

    if form.selector:
        if E < SELECTOR_TOP_K * (SELECTOR_TOP_K + 1) or E % CONV_GROUP:
            raise ValueError(f"n_embd {E} cannot hold the DFlash2 lattice or conv groups")
        t("selector_predecessor.weight", (SELECTOR_RANK, V), 0.5)
        t("selector_successor.weight", (SELECTOR_RANK, V), 0.5)
        t("selector_hidden.weight", (E, SELECTOR_RANK))
        projected = 2 * CONV_KERNEL * (E // CONV_GROUP)
        for il in range(cfg.draft_n_layer):
            for part in ("attn", "ffn"):
                # the conv's static taps near identity (tap 0 = 1), so the block keeps its scale
                base = rng.normal((2, CONV_KERNEL, E), 0.05)
                base[:, 0, :] += 1.0
                w.add_tensor(f"blk.{il}.{part}_conv_base", base)
                t(f"blk.{il}.{part}_conv_proj.weight", (E, projected), 0.05)
    if form.markov:
        n_out = form.vocab_draft or V
        t("markov_w1.weight", (MARKOV_RANK, V), 0.5)
        t("markov_w2.weight", (MARKOV_RANK, n_out), 0.5)
        if form.confidence:
            t("conf_proj.weight", (E + MARKOV_RANK, 1), 0.3)
            w.add_tensor("conf_proj.bias", np.zeros(1, dtype=np.float32))
    if form.vocab_draft is not None:
        if not 0 < form.vocab_draft < V:
            raise ValueError(f"a reduced draft vocabulary needs 0 < {form.vocab_draft} < n_vocab {V}")
        # absolute target ids, distinct (the converter checks both): the special tokens, then a seeded
        # choice of the others
        n_special = len(SPECIALS)
        rest = rng.rng.choice(np.arange(n_special, V, dtype=np.int64), form.vocab_draft - n_special, replace=False)
        w.add_tensor("d2t", np.concatenate([np.arange(n_special, dtype=np.int64), np.sort(rest)]))
        t("output.weight", (E, form.vocab_draft), cfg.out_std)


class _Trained:
    """A GGUF writer whose tensors named in ``trained`` are those arrays instead of the drawn ones
    (same name, shape and type), so a trained draft keeps the generator's keys and layout."""

    def __init__(self, writer: Any, trained: Mapping[str, np.ndarray]) -> None:
        self._writer, self._trained, self.used = writer, trained, set()

    def add_tensor(self, name: str, array: np.ndarray, *args: Any, **kwargs: Any) -> None:
        if name in self._trained:
            new = np.ascontiguousarray(self._trained[name])
            if new.shape != array.shape or new.dtype != array.dtype:
                raise ValueError(f"trained {name}: {new.dtype} {new.shape}, the draft's is {array.dtype} {array.shape}")
            array = new
            self.used.add(name)
        self._writer.add_tensor(name, array, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def _digest(trained: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(trained):
        h.update(name.encode())
        h.update(np.ascontiguousarray(trained[name]).tobytes())
    return h.hexdigest()


def write_draft(
    path: Path,
    cfg: TinyConfig | None = None,
    *,
    seed: int = 0,
    mrope: bool = False,
    swa: int | None = None,
    form: Drafter = DFLASH,
    gguf: Any = None,
    trained: Mapping[str, np.ndarray] | None = None,
    image_rows: bool = False,
    vocab: tuple[str, Callable[[Any], None]] | None = None,
) -> bool:
    """Write the draft GGUF; returns False if an up-to-date file was already there. ``trained``
    replaces the drawn tensors of those names (every one must exist in the draft); ``image_rows``
    marks the draft as trained with image rows (IMAGE_ROWS_KEY); ``vocab`` is ``(name, writer)`` of a
    vocabulary other than the ``test`` one (the name goes into the fingerprint)."""
    cfg = cfg or TinyConfig()
    extra = {"trained": _digest(trained)} if trained else {}
    if image_rows:
        extra["image_rows"] = True
    if vocab is not None:
        extra["vocab"] = vocab[0]
    fp = fingerprint("draft", cfg, seed, mrope=mrope, swa=swa, **form.options(), **extra)

    def build(w: Any, g: Any) -> None:
        sub = _Trained(w, trained or {})
        build_draft(
            sub, cfg, seed, mrope=mrope, swa=swa, form=form, image_rows=image_rows, vocab=vocab[1] if vocab else None
        )
        unknown = set(trained or {}) - sub.used
        if unknown:
            raise ValueError(f"trained tensors the draft does not have: {', '.join(sorted(unknown))}")

    return write_gguf(path, ARCH, fp, build, gguf)
