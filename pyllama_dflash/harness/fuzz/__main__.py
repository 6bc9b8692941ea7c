"""``python -m pyllama_dflash.harness.fuzz``: search image/text schedules on every built variant.

Each variant runs the hypothesis loop in a child process of its own. A broken invariant is
shrunk, printed and written as a schedule file that ``python -m pyllama_dflash.harness.repro --schedule
FILE`` replays. Exits 0 when the must-pass variant (``--must-pass``) broke nothing.
Builds nothing: build first with ``python build.py``.

``--seeds 0-4`` searches at each of several seeds in turn; ``--shard I/N`` keeps slice I of N of them
(every N-th seed of the sorted list, from the I-th), one slice per runner. ``--json`` writes the
results per seed and variant; ``--merge A.json B.json ...`` adds the slices' reports into the whole
run's, and exits as the whole run would.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ... import command
from ...errors import UsageError
from ...figures import PROVENANCE, provenance
from ...files import atomic_write_bytes, atomic_write_json
from ...flags import common_parser, export, pick, tool_prog
from ...product.llamabuild import default_must_pass, find_built
from ...product.llamabuild.patchset import BASELINE
from ...product.process.shard import check_slices, load_reports, parse_seeds, shard_from_json, shard_json
from ..engine.schedule import Schedule
from ..engine.schedule_runner import examples_from_env, search_variants, seed_from_env
from ..slotloop.models import tiny_models
from ..tiny import DRAFTERS, TARGET_KINDS
from .report import markdown


def parser() -> argparse.ArgumentParser:
    shared = common_parser(
        "variants",
        "must_pass",
        "jobs",
        "timeout",
        "backend",
        "cpu",
        "drafters",
        "targets",
        "patches",
        "shard",
        jobs=2,
        timeout=1800.0,
    )
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.harness.fuzz"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    _search_flags(ap)
    _output_flags(ap)
    return ap


def _search_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--examples",
        type=int,
        default=None,
        help="schedules per variant (default: $PYLLAMA_DFLASH_FUZZ_EXAMPLES or 50)",
    )
    seeds = ap.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seed", type=int, default=None, help="hypothesis seed (default: $PYLLAMA_DFLASH_FUZZ_SEED or 0)"
    )
    seeds.add_argument(
        "--seeds",
        type=parse_seeds,
        metavar="LIST",
        help="several seeds, searched one after another: 0,1,2 or 0-4 or 0-2,7 (--shard slices them)",
    )
    ap.add_argument("--max-steps", type=int, default=8, help="raw steps per schedule (a request is up to 4 steps)")
    ap.add_argument("--exact", action="store_true", help="also compare the output with decoding without the draft")
    ap.add_argument(
        "--trained-with-image-rows",
        action="store_true",
        help="drafts marked as trained with image rows (dflash.trained_with_image_rows): an as-trained "
        "variant then serves them, and is judged, as the definition is",
    )
    ap.add_argument(
        "--no-drift",
        action="store_true",
        help="skip the drift oracle (each schedule also run on baseline with the draft's reconverted "
        "twin, whose drafts every completed run must equal)",
    )
    ap.add_argument(
        "--ignore",
        default="",
        metavar="KINDS",
        help="comma-separated violation kinds that end a run without failing it (to look past a known one)",
    )
    ap.add_argument(
        "--unweighted",
        action="store_true",
        help="draw schedules as before the weighting (no restore-then-draft requests, no boundary grids, "
        "the draft sized as the target): to measure what the weighting buys",
    )


def _output_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, help="folder for the shrunk schedules (default: a new temporary folder)")
    ap.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the results per seed and variant (with --merge: the merged ones)",
    )
    ap.add_argument(
        "--markdown",
        type=Path,
        metavar="PATH",
        help="also write the results as a Markdown table (with --merge: the merged ones; the docs' table)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="run nothing: add these --json reports of the slices of one run (--shard 1/N ... N/N) into the "
        "whole run's, print it, and exit as the whole run would",
    )


def _print_seed(results: dict[str, dict], variants: list[str], must_pass: str, seed: int, out: Path | None) -> bool:
    """One seed's results, variant by variant; the shrunk schedules saved in ``out`` (None: printed only).
    Returns whether the must-pass variant broke."""
    broken = False
    for v in variants:
        r = results[v]
        if "runs" not in r:  # the child itself failed
            print(f"{v}: {r.get('status')}: {r.get('first_failure')}")
            broken |= v == must_pass
            continue
        found = r["failures"]
        print(
            f"{v}: {r['runs']} schedules run ({r['steps_run']} steps, {r['examples']} examples asked, "
            f"shrinking included) in {r['wall_s']:.1f}s: {len(found) or 'no'} violation kind(s); "
            f"checks {r['stats']}"
        )
        for f in found:
            broken |= v == must_pass
            print(f"  {f['kind']} (first seen at run {r['first_failure_run'].get(f['kind'], '?')}): {f['message']}")
            if f["schedule"]:
                s = Schedule.from_json(f["schedule"])
                s.found = {"variant": v, "kind": f["kind"], "message": f["message"], "seed": seed}
                if out is not None:
                    path = s.save(out / f"{v}-{f['kind']}.json")
                    print(f"  shrunk to {len(s.steps)} steps: {path}")
                print("  " + s.dumps().replace("\n", "\n  "))
    return broken


def merge_reports(reports: list[dict]) -> dict:
    """The slices' reports as one run's: the same must-pass variant, variants and settings in each, every slice 1..N
    once, and together every seed of the run exactly once. ValueError says what does not fit."""
    if not reports:
        raise ValueError("no reports to merge")
    for key in ("must_pass", "variants", "selection"):
        if len({json.dumps(r.get(key), sort_keys=True) for r in reports}) != 1:
            raise ValueError(f"the reports are not slices of one run: their {key!r} differ")
    check_slices([shard_from_json(r.get("shard")) for r in reports], "fuzz")
    seeds: dict[str, dict] = {}
    for r in reports:
        for seed, results in r["seeds"].items():
            if seed in seeds:
                raise ValueError(f"seed {seed} is in two reports")
            seeds[seed] = results
    wanted = [str(x) for x in reports[0]["selection"]["seeds"]]
    if sorted(seeds, key=int) != sorted(wanted, key=int):
        missing = [x for x in wanted if x not in seeds]
        raise ValueError(f"the reports do not hold the run's seeds: {', '.join(missing) or 'others'} missing")
    first = reports[0]
    return {
        **{key: first[key] for key in PROVENANCE if key in first},
        "must_pass": first["must_pass"],
        "variants": first["variants"],
        "selection": first["selection"],
        "shard": None,
        "seeds": {x: seeds[x] for x in wanted},
        "broken": any(r["broken"] for r in reports),
        "wall_s": round(sum(r["wall_s"] for r in reports), 1),
        "shards": [r.get("shard") for r in sorted(reports, key=lambda r: shard_from_json(r.get("shard")) or 0)],
    }


def merge_main(args: argparse.Namespace) -> int:
    try:
        reports = load_reports(args.merge, ("seeds", "selection"), "fuzz --json")
        merged = merge_reports(reports)
    except ValueError as e:
        raise UsageError(f"--merge: {e}") from None
    broken = False
    for seed, results in merged["seeds"].items():
        print(f"== seed {seed} ==")
        broken |= _print_seed(results, merged["variants"], merged["must_pass"], int(seed), None)
    _write(args, merged)
    must_pass = merged["must_pass"]
    print(
        f"fuzz: {len(merged['seeds'])} seeds from {len(reports)} slices, {merged['wall_s']:.1f}s in all; "
        f"must-pass variant {must_pass!r}: {'NOT OK' if broken else 'OK'}"
    )
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.merge:
        return merge_main(args)
    command.require("hypothesis", extra="fuzz", command="fuzz")  # its children draw the schedules with it
    export(args)  # --cpu and --patches: for the lookups here and in every child process
    backend = args.backend if args.backend != "auto" else None
    names = args.variants or ["all"]
    manifests = find_built(names, backend=backend)
    variants = [m.variant for m in manifests]
    if not args.no_drift:
        find_built([BASELINE], backend=backend)  # the drift oracle's reference runs on baseline
    must_pass = args.must_pass or default_must_pass(variants)
    examples = args.examples or examples_from_env()
    every_seed = args.seeds or [seed_from_env() if args.seed is None else args.seed]
    seeds = args.shard.by_place(every_seed) if args.shard else every_seed
    if not seeds:
        raise UsageError(
            f"--shard {args.shard}: no seed in this slice of {len(every_seed)} "
            f"(give at least {args.shard.count} with --seeds)"
        )
    out = args.out or Path(tempfile.mkdtemp(prefix="pyllama-dflash-schedules-"))
    out.mkdir(parents=True, exist_ok=True)
    selection = {
        "seeds": every_seed,  # before the slicing: what the slices together must search
        "examples": examples,
        "max_steps": args.max_steps,
        "exact": args.exact,
        "drift": not args.no_drift,
        "weighted": not args.unweighted,
        "ignore": [k for k in args.ignore.split(",") if k],
        "drafters": pick(args.drafters, tuple(DRAFTERS), "--drafters"),
        "targets": pick(args.targets, TARGET_KINDS, "--targets"),
        "image_rows": args.trained_with_image_rows,
    }
    t0 = time.monotonic()
    broken, by_seed = False, {}
    for seed in seeds:
        results = _search(variants, seed, selection, args, backend)
        if len(every_seed) > 1:
            print(f"== seed {seed} ==")
        # each seed's shrunk schedules in a folder of their own when there are several
        folder = out / f"seed-{seed}" if len(seeds) > 1 else out
        folder.mkdir(parents=True, exist_ok=True)
        broken |= _print_seed(results, variants, must_pass, seed, folder)
        by_seed[str(seed)] = results
    wall = time.monotonic() - t0
    report = {
        **provenance(manifests[0]),
        "must_pass": must_pass,
        "variants": variants,
        "selection": selection,
        "shard": shard_json(args.shard),
    }
    _write(args, {**report, "seeds": by_seed, "broken": broken, "wall_s": round(wall, 1)})
    sliced = f" (seeds {', '.join(map(str, seeds))}: slice {args.shard})" if args.shard else ""
    print(f"fuzz: {wall:.1f}s{sliced}; must-pass variant {must_pass!r}: {'NOT OK' if broken else 'OK'}")
    return 1 if broken else 0


def _write(args: argparse.Namespace, report: dict) -> None:
    """The report where --json and --markdown ask for it."""
    if args.json:
        atomic_write_json(args.json, report)
    if args.markdown:
        atomic_write_bytes(args.markdown, markdown(report).encode())


def _search(variants: list[str], seed: int, selection: dict, args: argparse.Namespace, backend: str | None) -> dict:
    """One seed's search on every variant, as the selection (the report's) has it."""
    return search_variants(
        variants,
        tiny_models(image_rows=selection["image_rows"]),
        examples=selection["examples"],
        seed=seed,
        max_steps=selection["max_steps"],
        exact=selection["exact"],
        ignore=tuple(selection["ignore"]),
        backend=backend,
        parallel=args.jobs,
        timeout_s=args.timeout,
        drift=selection["drift"],
        weighted=selection["weighted"],
        drafters=tuple(selection["drafters"]),
        targets=tuple(selection["targets"]),
    )


if __name__ == "__main__":
    sys.exit(command.run(main))
