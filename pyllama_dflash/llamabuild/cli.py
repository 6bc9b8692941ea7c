"""``python build.py``: build, list and check the variants of the patch series."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import BuildError
from ..flags import common_parser, tool_prog
from . import builder, ctest
from . import manifest as manifests
from .patchset import check_series


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("build.py"),
        description="Build llama.cpp (pinned) with each prefix of patches/series, side by side.",
        parents=[common_parser("backend", "jobs", "cpu", "patches", short=True)],
    )
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME",
        help="baseline, a variant named in patches/series, or all (default: all); repeatable",
    )
    ap.add_argument("--list", action="store_true", help="list the variants and whether each is built")
    ap.add_argument(
        "--stage",
        metavar="NAME",
        help="leave the shared build folder holding this variant, compiled (for ctest or a debugger by "
        "hand), and print its folders; publishes nothing",
    )
    ap.add_argument("--check", action="store_true", help="dry-run every patch against the source, build nothing")
    ap.add_argument("--cuda-arch", metavar="ARCHS", help="CMAKE_CUDA_ARCHITECTURES for a CUDA build, e.g. 90")
    ap.add_argument(
        "--llama-dir",
        type=Path,
        metavar="PATH",
        help="use this llama.cpp tree (default: $LLAMA_CPP_DIR, vendor/llama.cpp, or the pinned sdist)",
    )
    ap.add_argument("--allow-unpinned", action="store_true", help="accept a tree that is not the pinned release")
    ap.add_argument("--quiet", "-q", action="store_true", help="print only errors and the result")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    opts = builder.BuildOptions(
        llama_dir=args.llama_dir,
        allow_unpinned=args.allow_unpinned,
        backend=args.backend,
        cuda_arch=args.cuda_arch,
        cpu=args.cpu,
        jobs=args.jobs,
        patches_dir=args.patches,
        quiet=args.quiet,
    )
    t0 = time.monotonic()
    try:
        if args.check:
            return _check(opts)
        if args.stage:
            return _stage(args.stage, opts)
        if args.list:
            return _list(opts)
        built = builder.build(args.variant or ["all"], opts)
    except BuildError as e:
        print(f"build.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("build.py: interrupted; run it again to resume", file=sys.stderr)
        return 130
    for m in built:
        print(f"{m.variant:12s} {m.backend:5s} {m.cpu_mode or '?':8s} {m.lib_dir}")
    print(f"done in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


def _stage(variant: str, opts: builder.BuildOptions) -> int:
    staged = builder.stage(variant, opts)
    print(f"{variant}: tree {staged.tree}")
    print(f"{variant}: build {staged.build_dir}")
    print(f"run its C++ test: ctest --test-dir {staged.ctest_dir} -L main -R {ctest.TEST} --output-on-failure")
    return 0


def _check(opts: builder.BuildOptions) -> int:
    p = builder.plan(opts, log=lambda msg: None if opts.quiet else print(msg, file=sys.stderr))
    print(f"source: {p.src.path} ({p.src.route})")
    if not p.series.patches:
        print(f"{p.series.directory}/series: empty (only baseline)")
    for line in check_series(p.series, p.src.path):
        print(line)
    return 0


def _list(opts: builder.BuildOptions) -> int:
    p = builder.plan(opts, log=lambda msg: None)
    features = f" ({', '.join(p.tc.cpu_features)})" if p.tc.cpu_features else ""
    print(
        f"source: {p.src.path} ({p.src.route}); backend {p.tc.backend}; cpu {p.tc.cpu}{features}; "
        f"build key {p.build_key}"
    )
    for variant in p.series.variants:
        m = p.manifest(variant)
        found = manifests.read(p.variant_dir(variant) / manifests.MANIFEST)
        if m is not None:
            state = f"built     {m.lib_dir}"
        elif found is not None:
            problems = found.problems(p.inputs(variant))
            kind = "broken" if any(x.endswith(" is missing") for x in problems) else "stale"
            state = f"{kind:9s} ({'; '.join(problems)})"
        elif (p.variant_dir(variant) / "manifest.json").exists():
            state = "broken    (unreadable manifest.json)"
        else:
            state = "not built"
        print(f"{variant:12s} {state}")
    return 0
