"""Building variants: stage the patched tree, compile incrementally, publish the outputs.

One build folder per (source fingerprint, backend, CMake arguments) is shared by all
variants: switching from one variant to the next rewrites only the files the patches
touch, so ninja recompiles those and relinks what depends on them. Each variant's
outputs are then copied into a folder of its own with a manifest, which makes a
repeated build a no-op and lets any number of variants sit side by side.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...errors import BuildError
from ...files import (
    atomic_write_bytes,
    atomic_write_json,
    file_lock,
    replace_dir,
    sha256_bytes,
    stable_hash,
)
from ...paths import NATIVE_DIR, cache_root, default_patches_dir, package_patches_dir
from . import ctest, pinned, prerequisites, source, toolchain
from . import manifest as manifests
from .cmake import run_logged
from .patchset import Patch, Series, apply_series, load_series, tree_reader
from .progress import Progress
from .stage import Stage

NATIVE_FILES = ("CMakeLists.txt", "shim.cpp", "pyllama_dflash_shim.h")
TARGETS = ("pyllama_dflash_shim",)  # the libraries and the shim: what the bindings load
SERVER = "llama-server"  # built on request (BuildOptions.server): a fifth of a cold build
LIBRARIES = ("llama", "ggml", "ggml-base", "ggml-cpu", "mtmd", "llama-common", "pyllama_dflash_shim")


@dataclass
class BuildOptions:
    llama_dir: Path | None = None
    allow_unpinned: bool = False
    backend: str | None = None
    cuda_arch: str | None = None
    cpu: str | None = None  # native | avx2 | portable (default: $PYLLAMA_DFLASH_CPU, else native)
    jobs: int | None = None
    patches_dir: Path | None = None
    quiet: bool = False
    server: bool = False  # build llama-server too (incrementally, in the same build folder)
    extra: dict = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def native_hash() -> str:
    """Hash of the native sources and bindings (read once per process: every manifest check needs it)."""
    return _native_hash_now()


def _native_hash_now() -> str:
    from pyllama_dflash.product.bindings import ffibuild  # imported late: the bindings import cffi

    parts = [(NATIVE_DIR / "CMakeLists.txt").read_bytes(), ffibuild.source_hash().encode()]
    return sha256_bytes(b"\0".join(parts))


def series_tag(series: Series) -> str | None:
    """A series' identity in its builds' folder names: None for the project's own series, else a short
    hash of its folder. A variant of another folder (a fork's series, a mutant's) is then published
    beside the project's variant of the same name, never over it."""
    where = Path(series.directory).resolve()
    if where == package_patches_dir().resolve():
        return None
    return "s" + sha256_bytes(str(where).encode())[:8]


def series_inputs(series: Series, variant: str) -> dict:
    """What a build of ``variant`` is made from, besides the source and toolchain: its patches
    and the native sources."""
    return {
        "patches": [{"name": p.name, "sha256": p.sha256} for p in series.prefix(variant)],
        "native": native_hash(),
    }


def expected_inputs(variant: str, patches_dir: Path | None = None) -> dict:
    """What a usable build of ``variant`` must have been built from, as far as the package can
    tell without resolving the source: the current patches and native sources."""
    return series_inputs(load_series(patches_dir or default_patches_dir()), variant)


@dataclass
class Plan:
    """Everything that decides what a build of a variant is, computed without building."""

    src: source.SourceTree
    series: Series
    tc: toolchain.Toolchain
    build_key: str

    @property
    def work_dir(self) -> Path:
        return cache_root() / "work" / self.build_key

    def variant_dir(self, variant: str) -> Path:
        tag = series_tag(self.series)
        return manifests.variants_root() / f"{variant}-{self.build_key}{f'-{tag}' if tag else ''}"

    def inputs(self, variant: str) -> dict:
        return {**series_inputs(self.series, variant), "build_key": self.build_key}

    def manifest(self, variant: str, server: bool = False) -> manifests.Manifest | None:
        """The published build of ``variant`` if it is usable (and holds llama-server, if asked)."""
        m = manifests.read(self.variant_dir(variant) / manifests.MANIFEST)
        if m is None or m.problems(self.inputs(variant)) or (server and not m.has_binary(SERVER)):
            return None
        return m


def plan(opts: BuildOptions, log=print, series: Series | None = None) -> Plan:
    tc = toolchain.select(opts.backend, opts.cuda_arch, opts.cpu)  # first: a missing toolkit needs no download
    series = series or load_series(opts.patches_dir or default_patches_dir())
    src = source.resolve(opts.llama_dir, allow_unpinned=opts.allow_unpinned, log=log)
    key_src = {"fingerprint": src.fingerprint, "pinned": src.pinned}
    if not src.pinned:
        key_src["path"] = str(src.path)  # two unpinned trees may share the fingerprinted files
    return Plan(src, series, tc, stable_hash({"source": key_src, "toolchain": tc.key()}))


def resolve_variants(series: Series, names: list[str]) -> list[str]:
    if not names or names == ["all"]:
        return series.variants
    for name in names:
        series.prefix(name)  # raises PatchError for unknown names
    return names


def find_built(
    variants: list[str],
    *,
    backend: str | None = None,
    patches_dir: Path | None = None,
    cpu_mode: str | None = None,
    server: bool = False,
) -> list[manifests.Manifest]:
    """The built variants (``["all"]``: every one of the series), found through their manifests
    alone: nothing is resolved, fetched or built. A build whose patches or native sources changed
    since is refused as stale, and with ``server`` one without llama-server (:class:`VariantNotBuilt`
    says how to build it)."""
    series = load_series(patches_dir or default_patches_dir())
    binaries = (SERVER,) if server else ()
    return [
        manifests.find(
            v,
            backend=backend,
            expected_inputs=series_inputs(series, v),
            cpu_mode=cpu_mode,
            binaries=binaries,
            series_tag=series_tag(series),
        )
        for v in resolve_variants(series, variants)
    ]


def build(variants: list[str], opts: BuildOptions | None = None) -> list[manifests.Manifest]:
    """Build the named variants (``["all"]`` for every one); returns their manifests."""
    opts = opts or BuildOptions()
    # a misspelt variant fails here, before the source is resolved (and perhaps fetched)
    series = load_series(opts.patches_dir or default_patches_dir())
    names = resolve_variants(series, variants)
    progress0 = Progress("build", quiet=opts.quiet)
    progress0.stage("verify", "resolving the llama.cpp source")
    p = plan(opts, log=progress0.say, series=series)
    progress0.say(f"source: {p.src.path} ({p.src.route}, {'pinned ' + pinned.RELEASE if p.src.pinned else 'UNPINNED'})")
    progress0.say(f"backend: {p.tc.backend}; build folder {p.work_dir}")
    results = []
    for variant in names:
        existing = p.manifest(variant, opts.server)
        if existing is not None:
            progress0.say(f"{variant}: up to date ({existing.lib_dir})")
            results.append(existing)
            continue
        broken = manifests.read(p.variant_dir(variant) / manifests.MANIFEST)
        if broken is not None:
            why = broken.problems(p.inputs(variant)) or [f"{SERVER} asked for"]
            progress0.say(f"{variant}: rebuilding ({'; '.join(why)})")
        results.append(_build_one(p, variant, opts))
    return results


@dataclass(frozen=True)
class Staged:
    """The shared build folder, left holding one variant: its patched tree and its build."""

    variant: str
    tree: Path
    build_dir: Path

    @property
    def ctest_dir(self) -> Path:
        """Where upstream's ctest registrations land (llama.cpp is a subproject of native/)."""
        return self.build_dir / "llama.cpp"


def stage(variant: str, opts: BuildOptions | None = None) -> Staged:
    """Leave the shared build folder holding ``variant``, compiled, for work by hand (ctest, a
    debugger), whether or not its published build is up to date; nothing is published. Another build
    may stage the folder anew once this returns: what must find the variant there runs inside
    :func:`holding_stage`."""
    with holding_stage(variant, opts) as staged:
        return staged


@contextmanager
def holding_stage(variant: str, opts: BuildOptions | None = None) -> Iterator[Staged]:
    """:func:`stage`, with the shared build folder's lock held until the block ends, so that no other build
    stages the folder anew under the tests the block runs on it."""
    opts = opts or BuildOptions()
    series = load_series(opts.patches_dir or default_patches_dir())
    resolve_variants(series, [variant])
    p = plan(opts, log=Progress("stage", quiet=opts.quiet).say, series=series)
    progress = Progress(variant, quiet=opts.quiet)
    with _folder_lock(p, progress) as lock_fd:
        _build_locked(p, variant, opts, progress, lock_fd, publish=False)
        yield Staged(variant, p.work_dir / "llama.cpp", p.work_dir / "build")


def needs_server(chain: tuple[Patch, ...]) -> bool:
    """Whether a chain of patches touches llama-server's tree (its sources or its tests), so that a build of
    it builds llama-server too."""
    return any(path.startswith("tools/server/") for p in chain for path in p.touched)


def stage_chain(series: Series, chain: tuple[Patch, ...], opts: BuildOptions, folder: Path) -> Staged:
    """``chain`` (patches of ``series``) alone on the pristine tree, written as a series folder in ``folder``
    and compiled in the shared build folder, llama-server too where :func:`needs_server`; nothing is
    published (``build --alone``)."""
    with holding_chain(series, chain, opts, folder) as staged:
        return staged


@contextmanager
def holding_chain(series: Series, chain: tuple[Patch, ...], opts: BuildOptions, folder: Path) -> Iterator[Staged]:
    """:func:`stage_chain`, the folder's lock held until the block ends (one side of a pull request, whose
    tests run on the folder)."""
    written = prerequisites.alone_series(series, chain, folder)
    with holding_stage(
        prerequisites.ALONE, replace(opts, patches_dir=written, server=needs_server(chain), quiet=True)
    ) as staged:
        yield staged


def _build_one(p: Plan, variant: str, opts: BuildOptions, publish: bool = True) -> manifests.Manifest | None:
    """Stage, configure and compile ``variant`` in the shared build folder, under its lock, then publish
    it (unless ``publish`` is false: the folder is then left holding it); its manifest."""
    progress = Progress(variant, quiet=opts.quiet)
    with _folder_lock(p, progress) as lock_fd:
        return _build_locked(p, variant, opts, progress, lock_fd, publish)


def _folder_lock(p: Plan, progress: Progress):
    """The shared build folder's lock (files.file_lock): one build, or one holder of a stage, at a time."""
    return file_lock(p.work_dir / "lock", on_wait=lambda: progress.say("waiting for another build of this folder"))


def _build_locked(
    p: Plan, variant: str, opts: BuildOptions, progress: Progress, lock_fd: int, publish: bool
) -> manifests.Manifest | None:
    """:func:`_build_one`'s work, the folder's lock held (``lock_fd``, which the compilers hold too)."""
    existing = p.manifest(variant, opts.server) if publish else None  # built by whoever held the lock before us
    if existing is not None:
        progress.say(f"up to date ({existing.lib_dir}), built by another process")
        return existing
    built = _Built(variant, *_stage_tree(p, variant, progress))
    built.configure_args = _configure(p, built.stage, progress, lock_fd)
    built.tests = _compile(p, variant, opts, progress, lock_fd)
    if not publish:
        progress.finish()
        return None
    return _publish(p, built, opts, progress)


@dataclass
class _Built:
    """What a build of one variant did, for its manifest."""

    variant: str
    stage: Stage
    files_rewritten: list[str]
    configure_args: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)  # the series' C++ tests built with it


def _stage_tree(p: Plan, variant: str, progress: Progress) -> tuple[Stage, list[str]]:
    """The staged tree made the variant's, file by file: the stage and the files rewritten."""
    progress.stage("stage", f"{len(p.series.prefix(variant))} patch(es)")
    stage = Stage(p.work_dir / "llama.cpp", p.src.path, p.src.record)
    stage.ensure(progress.say)
    contents = apply_series(tree_reader(p.src.path), p.series.prefix(variant))
    changed = stage.sync(contents, p.series.touched)
    changed += _sync_native(p.work_dir / "native")
    progress.say(f"files rewritten: {', '.join(changed) if changed else 'none'}")
    return stage, changed


def _configure(p: Plan, stage: Stage, progress: Progress, lock_fd: int) -> list[str]:
    """cmake's configure, when its arguments changed since the last (or never ran); the arguments."""
    work = p.work_dir
    build_dir = work / "build"
    args = toolchain.cmake_configure_args(
        p.tc,
        stage.root,
        pinned.BUILD_NUMBER if p.src.pinned else None,
        pinned.COMMIT if p.src.pinned else None,
    )
    if _needs_configure(build_dir, args):
        progress.stage("configure")
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        run_logged(
            ["cmake", "-S", str(work / "native"), "-B", str(build_dir), *args],
            work / "build.log",
            progress,
            "configure",
            keep_fds=(lock_fd,),
        )
        atomic_write_json(build_dir / "pyllama-dflash-configure.json", args)
    return args


def _compile(p: Plan, variant: str, opts: BuildOptions, progress: Progress, lock_fd: int) -> bool:
    """The libraries (and llama-server, and the series' C++ tests the variant has); the tests built."""
    progress.stage("compile")
    jobs = opts.jobs or os.cpu_count() or 2
    tests = ctest.built_with(p.series, variant)
    targets = (*TARGETS, *((SERVER,) if opts.server else ()), *tests)
    # the compilers inherit the lock: if this process is killed alone, the next build
    # waits for them instead of running a second ninja in the same folder
    run_logged(
        ["cmake", "--build", str(p.work_dir / "build"), "--target", *targets, "-j", str(jobs)],
        p.work_dir / "build.log",
        progress,
        "compile",
        keep_fds=(lock_fd,),
    )
    return tests


def _publish(p: Plan, built: _Built, opts: BuildOptions, progress: Progress) -> manifests.Manifest:
    """The outputs, the C++ test and the bindings in a folder of the variant's own, its manifest last,
    swapped in for the previous build at once."""
    progress.stage("publish")
    variant, build_dir = built.variant, p.work_dir / "build"
    final = p.variant_dir(variant)
    final.parent.mkdir(parents=True, exist_ok=True)
    for pattern in (f".{final.name}-*", f".{final.name}.old-*"):
        for dead in final.parent.glob(pattern):
            shutil.rmtree(dead, ignore_errors=True)  # a killed publish's; only a lock holder makes them
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        files = _collect_outputs(build_dir / "bin", tmp, server=opts.server)
        tests = ctest.publish(build_dir, tmp, built.tests)
        for entry in tests:
            files["binaries"][entry["test"]] = entry["binary"]
        progress.stage("bindings")
        from pyllama_dflash.product.bindings import ffibuild

        module = ffibuild.compile_module(tmp, include_dirs(built.stage.root), tmp, p.work_dir / "ffi-tmp")
        if _native_hash_now() != p.inputs(variant)["native"]:
            # the manifest would pair the hash read at the start with binaries of later sources
            raise BuildError(
                f"the native sources or bindings ({NATIVE_DIR}) changed while {variant} was building; "
                "nothing was published: run the build again"
            )
        timings = progress.finish()
        data = _manifest_data(p, built, files, tests, module.name, timings)
        atomic_write_json(tmp / manifests.MANIFEST, data)  # last: its presence means "complete"
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress.say(f"built in {timings['total']:.1f}s -> {final}")
    m = manifests.read(final / manifests.MANIFEST)
    assert m is not None
    return m


def _manifest_data(p: Plan, built: _Built, files: dict, tests: list[dict], bindings: str, timings: dict) -> dict:
    variant = built.variant
    return {
        "schema": manifests.SCHEMA,
        "variant": variant,
        "build_key": p.build_key,
        "inputs": p.inputs(variant),
        "source": p.src.to_json(),
        "patches_dir": str(p.series.directory),
        "series_tag": series_tag(p.series),
        "patches": [{"name": x.name, "sha256": x.sha256, "files": x.touched} for x in p.series.prefix(variant)],
        "backend": p.tc.backend,
        "cuda_arch": p.tc.cuda_arch,
        "cpu": {"mode": p.tc.cpu, "features": list(p.tc.cpu_features)},
        "cmake_args": list(p.tc.cmake_args),
        "configure_args": built.configure_args,
        "libraries": files["libraries"],
        "binaries": files["binaries"],
        "ctest": tests,
        "bindings": bindings,
        "include_dirs": [str(d) for d in include_dirs(built.stage.root)],
        "files_rewritten": built.files_rewritten,
        "timings": timings,
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "system": platform.system(), "cpus": os.cpu_count()},
    }


def include_dirs(tree: Path) -> list[Path]:
    return [
        tree / "include",
        tree / "ggml" / "include",
        tree / "tools" / "mtmd",
        tree / "common",
        tree / "src",
        NATIVE_DIR,
    ]


def _sync_native(dest: Path) -> list[str]:
    """Copy the project's native sources into the build folder, rewriting only what changed
    (the build folder must not depend on where this checkout lives)."""
    changed = []
    for name in NATIVE_FILES:
        src = NATIVE_DIR / name
        if not src.is_file():
            raise BuildError(f"{src}: missing from the package")
        data = src.read_bytes()
        out = dest / name
        if not out.is_file() or out.read_bytes() != data:
            atomic_write_bytes(out, data)
            changed.append(f"native/{name}")
    return changed


def _needs_configure(build_dir: Path, args: list[str]) -> bool:
    if not (build_dir / "CMakeCache.txt").is_file():
        return True
    if not any((build_dir / f).is_file() for f in ("build.ninja", "Makefile")):
        return True
    try:
        return json.loads((build_dir / "pyllama-dflash-configure.json").read_text()) != args
    except (FileNotFoundError, ValueError):
        return True


def _collect_outputs(bin_dir: Path, dest: Path, server: bool) -> dict:
    """Copy the shared libraries (with their soname links), and llama-server when it was built in this
    build (an older one in the folder belongs to whichever variant last built it), into ``dest``."""
    libraries: dict[str, str] = {}
    for entry in sorted(bin_dir.iterdir()):
        if ".so" not in entry.name or not entry.name.startswith("lib"):
            continue
        target = dest / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        else:
            shutil.copy2(entry, target)
        stem = entry.name[3:].split(".so")[0]
        if entry.name == f"lib{stem}.so":
            libraries[stem] = entry.name
    missing = [lib for lib in LIBRARIES if lib not in libraries]
    if missing:
        raise BuildError(f"{bin_dir}: expected libraries not built: {', '.join('lib' + m + '.so' for m in missing)}")
    if not server:
        return {"libraries": libraries, "binaries": {}}
    binary = bin_dir / SERVER
    if not binary.is_file():
        raise BuildError(f"{binary}: not built")
    shutil.copy2(binary, dest / binary.name)
    return {"libraries": libraries, "binaries": {SERVER: binary.name}}
