"""``python -m pyllama_dflash.lab.bench``: the project's performance figures, as side-by-side ratios.

These machines are noisy, so every figure that compares two things measures both in one run,
interleaved (A, B, B, A, ...), over several rounds, and reports the median with its spread or a
bootstrap interval. Writes JSON (``--json``) and a Markdown table (``--markdown``).

Sections (``--only``):
  build     cold build of the first variant, extra cost of each further one, no-op rebuild
            (a real cold build in a temporary cache with --cold-build, ~11 min on 2 cores;
            without it, the figures recorded in the existing manifests plus a live no-op)
  matrix    the repro matrix on the tiny models, drift references included: wall time, share
            spent starting children
  overhead  text-only speculative loop, full vs baseline, tokens/s ratio with a bootstrap CI
  instructions  the same loop under callgrind: instructions per generated token, full / baseline
            (on the portable builds where they exist: valgrind cannot run every native build)
  portable  the same loop, full's portable build against its native one: tok/s ratio
  fill      the draft fill's cost, with the removal of the filled positions, for holes of
            3..1024 positions vs the image chunk's decode
  bindings  a 4096-row numpy embedding batch through the bindings vs a per-row Python loop
  batch     the bench pair's target (tiny/bench_pair.py, memory-bound here): its decode of a
            k-token batch over one token's, k = 2, 4, 8, interleaved, with bootstrap intervals
  round     the speed model's costs, on the tiny pair and the bench pair: a speculative round's
            parts (draft step, verify, process) over one plain decode, and from them the accepted
            tokens per round where drafting breaks even and the speed-up were every token accepted
  speed     the bench pair through each variant's llama-server that takes images (with its untrained
            draft, or one trained for it: --bench-pair-draft), with and without the draft side by
            side: tokens/s and time to first token per phase, with bootstrap intervals, and beside
            them the speed model's (1 + a) / c when the round section ran too; then the same
            conversations through each variant's libraries (acceptance.timed)
  acceptance  the trained draft's accepted tokens per round, by phase of a conversation with images,
            for every variant and reference (pyllama_dflash.lab.acceptance), with bootstrap intervals;
            then the same conversations through each variant's llama-server: the acceptance rate
            from its timings, and tokens/s with the draft over without, side by side
  paired    paired acceptance (pyllama_dflash.lab.acceptance.paired): the text-trained and the image-trained
            drafts of each target, images of 64, 256 and 1024 rows, every semantics judged at every
            position of the same target replies, with paired differences and bootstrap intervals
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from ... import command
from ...bootstrap import median_interval
from ...env import CACHE_ENV
from ...errors import UsageError
from ...figures import busy_warning, provenance
from ...files import atomic_write_bytes, atomic_write_json, default_file_mode
from ...flags import tool_prog
from ...harness.slotloop.models import bench_pair_models
from ...paths import cache_root, default_patches_dir
from ...product.llamabuild import BuildError, BuildOptions, build, find_built
from ...product.llamabuild.patchset import load_series
from ..acceptance.script import IMAGE_ROWS_PX
from ..draftmodel.trained import TARGET_KINDS, TRAINED_ON
from . import SectionUnavailable, stats
from .callgrind import bench_overhead_instructions
from .costs import bench_batch, bench_round
from .job import BindingsFill, FillCurve, SpecLoop, measure
from .report import markdown

SECTIONS = (
    "build",
    "matrix",
    "overhead",
    "instructions",
    "portable",
    "fill",
    "bindings",
    "batch",
    "round",
    "speed",
    "acceptance",
    "paired",
)
HOLES = (3, 6, 12, 24, 48, 96, 192, 384, 768, 1024)


def bench_build(cold: bool) -> dict:
    repo_build = [sys.executable, str(Path(__file__).resolve().parents[3] / "build.py")]
    if cold:
        # a fresh cache, the already-fetched pristine tree: the compile alone is measured
        src = build(["baseline"], BuildOptions(quiet=True))[0].data["source"]["path"]
        names = load_series(default_patches_dir()).variants  # baseline first, then each patched variant
        with tempfile.TemporaryDirectory(prefix="pyllama-dflash-coldbuild-") as tmp:
            env = {**os.environ, CACHE_ENV: tmp}
            times = {}
            for name, args in [*((v, ["--variants", v]) for v in names), ("no-op", ["--variants", "all"])]:
                t0 = time.monotonic()
                subprocess.run(
                    [*repo_build, "--llama-dir", src, "--quiet", *args], env=env, check=True, capture_output=True
                )
                times[name] = time.monotonic() - t0
        return {
            "source": "cold build in a temporary cache",
            "first_s": times[names[0]],
            "extra_s": {v: times[v] for v in names[1:]},
            "noop_s": times["no-op"],
            "ratio_second_to_first": times[names[1]] / times[names[0]] if len(names) > 1 else None,
        }
    built = {m.variant: m for m in build(["all"], BuildOptions(quiet=True))}
    t0 = time.monotonic()
    subprocess.run([*repo_build, "--variants", "all", "--quiet"], check=True, capture_output=True)
    noop = time.monotonic() - t0
    first = built["baseline"].data["timings"]["total"]
    extra = {v: m.data["timings"]["total"] for v, m in built.items() if v != "baseline"}
    return {
        "source": "timings recorded in the manifests (built " + built["baseline"].data["built_at"] + "), live no-op",
        "first_s": first,
        "extra_s": extra,
        "noop_s": noop,
        "ratio_second_to_first": next(iter(extra.values())) / first if extra else None,
    }


def bench_matrix() -> dict:
    """The matrix as repro runs it: every scenario on every variant plus its drift reference."""
    from pyllama_dflash.harness.engine.matrix import run_table
    from pyllama_dflash.harness.scenarios.catalog import SCENARIOS
    from pyllama_dflash.harness.slotloop import DEFAULT_CONFIG
    from pyllama_dflash.harness.slotloop.models import tiny_models

    variants = [m.variant for m in build(["all"], BuildOptions(quiet=True))]
    models = tiny_models()
    t0 = time.monotonic()
    table = run_table(list(SCENARIOS), variants, models, DEFAULT_CONFIG, parallel=os.cpu_count() or 2)
    wall = time.monotonic() - t0
    results = [r for row in table.values() for r in row.values()]
    child_wall = sum(r["wall_s"] for r in results)
    inside = sum(r.get("timings", {}).get("total_s", 0.0) for r in results)
    return {
        "runs": len(results),
        "references": len(table),
        "wall_s": wall,
        "child_wall_s": child_wall,
        "child_work_s": inside,
        "startup_share": (child_wall - inside) / child_wall if child_wall else None,
    }


def _ab_ratio(sides: dict[str, Callable[[], list[float]]], rounds: int) -> dict:
    """Two sides measured alternately (A B, B A, ...), each a child's tok/s samples; per round the
    ratio of their medians, second over first, then the median ratio with a bootstrap interval."""
    (first, _), (second, _) = sides.items()
    pairs, rates = [], {name: [] for name in sides}
    for r in range(rounds):
        med = {}
        for name in (first, second) if r % 2 == 0 else (second, first):
            med[name] = stats.summary(sides[name]())["median"]
            rates[name].append(med[name])
        pairs.append(med[second] / med[first])
    lo, hi = median_interval(pairs)
    return {
        "rounds": rounds,
        "ratio_median": stats.summary(pairs)["median"],
        "ratio_ci95": [lo, hi],
        "ratios": pairs,
        "tok_per_s": {name: stats.summary(x) for name, x in rates.items()},
    }


LOOP = SpecLoop(n_tokens=128, repeats=7)  # the text-only speculative loop both ratios time


def bench_overhead(rounds: int) -> dict:
    """full vs baseline on a loop with no image: interleaved child processes."""
    return _ab_ratio({v: (lambda v=v: measure(v, LOOP)["tok_per_s"]) for v in ("baseline", "full")}, rounds)


def bench_portable(rounds: int) -> dict:
    """`full`'s portable build against its native one, same loop, interleaved."""
    _require_built(["full"], "portable", "build it first: pyllama-dflash build --variants full --cpu portable")
    return _ab_ratio(
        {m: (lambda m=m: measure("full", LOOP, cpu=m)["tok_per_s"]) for m in ("native", "portable")},
        rounds,
    )


def _require_built(variants: list[str], cpu_mode: str, remedy: str) -> None:
    try:
        find_built(variants, cpu_mode=cpu_mode)
    except BuildError as e:
        raise SectionUnavailable(f"no {cpu_mode} build ({e.__class__.__name__}); {remedy}") from None


def bench_fill(repeats: int) -> dict:
    out = {
        "plain_draft": measure("full", FillCurve(HOLES, repeats=repeats)),
        "swa_draft": measure("full", FillCurve(HOLES, repeats=repeats, draft="swa")),
    }
    for curve in out.values():
        # the per-position cost as the slope of a least-squares line: steadier than any one point
        h = [p["hole"] for p in curve["points"]]
        t = [p["fill_remove_s"] for p in curve["points"]]
        slope, intercept = np.polyfit(h, t, 1)
        curve["fit"] = {"per_position_s": float(slope), "intercept_s": float(intercept)}
    return out


def bench_bindings() -> dict:
    return measure("baseline", BindingsFill(rows=4096, n_embd=(64, 2048)))


ACCEPTANCE_CONVERSATIONS = 24  # per column: intervals over conversations narrow enough to tell columns apart
# per remedy, each run four times (two servers, the library with the draft and without): under 20 minutes
SPEED_CONVERSATIONS = 6


def held_out_seeds(conversations: int) -> range:
    """The bench's conversations: the committed drafts trained on conversations 0..999 at most."""
    return range(1000, 1000 + conversations)


def bench_acceptance(conversations: int, target_kind: str, trained_on: str, image_px: int | None) -> dict:
    from pyllama_dflash.lab.acceptance.measure import measure
    from pyllama_dflash.lab.acceptance.served import measure_server
    from pyllama_dflash.lab.draftmodel.trained import trained_models

    models, seeds = trained_models(target_kind, trained_on=trained_on), held_out_seeds(conversations)
    result = measure(models, seeds, image_px=image_px)
    result["target"] = target_kind
    result["trained_on"] = trained_on
    # the same conversations, as a chat client sends them
    result["server"] = measure_server(models, seeds, image_px=image_px)
    return result


def bench_speed(conversations: int, draft: Path | None, image_px: int | None) -> dict:
    """The bench pair through each image-taking variant's llama-server, every conversation on a server
    with the draft and on one without it, side by side: tokens/s and time to first token per phase; then
    the same through the library (acceptance.timed). The draft is the bench pair's own (untrained) or
    ``draft``, one trained for it (``train --pair bench``); ``image_px``: the images' size (None: the
    corpus's drawn ones)."""
    from pyllama_dflash.files import sha256_file
    from pyllama_dflash.lab.acceptance.measure import columns
    from pyllama_dflash.lab.acceptance.served import measure_server, server_columns
    from pyllama_dflash.lab.acceptance.timed import measure_library_speed
    from pyllama_dflash.lab.draftmodel.trained import BENCH_PAIR_RECORD, bench_pair_draft_record
    from pyllama_dflash.product.upgrade.draft import reconverted_twin

    models = bench_pair_models()
    if draft is not None:
        if not draft.is_file():
            raise UsageError(f"--bench-pair-draft {draft}: no such file")
        models = replace(models, draft=draft, twin=reconverted_twin(draft, cache_root() / "bench-pair" / "twins"))
    # every remedy: the upgraded draft on b11434 (its twin), and each variant that takes an image
    cols = [c for c in server_columns(columns()) if c.images and (c.twin or c.variant != "baseline")]
    digest, recorded = sha256_file(models.draft), None  # 65 MB trained: hashed once
    if draft is not None:
        recorded = bench_pair_draft_record(digest)
        if recorded is None:
            print(
                f"bench: warning: --bench-pair-draft {draft} is not the draft {BENCH_PAIR_RECORD.name} records "
                "(training is not known to be bit-reproducible across CPUs): its figures are this draft's",
                file=sys.stderr,
                flush=True,
            )
    seeds = held_out_seeds(conversations)
    result = measure_server(models, seeds, cols, image_px=image_px)
    # the same conversations and columns through the library, each variant's own libraries in a child
    try:
        result["library"] = measure_library_speed(models, seeds, cols, image_px=image_px)
    except RuntimeError as e:  # a library child that failed: the server half, minutes of it, is kept
        result["library"] = {"error": str(e)[:2000]}
    result["draft"] = {
        "file": models.draft.name,
        "sha256": digest,
        "trained": draft is not None,
        "recorded": recorded is not None,  # the draft tests/data/trained/bench-pair.json records
    }
    return result


def bench_paired(conversations: int, targets: list[str], sizes: list[int]) -> dict:
    from pyllama_dflash.lab.acceptance.paired import measure_paired
    from pyllama_dflash.lab.draftmodel.trained import trained_models

    seeds, runs = held_out_seeds(conversations), {}
    total, t0 = len(targets) * len(TRAINED_ON) * len(sizes), time.monotonic()
    for target in targets:
        for trained_on in TRAINED_ON:
            models = trained_models(target, trained_on=trained_on)
            for rows in sizes:
                key = f"{target}/{trained_on}/{rows}"
                runs[key] = measure_paired(models, seeds, rows, log=lambda line: print(line, file=sys.stderr))
                spent = time.monotonic() - t0
                left = spent / len(runs) * (total - len(runs))
                print(f"bench: paired {key} done ({len(runs)}/{total}, about {left:.0f} s left)", file=sys.stderr)
    return {"conversations": conversations, "runs": runs}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.lab.bench"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", help=f"comma-separated sections ({', '.join(SECTIONS)}); default: all")
    ap.add_argument("--cold-build", action="store_true", help="measure a real cold build (about 11 min on 2 cores)")
    ap.add_argument("--rounds", type=int, default=16, help="interleaved rounds for the overhead ratio")
    ap.add_argument("--repeats", type=int, default=7, help="repeats per point of the fill curve")
    ap.add_argument(
        "--conversations",
        type=int,
        help=f"conversations per column (default {ACCEPTANCE_CONVERSATIONS} for acceptance and paired, "
        f"{SPEED_CONVERSATIONS} for speed: each of its conversations runs with and without the draft on two servers "
        "of the 830 MB pair and through the library)",
    )
    ap.add_argument("--target", choices=TARGET_KINDS, default="dense", help="the tiny target of the trained draft")
    ap.add_argument(
        "--trained-on",
        choices=TRAINED_ON,
        default="images",
        help="the acceptance section's draft: trained on conversations with images or on text only",
    )
    ap.add_argument(
        "--paired-targets", default="dense,moe", help="the paired section's targets (comma-separated; default both)"
    )
    ap.add_argument(
        "--rows-per-image",
        help="image sizes in rows, of 64, 256 and 1024 (comma-separated): the paired section's (default all "
        "three), or the acceptance and speed sections' one (default: the corpus's drawn images, 9 to 25 rows)",
    )
    ap.add_argument(
        "--bench-pair-draft",
        type=Path,
        metavar="GGUF",
        help="the speed section's draft: one trained for the bench pair (train --pair bench --out DIR); "
        "default: the bench pair's untrained one",
    )
    ap.add_argument(
        "--batch-target",
        type=Path,
        metavar="GGUF",
        help="the batch section's target (default: the bench pair's), e.g. the trained target padded by `vlm pad`",
    )
    ap.add_argument("--json", type=Path, default=cache_root() / "bench" / "bench.json")
    ap.add_argument("--markdown", type=Path, help="also write the Markdown table here")
    ap.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="the paired section's pictures, paired-acceptance-TARGET.svg in DIR (the plot extra: matplotlib)",
    )
    return ap


def _paired_choices(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The paired section's targets and image sizes, or the parser's error naming the flag."""
    targets = [t for t in args.paired_targets.split(",") if t]
    if not targets or any(t not in TARGET_KINDS for t in targets):
        ap.error(f"--paired-targets {args.paired_targets!r}: a comma-separated choice of {', '.join(TARGET_KINDS)}")
    if args.rows_per_image is None:
        return targets, []
    try:
        sizes = [int(x) for x in args.rows_per_image.split(",") if x]
    except ValueError:
        sizes = []
    if not sizes or any(x not in IMAGE_ROWS_PX for x in sizes):
        ap.error(f"--rows-per-image {args.rows_per_image!r}: a comma-separated choice of 64, 256, 1024")
    return targets, sizes


def _served_image_px(ap: argparse.ArgumentParser, args: argparse.Namespace, only: list[str], sizes: list[int]):
    """The acceptance and speed sections' one image size in px (None: the corpus's), or the parser's error;
    their chats with llama-server go through the openai client, which must be there."""
    served = [s for s in ("acceptance", "speed") if s in only]
    if not served:
        return None
    command.require("openai", extra="bench", command=f"bench (its sections {', '.join(served)})")
    if len(sizes) > 1:
        ap.error(f"--rows-per-image {args.rows_per_image}: the {' and '.join(served)} section takes one image size")
    return IMAGE_ROWS_PX[sizes[0]] if sizes else None


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else list(SECTIONS)
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"--only: unknown section(s) {', '.join(unknown)}")
    if args.plot:  # before the runs, not after them
        command.require("matplotlib", extra="plot", command="bench --plot")
    targets, sizes = _paired_choices(ap, args)
    one_size = _served_image_px(ap, args, only, sizes)
    if args.conversations is not None and args.conversations < 1:
        ap.error(f"--conversations {args.conversations}: at least one conversation per column")
    conversations = args.conversations or ACCEPTANCE_CONVERSATIONS
    if args.batch_target is not None and not args.batch_target.is_file():
        ap.error(f"--batch-target {args.batch_target}: no such file")

    if warning := busy_warning():
        print(f"bench: warning: {warning}", file=sys.stderr, flush=True)
    head = build(["baseline"], BuildOptions(quiet=True))[0]
    report: dict = provenance(head)
    runners = {
        "build": lambda: bench_build(args.cold_build),
        "matrix": bench_matrix,
        "overhead": lambda: bench_overhead(args.rounds),
        "instructions": bench_overhead_instructions,
        "portable": lambda: bench_portable(args.rounds),
        "fill": lambda: bench_fill(args.repeats),
        "bindings": bench_bindings,
        "batch": lambda: bench_batch(args.rounds, args.batch_target),
        "round": lambda: bench_round(args.rounds),
        "speed": lambda: bench_speed(args.conversations or SPEED_CONVERSATIONS, args.bench_pair_draft, one_size),
        "acceptance": lambda: bench_acceptance(conversations, args.target, args.trained_on, one_size),
        "paired": lambda: bench_paired(conversations, targets, sizes or list(IMAGE_ROWS_PX)),
    }
    for i, section in enumerate(only, 1):
        t0 = time.monotonic()
        print(f"bench: {section} ({i}/{len(only)}) ...", file=sys.stderr, flush=True)
        try:
            report[section] = runners[section]()
        except SectionUnavailable as e:  # one line, and the other sections still run
            report[section] = {"skipped": str(e)}
            print(f"bench: {section} cannot run here: {e}", file=sys.stderr, flush=True)
            continue
        print(f"bench: {section} done in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
    atomic_write_json(args.json, report, mode=default_file_mode())
    # the table of the record as written (its keys sorted), so that the page and a later render agree
    table = markdown(json.loads(args.json.read_text()))
    if args.markdown:
        atomic_write_bytes(args.markdown, table.encode(), mode=default_file_mode())
    if args.plot and "runs" in report.get("paired", {}):
        from pyllama_dflash.lab.acceptance.plot import plot_since_image

        for target in targets:
            path = plot_since_image(report["paired"]["runs"], target, args.plot / f"paired-acceptance-{target}.svg")
            print(f"bench: wrote {path}", file=sys.stderr)
    print(table)
    print(f"bench: JSON in {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
