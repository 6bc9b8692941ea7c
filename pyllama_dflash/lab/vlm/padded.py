"""The padded target: the trained core's function at a size whose decode streams its weights.

Drafting pays where a verify of several tokens costs about what one token costs: a decode that
streams weights far larger than the last-level cache. Three ways to get there without changing the
function, each exact in arithmetic or within a millionth (they add terms that are exactly zero):

- ``wide``: every layer's FFN widened to ``n_ff`` with zero rows in ``ffn_gate``/``ffn_up`` and zero
  columns in ``ffn_down`` (a zero hidden unit is ``silu(0) * 0 = 0``, times a zero column);
- ``deep``: identity layers appended after the core (a gated-delta-net and an attention layer per
  pair, every output projection zero), so the feature layers a draft reads keep their ids;
- ``embedded``: the core in a residual stream four times as wide, its FFNs widened as ``wide`` widens
  them (``pad_embedded``): matrices of a real model's proportions, which the CPU's kernels run nearer
  the memory-bound limit than the core's narrow rows. Its image rows are the core's with zeros after
  them (``widened_rows``), and a draft served with it needs the same width.

llama.cpp reads no value: zeros are streamed and multiplied like any weight.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from pathlib import Path

import numpy as np

from .config import CoreConfig
from .weights import trained_names

PARAM_BYTES = 4  # F32


class PaddingForm(enum.Enum):
    WIDE = "wide"
    DEEP = "deep"
    EMBEDDED = "embedded"


def weight_bytes(cfg: CoreConfig) -> int:
    """The bytes of every tensor llama.cpp streams for one decode (the output head included)."""
    E, F, V, d = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.head_dim
    attn = E * 2 * cfg.n_head * d + 2 * E * cfg.n_head_kv * d + cfg.n_head * d * E
    key_dim = cfg.ssm_state_size * cfg.ssm_group_count
    val_dim = cfg.ssm_state_size * cfg.ssm_time_step_rank
    mixer = E * (2 * key_dim + val_dim) + E * val_dim + val_dim * E + 2 * E * cfg.ssm_time_step_rank
    total = 2 * V * E
    for il in range(cfg.n_layer):
        total += 3 * E * F + (attn if cfg.is_attention(il) else mixer)
    return total * PARAM_BYTES


def pad_wide(cfg: CoreConfig, params: dict[str, np.ndarray], n_ff: int) -> tuple[CoreConfig, dict[str, np.ndarray]]:
    if n_ff < cfg.n_ff:
        raise ValueError(f"n_ff {n_ff} is narrower than the core's {cfg.n_ff}")
    out = dict(params)
    for il in range(cfg.n_layer):
        pre = f"blk.{il}."
        for name in ("ffn_gate.weight", "ffn_up.weight"):
            wide = np.zeros((n_ff, cfg.n_embd), np.float32)
            wide[: cfg.n_ff] = params[pre + name]
            out[pre + name] = wide
        down = np.zeros((cfg.n_embd, n_ff), np.float32)
        down[:, : cfg.n_ff] = params[pre + "ffn_down.weight"]
        out[pre + "ffn_down.weight"] = down
    return replace(cfg, n_ff=n_ff), out


# by a tensor's name after ``blk.N.``: those whose last axis (numpy order) reads the residual stream, and
# those whose first axis writes it
READS_STREAM = (
    *("ffn_gate.weight", "ffn_up.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight"),
    *("token_embd.weight", "output.weight"),  # [vocab, n_embd]: the embeddings and the head read it alike
)
WRITES_STREAM = ("ffn_down.weight", "attn_output.weight")
_NORMS = ("attn_norm.weight", "post_attention_norm.weight", "output_norm.weight")
EMBEDDED_WIDTH = 4  # the embedded form's residual stream, in core widths


def pad_embedded(
    cfg: CoreConfig, params: dict[str, np.ndarray], n_embd: int, n_ff: int
) -> tuple[CoreConfig, dict[str, np.ndarray]]:
    """The core in the first ``cfg.n_embd`` dimensions of a residual stream ``n_embd`` wide, its FFNs
    widened to ``n_ff`` as ``pad_wide`` widens them.

    The added dimensions are read by nothing and written by nothing, so they stay exactly zero. An RMS
    norm over the wider stream divides by ``n_embd`` where the core divides by its own width; its weights
    scaled by ``sqrt(core / n_embd)`` (a power of two: ``n_embd`` is the core's times a power of four) and
    the epsilon by ``core / n_embd`` give the core's norm. The per-head query and key norms share that
    epsilon (one key in the GGUF), so theirs shrinks too: a change of about a millionth of each head's
    scale, which the logits check bounds."""
    ratio, scale = embedding_scale(cfg, n_embd)
    cfg, params = pad_wide(cfg, params, n_ff)
    out = {name: widened(leaf(name), a, n_embd, scale, _NORMS) for name, a in params.items()}
    return replace(cfg, n_embd=n_embd, rms_eps=cfg.rms_eps / ratio), out


def leaf(name: str) -> str:
    """A tensor's name without its layer's ``blk.N.``."""
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def widened(leaf: str, a: np.ndarray, n_embd: int, scale: np.float32, norms: tuple[str, ...]) -> np.ndarray:
    """One tensor in a stream ``n_embd`` wide, by what it does to the stream: a matrix that reads it gets
    zero columns, one that writes it zero rows, a norm over it (``norms``) its weights times ``scale`` with
    zeros after them; the per-head norms stay as they are."""
    if leaf in READS_STREAM:
        return grown(a, 1, n_embd)
    if leaf in WRITES_STREAM:
        return grown(a, 0, n_embd)
    if leaf in norms:
        return grown(a * scale, 0, n_embd)
    return a


def embedding_scale(cfg: CoreConfig, n_embd: int) -> tuple[int, np.float32]:
    """How many core widths ``n_embd`` is, and what a norm's weights over it are multiplied by."""
    ratio = n_embd // cfg.n_embd
    if n_embd % cfg.n_embd or ratio < 4 or ratio & (ratio - 1) or ratio.bit_length() % 2 == 0:
        raise ValueError(f"n_embd {n_embd} must be the core's {cfg.n_embd} times a power of four")
    return ratio, np.float32(1 / 2 ** ((ratio.bit_length() - 1) // 2))


def grown(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``a`` with zeros after its own values along ``axis``, to ``size``."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, size - a.shape[axis])
    return np.pad(a, pad)


def widened_rows(rows: np.ndarray, n_embd: int) -> np.ndarray:
    """An image's rows as the embedded form reads them: the core's, then zeros."""
    return grown(rows, 1, n_embd)


def pad_deep(
    cfg: CoreConfig, params: dict[str, np.ndarray], extra_layers: int
) -> tuple[CoreConfig, dict[str, np.ndarray]]:
    if extra_layers % cfg.full_attention_interval:
        raise ValueError(
            f"extra_layers {extra_layers} must keep the layer pattern: a multiple of {cfg.full_attention_interval}"
        )
    padded = replace(cfg, n_layer=cfg.n_layer + extra_layers)
    out = dict(params)
    for name in trained_names(padded):
        if name not in out:  # an appended layer's tensor: zero, its norms one
            shape = _shape(padded, name)
            out[name] = np.ones(shape, np.float32) if name.endswith("norm.weight") else np.zeros(shape, np.float32)
    return padded, out


def _shape(cfg: CoreConfig, name: str) -> tuple[int, ...]:
    E, F, d = cfg.n_embd, cfg.n_ff, cfg.head_dim
    leaf = name.split(".", 2)[2]
    return {
        "post_attention_norm.weight": (E,),
        "attn_norm.weight": (E,),
        "ffn_gate.weight": (F, E),
        "ffn_up.weight": (F, E),
        "ffn_down.weight": (E, F),
        "attn_q.weight": (2 * cfg.n_head * d, E),
        "attn_k.weight": (cfg.n_head_kv * d, E),
        "attn_v.weight": (cfg.n_head_kv * d, E),
        "attn_output.weight": (E, cfg.n_head * d),
        "attn_q_norm.weight": (d,),
        "attn_k_norm.weight": (d,),
    }[leaf]


def pad_to(
    form: PaddingForm, cfg: CoreConfig, params: dict[str, np.ndarray], min_bytes: int
) -> tuple[CoreConfig, dict[str, np.ndarray]]:
    """The smallest padding of ``form`` whose weights reach ``min_bytes``."""
    if form is PaddingForm.WIDE:
        n_ff = cfg.n_ff
        while weight_bytes(replace(cfg, n_ff=n_ff)) < min_bytes:
            n_ff *= 2
        return pad_wide(cfg, params, n_ff)
    if form is PaddingForm.EMBEDDED:
        n_embd, n_ff = EMBEDDED_WIDTH * cfg.n_embd, cfg.n_ff
        while weight_bytes(replace(cfg, n_embd=n_embd, n_ff=n_ff)) < min_bytes:
            n_ff *= 2
        return pad_embedded(cfg, params, n_embd, n_ff)
    step = cfg.full_attention_interval
    extra = 0
    while weight_bytes(replace(cfg, n_layer=cfg.n_layer + extra)) < min_bytes:
        extra += step
    return pad_deep(cfg, params, extra)


def pad_and_check(core: Path, mmproj: Path, out: Path, form: PaddingForm, min_bytes: int, *, log=print) -> dict:
    """Write the padded target and judge its logits against the core's on a held-out mixed conversation,
    both through llama.cpp. What a verify costs on it is the bench's to measure (``bench --only batch
    --batch-target``)."""
    import time

    from pyllama_dflash.files import sha256_file

    from .corpus import draw_conversation, render
    from .evaluate import llama_logits, nmse
    from .imagerows import encode_images
    from .pipeline import HELD_OUT_IMAGE_SEEDS
    from .prose import topic_paragraphs
    from .weights import read_target, write_target

    started = time.monotonic()
    cfg, params = read_target(core)
    padded_cfg, padded = pad_to(form, cfg, {k: params[k] for k in trained_names(cfg)}, min_bytes)
    write_target(out, padded_cfg, padded, name=f"pyllama-dflash vlm target, padded ({form.value})")
    log(f"wrote {out}: {weight_bytes(padded_cfg) / 2**20:.0f} MiB of weights ({form.value})")
    held = [p for p in topic_paragraphs() if p.held_out]
    conv = draw_conversation("mixed", np.random.default_rng([3, 59]), held, 64, HELD_OUT_IMAGE_SEEDS)
    encoded = encode_images(core, mmproj, [t.image for t in conv if t.image is not None])
    rendered = render(conv, {key[3]: (nx, ny) for key, (_r, nx, ny) in encoded.items()})
    rows_of = {key: r for key, (r, _nx, _ny) in encoded.items()}
    padded_rows = {key: widened_rows(r, padded_cfg.n_embd) for key, r in rows_of.items()}
    err = nmse(llama_logits(out, rendered, padded_rows), llama_logits(core, rendered, rows_of))
    log(f"logits against the core's: NMSE {err:.3g} over {rendered.n} rows")
    return {
        "form": form.value,
        "core": core.name,
        "core_weight_bytes": weight_bytes(cfg),
        "padded": {"file": out.name, "sha256": sha256_file(out), "config": padded_cfg.as_dict()},
        "weight_bytes": weight_bytes(padded_cfg),
        "logits_nmse_against_core": err,
        "rows_compared": rendered.n,
        "seconds": round(time.monotonic() - started, 1),
    }
