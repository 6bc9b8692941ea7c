"""Small filesystem helpers the build cache relies on: atomic writes, hashes, a lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def stable_hash(obj: Any, length: int = 12) -> str:
    """A short, order-independent hash of a JSON-able value (used for cache keys)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return sha256_bytes(text.encode())[:length]


@contextlib.contextmanager
def atomic_path(path: Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path in path's folder, renamed onto path when the block ends without error.

    The one mechanism behind every file this package writes for others to read. A reader sees
    the old file or the new one, never half of one; an interrupted write leaves at most a stray
    temporary file, never a truncated target. Writing a new inode also breaks any hard link the
    old path had (the staged tree relies on it). ``mode`` sets the file's permissions (default:
    0600, which mkstemp gives).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def default_file_mode() -> int:
    """The mode a plain open() would give a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write data through :func:`atomic_path` (``mode`` as there), synced to disk before the rename."""
    with atomic_path(path, mode=mode) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: Path, obj: Any, *, mode: int | None = None) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written folder into place, replacing an older one if present."""
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)


@contextlib.contextmanager
def file_lock(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[int]:
    """An exclusive advisory lock; blocks while another build holds it. Yields the lock's fd.

    The kernel drops flock locks when the last holder of the open file closes it, so a killed
    build never leaves a stale lock behind. A child given the fd (``pass_fds``) holds the lock
    too, and keeps holding it when the build ends: a compiler that outlives its build, however
    the build ended, keeps the next one waiting until it exits. So the lock is never released
    explicitly (``LOCK_UN`` would free it for those children as well): closing the file drops
    this process's hold alone.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield f.fileno()
