"""pyllama-dflash vlm: the trained vision-language target, stage by stage (the ``train`` extra: JAX).

    pyllama-dflash vlm vocab --out F         # the character vocabulary, listed (nothing to train)
    pyllama-dflash vlm corpus --out DIR      # the training pool: conversations, their images through mtmd
    pyllama-dflash vlm target --out DIR      # training on the pool (made first if --corpus names none)
    pyllama-dflash vlm judge [--target F]    # llama.cpp's logits against the reference; captions
    pyllama-dflash vlm probe [--rows 9,64]   # how much of the shape the projector's rows keep, no target
    pyllama-dflash vlm pad --out F [--form wide|deep|embedded]   # the padded target, its logits against the core's
    pyllama-dflash vlm drafts --out DIR      # the text- and image-trained DFlash drafts
    pyllama-dflash vlm speed --target F      # tokens/s with a draft over without, through llama-server
    pyllama-dflash vlm pair A.json B.json    # two speed records' acceptance, paired over conversations
    pyllama-dflash vlm accept                # paired acceptance through the libraries, every semantics
    pyllama-dflash vlm plot R.json --out F   # an accept record's picture, by tokens since the image
    pyllama-dflash vlm images --out DIR      # two held-out scenes as PNG, for repro on the trained pair

``--smoke`` runs a stage at toy size in seconds (what CI runs). Each stage writes a JSON record
beside what it made: the command, its inputs, the time it took and the sha256 of every output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from ... import command
from ...errors import UsageError
from ...files import atomic_write_json, sha256_file
from .cli_common import COMMITTED, MMPROJ_FILE, TARGET_FILE, existing, load_baseline, machine, shown
from .cli_common import log as _log
from .config import CORE, TOY, CoreConfig
from .imagerows import write_projector
from .pipeline import HELD_OUT_IMAGE_SEEDS, PHASES, SMOKE_PHASES, SMOKE_POOL, Phase, PoolSpec, build_pool, train_core
from .poolfile import load_pool, save_pool
from .scenes import SIDE_FOR_ROWS
from .serving_cli import add_serving_stages
from .weights import init_params, read_target, write_target

RECORD_FILE = "vlm-target.json"
POOL_FILE = "vlm-pool.npz"


def _phases(args: argparse.Namespace) -> tuple[CoreConfig, tuple[Phase, ...]]:
    """The target's size and its phases: the two default ones (or the smoke's), or one the flags describe."""
    cfg = TOY if args.smoke else CORE
    phases = SMOKE_PHASES if args.smoke else PHASES
    shaped = args.caption_rows or args.mixed_rows or args.length or args.batch or args.image_seeds
    if not (args.steps or args.lr or args.mix or args.init or args.corpus or shaped):
        return cfg, phases
    spec, recipe = phases[0].pool, phases[0].recipe
    if args.steps:
        recipe = replace(recipe, steps=args.steps)
    if args.length:
        recipe = replace(recipe, length=args.length)
    if args.batch:
        recipe = replace(recipe, batch=args.batch)
    if args.image_seeds:
        if not 0 < args.image_seeds <= HELD_OUT_IMAGE_SEEDS[0]:
            raise UsageError(f"--image-seeds {args.image_seeds}: from 1 to {HELD_OUT_IMAGE_SEEDS[0]} (held out above)")
        spec = replace(spec, image_seeds=args.image_seeds)
    if args.caption_rows:
        spec = replace(spec, caption_rows=_shares("--caption-rows", args.caption_rows))
    if args.mixed_rows:
        spec = replace(spec, mixed_rows=_shares("--mixed-rows", args.mixed_rows))
    if args.lr:
        recipe = replace(recipe, lr=args.lr, lr_final=min(recipe.lr_final, args.lr / 10))
    if args.mix:
        try:
            prose, caption, mixed = (int(x) for x in args.mix.split(","))
        except ValueError:
            raise UsageError(f"--mix {args.mix!r}: three counts, prose,caption,mixed") from None
        spec = replace(spec, prose=prose, caption=caption, mixed=mixed)
    return cfg, (Phase("as asked", spec, recipe),)


def _shares(flag: str, text: str) -> tuple[tuple[int, float], ...]:
    """``9:0.3,1024:0.7`` -> ((9, 0.3), (1024, 0.7)): image sizes in rows, each with its share."""
    try:
        shares = tuple((int(rows), float(share)) for rows, share in (x.split(":") for x in text.split(",")))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: ROWS:SHARE pairs, comma-separated, e.g. 9:0.5,64:0.5") from None
    unknown = sorted({rows for rows, _ in shares} - set(SIDE_FOR_ROWS))
    if unknown:
        raise UsageError(f"{flag} {text!r}: {unknown} rows is no image size the bench serves {sorted(SIDE_FOR_ROWS)}")
    if any(share <= 0 for _, share in shares):
        raise UsageError(f"{flag} {text!r}: every share must be above 0")
    return shares


def _pool(args: argparse.Namespace, cfg: CoreConfig, spec: PoolSpec, target: Path, mmproj: Path) -> tuple:
    """The pool ``--corpus`` names (checked to be this size's), else one drawn and encoded here."""
    if not args.corpus:
        return (*build_pool(spec, target, mmproj, log=_log), spec)
    pool, rows_of, meta = load_pool(existing(Path(args.corpus) / POOL_FILE, "training pool"))
    if meta["config"] != json.loads(json.dumps(cfg.as_dict())):
        size = "the toy size" if not args.smoke else "the core's size"
        raise UsageError(f"--corpus {args.corpus}: its pool was made at {size}, not this run's")
    _log(f"read the pool of {len(pool)} conversations from {args.corpus}")
    spec = PoolSpec(**{k: tuple(map(tuple, v)) if isinstance(v, list) else v for k, v in meta["pool"].items()})
    return pool, rows_of, spec


def _start(args: argparse.Namespace, cfg: CoreConfig) -> dict | None:
    """The weights ``--init`` names (checked to be this size's), or None: fresh ones."""
    if not args.init:
        return None
    init_cfg, init = read_target(existing(args.init, "target to start from"))
    if init_cfg != cfg:
        raise UsageError(f"--init {args.init}: a target of another shape than this run's")
    _log(f"starting from {args.init}")
    return init


def cmd_target(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, phases = _phases(args)
    target, mmproj = out / TARGET_FILE, out / MMPROJ_FILE
    at_start = machine()
    write_projector(mmproj, cfg)
    record_provenance = load_baseline()
    params = _start(args, cfg)
    write_target(target, cfg, params or init_params(cfg, 0), name="pyllama-dflash vlm target (untrained)")
    done = []
    for phase in phases:
        _log(f"phase {phase.name}: {phase.recipe.steps} steps")
        started = time.monotonic()
        pool, rows_of, spec = _pool(args, cfg, phase.pool, target, mmproj)
        pool_seconds = round(time.monotonic() - started, 1)

        def checkpoint(p: dict, step: int, name: str = phase.name) -> None:
            write_target(target, cfg, p, name=f"pyllama-dflash vlm target ({name}, step {step})")
            _log(f"checkpoint at step {step}: {target}")

        params, record = train_core(cfg, pool, rows_of, phase.recipe, log=_log, checkpoint=checkpoint, init=params)
        done.append({"phase": phase.name, "pool": asdict(spec), "pool_seconds": pool_seconds, **record})
    write_target(target, cfg, params, name="pyllama-dflash vlm target")
    record = {
        "command": args.command_line,
        "started_from": Path(args.init).name if args.init else None,
        "config": cfg.as_dict(),
        "phases": done,
        **record_provenance,
        "machine_at_start": at_start,
        "files": {p.name: sha256_file(p) for p in (target, mmproj)},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / RECORD_FILE, record)
    _log(f"wrote {target} ({json.dumps(record['files'])})")
    return 0


def cmd_vocab(args: argparse.Namespace) -> int:
    from .vocab import VOCAB

    listing = [
        {"id": i, "token": t, "type": ty} for i, (t, ty) in enumerate(zip(VOCAB.tokens, VOCAB.token_types, strict=True))
    ]
    atomic_write_json(
        Path(args.out), {"n_vocab": VOCAB.n_vocab, "tokenizer": "llama (SPM), characters", "tokens": listing}
    )
    _log(f"wrote {args.out}: {VOCAB.n_vocab} tokens")
    return 0


def cmd_corpus(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = TOY if args.smoke else CORE
    spec = SMOKE_POOL if args.smoke else PoolSpec()
    started = time.monotonic()
    mmproj, scratch = out / MMPROJ_FILE, out / "vlm-target-untrained.gguf"
    write_projector(mmproj, cfg)
    load_baseline()
    write_target(scratch, cfg, init_params(cfg, 0), name="pyllama-dflash vlm target (untrained: its width for mtmd)")
    pool, rows_of = build_pool(spec, scratch, mmproj, log=_log)
    meta = {"pool": asdict(spec), "config": cfg.as_dict(), "seconds": round(time.monotonic() - started, 1)}
    save_pool(out / POOL_FILE, pool, rows_of, meta)
    scratch.unlink()
    _log(f"wrote {out / POOL_FILE}: {len(pool)} conversations, {len(rows_of)} images ({meta['seconds']} s)")
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    from .judge import judge

    target = existing(args.target, "target")
    mmproj = existing(args.mmproj or target.with_name(MMPROJ_FILE), "projector")
    prov = load_baseline()
    report = judge(target, mmproj, n_images=args.images, n_conversations=args.conversations, log=_log)
    report |= {"kind": "judge", "target": shown(target), "images": args.images, "conversations": args.conversations}
    report |= prov
    if args.json:
        atomic_write_json(Path(args.json), report)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import GAMMA, HELD_OUT_PER_SCENE, RIDGE, shape_probe

    target = existing(args.target, "target")
    mmproj = existing(args.mmproj or target.with_name(MMPROJ_FILE), "projector")
    sizes, counts = _counts("--rows", args.rows), _counts("--seeds", args.seeds)
    if unknown := sorted(set(sizes) - set(SIDE_FOR_ROWS)):
        raise UsageError(f"--rows {args.rows}: {unknown} is no image size the bench serves {sorted(SIDE_FOR_ROWS)}")
    if max(counts) > HELD_OUT_IMAGE_SEEDS[0]:
        raise UsageError(f"--seeds {args.seeds}: at most {HELD_OUT_IMAGE_SEEDS[0]} (held out above)")
    prov, started = load_baseline(), time.monotonic()
    accuracy = {str(rows): shape_probe(target, mmproj, rows, counts, log=_log) for rows in sizes}
    report = {
        "kind": "probe",
        "command": args.command_line,
        "target": target.name,
        "classifier": {"kernel": "rbf", "gamma_times_features": GAMMA, "ridge": RIDGE},
        "held_out_per_scene": HELD_OUT_PER_SCENE,
        "held_out_shape_accuracy": accuracy,
        "seconds": round(time.monotonic() - started, 1),
        **prov,
    }
    if args.json:
        atomic_write_json(Path(args.json), report)
    print(json.dumps(accuracy, indent=1))
    return 0


def _counts(flag: str, text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: whole numbers, comma-separated") from None
    if min(counts) < 1:
        raise UsageError(f"{flag} {text!r}: each must be at least 1")
    return counts


def cmd_pad(args: argparse.Namespace) -> int:
    from .drafts import TrainedOn, draft_file
    from .padded import PaddingForm, pad_and_check

    core = existing(args.core, "core target")
    mmproj = existing(args.mmproj or core.with_name(MMPROJ_FILE), "projector")
    prov = load_baseline()
    form = PaddingForm(args.form)
    record = pad_and_check(core, mmproj, Path(args.out), form, args.min_mib << 20, log=_log)
    if form is PaddingForm.EMBEDDED:  # a draft borrows the target's embeddings: it must be as wide
        from .embedded_pair import write_embedded_pair
        from .weights import read_target

        drafts = {f.name: f for f in (core.with_name(draft_file(k)) for k in TrainedOn) if f.is_file()}
        n_embd = record["padded"]["config"]["n_embd"]
        record["pair"] = write_embedded_pair(Path(args.out), read_target(core)[0], n_embd, drafts)
        _log(f"wrote its projector and {len(drafts)} draft(s): {', '.join(record['pair'])}")
    record |= {"kind": "padded", **prov}
    atomic_write_json(Path(args.out).with_suffix(".json"), record)
    if args.json:
        atomic_write_json(Path(args.json), record)
    print(json.dumps(record, indent=1))
    return 0


def cmd_drafts(args: argparse.Namespace) -> int:
    from .drafts import TrainedOn, draft_file, make_draft

    target = existing(args.target, "target")
    mmproj = existing(args.mmproj or target.with_name(MMPROJ_FILE), "projector")
    prov = load_baseline()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for kind in [TrainedOn(k) for k in args.trained_on.split(",") if k != "none"]:
        record = make_draft(target, mmproj, out, kind, smoke=args.smoke, steps=args.steps, log=_log)
        _log(f"{kind.value}-trained draft: held-out mean accepted {record['held_out_mean_accepted']} of 3")
        made.append(record)
    if args.json:  # every draft recorded in --out, those of an earlier run included
        records = [(out / draft_file(k)).with_suffix(".json") for k in TrainedOn]
        made = [json.loads(r.read_text()) for r in records if r.exists()]
        atomic_write_json(Path(args.json), {"kind": "drafts", "drafts": made, **prov})
    return 0


def _add_target_stage(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("target", help="train the target core; write its GGUF, projector and record")
    t.add_argument("--out", required=True, help="folder for the GGUFs and the record")
    t.add_argument("--steps", type=int, default=0, help="training steps (default: the recipe's)")
    t.add_argument("--smoke", action="store_true", help="toy sizes: a few conversations and steps")
    t.add_argument("--corpus", default=None, help="a folder `vlm corpus` wrote (default: make the pool here)")
    t.add_argument("--init", default=None, help="a target GGUF to start from (default: fresh weights)")
    t.add_argument("--lr", type=float, default=0.0, help="the peak learning rate (default: the recipe's)")
    t.add_argument("--length", type=int, default=0, help="rows of a packed training row (default: the recipe's)")
    t.add_argument("--batch", type=int, default=0, help="packed rows a step (default: the recipe's)")
    t.add_argument("--caption-rows", default=None, help="captions' image sizes, ROWS:SHARE,... (default: 9, 64, 256)")
    t.add_argument("--image-seeds", type=int, default=0, help="renderings of each scene (default: the pool's 8)")
    t.add_argument("--mixed-rows", default=None, help="mixed conversations' image sizes, ROWS:SHARE,...")
    t.add_argument(
        "--mix",
        default=None,
        help="conversations of each kind, prose,caption,mixed (default: the pool's 4000,3000,1500)",
    )
    t.set_defaults(func=cmd_target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyllama-dflash vlm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    _add_target_stage(sub)
    v = sub.add_parser("vocab", help="list the character vocabulary (ids, tokens, types) as JSON")
    v.add_argument("--out", required=True, help="the JSON file to write")
    v.set_defaults(func=cmd_vocab)
    c = sub.add_parser("corpus", help="draw the training pool and encode its images through mtmd")
    c.add_argument("--out", required=True, help="folder for the pool and the projector")
    c.add_argument("--smoke", action="store_true", help="toy sizes: a few conversations")
    c.set_defaults(func=cmd_corpus)
    j = sub.add_parser("judge", help="llama.cpp's logits against the reference forward, and the captions")
    j.add_argument("--target", default=str(COMMITTED / TARGET_FILE), help="the target GGUF (default: the committed)")
    j.add_argument("--mmproj", default=None, help="its projector (default: vlm-mmproj.gguf beside it)")
    j.add_argument("--images", type=int, default=90, help="held-out images to caption")
    j.add_argument("--conversations", type=int, default=6, help="held-out conversations for the logits")
    j.add_argument("--json", default=None, help="write the report here")
    j.set_defaults(func=cmd_judge)
    pr = sub.add_parser("probe", help="how much of the shape the projector's rows keep: a classifier, no target")
    pr.add_argument("--target", default=str(COMMITTED / TARGET_FILE), help="a target GGUF (mtmd needs one)")
    pr.add_argument("--mmproj", default=None, help="the projector (default: vlm-mmproj.gguf beside the target)")
    pr.add_argument("--rows", default="9,64,256", help="image sizes in rows, comma-separated")
    pr.add_argument("--seeds", default="8,32", help="counts of training seeds per scene, comma-separated")
    pr.add_argument("--json", default=None, help="write the record here (docs/figures/vlm-probe.json)")
    pr.set_defaults(func=cmd_probe)
    p = sub.add_parser("pad", help="the padded target: the core's function, weights 8x the last-level cache")
    p.add_argument("--core", default=str(COMMITTED / TARGET_FILE), help="the core target GGUF")
    p.add_argument("--mmproj", default=None, help="its projector (default: vlm-mmproj.gguf beside it)")
    p.add_argument("--out", required=True, help="the padded GGUF to write (its record beside it, .json)")
    p.add_argument("--form", choices=["wide", "deep", "embedded"], default="wide", help="how (padded.py)")
    p.add_argument("--min-mib", type=int, default=256, help="the least MiB of weights (default 256: 8 x 32 MiB)")
    p.add_argument("--json", default=None, help="also write the record here (docs/figures/vlm-padded-FORM.json)")
    p.set_defaults(func=cmd_pad)
    d = sub.add_parser("drafts", help="train DFlash drafts for the target with the project's draft pipeline")
    d.add_argument("--target", default=str(COMMITTED / TARGET_FILE), help="the target GGUF")
    d.add_argument("--mmproj", default=None, help="its projector (default: vlm-mmproj.gguf beside it)")
    d.add_argument("--out", required=True, help="folder for the drafts and their records")
    d.add_argument(
        "--trained-on",
        default="text,images",
        help="which drafts: text, images, both (text,images), or none (train nothing: --json gathers the records)",
    )
    d.add_argument("--steps", type=int, default=0, help="training steps (default: the recipe's)")
    d.add_argument("--smoke", action="store_true", help="toy sizes: a few conversations and steps")
    d.add_argument("--json", default=None, help="write both records here (docs/figures/vlm-drafts.json)")
    d.set_defaults(func=cmd_drafts)
    add_serving_stages(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_line = "pyllama-dflash vlm " + " ".join(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(command.run(main))
