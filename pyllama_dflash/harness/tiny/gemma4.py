"""A tiny Gemma 4 target and its assistant: the one MTP drafter that shares the target's memory.

libcommon's MTP driver takes a Gemma 4 assistant (arch ``gemma4-assistant``) as a head whose context reads
the target's KV cache (``ctx_other``): it decodes no catch-up rows and drafts from the target's hidden
state of the last row (``is_mem_shared`` in common/speculative.cpp). No other tiny model here does that.

Shapes follow b11434's loaders (src/models/gemma4.cpp, src/models/gemma4-assistant.cpp):
- both models need an SWA layer, and the assistant's layers share the target's last two: an SWA layer
  shares the target's second to last, a full one its last (src/llama-model.cpp), so the target's layers
  are [SWA, full] and the assistant's too;
- the assistant reads the shared keys and values with its own head count and sizes: they equal the target's;
- the assistant's width must differ from the target's (``embedding_length_out`` carries the target's),
  and every one of its layers is a NextN layer;
- Gemma 4 is NEOX: an image's rows take one position each, as text does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ._gguf import gguf_module
from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

TARGET_ARCH, ASSISTANT_ARCH = "gemma4", "gemma4-assistant"
TARGET_FILE, ASSISTANT_FILE = "tiny-gemma4.gguf", "tiny-gemma4-assistant.gguf"
TARGET_STREAM, ASSISTANT_STREAM = 11, 12  # rng streams of their own: no other file's weights move
SWA_PATTERN = [True, False]  # layer 0 sliding-window, layer 1 full: what the assistant's sharing needs
N_SWA = 16
ASSISTANT_N_EMBD = 32  # its own width; its rows in and out are the target's (embedding_length_out)


def _shared_hparams(w: Any, cfg: TinyConfig, n_embd: int, n_ff: int) -> None:
    add_text_hparams(w, cfg, len(SWA_PATTERN), n_embd=n_embd, n_ff=n_ff)
    w.add_key_length_swa(cfg.head_dim)
    w.add_value_length_swa(cfg.head_dim)
    w.add_sliding_window(N_SWA)
    w.add_sliding_window_pattern(SWA_PATTERN)


def _attention_and_ffn(w: Any, rng: Weights, cfg: TinyConfig, il: int, n_embd: int, n_ff: int, *, kv: bool) -> None:
    """One layer's tensors in the order both loaders create them; ``kv``: its own keys and values (the
    assistant has none: it reads the target's)."""
    p, q_dim, std = f"blk.{il}.", cfg.n_head * cfg.head_dim, cfg.w_std
    w.add_tensor(p + "attn_norm.weight", rng.norm(n_embd))
    w.add_tensor(p + "attn_q.weight", rng.ggml((n_embd, q_dim), std))
    if kv:
        w.add_tensor(p + "attn_k.weight", rng.ggml((n_embd, cfg.n_head_kv * cfg.head_dim), std))
        w.add_tensor(p + "attn_v.weight", rng.ggml((n_embd, cfg.n_head_kv * cfg.head_dim), std))
    w.add_tensor(p + "attn_output.weight", rng.ggml((q_dim, n_embd), std))
    w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
    if kv:
        w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
    w.add_tensor(p + "post_attention_norm.weight", rng.norm(n_embd))
    w.add_tensor(p + "layer_output_scale.weight", rng.norm(1))
    w.add_tensor(p + "ffn_norm.weight", rng.norm(n_embd))
    w.add_tensor(p + "ffn_gate.weight", rng.ggml((n_embd, n_ff), std))
    w.add_tensor(p + "ffn_up.weight", rng.ggml((n_embd, n_ff), std))
    w.add_tensor(p + "ffn_down.weight", rng.ggml((n_ff, n_embd), std))
    w.add_tensor(p + "post_ffw_norm.weight", rng.norm(n_embd))


def _rope_freqs(w: Any, cfg: TinyConfig) -> None:
    w.add_tensor("rope_freqs.weight", np.ones(cfg.head_dim // 2, np.float32))  # plain rope on the full layer


def build_target(w: Any, cfg: TinyConfig, seed: int) -> None:
    w.add_name("pyllama-dflash tiny Gemma 4 target")
    _shared_hparams(w, cfg, cfg.n_embd, cfg.n_ff)
    w.add_embedding_length_per_layer_input(0)  # no per-layer embeddings
    add_test_vocab(w, cfg, chat_template=True)
    rng, E = Weights(seed, TARGET_STREAM), cfg.n_embd
    w.add_tensor("token_embd.weight", rng.ggml((E, cfg.n_vocab), cfg.embd_std))
    # an output head of its own, with zero rows for the end-of-generation tokens (as the Qwen3.5 target's)
    out = rng.normal((cfg.n_vocab, E), cfg.out_std)
    out[list(cfg.eog_ids)] = 0.0
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", rng.norm(E))
    _rope_freqs(w, cfg)
    for il in range(len(SWA_PATTERN)):
        _attention_and_ffn(w, rng, cfg, il, E, cfg.n_ff, kv=True)


def build_assistant(w: Any, cfg: TinyConfig, seed: int) -> None:
    w.add_name("pyllama-dflash tiny Gemma 4 assistant")
    A, n_ff = ASSISTANT_N_EMBD, cfg.n_ff // 2
    _shared_hparams(w, cfg, A, n_ff)
    w.add_embedding_length_out(cfg.n_embd)
    w.add_nextn_predict_layers(len(SWA_PATTERN))
    add_test_vocab(w, cfg, chat_template=False)
    rng = Weights(seed, ASSISTANT_STREAM)
    w.add_tensor("token_embd.weight", rng.ggml((A, cfg.n_vocab), cfg.embd_std))  # also its output head
    w.add_tensor("output_norm.weight", rng.norm(A))
    w.add_tensor("nextn.post_projection.weight", rng.ggml((A, cfg.n_embd), cfg.w_std))
    w.add_tensor("nextn.pre_projection.weight", rng.ggml((2 * cfg.n_embd, A), cfg.w_std))
    _rope_freqs(w, cfg)
    for il in range(len(SWA_PATTERN)):
        _attention_and_ffn(w, rng, cfg, il, A, n_ff, kv=False)


def write_pair(out_dir: Path, cfg: TinyConfig | None = None, *, seed: int = 0, gguf: Any = None) -> tuple[Path, Path]:
    """Write (or reuse, by fingerprint) the target and its assistant in ``out_dir``; their paths."""
    cfg, g = cfg or TinyConfig(), gguf if gguf is not None else gguf_module()
    target, assistant = Path(out_dir) / TARGET_FILE, Path(out_dir) / ASSISTANT_FILE
    write_gguf(
        target,
        TARGET_ARCH,
        fingerprint("gemma4", cfg, seed, swa=SWA_PATTERN, window=N_SWA, assistant_n_embd=ASSISTANT_N_EMBD),
        lambda w, _: build_target(w, cfg, seed),
        g,
    )
    write_gguf(
        assistant,
        ASSISTANT_ARCH,
        fingerprint("gemma4-assistant", cfg, seed, swa=SWA_PATTERN, window=N_SWA, assistant_n_embd=ASSISTANT_N_EMBD),
        lambda w, _: build_assistant(w, cfg, seed),
        g,
    )
    return target, assistant
