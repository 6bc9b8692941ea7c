"""Builds that survive: a killed build resumes to the same bytes, a broken cache entry is rebuilt
(and never loaded), two builds at once share the work, and a variant appears whole or not at all.

These build for real, cheaply: a private one-patch series (the test-comment patch of
tests/data/test-patches, under the variant name ``survival`` so that no other test's build is
touched) in the shared build folder of the real cache, whose stage is put back to baseline
content first, so each build recompiles ``common/speculative.cpp`` and relinks (~15 s on 2 cores).
The published ``survival`` entries are removed afterwards; baseline/zero-fill/full are never
written.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import pyllama_dflash
from pyllama_dflash.files import file_lock, sha256_file
from pyllama_dflash.paths import cache_root
from pyllama_dflash.product.llamabuild import VariantNotBuilt
from pyllama_dflash.product.llamabuild import manifest as manifests
from pyllama_dflash.product.llamabuild.builder import series_tag
from pyllama_dflash.product.llamabuild.patchset import load_series
from pyllama_dflash.product.llamabuild.stage import Stage

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
VARIANT = "survival"
BUILD_TIMEOUT_S = 900

pytestmark = [pytest.mark.slow, pytest.mark.build]


# ---- helpers -------------------------------------------------------------------------------------


class Build:
    """``build.py`` for the survival variant, in its own process group, its output read as it comes."""

    def __init__(self, series: Path) -> None:
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "build.py"), "--patches", str(series), "--variants", VARIANT, "--jobs", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float = BUILD_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            assert self.proc.poll() is None or needle in self.text, f"build ended before {needle!r}:\n{self.text}"
            assert time.monotonic() < deadline, f"no {needle!r} after {timeout}s:\n{self.text}"
            time.sleep(0.02)

    def finish(self, timeout: float = BUILD_TIMEOUT_S) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        self.wall = time.monotonic() - self.t0
        return rc


def _published(env: Env) -> Path:
    """Where the private series' variant is published: beside the project's builds (its series' tag)."""
    return manifests.variants_root() / f"{VARIANT}-{env.key}-{series_tag(load_series(env.series))}"


def _outputs(lib_dir: Path) -> dict[str, str]:
    """sha256 of every library and binary a manifest lists."""
    data = json.loads((lib_dir / manifests.MANIFEST).read_text())
    names = [*data["libraries"].values(), *data["binaries"].values()]
    return {name: sha256_file(lib_dir / name) for name in names}


def _forget(key: str) -> None:
    """Remove the survival variant's published folder (and any half-published one)."""
    root = manifests.variants_root()
    for entry in root.glob(f"*{VARIANT}-{key}*"):
        shutil.rmtree(entry)


def _lock_is_held(work: Path) -> bool:
    with open(work / "lock", "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def _lock_holders(work: Path) -> list[int]:
    """The processes that have the build folder's lock file open: a killed build's orphans."""
    lock, pids = (work / "lock").resolve(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(Path(os.readlink(fd)) == lock for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""


def _lock_frees(work: Path, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while _lock_is_held(work):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass
class Env:
    series: Path
    key: str
    work: Path
    pristine: Path
    timings: dict[str, float] = field(default_factory=dict)

    def reset_stage(self) -> None:
        """Put common/speculative.cpp back to baseline content, so the next build has work to do."""
        with file_lock(self.work / "lock"):
            Stage(self.work / "llama.cpp", self.pristine).sync({}, ["common/speculative.cpp"])

    def fresh(self) -> None:
        _forget(self.key)
        self.reset_stage()


@pytest.fixture(scope="module")
def env(variants, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    series = tmp_path_factory.mktemp("survival-series")
    shutil.copy2(DATA / "test-patches" / "0001-test-comment.patch", series)
    (series / "series").write_text(f"0001-test-comment.patch {VARIANT}\n")
    base = variants["baseline"]
    key = base.data["build_key"]
    e = Env(series, key, cache_root() / "work" / key, Path(base.data["source"]["path"]))
    yield e
    _forget(key)
    for m in variants.values():  # the project's variants are still whole
        assert not m.problems(), m.problems()
    print("\nsurvival timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in e.timings.items()))


@dataclass
class CleanBuild:
    outputs: dict[str, str]
    hidden_seen: set[str]
    incomplete_seen: list[str]
    wall: float


@pytest.fixture(scope="module")
def clean(env: Env) -> CleanBuild:
    """An uninterrupted build from baseline content: the reference bytes. While it runs, the
    variants folder is watched: the final name may only ever show a complete build."""
    env.fresh()
    final = _published(env)
    build = Build(env.series)
    hidden: set[str] = set()
    incomplete: list[str] = []
    while build.proc.poll() is None:
        for entry in manifests.variants_root().iterdir():
            if entry.name.startswith(f".{final.name}-"):
                hidden.add(entry.name)
            elif entry.name == final.name:
                m = manifests.read(entry / manifests.MANIFEST)
                if m is None or m.problems():
                    incomplete.append(f"{sorted(p.name for p in entry.iterdir())}")
        time.sleep(0.005)
    assert build.finish() == 0, build.text
    env.timings["clean build"] = build.wall
    return CleanBuild(_outputs(final), hidden, incomplete, build.wall)


# ---- tests ---------------------------------------------------------------------------------------


def test_a_variant_appears_whole_under_its_name_or_not_at_all(env: Env, clean: CleanBuild) -> None:
    final = _published(env)
    assert clean.incomplete_seen == []  # never a half-written folder under the final name
    assert clean.hidden_seen, "the build was not seen publishing through a hidden temporary folder"
    # the manifest was written last: nothing in the folder is newer
    newest = max((p for p in final.iterdir() if not p.is_symlink()), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name == manifests.MANIFEST
    assert not list(final.glob(".*")), "a temporary file was left inside the variant"
    assert not list(manifests.variants_root().glob(f".{final.name}*")), "a temporary folder was left beside it"


@pytest.mark.parametrize("victim", ["process-group", "build.py-only", "build.py-sigterm"])
def test_a_build_killed_mid_compile_resumes_to_the_same_bytes(env: Env, clean: CleanBuild, victim: str) -> None:
    env.fresh()
    killed = Build(env.series)
    killed.wait_for("compile [")
    # SIGKILL: no cleanup runs. Either way the compiler it was running lives on, orphaned: ninja
    # starts each command in a process group of its own, so even killing build.py's group
    # (what a CI timeout does) leaves it, and killing build.py alone also leaves ninja.
    # SIGTERM: build.py stops as for Ctrl-C, its finally blocks run, and it kills cmake and ninja
    # on its way out; the compiles already running finish orphaned
    if victim == "process-group":
        os.killpg(killed.proc.pid, signal.SIGKILL)
    elif victim == "build.py-only":
        os.kill(killed.proc.pid, signal.SIGKILL)
    else:
        os.kill(killed.proc.pid, signal.SIGTERM)
    assert killed.finish() == (130 if victim == "build.py-sigterm" else -signal.SIGKILL), killed.text
    assert not _published(env).exists()
    # the orphans inherited the build folder's lock: until they are gone, a new build waits
    # instead of compiling into the same object files beside them. A compile may end between the kill
    # and this check, leaving no orphan and a free lock; so the lock is looked at first, then the
    # orphans: one still holding the file open after the lock was seen free is the failure
    assert _lock_is_held(env.work) or not _lock_holders(env.work), _lock_holders(env.work)
    if victim == "build.py-sigterm":
        # a build that stopped itself leaves no ninja to start more compiles
        assert not [pid for pid in _lock_holders(env.work) if _command_name(pid) in ("cmake", "ninja")]
    assert _lock_frees(env.work), "the killed build's lock was never released"

    again = Build(env.series)
    assert again.finish() == 0, again.text
    env.timings[f"resume after killing {victim}"] = again.wall
    assert "compile" in again.text and "up to date" not in again.text, again.text
    assert _outputs(_published(env)) == clean.outputs


def test_two_builds_at_once_one_builds_the_other_waits_and_reuses(env: Env, clean: CleanBuild) -> None:
    env.fresh()
    first = Build(env.series)
    first.wait_for("stage: ")  # it holds the build folder's lock from here until it has published
    second = Build(env.series)
    assert first.finish() == 0, first.text
    assert second.finish() == 0, second.text
    env.timings["two builds at once"] = max(first.wall, second.wall)
    assert "compile [" in first.text and "waiting for another build" not in first.text
    assert "waiting for another build of this folder" in second.text, second.text
    assert f"up to date ({_published(env)}), built by another process" in second.text, second.text
    assert "compile" not in second.text
    assert _outputs(_published(env)) == clean.outputs


def test_a_cache_entry_missing_a_library_is_refused_then_rebuilt(env: Env, clean: CleanBuild) -> None:
    final = _published(env)
    if not final.exists():
        assert Build(env.series).finish() == 0
    missing = final / json.loads((final / manifests.MANIFEST).read_text())["libraries"]["llama"]
    missing.unlink()

    with pytest.raises(VariantNotBuilt) as info:
        pyllama_dflash.load(VARIANT, patches_dir=env.series)
    assert f"{final.name}: {missing} is missing" in str(info.value)

    listed = subprocess.run(
        [sys.executable, str(REPO / "build.py"), "--list", "--patches", str(env.series)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith(f"{VARIANT:12s} ")]
    assert line.startswith(f"{VARIANT:12s} broken ") and line.endswith(str(final)), listed.stdout
    assert f"({missing} is missing)" in listed.stdout, listed.stdout

    rebuilt = Build(env.series)
    assert rebuilt.finish() == 0, rebuilt.text
    env.timings["rebuild of a broken entry"] = rebuilt.wall
    assert f"{VARIANT}: rebuilding ({missing} is missing)" in rebuilt.text
    assert missing.exists() and _outputs(final) == clean.outputs
    code = f"import pyllama_dflash as p; m = p.load({VARIANT!r}, patches_dir={str(env.series)!r}); print(m.lib_dir)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == str(final), loaded.stderr
