"""``python -m pyllama_dflash.mutate``: how much of the fix the harness would notice breaking.

Every mutant of the C++ lines the fix variant adds to ``common/speculative.cpp`` and to
``tools/server/server-context.cpp`` (see operators.py) is built as a variant and tried: a mutant of
libcommon with the C++ test, the scenario matrix of every drafter and target, the rules tests and,
optionally, a fixed-seed fuzz; a mutant of llama-server with its slot checks (see runner.py).

Prints one line per mutant, the survivors, and the mutation score: killed / (killed + survived).
Equivalent mutants (equivalent.json, each with its reason) and mutants that do not compile are
not counted. Exits 0 when nothing survived. A libcommon mutant costs a recompile of one file and
a matrix run (about 20 s here); a llama-server mutant a relink of the server and its slot checks
(about 90 s).

``--shard I/N`` tries slice I of N of the mutants (each mutant's slice follows from its id alone), one
slice per runner; ``--merge A.json B.json ... [--json OUT]`` adds the slices' ``--json`` reports into
the whole run's score (report.py), and refuses slices that miss a mutant or come from other runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..child import sigterm_as_interrupt
from ..env import PATCHES_ENV
from ..files import atomic_write_json
from ..flags import common_parser, tool_prog
from ..llamabuild import BuildError, BuildOptions, build
from ..llamabuild.builder import stage
from ..llamabuild.manifest import all_manifests
from ..llamabuild.patchset import DEFINITION_ROLE, EVERY, FIX_ROLE, apply_series, load_series, tree_reader
from ..paths import default_patches_dir
from ..scenarios.models import tiny_models
from ..scenarios.session import DEFAULT_CONFIG
from . import report
from .operators import mutants
from .runner import (
    EQUIVALENT,
    EQUIVALENT_FILE,
    KILLED,
    MUTATED_FILES,
    SURVIVED,
    load_equivalents,
    references,
    try_mutant,
    write_series,
)


def parser() -> argparse.ArgumentParser:
    shared = common_parser("fix", "jobs", "shard", jobs=os.cpu_count() or 2)
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.mutate"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    ap.add_argument("--list", action="store_true", help="list the mutants and build nothing")
    ap.add_argument("--only", metavar="IDS", help="comma-separated mutant ids (as --list prints them)")
    ap.add_argument("--limit", type=int, help="try at most this many mutants (of the slice, with --shard)")
    ap.add_argument(
        "--files",
        default=",".join(MUTATED_FILES),
        help="comma-separated files whose added lines are mutated (default: %(default)s)",
    )
    ap.add_argument(
        "--every",
        type=int,
        default=1,
        metavar="K",
        help="try every K-th mutant only (a sample; the score then covers the sample)",
    )
    ap.add_argument(
        "--fuzz-examples",
        type=int,
        default=0,
        metavar="N",
        help="also fuzz each mutant the matrix did not kill with N examples, seed 0 (default: 0, no fuzz)",
    )
    ap.add_argument(
        "--write-series",
        type=Path,
        metavar="DIR",
        help="write the one mutant --only names as a series folder (variant 'mutant') and stop: for "
        "build.py, repro and fuzz with --patches DIR",
    )
    ap.add_argument(
        "--json", type=Path, metavar="PATH", help="write every outcome as JSON (with --merge: the merged report)"
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="build and try nothing: add these --json reports of the slices of one run (--shard 1/N ... N/N) "
        "into its score, print it as a run does, and exit as the whole run would",
    )
    return ap


def merge_main(args: argparse.Namespace) -> int:
    try:
        merged = report.merge(report.load(args.merge))
    except ValueError as e:
        print(f"mutate: error: --merge: {e}", file=sys.stderr)
        return 2
    for k, o in enumerate(merged["outcomes"], 1):
        by = f" by {o['killed_by']}" if o["killed_by"] else ""
        print(f"[{k}/{len(merged['outcomes'])}] {o['status']:10s}{by:8s} {o['id']:16s} {o['mutant']}")
    report.print_summary(merged)
    if args.json:
        atomic_write_json(args.json, merged)
    return report.exit_code(merged)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.merge:
        return merge_main(args)
    patches = default_patches_dir()
    series = load_series(patches)
    fix = args.fix or series.variants[-1]
    # each mutant is judged as its fix is: against the twin, or against the draft's definition (0005)
    role = series.role(fix) if fix in series.variants[1:] else FIX_ROLE
    if role not in (FIX_ROLE, DEFINITION_ROLE):
        print(f"mutate: error: --fix {fix!r} is judged as {role!r}: not a fix to mutate", file=sys.stderr)
        return 2
    try:
        (base,) = build(["baseline"], BuildOptions(cpu="native", quiet=True))
    except BuildError as e:
        print(f"mutate: error: {e}", file=sys.stderr)
        return 2
    pristine = Path(base.data["source"]["path"])
    read = tree_reader(pristine)
    fixed = apply_series(read, series.prefix(fix))
    own = {rel: fixed[rel] for p in series.prefix(fix) if p.variant != EVERY for rel in p.touched}
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    missing = [f for f in files if f not in own]
    if missing:
        print(f"mutate: error: variant {fix!r} does not change {', '.join(missing)}", file=sys.stderr)
        return 2
    all_mutants = [m for f in files for m in mutants(f, read(f), own[f])]
    every = all_mutants[:: max(1, args.every)]
    if args.only:
        wanted = {x.strip() for x in args.only.split(",")}
        every = [m for m in every if m.id in wanted]
    selection = {
        "every": args.every,
        "only": sorted(wanted) if args.only else None,
        "limit": args.limit,
        "mutants": [m.id for m in every],  # before the slicing: what the slices together must try
    }
    if args.shard:
        every = args.shard.by_key(every, lambda m: m.id)
    if args.limit:
        every = every[: args.limit]
    if args.write_series:
        if len(every) != 1:
            print(
                f"mutate: error: --write-series needs --only with one mutant id ({len(every)} selected)",
                file=sys.stderr,
            )
            return 2
        if args.write_series.exists() and any(args.write_series.iterdir()):
            print(
                f"mutate: error: --write-series {args.write_series}: not empty (nothing is overwritten)",
                file=sys.stderr,
            )
            return 2
        folder = write_series(every[0], own, series, pristine, args.write_series, role)
        print(f"{every[0].id}: {every[0].describe()}")
        print(f"series written to {folder}; build it with: python build.py --patches {folder} --variant mutant")
        return 0
    sliced = f" (slice {args.shard} of {len(selection['mutants'])})" if args.shard else ""
    if args.list:
        for m in every:
            print(f"{m.id:16s} {m.describe()}")
        print(f"{len(every)} mutants{sliced} of {', '.join(files)} as variant {fix!r} has it")
        return 0
    try:
        equivalents = load_equivalents()
    except ValueError as e:
        print(f"mutate: error: {e}", file=sys.stderr)
        return 2

    t0 = time.monotonic()
    models = tiny_models()
    work = Path(tempfile.mkdtemp(prefix="pyllama-dflash-mutate-"))
    print(f"mutate: {len(every)} mutants{sliced} of {', '.join(files)} ({fix})", flush=True)

    @functools.cache
    def refs() -> dict[str, dict]:
        """Run once, when a mutant's matrix first needs them (C1 and the server stage do not), on the
        series' own baseline: not the mutant's series, whatever the environment says by then."""
        mutant_series = os.environ.pop(PATCHES_ENV, None)
        print(
            f"mutate: references on baseline ({'the definition' if role == DEFINITION_ROLE else 'the twin'}) ...",
            flush=True,
        )
        try:
            return references(models, DEFAULT_CONFIG, args.jobs, work, role)
        finally:
            if mutant_series is not None:
                os.environ[PATCHES_ENV] = mutant_series

    outcomes = []
    try:
        for k, m in enumerate(every, 1):
            series_dir = write_series(m, own, series, pristine, work / "series", role)
            o = try_mutant(
                m,
                series_dir,
                refs,
                models,
                DEFAULT_CONFIG,
                parallel=args.jobs,
                work=work,
                fuzz_examples=args.fuzz_examples,
            )
            if o.status == SURVIVED and m.id in equivalents:
                o.status, o.detail = EQUIVALENT, equivalents[m.id]["reason"]
            outcomes.append(o)
            by = f" by {o.killed_by}" if o.killed_by else ""
            print(f"[{k}/{len(every)}] {o.status:10s}{by:8s} {m.id:16s} {m.describe()}", flush=True)
            if o.status != KILLED and o.detail:
                print(f"      {o.detail}", flush=True)
    finally:
        os.environ.pop(PATCHES_ENV, None)
        if every:  # the shared build folder back on the fix, compiled
            stage(fix, BuildOptions(cpu="native", quiet=True))
        # the builds of the run's scratch series go with the run: the mutants' folder, and the
        # baseline the mutant variant's series builds beside it (19 MB each, left in the cache before)
        for m in all_manifests():
            if Path(m.data.get("patches_dir", "")) == work / "series":
                shutil.rmtree(m.lib_dir, ignore_errors=True)
        # the scratch folder too (up to 25 MB of series, jobs and logs), unless a mutant survived:
        # its logs are what someone reads next
        if any(o.status == SURVIVED for o in outcomes):
            print(f"mutate: the logs of the run are kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    # equivalent.json serves every fix of the series: a mutant of another fix is not stale
    fixes = [v for v in series.variants[1:] if series.role(v) in (FIX_ROLE, DEFINITION_ROLE)]
    known = {
        m.id
        for v in fixes
        for rel, text in apply_series(read, series.prefix(v)).items()
        if rel in files
        for m in mutants(rel, read(rel), text)
    }
    stale = sorted(set(equivalents) - known - {m.id for m in all_mutants})
    result = report.scored(
        [o.to_json() for o in outcomes],
        files=files,
        fix=fix,
        selection=selection,
        shard=args.shard,
        wall_s=time.monotonic() - t0,
    )
    report.print_summary(result, stale, EQUIVALENT_FILE.name)
    if args.json:
        atomic_write_json(args.json, result)
    return report.exit_code(result, slice_of_run=args.shard is not None)


if __name__ == "__main__":
    with sigterm_as_interrupt():
        sys.exit(main())
