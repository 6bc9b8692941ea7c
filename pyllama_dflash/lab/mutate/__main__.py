"""``python -m pyllama_dflash.lab.mutate``: how much of the fix the harness would notice breaking.

Every mutant of the C++ lines the mutated variant (``--variant``) adds to ``common/speculative.cpp`` and to
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
the whole run's score (report.py), and refuses slices that miss a mutant or come from other runs. An
``--only`` report among them, on the same patches, is a rerun of those mutants (a survivor tried again
after a check was added): its outcomes replace the slices'.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ... import command
from ...errors import UsageError
from ...files import atomic_write_bytes, atomic_write_json
from ...flags import RetiredFlag, common_parser, tool_prog
from ...harness.slotloop.models import tiny_models
from . import report
from .plan import Plan, plan, stale
from .runner import EQUIVALENT_FILE, MUTATED_FILES, load_equivalents, write_series
from .trials import try_all


def parser() -> argparse.ArgumentParser:
    shared = common_parser("jobs", "shard", jobs=os.cpu_count() or 2)
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.lab.mutate"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    ap.add_argument(
        "--variant",
        metavar="VARIANT",
        help="the fix whose lines are mutated, judged as its role has it (default: the series' last variant)",
    )
    ap.add_argument("--fix", dest="variant", action=RetiredFlag, new="--variant", help=argparse.SUPPRESS)
    _selection_flags(ap)
    _output_flags(ap)
    return ap


def _selection_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--list", action="store_true", help="list the mutants and build nothing")
    ap.add_argument("--only", metavar="IDS", help="comma-separated mutant ids (as --list prints them)")
    ap.add_argument("--limit", type=int, help="try at most this many mutants (of the slice, with --shard)")
    ap.add_argument(
        "--files",
        help=f"comma-separated files whose added lines are mutated (default: those of {', '.join(MUTATED_FILES)} "
        "the variant changes)",
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


def _output_flags(ap: argparse.ArgumentParser) -> None:
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
        "--markdown",
        type=Path,
        metavar="PATH",
        help="write the report's tables as Markdown (docs/regression.md carries the committed run's)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="build and try nothing: add these --json reports of the slices of one run (--shard 1/N ... N/N) "
        "into its score, print it as a run does, and exit as the whole run would; an --only report of some "
        "of its mutants, on the same patches, is a rerun: its outcomes replace theirs",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.merge:
        return merge_main(args)
    p = plan(args)
    if args.write_series:
        return _write_series(p, args.write_series)
    sliced = f" (slice {args.shard} of {len(p.selection['mutants'])})" if args.shard else ""
    if args.list:
        for m in p.selected:
            print(f"{m.id:16s} {m.describe()}")
        print(f"{len(p.selected)} mutants{sliced} of {', '.join(p.files)} as variant {p.variant!r} has it")
        return 0
    try:
        equivalents = load_equivalents()
    except ValueError as e:
        raise UsageError(str(e)) from None
    t0 = time.monotonic()
    models = tiny_models()
    print(f"mutate: {len(p.selected)} mutants{sliced} of {', '.join(p.files)} ({p.variant})", flush=True)
    outcomes = try_all(p, models, equivalents, jobs=args.jobs, fuzz_examples=args.fuzz_examples)
    result = p.provenance | report.scored(
        [o.to_json() for o in outcomes],
        files=p.files,
        variant=p.variant,
        selection=p.selection,
        shard=args.shard,
        wall_s=time.monotonic() - t0,
    )
    report.print_summary(result, stale(p, equivalents), EQUIVALENT_FILE.name)
    _write(args, result)
    return report.exit_code(result, slice_of_run=args.shard is not None)


def _write_series(p: Plan, folder: Path) -> int:
    """--write-series: the one mutant selected as a series folder, for build.py, repro and fuzz."""
    if len(p.selected) != 1:
        raise UsageError(f"--write-series needs --only with one mutant id ({len(p.selected)} selected)")
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"--write-series {folder}: not empty (nothing is overwritten)")
    (m,) = p.selected
    written = write_series(m, p.own, p.series, p.variant, p.pristine, folder, p.role)
    print(f"{m.id}: {m.describe()}")
    print(f"series written to {written}; build it with: python build.py --patches {written} --variant mutant")
    return 0


def _write(args: argparse.Namespace, result: dict) -> None:
    """The report where --json and --markdown ask for it."""
    if args.json:
        atomic_write_json(args.json, result)
    if args.markdown:
        atomic_write_bytes(args.markdown, report.markdown(result).encode())


def merge_main(args: argparse.Namespace) -> int:
    try:
        merged = report.merge(report.load(args.merge))
    except ValueError as e:
        raise UsageError(f"--merge: {e}") from None
    for k, o in enumerate(merged["outcomes"], 1):
        by = f" by {o['killed_by']}" if o["killed_by"] else ""
        print(f"[{k}/{len(merged['outcomes'])}] {o['status']:10s}{by:8s} {o['id']:16s} {o['mutant']}")
    report.print_summary(merged)
    _write(args, merged)
    return report.exit_code(merged)


if __name__ == "__main__":
    sys.exit(command.run(main))
