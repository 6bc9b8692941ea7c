"""The trained target's tensors: drawn to start training, written to a qwen35 GGUF, read back.

Arrays are in numpy order (ggml's ``ne`` reversed) under their GGUF names. The gated-delta-net
layers get small random mixer tensors and an all-zero ``ssm_out``: llama.cpp computes and streams
them, and they add exactly nothing (config.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ...harness.tiny._gguf import gguf_module
from ...harness.tiny._write import add_text_hparams, write_gguf
from .config import CoreConfig
from .vocab import VOCAB

ARCH = "qwen35"
CORE_KEY = "pyllama_dflash.vlm.core"  # the CoreConfig the file was written from, as JSON


def trained_names(cfg: CoreConfig) -> list[str]:
    """The tensors training changes, in a fixed order."""
    names = ["token_embd.weight", "output.weight", "output_norm.weight"]
    for il in range(cfg.n_layer):
        pre = f"blk.{il}."
        names += [pre + "post_attention_norm.weight", pre + "ffn_gate.weight", pre + "ffn_up.weight"]
        names += [pre + "ffn_down.weight"]
        if cfg.is_attention(il):
            names += [pre + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight")]
            names += [pre + n for n in ("attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight")]
    return names


def init_params(cfg: CoreConfig, seed: int) -> dict[str, np.ndarray]:
    cfg.validate()
    rng = np.random.default_rng([seed, 59])
    E, F, V, d = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.head_dim
    H, Hkv = cfg.n_head, cfg.n_head_kv

    def normal(*shape: int, fan_in: int | None = None, scale: float = 1.0) -> np.ndarray:
        std = scale / np.sqrt(fan_in if fan_in is not None else shape[-1])
        return (rng.standard_normal(shape) * std).astype(np.float32)

    out_scale = 1.0 / np.sqrt(2 * cfg.n_layer)  # residual branches start small, so depth stays stable
    p = {
        "token_embd.weight": normal(V, E, fan_in=1),
        "output.weight": normal(V, E),
        "output_norm.weight": np.ones(E, np.float32),
    }
    for il in range(cfg.n_layer):
        pre = f"blk.{il}."
        p[pre + "post_attention_norm.weight"] = np.ones(E, np.float32)
        p[pre + "ffn_gate.weight"] = normal(F, E)
        p[pre + "ffn_up.weight"] = normal(F, E)
        p[pre + "ffn_down.weight"] = normal(E, F, scale=out_scale)
        if cfg.is_attention(il):
            p[pre + "attn_norm.weight"] = np.ones(E, np.float32)
            p[pre + "attn_q.weight"] = normal(2 * H * d, E)
            p[pre + "attn_k.weight"] = normal(Hkv * d, E)
            p[pre + "attn_v.weight"] = normal(Hkv * d, E)
            p[pre + "attn_output.weight"] = normal(E, H * d, scale=out_scale)
            p[pre + "attn_q_norm.weight"] = np.ones(d, np.float32)
            p[pre + "attn_k_norm.weight"] = np.ones(d, np.float32)
    return p


def identity_mixer(cfg: CoreConfig, il: int) -> dict[str, np.ndarray]:
    """A gated-delta-net mixer whose output is exactly zero: finite small weights, ``ssm_out`` zero."""
    rng = np.random.default_rng([il, 60])
    E = cfg.n_embd
    key_dim = cfg.ssm_state_size * cfg.ssm_group_count
    val_dim = cfg.ssm_state_size * cfg.ssm_time_step_rank
    conv_dim = 2 * key_dim + val_dim
    R = cfg.ssm_time_step_rank

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    pre = f"blk.{il}."
    return {
        pre + "attn_norm.weight": np.ones(E, np.float32),
        pre + "attn_qkv.weight": small(conv_dim, E),
        pre + "attn_gate.weight": small(val_dim, E),
        pre + "ssm_conv1d.weight": small(conv_dim, cfg.ssm_conv_kernel),
        pre + "ssm_dt.bias": small(R),
        pre + "ssm_a": -np.ones(R, np.float32),
        pre + "ssm_beta.weight": small(R, E),
        pre + "ssm_alpha.weight": small(R, E),
        pre + "ssm_norm.weight": np.ones(cfg.ssm_state_size, np.float32),
        pre + "ssm_out.weight": np.zeros((E, val_dim), np.float32),
    }


def params_digest(params: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(params[name], dtype=np.float32).tobytes())
    return h.hexdigest()


def write_target(path: Path, cfg: CoreConfig, params: dict[str, np.ndarray], *, name: str) -> bool:
    """Write the qwen35 GGUF of ``params`` (the trained tensors) at ``path``, atomically."""
    import json

    missing = sorted(set(trained_names(cfg)) - set(params))
    if missing:
        raise ValueError(f"params lack {len(missing)} tensor(s), first {missing[0]}")

    def build(w: Any, _g: Any) -> None:
        w.add_name(name)
        add_text_hparams(w, cfg, cfg.n_layer)  # the size keys, as the tiny generators write them
        w.add_rope_dimension_sections(list(cfg.rope_sections))
        w.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
        w.add_ssm_inner_size(cfg.ssm_state_size * cfg.ssm_time_step_rank)
        w.add_ssm_state_size(cfg.ssm_state_size)
        w.add_ssm_time_step_rank(cfg.ssm_time_step_rank)
        w.add_ssm_group_count(cfg.ssm_group_count)
        w.add_full_attention_interval(cfg.full_attention_interval)
        w.add_string(CORE_KEY, json.dumps(cfg.as_dict()))
        VOCAB.add_to_gguf(w)
        tensors = dict(params)
        for il in range(cfg.n_layer):
            if not cfg.is_attention(il):
                tensors.update(identity_mixer(cfg, il))
        for tensor_name in sorted(tensors, key=_gguf_order):
            w.add_tensor(tensor_name, np.ascontiguousarray(tensors[tensor_name], dtype=np.float32))

    return write_gguf(Path(path), ARCH, params_digest(params) + json.dumps(cfg.as_dict()), build)


def _gguf_order(name: str) -> tuple[int, str]:
    if name.startswith("blk."):
        return (int(name.split(".")[1]) + 1, name)
    return (0, name)


def read_target(path: Path) -> tuple[CoreConfig, dict[str, np.ndarray]]:
    """The config and every tensor of a target this module wrote."""
    import json

    reader = gguf_module().GGUFReader(Path(path))
    field = reader.get_field(CORE_KEY)
    if field is None:
        raise ValueError(f"{path}: not a trained vlm target (no {CORE_KEY} key)")
    raw = json.loads(str(field.contents()))
    raw["rope_sections"] = tuple(raw["rope_sections"])
    cfg = CoreConfig(**raw)
    params = {
        t.name: np.array(t.data, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors
    }
    return cfg, params
