"""``python build.py`` (``pyllama-dflash build``): build, list and check the variants of the patch series."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ... import command
from ...errors import BuildError, PatchError
from ...flags import RetiredFlag, common_parser, tool_prog
from ...paths import default_patches_dir
from ...words import Role
from . import builder, ctest, prerequisites
from . import manifest as manifests
from .patchset import CARRIED, Series, check_series, load_series, tree_reader
from .undone import asides_undone, by_pair, fixes_undone, removed_between


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("build.py"),
        description="Build llama.cpp (pinned) with each prefix of patches/series, side by side.",
        parents=[common_parser("variants", "backend", "jobs", "cpu", "patches", short=True)],
    )
    ap.add_argument(
        "--variant",
        dest="variants",
        action=RetiredFlag,
        new="--variants",
        type=lambda name: [name],
        help=argparse.SUPPRESS,
    )
    ap.add_argument("--list", action="store_true", help="list the variants and whether each is built")
    ap.add_argument(
        "--server",
        action="store_true",
        help="build llama-server too (the libraries alone are what repro, fuzz and the bindings need; the "
        "server checks, the soak and the server tests need it); incremental in the same build folder",
    )
    ap.add_argument(
        "--stage",
        metavar="NAME",
        help="leave the shared build folder holding this variant, compiled (for ctest or a debugger by "
        "hand), and print its folders; publishes nothing",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="dry-run every patch against the source, in the series and with only the prerequisites its header "
        "names; build nothing",
    )
    ap.add_argument(
        "--alone",
        action="store_true",
        help="compile each patch with only the prerequisites its header names (the libraries, llama-server "
        "where the patch touches it, the C++ tests it brings), one at a time in the shared build folder; "
        "publishes nothing",
    )
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


@command.on_interrupt("run it again to resume")
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
        server=args.server,
    )
    t0 = time.monotonic()
    if args.check:
        return _check(opts)
    if args.alone:
        return _alone(opts)
    if args.stage:
        return _stage(args.stage, opts)
    if args.list:
        return _list(opts)
    built = builder.build(args.variants or ["all"], opts)
    for m in built:
        print(f"{m.variant:12s} {m.backend:5s} {m.cpu_mode or '?':8s} {m.lib_dir}")
    print(f"done in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


def _stage(variant: str, opts: builder.BuildOptions) -> int:
    staged = builder.stage(variant, opts)
    print(f"{variant}: tree {staged.tree}")
    print(f"{variant}: build {staged.build_dir}")
    tests = "|".join(ctest.TESTS)
    print(f"run its C++ tests: ctest --test-dir {staged.ctest_dir} -L main -R '^({tests})$' --output-on-failure")
    return 0


def _check(opts: builder.BuildOptions) -> int:
    p = builder.plan(opts, log=lambda msg: None if opts.quiet else print(msg, file=sys.stderr))
    print(f"source: {p.src.path} ({p.src.route})")
    if not p.series.patches:
        print(f"{p.series.directory}/series: empty (only baseline)")
    for line in check_series(p.series, p.src.path):
        print(line)
    problems = prerequisites.check(p.series, tree_reader(p.src.path))
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print("every patch applies with only the prerequisites its header names")
    undone = by_pair(fixes_undone(tree_reader(p.src.path), p.series))
    print(f"lines a fix patch removes that an earlier fix patch added: {sum(undone.values())}")
    for (patch, added_by), n in sorted(undone.items()):
        print(f"  {patch} removes {n} of {added_by}'s")
    aside = by_pair(asides_undone(tree_reader(p.src.path), p.series))
    print(f"lines a variant aside removes of the patches it stands on (shown beside the fixes): {sum(aside.values())}")
    for (patch, added_by), n in sorted(aside.items()):
        print(f"  {patch} removes {n} of {added_by}'s")
    for since, until in _first_and_last_fix(p.series):
        floor = Counter(u.added_by for u in removed_between(tree_reader(p.src.path), p.series, since, until))
        print(
            f"lines of the patches up to {since} that {until}'s tree no longer has, a floor for any split of the "
            f"patches between: {sum(floor.values())}"
        )
        for added_by, n in sorted(floor.items()):
            print(f"  {n} of {added_by}'s")
    return 1 if problems else 0


def _first_and_last_fix(series: Series) -> list[tuple[str, str]]:
    """The chain's last variant judged as the twin and its last variant, where a later one follows it."""
    chain = [p.variant for p in series.chain if p.variant != CARRIED]
    twins = [v for v in chain if series.role(v) is Role.TWIN]
    return [(twins[-1], chain[-1])] if twins and twins[-1] != chain[-1] else []


def _alone(opts: builder.BuildOptions) -> int:
    """Each patch compiled with only its named prerequisites; exit 1 when one does not build."""
    series = load_series(opts.patches_dir or default_patches_dir())
    failed = []
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-alone-") as tmp:
        for patch in series.patches:
            chain = prerequisites.alone(series, patch)
            named = ", ".join(p.name[:4] for p in chain[:-1]) or "none"
            folder = Path(tmp) / patch.name
            t0 = time.monotonic()
            try:
                builder.stage_chain(series, chain, opts, folder)
            except (BuildError, PatchError) as e:
                failed.append(patch.name)
                print(f"{patch.name} (prerequisites: {named}): does not build: {e}", file=sys.stderr)
                continue
            what = "libraries" + (", llama-server" if builder.needs_server(chain) else "")
            tests = ctest.built_with(load_series(folder), prerequisites.ALONE)
            what += "".join(f", {t}" for t in tests)
            print(f"{patch.name} (prerequisites: {named}): builds ({what}) in {time.monotonic() - t0:.0f}s")
    return 1 if failed else 0


def _list(opts: builder.BuildOptions) -> int:
    """What the manifests say, per variant of the series and for every backend (or the one asked
    for): no source is resolved and no toolkit is needed."""
    series = load_series(opts.patches_dir or default_patches_dir())
    backend = opts.backend if opts.backend not in (None, "auto") else None
    found = [m for m in manifests.all_manifests() if backend is None or m.backend == backend]
    print(f"series: {series.directory} (variants: {', '.join(series.variants)})")
    ours = [m for m in found if not _from_elsewhere(m, series)]
    for variant in series.variants:
        builds = [m for m in ours if m.variant == variant]
        if not builds:
            print(f"{variant:12s} not built{f' for {backend}' if backend else ''}")
        for m in builds:
            print(f"{variant:12s} {_state(m, builder.series_inputs(series, variant))}")
    others = [m for m in found if m not in ours or m.variant not in series.variants]
    if others:
        print("builds of other series:")
        for m in others:
            print(f"{m.variant:12s} {_state(m, None)}")
    return 0


def _from_elsewhere(m: manifests.Manifest, series) -> bool:
    # by the series' tag, as the build folders are keyed, not by the path recorded at build time: a
    # clone of the project elsewhere shares the cache and finds the project's builds as its own
    return m.data.get("series_tag") != builder.series_tag(series)


def _state(m: manifests.Manifest, inputs: dict | None) -> str:
    problems = m.problems(inputs)
    kind = "built" if not problems else "broken" if any(x.endswith(" is missing") for x in problems) else "stale"
    has_server = "llama-server" in m.data.get("binaries", {})
    line = (
        f"{kind:7s} {m.backend:5s} {m.cpu_mode or '?':9s} {'server ' if has_server else 'no-server'} "
        f"series {m.data.get('patches_dir', '?')}  {m.lib_dir}"
    )
    return line + (f"\n{'':13s}({'; '.join(problems)})" if problems else "")


if __name__ == "__main__":
    sys.exit(command.run(main))
