"""``pyllama-dflash pulls``: each pull request of ``patches/pulls`` on b11434, its tests run without its fix
and with it.

For a request with tests, two builds in the shared build folder (nothing is published): the fixes' named
prerequisites and the test patches, then the same with the fixes. On each, the C++ tests run under ctest,
and the tests of llama-server's kind through upstream's own harness over that build's llama-server. The
request is proven when every kind of test fails on the first (FAIL or DRIFT: a call failed, or drafts
differ) and passes on the second (PASS, or TIE where the C++ test proves a tie broken by the cells'
order). A request without a test is listed, not judged. Exit 1 when a judged request is not proven.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ... import command
from ...figures import provenance
from ...files import atomic_write_json
from ...flags import common_parser, pick, tool_prog
from ...harness.engine.pull_check import build_and_test
from ...harness.slotloop.record import DRIFT, FAIL, PASS, TIE
from ...paths import default_patches_dir
from ...product.llamabuild import builder
from ...product.llamabuild.patchset import load_series
from ...product.llamabuild.pulls import Pull, load_pulls, with_fix, without
from ...words import PullVerdict
from . import report

FAILS = (FAIL, DRIFT)  # the test's cells that show a defect
PASSES = (PASS, TIE)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.lab.pulls"),
        description=__doc__.split("\n\n")[0],
        parents=[common_parser("cpu", "jobs", "patches")],
    )
    ap.add_argument("--only", metavar="NAMES", help="these requests only (comma-separated; default: all)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write the record here (docs/figures/pulls.json)")
    ap.add_argument("--markdown", type=Path, metavar="RECORD", help="print a record's tables; run nothing")
    return ap


@command.on_interrupt("nothing was published; the shared build folder holds the last side built")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.markdown:
        print(report.markdown(json.loads(args.markdown.read_text())), end="")
        return 0
    series = load_series(args.patches or default_patches_dir())
    pulls = load_pulls(series)
    chosen = pick(args.only, [p.name for p in pulls], "--only")
    if any(p.server_tests for p in pulls if p.name in chosen):  # llama-server's harness runs them
        for module in ("pytest", "requests", "wget"):
            command.require(module, extra="test", command="pyllama-dflash pulls")
    opts = builder.BuildOptions(cpu=args.cpu, jobs=args.jobs, patches_dir=args.patches, quiet=True)
    (base,) = builder.build(["baseline"], opts)
    record = {**provenance(base), "command": " ".join(["pyllama-dflash pulls", *(argv or [])]), "pulls": []}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-pulls-") as tmp:
        for pull in (p for p in pulls if p.name in chosen):
            entry = _judge(series, pull, opts, Path(tmp) / pull.name)
            record["pulls"].append(entry)
            print(report.line(entry), flush=True)
    if args.json:
        atomic_write_json(args.json, record)
    return 1 if any(e["verdict"] == PullVerdict.NOT_PROVEN for e in record["pulls"]) else 0


def _judge(series, pull: Pull, opts: builder.BuildOptions, folder: Path) -> dict:
    """The request's entry: its patches, and each side's build and tests where it has tests."""
    tests = {p.name for p in pull.tests}
    entry = {
        "name": pull.name,
        "fixes": [p.name for p in pull.fixes],
        "subjects": [report.subject(series.directory / p.name) for p in pull.fixes],
        "test_patches": sorted(tests),
        "tests": pull.test_names + pull.server_tests,
        "prerequisites": [p.name[:4] for p in without(series, pull) if p.name not in tests],
    }
    if not pull.tests:
        return {**entry, "verdict": PullVerdict.NO_TEST}
    for side, chain in (("without", without(series, pull)), ("with", with_fix(series, pull))):
        entry[side] = build_and_test(series, chain, pull.test_names, pull.server_tests, opts, folder / side)
    fails = all(cell["status"] in FAILS for cell in report.cells(entry["without"]))
    passes = all(cell["status"] in PASSES for cell in report.cells(entry["with"]))
    return {**entry, "verdict": PullVerdict.PROVEN if fails and passes else PullVerdict.NOT_PROVEN}


if __name__ == "__main__":
    sys.exit(command.run(main))
