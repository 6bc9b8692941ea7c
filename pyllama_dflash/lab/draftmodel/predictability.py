"""How predictable a target's own replies are, before any draft is trained: ``python -m
pyllama_dflash.lab.draftmodel.predictability --pair bench``.

A draft can only accept what it can learn to predict. These figures bound that from the corpus alone
(the target's greedy replies to the training conversations, seeds ``0..N-1`` as ``train`` collects them),
with no draft. Pairs are (a generated token, the generated token after it) within one reply, so a reply's
first token, which the prompt's last decode sampled, is not in them:

- ``repeat``: the share of held-out pairs whose two tokens are the same;
- ``successor``: the share of held-out pairs whose second token is the most frequent successor of the
  first in the training conversations' pairs (a bigram table: the simplest draft of the first drafted
  position, which DFlash drafts from the same previous token);
- ``successor_seen``: the share of held-out pairs whose first token the table knows;
- ``distinct`` and ``entropy_bits``: how many token ids all the replies use (training and held-out), and
  the entropy of their frequencies (replies spread evenly over 256 ids have 8 bits).

On the tiny pair a trained draft hits about half its first positions; where ``successor`` is far below
that on another target, its replies lack the short-range regularity the tiny target's have, and no
amount of training on this corpus shape would make the draft accept there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from ... import command, load
from ...flags import tool_prog
from ..acceptance.script import training_turns
from .corpus import Collector, Conversation


def replies(conv: Conversation) -> list[np.ndarray]:
    """The generated tokens of each reply, in order (a reply: a run of generated rows)."""
    out, cur = [], []
    for tok, gen in zip(conv.tokens.tolist(), conv.generated.tolist(), strict=True):
        if gen:
            cur.append(tok)
        elif cur:
            out.append(np.asarray(cur))
            cur = []
    if cur:
        out.append(np.asarray(cur))
    return out


def _pairs(convs: Sequence[Conversation]) -> list[tuple[int, int]]:
    reps = [r.tolist() for conv in convs for r in replies(conv)]
    return [(p, n) for r in reps for p, n in zip(r[:-1], r[1:], strict=True)]


def predictability(train: Sequence[Conversation], held_out: Sequence[Conversation]) -> dict:
    """The figures of the module's docstring; pairs (previous, next) are taken within a reply only."""
    table: dict[int, Counter] = defaultdict(Counter)
    for prev, nxt in _pairs(train):
        table[prev][nxt] += 1
    best = {prev: c.most_common(1)[0][0] for prev, c in table.items()}
    pairs = _pairs(held_out)
    if not table or not pairs:
        raise ValueError("predictability: the training and the held-out replies need two tokens each at least")
    every = np.concatenate([r for conv in [*train, *held_out] for r in replies(conv)])
    freq = np.bincount(every) / len(every)
    freq = freq[freq > 0]
    return {
        "held_out_pairs": len(pairs),
        "repeat": float(np.mean([p == n for p, n in pairs])),
        "successor": float(np.mean([best.get(p) == n for p, n in pairs])),
        "successor_seen": float(np.mean([p in best for p, _ in pairs])),
        "distinct": int(len(freq)),
        "entropy_bits": float(-(freq * np.log2(freq)).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    prog = tool_prog("python -m pyllama_dflash.lab.draftmodel.predictability")
    ap = argparse.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("--pair", choices=("tiny", "bench"), default="bench")
    ap.add_argument("--conversations", type=int, default=24, help="training conversations (default 24)")
    ap.add_argument("--held-out", type=int, default=8, help="held-out conversations (default 8)")
    args = ap.parse_args(argv)
    for name in ("conversations", "held_out"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    from pyllama_dflash.harness.slotloop.models import bench_pair_models, tiny_models
    from pyllama_dflash.product.llamabuild import BuildOptions, build

    build(["baseline"], BuildOptions(quiet=True))
    load("baseline")
    models = bench_pair_models() if args.pair == "bench" else tiny_models(target="dense")
    n = args.conversations + args.held_out
    with Collector(models) as c:  # the corpus train collects: the same seeds, turns and images
        convs = [c.run(training_turns(seed, True)) for seed in range(n)]
    result = {"pair": args.pair, "conversations": [args.conversations, args.held_out]}
    result.update(predictability(convs[: args.conversations], convs[args.conversations :]))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
