"""Tiny `dflash` draft matching the tiny target.

By default it has no `rope.dimension_sections`, like published DFlash GGUFs: the
draft is then NEOX and its memory demands consecutive positions (Y = X + 1),
which is what the image hole breaks. `mrope=True` adds degenerate sections
[head_dim/2, 0, 0, 0]: the draft turns M-RoPE and accepts forward jumps (the
control case). `swa=N` adds b11434's optional interleaved sliding window
(`dflash.attention.sliding_window` + `dflash.attention.sliding_window_pattern`,
one bool per draft layer, all True here).

No token_embd/output: the draft borrows them from the target via `ctx_other`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "dflash"
STREAM = 2


def build_draft(w: Any, cfg: TinyConfig, seed: int, *, mrope: bool = False, swa: int | None = None) -> None:
    cfg.validate()
    w.add_name("pyllama-dflash tiny dflash draft")
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
    w.add_causal_attention(False)
    add_test_vocab(w, cfg, chat_template=False)

    rng = Weights(seed, STREAM)
    E, F = cfg.n_embd, cfg.n_ff

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(name, rng.normal(tuple(reversed(ne)), std))

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


def write_draft(
    path: Path,
    cfg: TinyConfig | None = None,
    *,
    seed: int = 0,
    mrope: bool = False,
    swa: int | None = None,
    gguf: Any = None,
) -> bool:
    """Write the draft GGUF; returns False if an up-to-date file was already there."""
    cfg = cfg or TinyConfig()
    fp = fingerprint("draft", cfg, seed, mrope=mrope, swa=swa)
    return write_gguf(path, ARCH, fp, lambda w, g: build_draft(w, cfg, seed, mrope=mrope, swa=swa), gguf)
