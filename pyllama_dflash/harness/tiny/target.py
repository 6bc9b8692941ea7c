"""Tiny Qwen3.5 targets: IMROPE text models, blk.0 gated-delta-net, blk.1 attention.

Two kinds: ``dense`` (arch ``qwen35``) and ``moe`` (arch ``qwen35moe``, the kind of
Qwen3.6-35B-A3B: routed experts and a gated shared expert in every layer's FFN). Both graphs
fill the per-layer input tensors that DFlash extracts (qwen2vl aborts with "layer input tensor
is null"), and both need at least one recurrent layer or the hybrid memory asserts on the first
decode. The two share every tensor but the FFN's, drawn from the same stream in the same order,
so the MoE target differs from the dense one where an MoE does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._vocab import add_test_vocab
from ._write import Weights, add_text_hparams, write_gguf
from .config import TinyConfig, fingerprint

ARCH = "qwen35"
ARCHS = {"dense": "qwen35", "moe": "qwen35moe"}
TARGET_KINDS = tuple(ARCHS)
STREAM = 1  # rng stream id of this file kind
MOE_STREAM = 6  # the MoE FFN's tensors: drawn apart, so the shared ones equal the dense target's
MTP_STREAM = 7  # the MTP head's: drawn apart too, so the trunk equals the target without one

# the MoE FFN: 4 experts, 2 routed per token, each a quarter of the dense FFN; a shared expert
N_EXPERT = 4
N_EXPERT_USED = 2


def target_filename(kind: str = "dense", mtp: bool = False) -> str:
    _check_kind(kind)
    return f"tiny-{ARCHS[kind]}{'-mtp' if mtp else ''}.gguf"


def _check_kind(kind: str) -> None:
    if kind not in ARCHS:
        raise ValueError(f"unknown target kind {kind!r} (known: {', '.join(ARCHS)})")


def build_target(w: Any, cfg: TinyConfig, seed: int, kind: str = "dense", mtp: bool = False) -> None:
    cfg.validate()
    _check_kind(kind)
    moe = kind == "moe"
    w.add_name("pyllama-dflash tiny target" + (" (moe)" if moe else "") + (" with an MTP head" if mtp else ""))
    _add_target_hparams(w, cfg, moe, mtp)
    add_test_vocab(w, cfg, chat_template=True)

    rng = Weights(seed, STREAM)
    moe_rng = Weights(seed, MOE_STREAM)
    E = cfg.n_embd
    w.add_tensor("token_embd.weight", rng.ggml((E, cfg.n_vocab), cfg.embd_std))
    # Own output head: a head tied to token_embd makes the model copy its last
    # token forever. Zero rows give the EOG tokens logit 0, below the max of ~120
    # random logits, so greedy decoding never stops early.
    out = rng.normal((cfg.n_vocab, E), cfg.out_std)
    out[list(cfg.eog_ids)] = 0.0
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", rng.norm(E))
    for il in range(cfg.n_layer):
        _add_block(w, rng, moe_rng if moe else None, cfg, il)
    if mtp:
        _add_mtp_block(w, Weights(seed, MTP_STREAM), cfg, f"blk.{cfg.n_layer}.", moe)


def _add_target_hparams(w: Any, cfg: TinyConfig, moe: bool, mtp: bool) -> None:
    # an MTP head is one more block, the last, counted in block_count (nextn_predict_layers of them)
    add_text_hparams(w, cfg, cfg.n_layer + (1 if mtp else 0))
    if mtp:
        w.add_nextn_predict_layers(1)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(cfg.n_ff // N_EXPERT)
        w.add_expert_shared_feed_forward_length(cfg.n_ff // 2)
    w.add_rope_dimension_sections(list(cfg.rope_sections))  # IMROPE: 4 position rows per token
    w.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    w.add_ssm_inner_size(cfg.ssm_inner_size)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_time_step_rank(cfg.ssm_time_step_rank)
    w.add_ssm_group_count(cfg.ssm_group_count)
    w.add_full_attention_interval(cfg.full_attention_interval)


def _add_block(w: Any, rng: Weights, moe_rng: Weights | None, cfg: TinyConfig, il: int) -> None:
    """Layer ``il`` of the trunk: a recurrent (gated delta net) or a full-attention layer, and its FFN
    (the MoE one from ``moe_rng`` when given)."""
    E, F, std = cfg.n_embd, cfg.n_ff, cfg.w_std
    key_dim = cfg.ssm_state_size * cfg.ssm_group_count
    val_dim = cfg.ssm_state_size * cfg.ssm_time_step_rank
    conv_dim = 2 * key_dim + val_dim
    q_dim = cfg.n_head * cfg.head_dim
    kv_dim = cfg.n_head_kv * cfg.head_dim
    p = f"blk.{il}."
    w.add_tensor(p + "attn_norm.weight", rng.norm(E))
    w.add_tensor(p + "post_attention_norm.weight", rng.norm(E))
    recurrent = (il + 1) % cfg.full_attention_interval != 0
    if recurrent:
        w.add_tensor(p + "attn_qkv.weight", rng.ggml((E, conv_dim), std))
        w.add_tensor(p + "attn_gate.weight", rng.ggml((E, val_dim), std))
        w.add_tensor(p + "ssm_conv1d.weight", rng.ggml((cfg.ssm_conv_kernel, conv_dim), 0.3))
        w.add_tensor(p + "ssm_dt.bias", rng.ggml((cfg.ssm_time_step_rank,), 0.1))
        # A must be negative (decay); stored as is, not as A_log
        w.add_tensor(p + "ssm_a", -rng.uniform((cfg.ssm_time_step_rank,), 0.5, 1.5))
        w.add_tensor(p + "ssm_beta.weight", rng.ggml((E, cfg.ssm_time_step_rank), std))
        w.add_tensor(p + "ssm_alpha.weight", rng.ggml((E, cfg.ssm_time_step_rank), std))
        w.add_tensor(p + "ssm_norm.weight", rng.norm(cfg.ssm_state_size))
        w.add_tensor(p + "ssm_out.weight", rng.ggml((val_dim, E), std))
    else:
        w.add_tensor(p + "attn_q.weight", rng.ggml((E, 2 * q_dim), std))  # query and output gate interleaved
        w.add_tensor(p + "attn_k.weight", rng.ggml((E, kv_dim), std))
        w.add_tensor(p + "attn_v.weight", rng.ggml((E, kv_dim), std))
        w.add_tensor(p + "attn_output.weight", rng.ggml((q_dim, E), std))
        w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
        w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
    # the dense FFN is drawn either way, so every later tensor of the MoE target equals the dense one's
    dense_ffn = {
        name: rng.ggml(ne, std) for name, ne in (("ffn_gate", (E, F)), ("ffn_up", (E, F)), ("ffn_down", (F, E)))
    }
    if moe_rng is not None:
        _add_moe_ffn(w, moe_rng, cfg, p)
    else:
        for name, data in dense_ffn.items():
            w.add_tensor(p + name + ".weight", data)


def _add_mtp_block(w: Any, rng: Weights, cfg: TinyConfig, p: str, moe: bool) -> None:
    """Qwen3.5's MTP head (src/models/qwen35.cpp, qwen35moe.cpp): a full-attention block after the
    trunk, with its FFN, and nextn.eh_proj over [enorm(token embedding); hnorm(hidden state)]. The
    optional embed_tokens, shared_head_head and shared_head_norm fall back to the trunk's."""
    E, F = cfg.n_embd, cfg.n_ff
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(p + name, rng.ggml(ne, std))

    w.add_tensor(p + "attn_norm.weight", rng.norm(E))
    w.add_tensor(p + "post_attention_norm.weight", rng.norm(E))
    t("attn_q.weight", (E, 2 * q_dim))
    t("attn_k.weight", (E, kv_dim))
    t("attn_v.weight", (E, kv_dim))
    t("attn_output.weight", (q_dim, E))
    w.add_tensor(p + "attn_q_norm.weight", rng.norm(cfg.head_dim))
    w.add_tensor(p + "attn_k_norm.weight", rng.norm(cfg.head_dim))
    if moe:
        _add_moe_ffn(w, rng, cfg, p)
    else:
        t("ffn_gate.weight", (E, F))
        t("ffn_up.weight", (E, F))
        t("ffn_down.weight", (F, E))
    t("nextn.eh_proj.weight", (2 * E, E))
    w.add_tensor(p + "nextn.enorm.weight", rng.norm(E))
    w.add_tensor(p + "nextn.hnorm.weight", rng.norm(E))


def _add_moe_ffn(w: Any, rng: Weights, cfg: TinyConfig, p: str) -> None:
    """src/models/qwen35moe.cpp's FFN: a router, the routed experts and a gated shared expert."""
    E, F_exp, F_sh = cfg.n_embd, cfg.n_ff // N_EXPERT, cfg.n_ff // 2

    def t(name: str, ne: tuple[int, ...], std: float = cfg.w_std) -> None:
        w.add_tensor(name, rng.ggml(ne, std))

    t(p + "ffn_gate_inp.weight", (E, N_EXPERT), 0.5)  # a router that prefers some experts over others
    t(p + "ffn_gate_exps.weight", (E, F_exp, N_EXPERT))
    t(p + "ffn_up_exps.weight", (E, F_exp, N_EXPERT))
    t(p + "ffn_down_exps.weight", (F_exp, E, N_EXPERT))
    t(p + "ffn_gate_inp_shexp.weight", (E,))
    t(p + "ffn_gate_shexp.weight", (E, F_sh))
    t(p + "ffn_up_shexp.weight", (E, F_sh))
    t(p + "ffn_down_shexp.weight", (F_sh, E))


def write_target(
    path: Path,
    cfg: TinyConfig | None = None,
    *,
    seed: int = 0,
    kind: str = "dense",
    mtp: bool = False,
    gguf: Any = None,
) -> bool:
    """Write the target GGUF (with an MTP head: ``mtp``); returns False if an up-to-date file was already there."""
    cfg = cfg or TinyConfig()
    _check_kind(kind)
    options = ({} if kind == "dense" else {"target_kind": kind}) | ({"mtp": True} if mtp else {})
    fp = fingerprint("target", cfg, seed, **options)
    return write_gguf(path, ARCHS[kind], fp, lambda w, g: build_target(w, cfg, seed, kind, mtp), gguf)


__all__ = ["ARCH", "ARCHS", "TARGET_KINDS", "build_target", "target_filename", "write_target"]
