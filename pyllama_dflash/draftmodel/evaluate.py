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


def accepted_per_round(w: DraftWeights, conv: Conversation, n_max: int) -> list[int]:
    """Accepted draft tokens of each full drafting round of the conversation's replies."""
    out = []
    for first, end in replies(conv):
        a = first
        while a + n_max < end:
            block = np.array([conv.tokens[a]] + [w.hp.mask_id] * n_max)
            draft = forward.drafted(w, forward.block_logits(w, conv.features[:a], block))
            truth = conv.tokens[a + 1 : a + 1 + n_max].tolist()
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
