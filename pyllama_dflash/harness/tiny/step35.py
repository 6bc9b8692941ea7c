"""A tiny Step 3.5 target with two MTP heads: the one drafter here whose heads chain.

libcommon's MTP driver decodes each of a Step 3.5 model's NextN layers as one head of a chain, one per
drafted token (``chain_heads`` in common/speculative.cpp); the Qwen3.5 targets have one head. Shapes follow
b11434's loader (src/models/step35.cpp): every layer dense, the trunk [SWA, full] (the cache asserts an
SWA layer), the two heads full-attention layers with NextN's three tensors each. Step 3.5 is NEOX: an
image's rows take one position each, as text does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._gguf import gguf_module
from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "step35"
FILE = "tiny-step35-mtp2.gguf"
STREAM = 13  # an rng stream of its own
TRUNK_SWA = [True, False]
N_HEADS = 2  # NextN layers, after the trunk
N_SWA = 16


def build(w: Any, cfg: TinyConfig, seed: int) -> None:
    w.add_name("pyllama-dflash tiny Step 3.5 target with two MTP heads")
    n_trunk, E = len(TRUNK_SWA), cfg.n_embd
    n_all = n_trunk + N_HEADS
    add_text_hparams(w, cfg, n_all)
    w.add_expert_feed_forward_length(cfg.n_ff)  # read even where no layer has experts
    w.add_sliding_window(N_SWA)
    w.add_sliding_window_pattern(TRUNK_SWA + [False] * N_HEADS)
    w.add_nextn_predict_layers(N_HEADS)
    add_test_vocab(w, cfg, chat_template=True)
    rng = Weights(seed, STREAM)
    w.add_tensor("token_embd.weight", rng.ggml((E, cfg.n_vocab), cfg.embd_std))
    w.add_tensor("output_norm.weight", rng.norm(E))
    out = rng.normal((cfg.n_vocab, E), cfg.out_std)
    out[list(cfg.eog_ids)] = 0.0  # as the Qwen3.5 target's: greedy decoding never stops early
    w.add_tensor("output.weight", out)
    for il in range(n_all):
        _block(w, rng, cfg, il)
        if il >= n_trunk:
            p = f"blk.{il}."
            w.add_tensor(p + "nextn.eh_proj.weight", rng.ggml((2 * E, E), cfg.w_std))
            w.add_tensor(p + "nextn.enorm.weight", rng.norm(E))
            w.add_tensor(p + "nextn.hnorm.weight", rng.norm(E))


def _block(w: Any, rng: Weights, cfg: TinyConfig, il: int) -> None:
    p, E, F, std = f"blk.{il}.", cfg.n_embd, cfg.n_ff, cfg.w_std
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    w.add_tensor(p + "attn_norm.weight", rng.norm(E))
    w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
    w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
    w.add_tensor(p + "attn_q.weight", rng.ggml((E, q_dim), std))
    w.add_tensor(p + "attn_k.weight", rng.ggml((E, kv_dim), std))
    w.add_tensor(p + "attn_v.weight", rng.ggml((E, kv_dim), std))
    w.add_tensor(p + "attn_output.weight", rng.ggml((q_dim, E), std))
    w.add_tensor(p + "ffn_norm.weight", rng.norm(E))
    w.add_tensor(p + "ffn_gate.weight", rng.ggml((E, F), std))
    w.add_tensor(p + "ffn_down.weight", rng.ggml((F, E), std))
    w.add_tensor(p + "ffn_up.weight", rng.ggml((E, F), std))


def write(out_dir: Path, cfg: TinyConfig | None = None, *, seed: int = 0, gguf: Any = None) -> Path:
    """Write (or reuse, by fingerprint) the Step 3.5 target in ``out_dir``; its path."""
    cfg, g = cfg or TinyConfig(), gguf if gguf is not None else gguf_module()
    path = Path(out_dir) / FILE
    write_gguf(
        path,
        ARCH,
        fingerprint("step35-mtp2", cfg, seed, trunk_swa=TRUNK_SWA, heads=N_HEADS, window=N_SWA),
        lambda w, _: build(w, cfg, seed),
        g,
    )
    return path
