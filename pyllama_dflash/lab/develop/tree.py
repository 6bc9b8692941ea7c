"""``develop``: a git work tree of the pinned llama.cpp source, one commit per patch of a variant.

The tree is a copy: every file is a new file (never a hard link or a symlink into the source
cache), so nothing done in it can reach the pristine tree the builds read. The first commit
(tagged ``pristine``) holds the pristine tree; each commit above it is one patch of the variant,
in the order the build applies them (the variant's own patches, then the ``*`` patches), with the
content the build stages (patchset.apply_file_patch) and the patch's message and author. What
write-back needs to know (the base commit, the variant, the series folder and each patch's
sha256) is kept in ``.git/pyllama-dflash-develop.json``, outside the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...files import atomic_write_json, sha256_file
from ...paths import default_patches_dir
from ...product.llamabuild import pinned
from ...product.llamabuild.patchset import Patch, Series, apply_file_patch, load_series, tree_reader
from ...product.llamabuild.source import resolve
from . import mailpatch
from .git import DevelopError, git

META = "pyllama-dflash-develop.json"  # in the work tree's git folder
TAG = "pristine"
IDENTITY = ("pyllama-dflash", "pyllama-dflash@users.noreply.invalid")  # the base commit's author
_SKIP = {".git"}  # a vendored submodule's .git file or folder is not part of the source

Log = Callable[[str], None]


@dataclass(frozen=True)
class Developed:
    tree: Path
    variant: str
    patches_dir: Path
    commits: list[tuple[str, str, str]]  # (commit, patch file, summary), in order
    source: Path


def default_dir(variant: str) -> Path:
    return Path.cwd() / f"llama.cpp-dev-{variant}"


def develop(
    variant: str | None = None,
    dest: Path | None = None,
    patches_dir: Path | None = None,
    llama_dir: Path | None = None,
    log: Log = lambda _msg: None,
) -> Developed:
    """Make the work tree of a variant (default: the last of the series) from the pinned source."""
    series = load_series(Path(patches_dir) if patches_dir else default_patches_dir())
    variant = variant or series.variants[-1]
    series.prefix(variant)  # PatchError naming the known variants for an unknown one
    dest = Path(dest if dest is not None else default_dir(variant)).expanduser().absolute()
    check_dest(dest)
    src = resolve(llama_dir, log=log)
    return make_tree(src.path, series, variant, dest, f"llama.cpp {pinned.RELEASE} ({src.route})", log)


def make_tree(
    source: Path, series: Series, variant: str, dest: Path, what: str, log: Log = lambda _m: None
) -> Developed:
    """Copy source into dest (which must not exist, or be empty), commit it, then commit each
    patch of the variant on top; ``what`` names the source in the base commit's message."""
    dest = Path(dest).absolute()
    check_dest(dest)
    prefix = series.prefix(variant)
    # every patch applied first, in memory: a series that does not apply leaves nothing behind
    steps = _apply(prefix, tree_reader(source))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        log(f"develop: copying {source} -> {dest}")
        n_files = copy_tree(source, tmp)
        git(["init", "-q"], tmp)
        git(["symbolic-ref", "HEAD", f"refs/heads/{variant}"], tmp)
        git(["config", "core.autocrlf", "false"], tmp)
        log(f"develop: committing the pristine tree ({n_files} files)")
        git(["add", "-A", "-f"], tmp)
        base_message = (
            f"{what}, pristine\n\n"
            f"The source tree the builds read ({source}). Each commit above this one is one\n"
            f"patch of {series.directory}/series for variant {variant}.\n"
        )
        base = _commit(tmp, base_message, IDENTITY)
        git(["-c", "tag.gpgSign=false", "tag", TAG, base], tmp)  # lightweight, whatever the config says
        commits = []
        for patch, contents in zip(prefix, steps, strict=True):
            for rel, text in contents.items():
                path = tmp / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(text.encode("utf-8"))
            git(["add", "-f", "--", *contents], tmp)
            text = (series.directory / patch.name).read_text(encoding="utf-8")
            mp = mailpatch.parse(text, patch.name)
            message = mp.message() or f"{patch.name}\n"
            commits.append((_commit(tmp, message, mp.author or IDENTITY), patch.name, message.split("\n", 1)[0]))
        write_meta(
            tmp,
            {
                "variant": variant,
                "base": base,
                "patches_dir": str(series.directory.resolve()),
                "patches": [
                    {"name": p.name, "variant": p.variant, "sha256": sha256_file(series.directory / p.name)}
                    for p in prefix
                ],
                "source": str(source),
            },
        )
        if dest.exists():
            dest.rmdir()  # empty, checked above; a folder that filled up since then stops here
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Developed(dest, variant, series.directory.resolve(), commits, source)


def check_dest(dest: Path) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise DevelopError(f"{dest}: exists and is not a folder; pass --dir to make the work tree elsewhere")
    if dest.is_dir() and any(dest.iterdir()):
        raise DevelopError(
            f"{dest}: already exists and is not empty; write back what it holds (pyllama-dflash write-back "
            f"--dir {dest}) and remove it, or pass --dir to make the work tree elsewhere"
        )


def _apply(prefix: tuple[Patch, ...], read: Callable[[str], str | None]) -> list[dict[str, str]]:
    """Each patch's files after it, as the build stages them (patchset.apply_series, step by step)."""
    contents: dict[str, str | None] = {}
    steps = []
    for patch in prefix:
        for fp in patch.files:
            if fp.path not in contents:
                contents[fp.path] = read(fp.path)
            contents[fp.path] = apply_file_patch(contents[fp.path], fp, patch.name)
        steps.append({fp.path: contents[fp.path] for fp in patch.files})
    return steps


def copy_tree(src: Path, dst: Path) -> int:
    """Copy src into the folder dst, every file a new one (never a link); returns the file count."""
    n = 0
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            if name in _SKIP:
                continue
            s, d = Path(dirpath) / name, dst / rel / name
            if s.is_symlink():
                target = os.readlink(s)
                if os.path.isabs(target):
                    raise DevelopError(f"{s}: a symlink to an absolute path ({target}); refusing to link into it")
                os.symlink(target, d)
            else:
                shutil.copyfile(s, d)  # a new inode: the pristine file is never written through it
                os.chmod(d, stat.S_IMODE(s.stat().st_mode) | stat.S_IWUSR)
            n += 1
    return n


def _commit(tree: Path, message: str, who: tuple[str, str]) -> str:
    name, email = who
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
    git(
        ["-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "commit", "-q", "--no-verify"]
        + ["--cleanup=verbatim", "-F", "-"],
        tree,
        input=message.encode("utf-8"),
        env=env,
    )
    return git(["rev-parse", "HEAD"], tree).decode().strip()


# ---- what write-back reads -------------------------------------------------------------------


def meta_path(tree: Path) -> Path:
    common = git(["rev-parse", "--git-common-dir"], tree).decode().strip()
    return (tree / common).resolve() / META


def write_meta(tree: Path, meta: dict) -> None:
    atomic_write_json(meta_path(tree), meta)


def read_meta(tree: Path) -> dict:
    """The develop record of a work tree; DevelopError naming the folder when it is not one."""
    if not tree.is_dir():
        raise DevelopError(f"{tree}: no such folder")
    if not (tree / ".git").exists():
        raise DevelopError(f"{tree}: not a work tree made by pyllama-dflash develop (no .git)")
    path = meta_path(tree)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DevelopError(f"{tree}: not a work tree made by pyllama-dflash develop (no {path.name})") from None
    except ValueError as e:
        raise DevelopError(f"{path}: not JSON ({e})") from None
