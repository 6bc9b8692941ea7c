"""The ``vlm`` command's stages that measure the trained pair: ``speed`` and ``pair`` through llama-server,
``accept`` through each variant's libraries, ``plot`` of an accept record, and ``images`` for ``repro``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ...errors import UsageError
from ...files import atomic_write_bytes, atomic_write_json, sha256_file
from .cli_common import COMMITTED, MMPROJ_FILE, TARGET_FILE, existing, kept, shown
from .cli_common import log as _log


def cmd_speed(args: argparse.Namespace) -> int:
    from pyllama_dflash import load
    from pyllama_dflash.figures import provenance
    from pyllama_dflash.product.llamabuild import BuildOptions, build

    from .drafts import TrainedOn
    from .served_speed import Served, measure_side_by_side

    target = existing(args.target, "target")
    mmproj = existing(args.mmproj or COMMITTED / MMPROJ_FILE, "projector")
    drafts = [existing(d, "draft") for d in (args.draft or str(COMMITTED / "vlm-dflash-text.gguf")).split(",")]
    variants = args.variant.split(",")
    served = [Served(v, d) for d in drafts for v in variants]
    if len(served) > 1 and not (args.json and "{variant}" in args.json and "{draft}" in args.json):
        raise UsageError(
            f"--json {args.json}: {len(served)} ways of serving write a record each; "
            "name them with {variant} and {draft} in the path"
        )
    n_maxes = [int(n) for n in args.n_max.split(",")]
    build(sorted(set(variants)), BuildOptions(server=True, quiet=True))
    prov = provenance(load(variants[0]))  # one source and backend for every variant
    started = time.monotonic()
    seeds = range(args.conversations)
    made = measure_side_by_side(
        served, target, mmproj, TrainedOn(args.kind), seeds, n_maxes, args.rows_per_image, log=_log
    )
    seconds = round(time.monotonic() - started, 1)
    command = (
        f"pyllama-dflash vlm speed --target {shown(target)}"
        + (f" --mmproj {shown(mmproj)}" if args.mmproj else "")
        + f" --draft {','.join(shown(d) for d in drafts)} --variant {args.variant} --kind {args.kind}"
        + f" --conversations {args.conversations} --n-max {args.n_max}"
        + (f" --rows-per-image {args.rows_per_image}" if args.rows_per_image else "")
        + (f" --json {shown(Path(args.json))}" if args.json else "")
    )
    for way, report in zip(served, made, strict=True):
        files = {"target": target, "mmproj": mmproj, "draft": way.draft}
        report |= {
            "kind": "vlm-speed",
            "conversations": args.conversations,
            "files": {k: {"name": v.name, "sha256": sha256_file(v)} for k, v in files.items()},
            "seconds": seconds,
            "command": command,
            **prov,
        }
        if args.json:
            path = args.json.format(variant=way.variant, draft=_draft_label(way.draft))
            atomic_write_json(Path(path), report)
        print(json.dumps({f"{way.variant} {way.draft.name}": report["table"]}, indent=1))
    return 0


def _draft_label(draft: Path) -> str:
    """``{draft}`` in a speed record's path: what the draft was trained on, as its key says."""
    from .drafts import TrainedOn, trained_on

    return "image-draft" if trained_on(draft) is TrainedOn.IMAGES else "text-draft"


def cmd_pair(args: argparse.Namespace) -> int:
    from .served_speed import paired_acceptance

    records = [json.loads(existing(f, "speed record").read_text()) for f in (args.first, args.second)]
    for f, r in zip((args.first, args.second), records, strict=True):
        if r.get("kind") != "vlm-speed" or f"n_max {args.n_max}" not in r["turns"]:
            raise UsageError(f"{f}: not a vlm speed record with n_max {args.n_max}")
    if records[0]["files"]["draft"] != records[1]["files"]["draft"]:
        raise UsageError(f"{args.first} and {args.second}: records of different drafts")
    report = {
        "kind": "vlm-paired",
        "first": {"record": Path(args.first).name, "variant": records[0]["variant"]},
        "second": {"record": Path(args.second).name, "variant": records[1]["variant"]},
        "draft": records[0]["files"]["draft"]["name"],
        "n_max": args.n_max,
        **paired_acceptance(records[0], records[1], args.n_max),
        **{k: records[0][k] for k in ("date", "machine", "llama_cpp")},
    }
    command = f"pyllama-dflash vlm pair {shown(Path(args.first))} {shown(Path(args.second))} --n-max {args.n_max}"
    report = kept(args, report, command)
    print(json.dumps(report, indent=1))
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    from pyllama_dflash.figures import provenance
    from pyllama_dflash.product.llamabuild import BuildOptions, build

    from .drafts import TrainedOn, draft_file
    from .library_paired import AS_TRAINED, COLUMNS, TrainedPair, measure

    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: at least one column must run at a time")
    rows = [int(r) for r in args.rows.split(",")]
    kinds = [TrainedOn(k) for k in args.drafts.split(",")]
    built = {m.variant: m for m in build(sorted({c.variant for c in COLUMNS}), BuildOptions(server=True, quiet=True))}
    prov = provenance(built[AS_TRAINED])  # each column runs in a child: this process loads no variant
    started = time.monotonic()
    runs = {}
    for kind in kinds:
        pair = TrainedPair(
            existing(args.target or COMMITTED / TARGET_FILE, "target"),
            existing(args.mmproj or COMMITTED / MMPROJ_FILE, "projector"),
            existing(COMMITTED / draft_file(kind), "draft"),
        )
        for n in rows:
            _log(f"{kind.value}-trained draft, images of {n} rows:")
            seeds = range(args.conversations)
            runs[f"trained/{kind.value}/{n}"] = measure(pair, seeds, n, args.n_max, log=_log, jobs=args.jobs)
    report = {
        "kind": "vlm-accept",
        "conversations": args.conversations,
        "n_max": args.n_max,
        "runs": runs,
        "seconds": round(time.monotonic() - started, 1),
        **prov,
    }
    command = (
        f"pyllama-dflash vlm accept --drafts {args.drafts} --rows {args.rows} "
        f"--conversations {args.conversations} --n-max {args.n_max} --jobs {args.jobs}"
    )
    report = kept(args, report, command)
    from .report import markdown

    print(markdown(report))
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from pyllama_dflash.harness.tiny.image import png_bytes

    from .judge import chat_scenes

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, image in chat_scenes().items():
        atomic_write_bytes(out / name, png_bytes(image.pixels()))
        print(out / name, f"({image.scene.caption()})")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from pyllama_dflash.lab.acceptance.plot import plot_since_image

    record = json.loads(existing(args.record, "accept record").read_text())
    if record.get("kind") != "vlm-accept":
        raise UsageError(f"{args.record}: not a record of `vlm accept` (its kind is {record.get('kind')!r})")
    print(plot_since_image(record["runs"], "trained", Path(args.out), asked_by="vlm plot"))
    return 0


def add_serving_stages(sub: argparse._SubParsersAction) -> None:
    """The stages that measure the pair through llama-server: ``speed`` and ``pair``."""
    sp = sub.add_parser("speed", help="tokens/s with a draft over without, through llama-server, side by side")
    sp.add_argument("--target", required=True, help="the target GGUF (the core, or its padded form: vlm pad)")
    sp.add_argument("--mmproj", default=None, help="its projector (default: the committed vlm-mmproj.gguf)")
    sp.add_argument(
        "--draft", default=None, help="the draft, or several, comma-separated (default: the committed text-trained)"
    )
    sp.add_argument(
        "--variant",
        default="as-trained",
        help="the build the servers run, or several, comma-separated: each draft on each, side by side",
    )
    sp.add_argument("--kind", choices=["text", "images"], default="text", help="prose chats, or the bench's shape")
    sp.add_argument(
        "--rows-per-image", type=int, choices=[64, 256, 1024], default=None, help="image size (default: drawn)"
    )
    sp.add_argument("--conversations", type=int, default=24, help="held-out conversations (default 24)")
    sp.add_argument("--n-max", default="3,7", help="draft lengths, comma-separated (default 3,7)")
    sp.add_argument(
        "--json",
        default=None,
        help="write the record here; with several drafts or variants a path naming {variant} and {draft} "
        "({draft}: image-draft for a draft marked trained with image rows, else text-draft)",
    )
    sp.set_defaults(func=cmd_speed)
    pa = sub.add_parser("pair", help="accepted tokens a round of one speed record minus another's, paired")
    pa.add_argument("first", help="a vlm speed record (e.g. the draft under definition)")
    pa.add_argument("second", help="another of the same draft and conversations (e.g. under slots)")
    pa.add_argument("--n-max", type=int, default=7, help="the draft length both records ran (default 7)")
    pa.add_argument("--json", default=None, help="write the record here (docs/figures/vlm-paired-*.json)")
    pa.set_defaults(func=cmd_pair)
    ac = sub.add_parser("accept", help="paired acceptance through each variant's libraries, every semantics")
    ac.add_argument("--target", default=None, help="the target GGUF (default: the committed core)")
    ac.add_argument("--mmproj", default=None, help="its projector (default: the committed vlm-mmproj.gguf)")
    ac.add_argument("--drafts", default="text,images", help="the committed drafts, by what they were trained on")
    ac.add_argument("--rows", default="64,256,1024", help="image sizes in rows, comma-separated")
    ac.add_argument("--conversations", type=int, default=24, help="held-out conversations (default 24)")
    ac.add_argument("--n-max", type=int, default=7, help="the draft length (default 7, both drafts' block)")
    ac.add_argument("--jobs", type=int, default=2, help="columns run at once, sharing the cores (default 2)")
    ac.add_argument("--json", default=None, help="write the record here (docs/figures/vlm-accept.json)")
    ac.set_defaults(func=cmd_accept)
    im = sub.add_parser("images", help="the two held-out scenes of the chat and of repro on the pair, as PNG")
    im.add_argument("--out", required=True, help="folder for scene-7.png and scene-23.png")
    im.set_defaults(func=cmd_images)
    pl = sub.add_parser("plot", help="an accept record's picture: accepted length against tokens since the image")
    pl.add_argument("record", help="a record of `vlm accept` (docs/figures/vlm-accept.json)")
    pl.add_argument("--out", required=True, help="the SVG to write (the plot extra: matplotlib)")
    pl.set_defaults(func=cmd_plot)
