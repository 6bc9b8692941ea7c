"""The reference model drafting a corpus conversation round by round, as the definition has it.

Each reply of a conversation is drafted as llama-server's slot loop drafts it: the block anchors on
the reply's first token with the context of every row before it, the target accepts the longest
prefix of the draft that matches its own tokens, and the next block anchors on the token after
them. With the target's tokens known from the corpus, no target runs: this is the definition's
ceiling for a draft, measured on held-out conversations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import forward
from .corpus import Conversation
from .weights import DraftWeights


def replies(conv: Conversation) -> list[tuple[int, int]]:
    """The [first, end) rows of each run of generated rows."""
    out, start = [], None
    for i, g in enumerate([*conv.generated.tolist(), False]):
        if g and start is None:
            start = i
        elif not g and start is not None:
            out.append((start, i))
            start = None
    return out


def _drafts_at(w: DraftWeights, conv: Conversation, anchors: list[int], n_max: int, chunk: int = 64) -> dict:
    """The draft of a block anchored at each of ``anchors``, ``{anchor: drafted tokens}``. The context's K
    and V are computed once for the whole conversation: a row's depend on that row alone, so a block
    anchored at a sees exactly what a context of the rows before a gives (the later rows masked out);
    the blocks run ``chunk`` at a time."""
    p = {k: v.astype(np.float64, copy=False) if v.dtype.kind == "f" else v for k, v in w.params.items()}
    n = len(conv.tokens)
    ctx = forward.context_kv(np, p, w.hp, conv.features.astype(np.float64), np.arange(n))
    tok_embd, output = w.tok_embd.astype(np.float64, copy=False), w.output.astype(np.float64, copy=False)
    out = {}
    for i in range(0, len(anchors), chunk):
        a = np.asarray(anchors[i : i + chunk])
        blocks = np.concatenate([conv.tokens[a][:, None], np.full((len(a), n_max), w.hp.mask_id)], axis=1)
        visible = np.arange(n)[None, :] < a[:, None]
        pos = a[:, None] + np.arange(n_max + 1)[None, :]
        hidden = forward.block_hidden(np, p, w.hp, tok_embd, ctx, visible, blocks, pos)
        logits = forward.scatter_vocab(forward.head_logits(np, hidden, output), w.d2t, w.n_vocab, -np.inf)
        for j, anchor in enumerate(a.tolist()):
            row = logits[j]
            if "markov_w1.weight" in p:
                row = forward.markov_bias(p, w.hp, row, blocks[j], w.d2t)
            out[anchor] = forward.drafted(w, row)
    return out


def accepted_per_round(w: DraftWeights, conv: Conversation, n_max: int) -> list[int]:
    """Accepted draft tokens of each full drafting round of the conversation's replies."""
    runs = replies(conv)
    drafts = _drafts_at(w, conv, [a for first, end in runs for a in range(first, end - n_max)], n_max)
    out = []
    for first, end in runs:
        a = first
        while a + n_max < end:
            draft, truth = drafts[a], conv.tokens[a + 1 : a + 1 + n_max].tolist()
            k = 0
            while k < n_max and draft[k] == truth[k]:
                k += 1
            out.append(k)
            a += k + 1
    return out


def mean_accepted(w: DraftWeights, convs: Sequence[Conversation], n_max: int) -> float:
    w = w.float64()
    rounds = [k for c in convs for k in accepted_per_round(w, c, n_max)]
    return float(np.mean(rounds)) if rounds else 0.0
