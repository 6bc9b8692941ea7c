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
    The command runs in a process group of its own, which is killed whole when this function is
    interrupted: cmake and the ninja it started stop together, and no orphaned ninja starts more
    compiles. The compiles already running (ninja gives each a process group of its own) finish
    holding ``keep_fds``, so the lock stays held until the last of them exits.
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
            start_new_session=True,
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
            _kill_group(proc)
            raise
    if rc != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {rc}); full log: {log_path}\n--- last lines ---\n{tail}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the command's process group (cmake, its ninja), then wait for the command."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone already
        pass
    proc.wait()
