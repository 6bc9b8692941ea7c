"""Tiny `eagle3` draft for the tiny target (``--spec-type draft-eagle3``).

What src/models/eagle3.cpp loads for a one-layer draft over the 2-layer, n_embd-64 target: the keys
``eagle3.target_layers`` (exactly three ids; an id equal to the target's layer count means its final
hidden state) and ``eagle3.target_hidden_size`` (the target's n_embd), and the tensors ``fc`` over the
three extracted rows, one decoder layer whose attention reads [token embedding; fused features]
(``attn_q/k/v`` of width 2 n_embd, ``attn_norm_2`` for the features) and ``output_norm``. No token
embeddings or output head: they come from the target through ``ctx_other``. EAGLE3's rope is always
the plain one (llama-model.cpp lists eagle3 with LLAMA_ROPE_TYPE_NORM and eagle3.cpp never reads
``rope.dimension_sections``); ``mrope`` writes the key anyway, as b11434's converter does for a draft whose
own config has ``mrope_section``, to measure that b11434 ignores it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "eagle3"
STREAM = 8
FILENAME = "tiny-eagle3.gguf"


def target_layers(cfg: TinyConfig) -> list[int]:
    """The three rows EAGLE3 reads: the inputs of the target's two layers and its final hidden state."""
    return [0, 1, cfg.n_layer]


def build_eagle3(w: Any, cfg: TinyConfig, seed: int, mrope: bool = False) -> None:
    cfg.validate()
    w.add_name("pyllama-dflash tiny eagle3 draft")
    add_text_hparams(w, cfg, 1)
    if mrope:
        w.add_rope_dimension_sections([cfg.head_dim // 2, 0, 0, 0])
    w.add_target_layers(target_layers(cfg))
    w.add_target_hidden_size(cfg.n_embd)
    add_test_vocab(w, cfg, chat_template=False)

    rng = Weights(seed, STREAM)
    E, F = cfg.n_embd, cfg.n_ff
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(name, rng.ggml(ne, std))

    t("fc.weight", (3 * E, E))
    w.add_tensor("output_norm.weight", rng.norm(E))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", rng.norm(E))
    w.add_tensor(p + "attn_norm_2.weight", rng.norm(E))
    t(p + "attn_q.weight", (2 * E, q_dim))
    t(p + "attn_k.weight", (2 * E, kv_dim))
    t(p + "attn_v.weight", (2 * E, kv_dim))
    t(p + "attn_output.weight", (q_dim, E))
    w.add_tensor(p + "ffn_norm.weight", rng.norm(E))
    t(p + "ffn_gate.weight", (E, F))
    t(p + "ffn_up.weight", (E, F))
    t(p + "ffn_down.weight", (F, E))


def write_eagle3(
    path: Path, cfg: TinyConfig | None = None, *, seed: int = 0, gguf: Any = None, mrope: bool = False
) -> bool:
    """Write the EAGLE3 draft (``mrope``: with ``rope.dimension_sections``); returns False if an up-to-date
    file was already there."""
    cfg = cfg or TinyConfig()
    fp = fingerprint("eagle3", cfg, seed, **({"mrope": True} if mrope else {}))
    return write_gguf(path, ARCH, fp, lambda w, g: build_eagle3(w, cfg, seed, mrope), gguf)
