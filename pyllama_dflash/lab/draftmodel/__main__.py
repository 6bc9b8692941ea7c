"""``pyllama-dflash train --target dense [--trained-on text]``: regenerate a committed trained draft.

Runs the tiny target of that kind (baseline's build) over a seeded corpus shaped as the acceptance
bench's conversations (``acceptance.script.training_turns``), with images of 64 or 256 rows or, for
``--trained-on text``, none; trains the DFlash draft on it with the DFlash recipe (JAX, the ``train``
extra), writes the GGUF and its record into ``tests/data/trained``, and reports the held-out mean
accepted length of the reference model drafting as the definition has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from ... import command, load
from ...files import atomic_write_json, default_file_mode, sha256_file
from ...flags import tool_prog
from ...harness.tiny._write import stored_fingerprint
from ...harness.tiny.config import TinyConfig
from ...harness.tiny.draft import write_draft
from ...pace import eta
from ..acceptance.script import training_turns
from . import trained
from .corpus import Collector
from .evaluate import mean_accepted
from .train import Recipe, train
from .weights import load_draft


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # the module's own form: python -m pyllama_dflash.lab.draftmodel train
        argv = argv[1:]
    ap = argparse.ArgumentParser(prog=tool_prog("python -m pyllama_dflash.lab.draftmodel train"), description=__doc__)
    ap.add_argument("--target", choices=trained.TARGET_KINDS, default="dense")
    ap.add_argument(
        "--pair",
        choices=("tiny", "bench"),
        default="tiny",
        help="the tiny target of --target, or the bench pair (tiny/bench_pair.py, the dense kind at a width "
        "whose decode is memory-bound; its draft is too large to commit, so give --out)",
    )
    ap.add_argument(
        "--trained-on",
        choices=trained.TRAINED_ON,
        default="images",
        help="conversations with images (every row at the draft's own positions) or text only, as public drafts are",
    )
    ap.add_argument("--conversations", type=int, default=600, help="training conversations (default 600)")
    ap.add_argument("--held-out", type=int, default=40, help="held-out conversations (default 40)")
    ap.add_argument("--steps", type=int, default=Recipe.steps)
    ap.add_argument(
        "--lr",
        type=float,
        default=Recipe.lr,
        help=f"peak learning rate (default {Recipe.lr:g}), decayed to a tenth of it over the steps",
    )
    ap.add_argument("--out", type=Path, default=trained.TRAINED_DIR)
    args = ap.parse_args(argv)
    if args.pair == "bench" and args.out == trained.TRAINED_DIR:
        ap.error(f"--pair bench: give --out (its draft, about 65 MB, is not committed to {trained.TRAINED_DIR})")
    for name in ("conversations", "held_out", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.lr < 1:
        ap.error(f"--lr {args.lr:g}: a learning rate between 0 and 1")
    return _train(args)


def _pair(args: argparse.Namespace) -> tuple:
    """The model set the corpus runs on and the config its draft is written with."""
    from pyllama_dflash.harness.slotloop.models import bench_pair_models, tiny_models
    from pyllama_dflash.harness.tiny.bench_pair import BENCH_PAIR

    if args.pair == "bench":
        return bench_pair_models(), BENCH_PAIR
    return tiny_models(target=args.target), TinyConfig()


IMAGE_TURN = "image kept with probability 0.5, of 64 or 256 rows at even odds"


def _train(args: argparse.Namespace) -> int:
    from pyllama_dflash.product.llamabuild import BuildOptions, build

    # the target runs on baseline's build, made here if missing (as repro does); then, before the corpus
    # (minutes), the extra that training needs
    build(["baseline"], BuildOptions(quiet=True))
    load("baseline")
    command.require("jax", extra="train", command="train")
    models, config = _pair(args)
    n_train, n_total = args.conversations, args.conversations + args.held_out
    t0 = time.perf_counter()
    with Collector(models) as c:
        convs = []
        for seed in range(n_total):
            convs.append(c.run(training_turns(seed, args.trained_on == "images")))
            if len(convs) % max(1, n_total // 10) == 0:
                print(f"corpus: {len(convs)}/{n_total} conversations, {eta(len(convs), n_total, t0)}", flush=True)
    corpus_s = time.perf_counter() - t0
    print(f"corpus: {n_total} conversations, {sum(len(c.tokens) for c in convs)} rows, {corpus_s:.0f} s")
    recipe = Recipe(steps=args.steps, lr=args.lr, lr_final=Recipe.lr_final * (args.lr / Recipe.lr))
    params, summary = train(load_draft(models.draft, models.target), convs[:n_train], recipe)
    args.out.mkdir(parents=True, exist_ok=True)
    name = trained.file_name(args.target, args.trained_on)
    path = args.out / (name.replace("dflash-", "dflash-bench-pair-", 1) if args.pair == "bench" else name)
    # a draft trained with image rows says so (patch 0008 then serves it every row at its own positions)
    write_draft(path, config, seed=0, trained=params, image_rows=args.trained_on == "images")
    weights = load_draft(path, models.target)
    n_max = weights.hp.block_size - 1
    held_out = mean_accepted(weights, convs[n_train:], n_max)
    print(f"held out: {args.held_out} conversations, mean accepted per round {held_out:.3f} (n_max {n_max})")
    manifest = trained.read_manifest(args.out)
    manifest["files"][path.name] = {
        "sha256": sha256_file(path),
        "target": args.target if args.pair == "tiny" else "bench pair",
        "target_fingerprint": stored_fingerprint(models.target),
        "drafter": "dflash",
        "trained_on": args.trained_on,
        "corpus": {
            "train_seeds": [0, n_train],
            "held_out_seeds": [n_train, n_total],
            "shape": "acceptance.script.training_turns: the bench's four turns, each image turn with an "
            + (IMAGE_TURN if args.trained_on == "images" else "no image"),
        },
        "recipe": dataclasses.asdict(recipe),
        "train_seconds": summary["seconds"],
        "corpus_seconds": round(corpus_s, 1),
        "history": summary["history"],
        "held_out_mean_accepted": round(held_out, 4),
        "command": trained.regenerate_command(args.target, args.trained_on)
        + (
            f" --pair bench --conversations {args.conversations} --held-out {args.held_out} --steps {args.steps}"
            if args.pair == "bench"
            else ""
        )
        + (f" --lr {args.lr:g}" if args.lr != Recipe.lr else ""),
    }
    atomic_write_json(args.out / trained.MANIFEST, manifest, mode=default_file_mode())
    print(f"wrote {path} and {args.out / trained.MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
