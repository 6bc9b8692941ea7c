"""Training the target core with JAX on the CPU: next-token loss on the replies, images as rows.

Each step draws ``batch`` conversations from a fixed pool (corpus.py), each cut to ``length`` rows;
an image's rows are looked up in a bank encoded once through mtmd (imagerows.py). The optimizer is
Adam with a linear warm-up and a cosine decay, and the update is clipped by its global norm.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...errors import PyllamaError
from . import forward
from .config import CoreConfig
from .corpus import Rendered
from .weights import init_params, trained_names


class TrainingUnavailable(PyllamaError, RuntimeError):
    """JAX is missing: the ``train`` extra installs it."""


class TrainingDiverged(PyllamaError, RuntimeError):
    """The loss went NaN or inf."""


def _jax() -> tuple[Any, Any]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise TrainingUnavailable(
            f"training the target needs JAX, which the train extra installs: pip install -e '.[train]' ({exc})"
        ) from exc
    jax.config.update("jax_platforms", "cpu")
    return jax, jnp


@dataclass(frozen=True)
class Recipe:
    steps: int = 1000
    batch: int = 12
    length: int = 512
    lr: float = 3e-3
    lr_final: float = 1e-4
    warmup: int = 60
    clip: float = 1.0
    weight_decay: float = 0.01
    seed: int = 0


@dataclass
class Packed:
    """The pool as arrays of ``length`` rows, conversations laid end to end in each (greedy first
    fit), a segment id keeping each from seeing another; a conversation longer than a row is cut."""

    tokens: np.ndarray  # [N, L] int32 (0 at image rows and padding)
    bank_index: np.ndarray  # [N, L] int32: the row of the image bank, -1 for a token
    pos: np.ndarray  # [N, 4, L] int32: each conversation's own positions, from 0
    weight: np.ndarray  # [N, L] float32
    segment: np.ndarray  # [N, L] int32: which conversation of the row (-1: padding)
    bank: np.ndarray  # [R, E] float32


def _bins(lengths: list[int], length: int) -> list[list[int]]:
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = min(lengths[i], length)
        at = next((b for b, r in enumerate(room) if r >= n), None)
        if at is None:
            bins.append([i])
            room.append(length - n)
        else:
            bins[at].append(i)
            room[at] -= n
    return bins


def pack(pool: Sequence[Rendered], rows_of: dict[tuple, np.ndarray], length: int) -> Packed:
    keys = sorted({im.key for r in pool for _, im in r.image_rows})
    offsets, blocks, at = {}, [], 0
    for key in keys:
        offsets[key] = at
        blocks.append(rows_of[key])
        at += len(rows_of[key])
    width = next(iter(rows_of.values())).shape[1] if rows_of else 1
    bank = np.concatenate(blocks) if blocks else np.zeros((1, width), np.float32)
    bins = _bins([r.n for r in pool], length)
    N = len(bins)
    tokens = np.zeros((N, length), np.int32)
    index = np.full((N, length), -1, np.int32)
    pos = np.zeros((N, 4, length), np.int32)
    weight = np.zeros((N, length), np.float32)
    segment = np.full((N, length), -1, np.int32)
    for b, members in enumerate(bins):
        start = 0
        for seg, i in enumerate(members):
            r = pool[i]
            n = min(r.n, length)
            span = slice(start, start + n)
            tokens[b, span] = np.maximum(r.tokens[:n], 0)
            pos[b, :, span] = r.pos[:, :n]
            weight[b, span] = r.weight[:n]
            weight[b, start + n - 1] = 0.0  # its label is the next conversation's row, or past the cut
            segment[b, span] = seg
            for first, im in r.image_rows:
                rows = np.arange(first, min(first + len(rows_of[im.key]), n))
                index[b, start + rows] = offsets[im.key] + (rows - first)
            start += n
    return Packed(tokens, index, pos, weight, segment, bank.astype(np.float32))


def _loss(jnp: Any, cfg: CoreConfig, params: dict, bank: Any, batch: tuple) -> tuple[Any, Any]:
    tokens, index, pos, weight, segment = batch
    x = jnp.where((index >= 0)[..., None], bank[jnp.maximum(index, 0)], params["token_embd.weight"][tokens])
    n = tokens.shape[-1]
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    visible = causal & (segment[..., :, None] == segment[..., None, :])
    logits = forward.logits(jnp, params, cfg, x, pos, visible)
    labels = jnp.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1)
    logp = logits - jnp.max(logits, axis=-1, keepdims=True)
    logp = logp - jnp.log(jnp.sum(jnp.exp(logp), axis=-1, keepdims=True))
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    hits = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    total = jnp.maximum(jnp.sum(weight), 1.0)
    return jnp.sum(nll * weight) / total, jnp.sum(hits * weight) / total


def _adam_step(jax: Any, jnp: Any, cfg: CoreConfig, bank: Any, recipe: Recipe, names: list[str]) -> Callable:
    """One jitted step: the loss's gradient, clipped by its global norm, then Adam with weight decay on
    the projections (not on the norms, nor on the embeddings)."""
    decayed = {k: ("ffn_" in k or "attn_" in k) and not k.endswith("norm.weight") for k in names}

    def step(params: dict, m: dict, v: dict, t: Any, lr: Any, batch: tuple) -> tuple:
        (loss, acc), grads = jax.value_and_grad(lambda p: _loss(jnp, cfg, p, bank, batch), has_aux=True)(params)
        gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.minimum(1.0, recipe.clip / (gnorm + 1e-6))
        new_p, new_m, new_v = {}, {}, {}
        for k in params:
            g = grads[k] * scale
            new_m[k] = 0.9 * m[k] + 0.1 * g
            new_v[k] = 0.99 * v[k] + 0.01 * g * g
            mh, vh = new_m[k] / (1 - 0.9**t), new_v[k] / (1 - 0.99**t)
            upd = mh / (jnp.sqrt(vh) + 1e-8) + (recipe.weight_decay * params[k] if decayed[k] else 0.0)
            new_p[k] = params[k] - lr * upd
        return new_p, new_m, new_v, loss, acc

    return jax.jit(step)


def train(
    cfg: CoreConfig,
    packed: Packed,
    recipe: Recipe = Recipe(),
    log: Callable[[str], None] = print,
    init: dict[str, np.ndarray] | None = None,
    checkpoint: Callable[[dict[str, np.ndarray], int], None] | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """Train from ``init`` (else fresh weights); returns the trained tensors and a record. ``checkpoint``
    gets the tensors at each quarter of the run."""
    jax, jnp = _jax()
    params = {k: jnp.asarray(v) for k, v in (init or init_params(cfg, recipe.seed)).items() if k in trained_names(cfg)}
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = _adam_step(jax, jnp, cfg, jnp.asarray(packed.bank), recipe, list(params))
    rng = np.random.default_rng([recipe.seed, 61])
    history: list[dict] = []
    started = time.monotonic()
    N = len(packed.tokens)
    for t in range(1, recipe.steps + 1):
        pick = rng.choice(N, size=min(recipe.batch, N), replace=False)
        arrays = (packed.tokens, packed.bank_index, packed.pos, packed.weight, packed.segment)
        lr = _schedule(recipe, t)
        params, m, v, loss, acc = step(params, m, v, jnp.float32(t), jnp.float32(lr), tuple(a[pick] for a in arrays))
        loss = float(loss)
        if not np.isfinite(loss):
            raise TrainingDiverged(f"step {t}: the loss is {loss} (lr {lr:.2e}); lower --lr")
        if t == 1 or t % max(1, recipe.steps // 20) == 0 or t == recipe.steps:
            seconds = round(time.monotonic() - started, 1)
            history.append(
                {"step": t, "loss": round(loss, 4), "accuracy": round(float(acc), 4), "lr": lr, "seconds": seconds}
            )
            log(f"step {t}/{recipe.steps}: loss {loss:.3f}, next-token accuracy {float(acc):.3f} ({seconds} s)")
            if checkpoint is not None and t % max(1, recipe.steps // 4) == 0:
                checkpoint({k: np.asarray(p, dtype=np.float32) for k, p in params.items()}, t)
    out = {k: np.asarray(p, dtype=np.float32) for k, p in params.items()}
    return out, {"recipe": asdict(recipe), "history": history, "train_seconds": round(time.monotonic() - started, 1)}


def _schedule(recipe: Recipe, t: int) -> float:
    if t <= recipe.warmup:
        return recipe.lr * t / recipe.warmup
    frac = (t - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return float(recipe.lr_final + 0.5 * (recipe.lr - recipe.lr_final) * (1 + np.cos(np.pi * frac)))
