"""The DFlash draft's forward pass, from its definition, over an array module ``xp``.

The draft has two inputs (the DFlash paper; SpecForge's draft model; b11434's graph in
src/models/dflash.cpp is the authority on the details):

- **context rows**: the target's features of every row before the block (the inputs of the draft's
  target layers, side by side), fused by ``fc`` and a norm, projected to each layer's K and V;
- **the noise block** ``[anchor, mask, ..., mask]`` at the positions after the context, embedded
  with the target's token embeddings, through pre-norm attention layers that see every context row
  and the whole block (bidirectional inside; causal for a draft that says so), then the target's
  output head (or the draft's own, for a reduced vocabulary scattered back through ``d2t``).

Rotary positions are NeoX's; a reconverted draft's degenerate M-RoPE sections ``[n_rot/2, 0, 0, 0]``
with positions ``{p, p, p, 0}`` rotate alike, so one rope serves both. Every function takes leading
batch axes, so training runs many blocks at once with a mask saying which context rows each sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .weights import DraftHparams

Params = dict[str, Any]


def rms_norm(xp: Any, x: Any, w: Any, eps: float) -> Any:
    return x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(xp: Any, x: Any) -> Any:
    # exp(-x) overflows below x = -88.7 in float32: the value is still -0, but its gradient is inf / inf,
    # which makes every weight NaN at the next step; capping the exponent changes no value above -80
    return x / (1.0 + xp.exp(xp.minimum(-x, 80.0)))


def rope(xp: Any, x: Any, pos: Any, base: float) -> Any:
    """NeoX rotary embedding of ``x [..., n, heads, d]`` at ``pos [..., n]``: pair (i, i + d/2)
    turns by ``pos * base^(-2i/d)``."""
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-(2.0 * xp.arange(half, dtype=xp.float32)) / d)
    ang = pos[..., :, None, None].astype(xp.float32) * inv
    cos, sin = xp.cos(ang), xp.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return xp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _heads(x: Any, n_heads: int, head_dim: int) -> Any:
    return x.reshape(*x.shape[:-1], n_heads, head_dim)


def fuse(xp: Any, p: Params, hp: DraftHparams, feats: Any) -> Any:
    """The encoder: target features ``[..., n, n_layers * n_embd]`` to the draft's width."""
    return rms_norm(xp, feats @ p["fc.weight"].T, p["enc.output_norm.weight"], hp.rms_eps)


def context_kv(xp: Any, p: Params, hp: DraftHparams, feats: Any, pos: Any) -> list[tuple[Any, Any]]:
    """Each layer's K (normed, roped) and V of the context rows: what the draft's cache holds."""
    g = fuse(xp, p, hp, feats)
    out = []
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        k = _heads(g @ p[b + "attn_k.weight"].T, hp.n_head_kv, hp.head_dim)
        k = rope(xp, rms_norm(xp, k, p[b + "attn_k_norm.weight"], hp.rms_eps), pos, hp.rope_freq_base)
        v = _heads(g @ p[b + "attn_v.weight"].T, hp.n_head_kv, hp.head_dim)
        out.append((k, v))
    return out


def _attend(xp: Any, hp: DraftHparams, q: Any, kv: list[tuple[Any, Any, Any]]) -> Any:
    """Softmax attention of ``q [..., B, H, d]`` over several parts of keys and values at once, each
    ``(k [..., n, Hkv, d], v, visible [..., B, n])``: one softmax over all their rows. A part's leading
    axes need only broadcast against q's, so a context shared by many blocks is never copied per block;
    grouped-query heads read their KV head in place (head h uses KV head h // (H / Hkv))."""
    group = hp.n_head // hp.n_head_kv
    qg = q.reshape(*q.shape[:-2], hp.n_head_kv, group, hp.head_dim) / np.sqrt(hp.head_dim)
    scores = [
        xp.where(vis[..., None, None, :, :], xp.einsum("...qgrd,...kgd->...grqk", qg, k), -xp.inf) for k, _, vis in kv
    ]
    top = scores[0].max(axis=-1, keepdims=True)
    for s in scores[1:]:
        top = xp.maximum(top, s.max(axis=-1, keepdims=True))
    weights = [xp.exp(s - top) for s in scores]
    total = sum(w.sum(axis=-1, keepdims=True) for w in weights)
    out = sum(xp.einsum("...grqk,...kgd->...qgrd", w / total, v) for w, (_, v, _) in zip(weights, kv, strict=True))
    return out.reshape(q.shape)


def block_hidden(
    xp: Any,
    p: Params,
    hp: DraftHparams,
    tok_embd: Any,
    ctx: list[tuple[Any, Any]],
    ctx_visible: Any,
    tokens: Any,
    pos: Any,
    inner: Any = None,
) -> Any:
    """The noise block's final hidden states ``[..., B, n_embd]``.

    ``ctx`` is context_kv's output with context axis n; ``ctx_visible [..., n]`` says which context rows
    the block sees (all of them when drafting; the rows before the anchor in training); ``inner [..., B, B]``
    which block rows each block row sees (default: all, or those up to it for a causal draft)."""
    n_block = tokens.shape[-1]
    x = tok_embd[tokens]
    if inner is None:
        full = xp.ones((n_block, n_block), dtype=bool)
        inner = xp.tril(full) if hp.causal else full
    ctx_vis = ctx_visible[..., None, :]
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        h = rms_norm(xp, x, p[b + "attn_norm.weight"], hp.rms_eps)
        q = _heads(h @ p[b + "attn_q.weight"].T, hp.n_head, hp.head_dim)
        k = _heads(h @ p[b + "attn_k.weight"].T, hp.n_head_kv, hp.head_dim)
        v = _heads(h @ p[b + "attn_v.weight"].T, hp.n_head_kv, hp.head_dim)
        q = rope(xp, rms_norm(xp, q, p[b + "attn_q_norm.weight"], hp.rms_eps), pos, hp.rope_freq_base)
        k = rope(xp, rms_norm(xp, k, p[b + "attn_k_norm.weight"], hp.rms_eps), pos, hp.rope_freq_base)
        ck, cv = ctx[il]
        a = _attend(xp, hp, q, [(ck, cv, ctx_vis), (k, v, inner)])
        x = x + a.reshape(*a.shape[:-2], -1) @ p[b + "attn_output.weight"].T
        h = rms_norm(xp, x, p[b + "ffn_norm.weight"], hp.rms_eps)
        gate = h @ p[b + "ffn_gate.weight"].T
        up = h @ p[b + "ffn_up.weight"].T
        x = x + (silu(xp, gate) * up) @ p[b + "ffn_down.weight"].T
    return rms_norm(xp, x, p["output_norm.weight"], hp.rms_eps)


def head_logits(xp: Any, hidden: Any, output: Any) -> Any:
    """The output head's logits over the head's own rows (the draft vocabulary)."""
    return hidden @ output.T


def scatter_vocab(logits: np.ndarray, d2t: np.ndarray | None, n_vocab: int, fill: float) -> np.ndarray:
    """A reduced vocabulary's rows put back at their target ids, ``fill`` elsewhere."""
    if d2t is None:
        return logits
    full = np.full((*logits.shape[:-1], n_vocab), fill, dtype=logits.dtype)
    full[..., d2t] = logits
    return full


def markov_bias(
    p: Params, hp: DraftHparams, logits: np.ndarray, tokens: np.ndarray, d2t: np.ndarray | None
) -> np.ndarray:
    """DSpark's Markov head on one block's logits ``[B, n_vocab]``: slot i gets ``w2 @ w1[prev]``,
    prev being the anchor for the first drafted slot and the biased argmax of the slot before after
    that (greedy, as the graph chains it); a bonus-anchor block's slot 0 passes through."""
    w1, w2 = p["markov_w1.weight"], p["markov_w2.weight"]
    out = logits.copy()
    first = 0 if hp.sample_from_anchor else 1
    prev = int(tokens[0])
    for i in range(first, logits.shape[0]):
        bias = scatter_vocab(w2 @ w1[prev], d2t, logits.shape[-1], 0.0)
        out[i] = logits[i] + bias
        prev = int(np.argmax(out[i]))
    return out


def block_logits(
    w: Any, feats: np.ndarray, tokens: np.ndarray, ctx_pos: np.ndarray | None = None, pos0: int | None = None
) -> np.ndarray:
    """One sequence drafting as llama.cpp's draft does: context rows ``feats [n, *]`` at ``ctx_pos``
    (default ``0..n-1``), the block ``tokens [B]`` at ``pos0..`` (default: after the last context row,
    the definition's next position); returns the block's logits over the target vocabulary
    ``[B, n_vocab]`` (float64)."""
    xp = np
    p = {k: v.astype(np.float64, copy=False) if v.dtype.kind == "f" else v for k, v in w.params.items()}
    n = feats.shape[0]
    ctx_pos = np.arange(n) if ctx_pos is None else np.asarray(ctx_pos)
    pos0 = int(ctx_pos[-1]) + 1 if pos0 is None else pos0
    ctx = context_kv(xp, p, w.hp, feats.astype(np.float64), ctx_pos)
    hidden = block_hidden(
        xp,
        p,
        w.hp,
        w.tok_embd.astype(np.float64, copy=False),
        ctx,
        np.ones(n, dtype=bool),
        np.asarray(tokens),
        np.arange(pos0, pos0 + len(tokens)),
    )
    logits = scatter_vocab(head_logits(xp, hidden, w.output.astype(np.float64, copy=False)), w.d2t, w.n_vocab, -np.inf)
    if "markov_w1.weight" in p:
        logits = markov_bias(p, w.hp, logits, np.asarray(tokens), w.d2t)
    return logits


def drafted(w: Any, logits: np.ndarray) -> list[int]:
    """The greedy draft read from a block's logits: slots 1.. (slot 0 too for an anchor-first DSpark)."""
    first = 0 if w.hp.sample_from_anchor else 1
    return [int(np.argmax(row)) for row in logits[first:]]
