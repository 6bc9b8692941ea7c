"""``python -m pyllama_dflash.harness.repro``: the scenario matrix across every variant of the series.

With no flag it runs on the tiny generated models (no download) against every variant,
building what is not built yet: every drafter of the DFlash family on the dense target, and the
image scenarios on the MoE target too. It prints a table per drafter and target (scenarios down,
variants across) and exits 0 when the must-pass variant passes every scenario of every table. See
``--help`` for real models and the JSON report.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from ... import command
from ...files import atomic_write_bytes, atomic_write_json
from ...flags import common_parser, export, tool_prog
from ..engine import ctest_row
from ..scenarios.catalog import SCENARIOS
from ..slotloop.config import DEFAULT_CONFIG
from . import plan as planning
from . import tables, verdict
from .replay import replay_schedule
from .report import (
    compact_record,
    format_siblings,
    json_report,
    markdown,
    print_matrix,
    print_server,
    print_summary,
)


def parser() -> argparse.ArgumentParser:
    picked = "variants must_pass jobs timeout backend cpu drafters targets patches".split()
    shared = common_parser(*picked, jobs=os.cpu_count() or 2, timeout=300.0)
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.harness.repro"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    _run_flags(ap)  # what runs, what is required of it, what is written
    _check_flags(ap)  # the checks beside the scenarios, each skipped or added by its flag
    _real_model_flags(ap)
    return ap


def _run_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--scenarios", help="comma-separated scenario ids (default: all)")
    ap.add_argument(
        "--expect-baseline-fail",
        action="store_true",
        help="also require baseline to fail S1 (proves the harness still reproduces the bug)",
    )
    ap.add_argument(
        "--check-expected",
        action="store_true",
        help="also require every variant to do what is expected of it (scenarios.catalog.expectations: the "
        "table for the series' named variants, the fix's bar for any other)",
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="write the full report as JSON")
    ap.add_argument(
        "--markdown", type=Path, metavar="PATH", help="also write the tables as docs/scenarios.md shows them"
    )
    ap.add_argument(
        "--record",
        type=Path,
        metavar="PATH",
        help="write the compact record the tables are written from (docs/figures/repro.json)",
    )
    ap.add_argument(
        "--detail",
        action="store_true",
        help="print every drafter's and target's table in full, with its first failures (default: the "
        "first in full, then every drafter of a target side by side)",
    )
    ap.add_argument("--no-build", action="store_true", help="use what is built; fail for a variant that is not")


def _check_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-exact", action="store_true", help="skip the greedy-reference comparison of the output")
    ap.add_argument(
        "--no-drift",
        action="store_true",
        help="skip the drift oracle: the reference runs of each scenario on baseline with the draft's "
        "reconverted twin, and the round-by-round comparison of drafted tokens with them",
    )
    ap.add_argument(
        "--no-ctest",
        action="store_true",
        help="skip row C1: the series' C++ regression test under ctest, per variant",
    )
    ap.add_argument(
        "--schedule",
        type=Path,
        metavar="FILE",
        help="replay a schedule file (as python -m pyllama_dflash.harness.fuzz writes) instead of the scenarios",
    )
    ap.add_argument(
        "--server",
        action="store_true",
        help='also run the llama-server checks (HTTP codes, exactness) per variant, under "server"',
    )
    ap.add_argument(
        "--siblings",
        action="store_true",
        help="also measure the sibling drafters that keep a memory of the conversation, draft-mtp (the "
        "target's own MTP head) and draft-eagle3, on the image scenarios: a table of measurements, under "
        '"siblings" (with --server, their llama-server checks too, under "server_siblings")',
    )


def _real_model_flags(ap: argparse.ArgumentParser) -> None:
    real = ap.add_argument_group("real models (instead of the tiny generated ones)")
    real.add_argument("--target", type=Path, help="target GGUF (an M-RoPE model with an mmproj, Qwen3.5-style)")
    real.add_argument(
        "--draft",
        type=Path,
        help="DFlash draft GGUF; alone, it replaces the tiny plain draft (its reconverted twin, "
        "the drift reference, is made by pyllama_dflash.product.upgrade into the cache)",
    )
    real.add_argument("--mmproj", type=Path, help="multimodal projector GGUF")
    real.add_argument("--image", type=Path, action="append", help="an image file (PNG/JPEG); repeat for a second")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers to offload (needs a CUDA build)")
    real.add_argument(
        "--n-batch",
        type=int,
        help=f"target n_batch (default {DEFAULT_CONFIG.n_batch} tiny, {planning.REAL_N_BATCH} real)",
    )
    ap.add_argument("--draft-n-batch", type=int, help="the draft context's n_batch (default: the target's)")
    ap.add_argument(
        "--draft-n-ubatch", type=int, help="the draft context's n_ubatch (default: its n_batch, else the target's)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.command_line = shlex.join(["pyllama-dflash", "repro", *argv])  # what a --json record says ran it
    export(args)  # --cpu and --patches: for the lookups here and in every child process
    t0 = time.monotonic()
    manifests = planning.manifests(args)
    must_pass = planning.must_pass_of(args, [m.variant for m in manifests])
    plan = planning.Plan(manifests, must_pass, *planning.models_and_config(args))
    if args.schedule:
        return replay_schedule(args, plan)
    scenarios = planning.scenario_ids(args)
    matrix = tables.run_matrix(args, plan, planning.cases(args, plan.models, scenarios, plan.variants), scenarios)
    print_matrix(matrix, {**SCENARIOS, ctest_row.ROW: ctest_row.TITLE}, detail=args.detail)
    reasons = verdict.matrix_problems(matrix, must_pass, args.expect_baseline_fail, args.check_expected)
    server = family = siblings = None
    if args.server:
        server, family = tables.run_server(args, plan, matrix.cases)
        print_server(server, family, plan.variants)
        reasons += verdict.server_problems(server, family)
    if args.siblings:
        siblings = tables.run_siblings(args, plan)
        print(format_siblings(siblings.tables, plan.variants, SCENARIOS))
        if args.server:
            siblings.server = tables.run_siblings_server(plan, siblings)
            print_server(siblings.server, None, plan.variants, measured=True)
    wall, ok = time.monotonic() - t0, not reasons
    print_summary(matrix, reasons, must_pass, wall)
    if args.json or args.markdown or args.record:
        report = json_report(plan, matrix, args, server, family, siblings, ok, wall)
        if args.json:
            atomic_write_json(args.json, report)
        if args.record:
            atomic_write_json(args.record, compact_record(report))
        if args.markdown:
            atomic_write_bytes(args.markdown, markdown(report).encode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(command.run(main))
