"""The trained target's forward pass, over an array module ``xp`` (numpy to judge, JAX to train).

What b11434's ``src/models/qwen35.cpp`` computes, for the layers this target has:

- each layer: ``r = x + mixer(rms(x, attn_norm))``, then ``x = r + ffn(rms(r, post_attention_norm))``;
  the FFN is SwiGLU; norms multiply by their stored weight (no ``1 +``);
- a gated-delta-net layer's mixer is zero here (``ssm_out`` is all zero: CoreConfig), so it is left out;
- an attention layer: ``attn_q`` gives per head ``[query, gate]``, q and k are RMS-normed per head,
  rotated by IMROPE (NeoX pairs ``(j, j + n_rot/2)``; pair j turns by the position row its section
  picks: ``j % 3`` of 1, 2, 0 reads y, x, t while ``j`` is under three times that section), attention
  is causal in row order with scale ``1/sqrt(head_dim)``, and its output is gated by ``sigmoid(gate)``;
- the logits: ``rms(x, output_norm) @ output.T``.

Positions come as ``pos [4, n]`` rows (t, y, x, z), as llama.cpp's batches carry them: a text token
at p is ``(p, p, p, 0)``; an image row i of an nx-wide grid starting at P is ``(P, P + i // nx,
P + i % nx, 0)``. Every function takes leading batch axes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import CoreConfig

Params = dict[str, Any]


def rms_norm(xp: Any, x: Any, w: Any, eps: float) -> Any:
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(xp: Any, x: Any) -> Any:
    return x / (1.0 + xp.exp(xp.minimum(-x, 80.0)))  # the cap keeps exp's gradient finite


def imrope_rows(cfg: CoreConfig) -> np.ndarray:
    """Which position row (0 t, 1 y, 2 x, 3 z) turns each rotary pair (ggml's IMROPE sector rule)."""
    s0, s1, s2, _ = cfg.rope_sections
    rows = []
    for j in range(cfg.head_dim // 2):
        if j % 3 == 1 and j < 3 * s1:
            rows.append(1)
        elif j % 3 == 2 and j < 3 * s2:
            rows.append(2)
        elif j % 3 == 0 and j < 3 * s0:
            rows.append(0)
        else:
            rows.append(3)
    return np.array(rows)


def rope_angles(xp: Any, cfg: CoreConfig, pos: Any) -> tuple[Any, Any]:
    """cos and sin ``[..., n, 1, head_dim/2]`` for positions ``pos [..., 4, n]``."""
    half = cfg.head_dim // 2
    inv = (cfg.rope_freq_base ** (-(2.0 * np.arange(half)) / cfg.head_dim)).astype(np.float32)
    picked = xp.take(pos, xp.asarray(imrope_rows(cfg)), axis=-2)  # [..., half, n]
    ang = xp.swapaxes(picked, -1, -2).astype(xp.float32) * inv  # [..., n, half]
    return xp.cos(ang)[..., None, :], xp.sin(ang)[..., None, :]


def _rotate(xp: Any, x: Any, cos: Any, sin: Any) -> Any:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return xp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def attention(xp: Any, p: Params, cfg: CoreConfig, il: int, h: Any, rope: tuple[Any, Any], visible: Any) -> Any:
    """One attention layer's mixer on ``h [..., n, E]``; ``visible [..., n, n]`` says which rows each sees."""
    pre = f"blk.{il}."
    H, Hkv, d = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    qg = (h @ p[pre + "attn_q.weight"].T).reshape(*h.shape[:-1], H, 2, d)
    q, gate = qg[..., 0, :], qg[..., 1, :]
    k = (h @ p[pre + "attn_k.weight"].T).reshape(*h.shape[:-1], Hkv, d)
    v = (h @ p[pre + "attn_v.weight"].T).reshape(*h.shape[:-1], Hkv, d)
    q = _rotate(xp, rms_norm(xp, q, p[pre + "attn_q_norm.weight"], cfg.rms_eps), *rope)
    k = _rotate(xp, rms_norm(xp, k, p[pre + "attn_k_norm.weight"], cfg.rms_eps), *rope)
    rep = H // Hkv  # query head hq reads kv head hq // rep
    k = xp.repeat(k, rep, axis=-2)
    v = xp.repeat(v, rep, axis=-2)
    scores = xp.einsum("...qhd,...khd->...hqk", q, k) / np.float32(np.sqrt(d))
    scores = xp.where(visible[..., None, :, :], scores, np.float32(-1e30))
    scores = scores - xp.max(scores, axis=-1, keepdims=True)
    weights = xp.exp(scores)
    weights = weights / xp.sum(weights, axis=-1, keepdims=True)
    out = xp.einsum("...hqk,...khd->...qhd", weights, v)
    out = out * (1.0 / (1.0 + xp.exp(-gate)))
    return out.reshape(*h.shape[:-1], H * d) @ p[pre + "attn_output.weight"].T


def ffn(xp: Any, p: Params, il: int, u: Any) -> Any:
    pre = f"blk.{il}."
    return (silu(xp, u @ p[pre + "ffn_gate.weight"].T) * (u @ p[pre + "ffn_up.weight"].T)) @ p[
        pre + "ffn_down.weight"
    ].T


def hidden(xp: Any, p: Params, cfg: CoreConfig, x: Any, pos: Any, visible: Any) -> Any:
    """The residual stream after the last layer, before the output norm."""
    rope = rope_angles(xp, cfg, pos)
    for il in range(cfg.n_layer):
        pre = f"blk.{il}."
        if cfg.is_attention(il):
            x = x + attention(xp, p, cfg, il, rms_norm(xp, x, p[pre + "attn_norm.weight"], cfg.rms_eps), rope, visible)
        x = x + ffn(xp, p, il, rms_norm(xp, x, p[pre + "post_attention_norm.weight"], cfg.rms_eps))
    return x


def logits(xp: Any, p: Params, cfg: CoreConfig, x: Any, pos: Any, visible: Any | None = None) -> Any:
    """Logits ``[..., n, n_vocab]`` of input rows ``x [..., n, E]`` at ``pos [..., 4, n]``; causal when
    ``visible`` is None."""
    if visible is None:
        n = x.shape[-2]
        visible = xp.asarray(np.tril(np.ones((n, n), dtype=bool)))
    out = rms_norm(xp, hidden(xp, p, cfg, x, pos, visible), p["output_norm.weight"], cfg.rms_eps)
    return out @ p["output.weight"].T


def text_positions(n: int, start: int = 0) -> np.ndarray:
    p = np.arange(start, start + n)
    return np.stack([p, p, p, np.zeros_like(p)])


def image_positions(nx: int, ny: int, start: int) -> np.ndarray:
    i = np.arange(nx * ny)
    return np.stack([np.full_like(i, start), start + i // nx, start + i % nx, np.zeros_like(i)])
