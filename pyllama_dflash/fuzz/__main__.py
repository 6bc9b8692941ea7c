"""``python -m pyllama_dflash.fuzz``: search image/text schedules on every built variant.

Each variant runs the hypothesis loop in a child process of its own. A broken invariant is
shrunk, printed and written as a schedule file that ``python -m pyllama_dflash.repro --schedule
FILE`` replays. Exits 0 when the fix variant (default: the last of the series) broke nothing.
Builds nothing: build first with ``python build.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from .. import command
from ..engine.schedule import Schedule
from ..engine.schedule_runner import examples_from_env, search_variants, seed_from_env
from ..flags import common_parser, export, pick, tool_prog
from ..llamabuild import find_built
from ..llamabuild.patchset import BASELINE
from ..scenarios.models import tiny_models
from ..tiny import DRAFTERS, TARGET_KINDS


def parser() -> argparse.ArgumentParser:
    shared = common_parser(
        "variants",
        "fix",
        "jobs",
        "timeout",
        "backend",
        "cpu",
        "drafters",
        "targets",
        "patches",
        jobs=2,
        timeout=1800.0,
    )
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.fuzz"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    ap.add_argument(
        "--examples",
        type=int,
        default=None,
        help="schedules per variant (default: $PYLLAMA_DFLASH_FUZZ_EXAMPLES or 50)",
    )
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: $PYLLAMA_DFLASH_FUZZ_SEED or 0)")
    ap.add_argument("--max-steps", type=int, default=8, help="raw steps per schedule (a request is up to 4 steps)")
    ap.add_argument("--exact", action="store_true", help="also compare the output with decoding without the draft")
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
    ap.add_argument("--out", type=Path, help="folder for the shrunk schedules (default: a new temporary folder)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command.require("hypothesis", extra="fuzz", command="fuzz")  # its children draw the schedules with it
    export(args)  # --cpu and --patches: for the lookups here and in every child process
    backend = args.backend if args.backend != "auto" else None
    names = [v.strip() for v in args.variants.split(",")] if args.variants else ["all"]
    variants = [m.variant for m in find_built(names, backend=backend)]
    if not args.no_drift:
        find_built([BASELINE], backend=backend)  # the drift oracle's reference runs on baseline
    fix = args.fix or variants[-1]
    examples = args.examples or examples_from_env()
    seed = seed_from_env() if args.seed is None else args.seed
    out = args.out or Path(tempfile.mkdtemp(prefix="pyllama-dflash-schedules-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = search_variants(
        variants,
        tiny_models(),
        examples=examples,
        seed=seed,
        max_steps=args.max_steps,
        exact=args.exact,
        ignore=tuple(k for k in args.ignore.split(",") if k),
        backend=backend,
        parallel=args.jobs,
        timeout_s=args.timeout,
        drift=not args.no_drift,
        weighted=not args.unweighted,
        drafters=tuple(pick(args.drafters, tuple(DRAFTERS), "--drafters")),
        targets=tuple(pick(args.targets, TARGET_KINDS, "--targets")),
    )
    broken = False
    for v in variants:
        r = results[v]
        if "runs" not in r:  # the child itself failed
            print(f"{v}: {r.get('status')}: {r.get('first_failure')}")
            broken |= v == fix
            continue
        found = r["failures"]
        print(
            f"{v}: {r['runs']} schedules run ({r['steps_run']} steps, {r['examples']} examples asked, "
            f"shrinking included) in {r['wall_s']:.1f}s: {len(found) or 'no'} violation kind(s); "
            f"checks {r['stats']}"
        )
        for f in found:
            broken |= v == fix
            print(f"  {f['kind']} (first seen at run {r['first_failure_run'].get(f['kind'], '?')}): {f['message']}")
            if f["schedule"]:
                s = Schedule.from_json(f["schedule"])
                s.found = {"variant": v, "kind": f["kind"], "message": f["message"], "seed": seed}
                path = s.save(out / f"{v}-{f['kind']}.json")
                print(f"  shrunk to {len(s.steps)} steps: {path}")
                print("  " + s.dumps().replace("\n", "\n  "))
    print(f"fuzz: {time.monotonic() - t0:.1f}s; fix variant {fix!r}: {'NOT OK' if broken else 'OK'}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(command.run(main))
