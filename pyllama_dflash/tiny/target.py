"""Tiny `qwen35` target: IMROPE text model, blk.0 gated-delta-net, blk.1 attention.

qwen35 because its graph fills the per-layer input tensors that DFlash extracts
(qwen2vl aborts with "layer input tensor is null"), and it needs at least one
recurrent layer or the hybrid memory asserts on the first decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "qwen35"
STREAM = 1  # rng stream id of this file kind


def build_target(w: Any, cfg: TinyConfig, seed: int) -> None:
    cfg.validate()
    w.add_name("pyllama-dflash tiny target")
    add_text_hparams(w, cfg, cfg.n_layer)
    w.add_rope_dimension_sections(list(cfg.rope_sections))  # IMROPE: 4 position rows per token
    w.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    w.add_ssm_inner_size(cfg.ssm_inner_size)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_time_step_rank(cfg.ssm_time_step_rank)
    w.add_ssm_group_count(cfg.ssm_group_count)
    w.add_full_attention_interval(cfg.full_attention_interval)
    add_test_vocab(w, cfg, chat_template=True)

    rng = Weights(seed, STREAM)
    E, F = cfg.n_embd, cfg.n_ff

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        # ggml ne order is the reverse of numpy's shape
        w.add_tensor(name, rng.normal(tuple(reversed(ne)), std))

    t("token_embd.weight", (E, cfg.n_vocab), cfg.embd_std)
    # Own output head: a head tied to token_embd makes the model copy its last
    # token forever. Zero rows give the EOG tokens logit 0, below the max of ~120
    # random logits, so greedy decoding never stops early.
    out = rng.normal((cfg.n_vocab, E), cfg.out_std)
    out[list(cfg.eog_ids)] = 0.0
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", rng.norm(E))

    key_dim = cfg.ssm_state_size * cfg.ssm_group_count
    val_dim = cfg.ssm_state_size * cfg.ssm_time_step_rank
    conv_dim = 2 * key_dim + val_dim
    q_dim = cfg.n_head * cfg.head_dim
    kv_dim = cfg.n_head_kv * cfg.head_dim
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", rng.norm(E))
        w.add_tensor(p + "post_attention_norm.weight", rng.norm(E))
        recurrent = (il + 1) % cfg.full_attention_interval != 0
        if recurrent:
            t(p + "attn_qkv.weight", (E, conv_dim))
            t(p + "attn_gate.weight", (E, val_dim))
            t(p + "ssm_conv1d.weight", (cfg.ssm_conv_kernel, conv_dim), 0.3)
            t(p + "ssm_dt.bias", (cfg.ssm_time_step_rank,), 0.1)
            # A must be negative (decay); stored as is, not as A_log
            w.add_tensor(p + "ssm_a", -rng.uniform((cfg.ssm_time_step_rank,), 0.5, 1.5))
            t(p + "ssm_beta.weight", (E, cfg.ssm_time_step_rank))
            t(p + "ssm_alpha.weight", (E, cfg.ssm_time_step_rank))
            w.add_tensor(p + "ssm_norm.weight", rng.norm(cfg.ssm_state_size))
            t(p + "ssm_out.weight", (val_dim, E))
        else:
            t(p + "attn_q.weight", (E, 2 * q_dim))  # query and output gate interleaved
            t(p + "attn_k.weight", (E, kv_dim))
            t(p + "attn_v.weight", (E, kv_dim))
            t(p + "attn_output.weight", (q_dim, E))
            w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
            w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
        t(p + "ffn_gate.weight", (E, F))
        t(p + "ffn_up.weight", (E, F))
        t(p + "ffn_down.weight", (F, E))


def write_target(path: Path, cfg: TinyConfig | None = None, *, seed: int = 0, gguf: Any = None) -> bool:
    """Write the target GGUF; returns False if an up-to-date file was already there."""
    cfg = cfg or TinyConfig()
    fp = fingerprint("target", cfg, seed)
    return write_gguf(path, ARCH, fp, lambda w, g: build_target(w, cfg, seed), gguf)


__all__ = ["ARCH", "build_target", "write_target"]
