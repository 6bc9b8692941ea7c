"""Running CMake and the build tool with the full log kept beside the build."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from ...errors import BuildError
from .progress import Progress

_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)")
_MAKE_STEP = re.compile(r"^\[\s*(\d+)%\]\s+(.*)")


def run_logged(
    cmd: list[str],
    log_path: Path,
    progress: Progress,
    what: str,
    cwd: Path | None = None,
    keep_fds: tuple[int, ...] = (),
) -> None:
    """Run ``cmd`` appending its output to ``log_path``; report ``[n/m]`` steps as they pass.

    ``keep_fds`` are inherited by the command and everything it starts (the build folder's lock).
    Interrupted (Ctrl-C, or SIGTERM turned into one), it stops the command and everything it started
    before raising: left alone, cmake's ninja would go on compiling. Killed outright, it cannot, and
    whatever outlives it keeps ``keep_fds``, so the build folder stays locked until the last of them
    exits (files.file_lock).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            pass_fds=keep_fds,
        )
        assert proc.stdout is not None
        last_report = 0.0
        try:
            for line in proc.stdout:
                log.write(line)
                m = _NINJA_STEP.match(line)
                if m:
                    n, total, rest = int(m.group(1)), int(m.group(2)), m.group(3)
                else:
                    m2 = _MAKE_STEP.match(line)
                    if not m2:
                        continue
                    n, total, rest = int(m2.group(1)), 100, m2.group(2)
                now = time.monotonic()
                if now - last_report >= 10 or n == total:
                    progress.say(
                        f"{what} [{n}/{total}] {'link ' if rest.startswith('Linking') else ''}"
                        f"{rest.split()[-1] if rest.split() else ''}"
                    )
                    last_report = now
            rc = proc.wait()
        except BaseException:
            _stop_tree(proc)
            raise
    if rc != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {rc}); full log: {log_path}\n--- last lines ---\n{tail}")


def _stop_tree(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the command and everything it started, as Ctrl-C in a terminal would reach them:
    ninja then stops its compiles (the compiler removes its half-written output) and waits for them.
    Whatever still runs after ``grace_s`` gets SIGKILL. Returns once the command has exited; what it
    started has exited too, or has just been sent SIGKILL (the build folder's lock covers the rest)."""
    tree = [proc.pid, *_descendants(proc.pid)]
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in tree[1:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in tree[1:]:
        _signal(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, children first, read from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], list(children.get(pid, []))
    while queue:
        found.append(queue.pop(0))
        queue.extend(children.get(found[-1], []))
    return found


def _alive(pid: int) -> bool:
    """Running and not a zombie: a zombie has already closed every file it held."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command's name (state, parent, ...); empty for a process gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # gone meanwhile
        pass
