"""Tiny `clip` projector of type `qwen2vl_merger` feeding the tiny target.

mtmd resizes an image to multiples of 28 px (patch 14 x merge 2) within
[8, 4096] output tokens; each 28x28 cell becomes one token of n_embd floats,
which the M-RoPE target places on a (temporal, y, x) grid. Load it with warmup
off (llama-server `--no-warmup`, mtmd_context_params.warmup = false), or mtmd
warms up on a 1288x1288 image.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ._write import Weights, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "clip"
PROJECTOR = "qwen2vl_merger"
STREAM = 3
MERGE = 2  # qwen2vl spatial merge (2x2 patches -> one token)


def build_mmproj(w: Any, cfg: TinyConfig, seed: int, projection_dim: int | None = None) -> None:
    """``projection_dim`` wider than ``cfg.n_embd`` gives the same projector with zero output columns
    after its own: the rows a target embedded in a wider stream reads."""
    cfg.validate()
    out_dim = projection_dim or cfg.n_embd
    V, P = cfg.v_n_embd, cfg.v_patch_size
    w.add_name("pyllama-dflash tiny qwen2vl projector")
    w.add_clip_projector_type(PROJECTOR)
    w.add_clip_has_vision_encoder(True)
    w.add_vision_use_gelu(True)
    w.add_vision_embedding_length(V)
    w.add_vision_head_count(cfg.v_n_head)
    w.add_vision_feed_forward_length(cfg.v_n_ff)
    w.add_vision_block_count(cfg.v_n_layer)
    w.add_vision_attention_layernorm_eps(cfg.v_eps)
    w.add_vision_projection_dim(out_dim)  # must equal the target's n_embd
    w.add_vision_image_size(cfg.v_image_size)
    w.add_vision_patch_size(P)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])

    rng = Weights(seed, STREAM)

    def t(name: str, ne: tuple[int, ...], std: float = 0.08, dtype: Any = np.float32) -> None:
        w.add_tensor(name, rng.ggml(ne, std, dtype))

    # two conv kernels (the temporal pair of qwen2vl's 3D patch embedding), F16 as ggml's conv wants
    t("v.patch_embd.weight", (P, P, 3, V), 0.02, np.float16)
    t("v.patch_embd.weight.1", (P, P, 3, V), 0.02, np.float16)
    for il in range(cfg.v_n_layer):
        p = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(p + name + ".weight", (V, V))
            t(p + name + ".bias", (V,), 0.02)  # qwen2vl's graph adds these biases unconditionally
        for name in ("ln1", "ln2"):
            w.add_tensor(p + name + ".weight", rng.norm(V))
            t(p + name + ".bias", (V,), 0.02)
        # n_ff != n_embd so the loader's legacy up/down swap check cannot fire
        t(p + "ffn_up.weight", (V, cfg.v_n_ff))
        t(p + "ffn_up.bias", (cfg.v_n_ff,), 0.02)
        t(p + "ffn_down.weight", (cfg.v_n_ff, V))
        t(p + "ffn_down.bias", (V,), 0.02)
    w.add_tensor("v.post_ln.weight", rng.norm(V))
    t("v.post_ln.bias", (V,), 0.02)
    M = V * MERGE * MERGE
    t("mm.0.weight", (M, M))
    t("mm.0.bias", (M,), 0.02)
    widen = lambda a: np.pad(a, [(0, out_dim - cfg.n_embd)] + [(0, 0)] * (a.ndim - 1))
    w.add_tensor("mm.2.weight", widen(rng.ggml((M, cfg.n_embd), 0.08)))
    w.add_tensor("mm.2.bias", widen(rng.ggml((cfg.n_embd,), 0.02)))


def write_mmproj(
    path: Path, cfg: TinyConfig | None = None, *, seed: int = 0, gguf: Any = None, projection_dim: int | None = None
) -> bool:
    """Write the projector GGUF; returns False if an up-to-date file was already there."""
    cfg = cfg or TinyConfig()
    wider = {"projection_dim": projection_dim} if projection_dim and projection_dim != cfg.n_embd else {}
    fp = fingerprint("mmproj", cfg, seed, **wider)
    return write_gguf(path, ARCH, fp, lambda w, g: build_mmproj(w, cfg, seed, projection_dim), gguf)


def image_grid(
    width: int, height: int, cfg: TinyConfig | None = None, min_tokens: int = 8, max_tokens: int = 4096
) -> tuple[int, int]:
    """(nx, ny) token grid mtmd's qwen2vl preprocessor gives a width x height image.

    Mirrors the b11434 resize rule: round each side to a multiple of 28, and
    if the area is below min_tokens cells scale up (ceil), above max scale down (floor).
    C++ does this in float32, so sizes right at a rounding edge may differ by one.
    """
    cfg = cfg or TinyConfig()
    f = cfg.v_patch_size * MERGE
    w_bar = max(f, math.floor(width / f + 0.5) * f)  # C++ std::round: half away from zero
    h_bar = max(f, math.floor(height / f + 0.5) * f)
    min_px, max_px = min_tokens * f * f, max_tokens * f * f
    if w_bar * h_bar > max_px:
        beta = math.sqrt(height * width / max_px)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif w_bar * h_bar < min_px:
        beta = math.sqrt(min_px / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return w_bar // f, h_bar // f
