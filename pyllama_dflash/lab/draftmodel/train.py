"""Training a DFlash draft on a fixed target's corpus, with the DFlash recipe, in JAX (the ``train`` extra).

The recipe (the DFlash paper; SpecForge's DFlash trainer): pick random anchors among the rows the
target generated; the block is ``[token at the anchor, mask x (B-1)]`` at the anchor's position and the
B-1 after it; it sees the context rows strictly before the anchor (every row, image rows included, at
1-D positions ``0..N-1``: the draft's definition) and is bidirectional inside; the labels are the
target's tokens at the B-1 rows after the anchor, weighted ``decay^(k-1)`` for slot k, since a later
slot only counts when the ones before it are accepted. The target stays fixed: its features and
tokens come from the corpus (llama.cpp), its token embeddings and output head are frozen.

The forward pass is ``forward``'s, with ``jax.numpy`` as the array module: the model trained is the
model the differential test checks llama.cpp against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import PyllamaError
from ...pace import eta
from . import forward
from .corpus import Conversation
from .weights import DraftWeights


class TrainingUnavailable(PyllamaError, ImportError):
    """JAX is missing: training is the ``train`` extra's."""


class TrainingDiverged(PyllamaError, ArithmeticError):
    """The loss stopped being a number: the weights are lost, and no draft is written from them."""


def _jax() -> tuple[Any, Any]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise TrainingUnavailable(
            f"training a draft needs JAX, which the train extra installs: pip install -e '.[train]' ({exc})"
        ) from exc
    jax.config.update("jax_platforms", "cpu")
    return jax, jnp


@dataclass(frozen=True)
class Recipe:
    steps: int = 3000
    seqs_per_step: int = 16
    anchors_per_seq: int = 24
    lr: float = 3e-3
    lr_final: float = 3e-4
    decay: float = 0.7  # slot k's loss weight: decay^(k-1)
    weight_decay: float = 1e-4
    seed: int = 0
    # the context rows a block sees in training, the latest before its anchor (0: every row). A window keeps
    # each row at its own position, so a long conversation is trained at every position it reaches while a
    # step costs the window, not the conversation
    context_rows: int = 0
    # the block lengths trained at, each block drawing one (empty: the draft's block size alone). b11434 decodes
    # n_max + 1 rows a round and the block is bidirectional, so a draft served at a shorter n_max than it was
    # trained for reads fewer masks than it learnt from: a draft trained on blocks of 8 alone keeps 2.54 of 7
    # but 1.05 of 3. A shorter block is the longer one with its last rows absent (unseen, no loss)
    block_lengths: tuple[int, ...] = ()


@dataclass
class Batches:
    """The corpus padded to one length: features, tokens, and each conversation's anchors."""

    feats: np.ndarray  # [n_conv, L, n_features]
    tokens: np.ndarray  # [n_conv, L + B] (padding 0)
    anchors: list[np.ndarray]  # per conversation: rows whose block's labels are all generated rows


def prepare(convs: Sequence[Conversation], block_size: int) -> Batches:
    length = max(len(c.tokens) for c in convs)
    width = convs[0].features.shape[1]
    feats = np.zeros((len(convs), length, width), dtype=np.float32)
    tokens = np.zeros((len(convs), length + block_size), dtype=np.int32)
    anchors = []
    for i, c in enumerate(convs):
        n = len(c.tokens)
        feats[i, :n] = c.features
        tokens[i, :n] = np.maximum(c.tokens, 0)
        ok = [a for a in range(1, n - block_size + 1) if c.tokens[a] >= 0 and c.generated[a + 1 : a + block_size].all()]
        if not ok:
            raise ValueError(f"conversation {i} has no anchor with {block_size - 1} generated rows after it")
        anchors.append(np.asarray(ok, dtype=np.int32))
    return Batches(feats, tokens, anchors)


def _adam(jax: Any, jnp: Any, lr_at: Callable[[Any], Any], wd: float):
    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}

    def update(params, grads, state):
        t = state["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, state["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, state["v"], grads)
        lr = lr_at(t)

        def step(p, m, v):
            mh = m / (1 - 0.9**t)
            vh = v / (1 - 0.999**t)
            return p - lr * (mh / (jnp.sqrt(vh) + 1e-8) + wd * p)

        return jax.tree_util.tree_map(step, params, m, v), {"m": m, "v": v, "t": t}

    return init, update


def train(
    init: DraftWeights,
    convs: Sequence[Conversation],
    recipe: Recipe = Recipe(),
    log: Callable[[str], None] = print,
) -> tuple[dict[str, np.ndarray], dict]:
    """Train the draft's own tensors from ``init``'s; returns them (float32, GGUF names) and a summary."""
    jax, jnp = _jax()
    hp = init.hp
    if init.d2t is not None or "markov_w1.weight" in init.params:
        raise ValueError("training covers the plain DFlash draft (and its causal form), not DSpark's heads")
    data = prepare(convs, hp.block_size)
    lengths = _block_lengths(recipe, hp.block_size)
    params = {k: jnp.asarray(v) for k, v in init.params.items()}
    loss_fn = _loss(jax, jnp, init, data, recipe)

    def lr_at(t):
        frac = jnp.minimum(t / recipe.steps, 1.0)
        return recipe.lr * (recipe.lr_final / recipe.lr) ** frac

    opt_init, opt_update = _adam(jax, jnp, lr_at, recipe.weight_decay)

    @jax.jit
    def step(p, state, conv_idx, anchor, length):
        (loss, hit), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, conv_idx, anchor, length)
        p, state = opt_update(p, grads, state)
        return p, state, loss, hit

    rng = np.random.default_rng(recipe.seed)
    state = opt_init(params)
    t0 = time.perf_counter()
    history = []
    for it in range(1, recipe.steps + 1):
        conv_idx = rng.choice(len(convs), size=recipe.seqs_per_step, replace=False)
        anchor = np.stack([rng.choice(data.anchors[c], size=recipe.anchors_per_seq) for c in conv_idx])
        length = rng.choice(lengths, size=anchor.shape)
        params, state, loss, hit = step(params, state, jnp.asarray(conv_idx), jnp.asarray(anchor), jnp.asarray(length))
        if not np.isfinite(float(loss)):  # every later step stays NaN: stop before the draft is written
            last = history[-1] if history else None
            raise TrainingDiverged(
                f"training diverged at step {it} of {recipe.steps} (lr {float(lr_at(it)):.2g}, recipe lr "
                f"{recipe.lr:g}): the loss is {float(loss)}"
                + (f", {last['loss']:.3f} at step {last['step']}" if last else "")
                + "; a lower --lr or fewer --steps may hold"
            )
        if it % max(1, recipe.steps // 10) == 0 or it == 1:
            line = (
                f"step {it}/{recipe.steps}: loss {float(loss):.3f}, slot hits {np.round(np.asarray(hit), 3).tolist()}"
            )
            history.append({"step": it, "loss": float(loss), "hits": [float(h) for h in hit]})
            log(f"{line} ({eta(it, recipe.steps, t0)})")
    out = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    return out, {"seconds": round(time.perf_counter() - t0, 1), "history": history}


def _block_lengths(recipe: Recipe, block_size: int) -> np.ndarray:
    lengths = recipe.block_lengths or (block_size,)
    bad = [n for n in lengths if not 2 <= n <= block_size]
    if bad:
        raise ValueError(f"Recipe.block_lengths {list(lengths)}: each must be 2..{block_size} (the draft's block size)")
    return np.asarray(lengths, dtype=np.int32)


def _loss(jax: Any, jnp: Any, init: DraftWeights, data: Batches, recipe: Recipe) -> Callable:
    """The training loss of a batch of anchors (``conv_idx``, ``anchor``): each block's labels' negative
    log-likelihood, slot k weighted decay^(k-1), and the hit rate per slot beside it."""
    hp = init.hp
    block = hp.block_size
    feats, tokens = jnp.asarray(data.feats), jnp.asarray(data.tokens)
    tok_embd, output = jnp.asarray(init.tok_embd), jnp.asarray(init.output)
    length = data.feats.shape[1]
    weights = jnp.asarray([recipe.decay**k for k in range(block - 1)], dtype=jnp.float32)

    def context(p, conv_idx, anchor):
        """Each block's context K and V and which of its rows it sees."""
        if recipe.context_rows:
            rows = anchor[..., None] - recipe.context_rows + jnp.arange(recipe.context_rows)  # [S, A, W]
            f = feats[conv_idx[:, None, None], jnp.maximum(rows, 0)]  # [S, A, W, F]
            return forward.context_kv(jnp, p, hp, f, jnp.maximum(rows, 0)), rows >= 0
        ctx = forward.context_kv(jnp, p, hp, feats[conv_idx], jnp.arange(length)[None, :])
        ctx = [(k[:, None], v[:, None]) for k, v in ctx]  # one context per sequence, shared by its anchors
        return ctx, jnp.arange(length)[None, None, :] < anchor[..., None]

    def loss_fn(p, conv_idx, anchor, length):
        """``length [S, A]``: each block's length; its rows from there on are neither seen nor scored."""
        ctx, visible = context(p, conv_idx, anchor)
        offs = jnp.arange(block)
        present = offs < length[..., None]  # [S, A, B]
        inner = present[..., None, :] & (jnp.tril(jnp.ones((block, block), bool)) if hp.causal else True)
        rows = anchor[..., None] + offs  # [S, A, B]
        seq_tokens = tokens[conv_idx]  # [S, L + B]
        labels = jnp.take_along_axis(seq_tokens[:, None, :], rows[..., 1:], axis=-1)
        block_tokens = jnp.concatenate(
            [jnp.take_along_axis(seq_tokens[:, None, :], rows[..., :1], axis=-1), jnp.full(labels.shape, hp.mask_id)],
            axis=-1,
        )
        hidden = forward.block_hidden(jnp, p, hp, tok_embd, ctx, visible, block_tokens, rows, inner)
        logits = forward.head_logits(jnp, hidden[..., 1:, :], output)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]  # [S, A, B-1]
        scored = weights * present[..., 1:]
        hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        hits = jnp.sum(hit * present[..., 1:], axis=(0, 1)) / jnp.maximum(jnp.sum(present[..., 1:], axis=(0, 1)), 1)
        return jnp.sum(nll * scored) / jnp.sum(scored), hits

    return loss_fn
