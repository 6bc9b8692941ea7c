"""Running git for develop and write-back, and the one error both raise."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import PyllamaError

# what a git hook or a wrapper may have exported, and that would point git at another repository
_DROP = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


class DevelopError(PyllamaError, RuntimeError):
    """A develop work tree could not be made, or written back; names the folder and the reason."""


def git(
    args: Sequence[str],
    cwd: Path,
    *,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    ok: tuple[int, ...] = (0,),
) -> bytes:
    """git's stdout; DevelopError naming the folder, the command and git's message when it fails."""
    return run_git(args, cwd, input=input, env=env, ok=ok).stdout


def run_git(
    args: Sequence[str],
    cwd: Path,
    *,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    ok: tuple[int, ...] = (0,),
) -> subprocess.CompletedProcess:
    if shutil.which("git") is None:
        raise DevelopError("git is not on PATH: develop and write-back need it")
    full_env = {k: v for k, v in os.environ.items() if k not in _DROP}
    full_env["GIT_TERMINAL_PROMPT"] = "0"
    full_env.update(env or {})
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=full_env)
    if proc.returncode not in ok:
        message = proc.stderr.decode("utf-8", "replace").strip() or "no message"
        raise DevelopError(f"{cwd}: git {' '.join(args)} failed (exit {proc.returncode}): {message}")
    return proc
