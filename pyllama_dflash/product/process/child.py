"""Work in a child process: one place for starting it, its timeout, and what a crash looks like.

The variants share sonames, so a process holds one variant, and llama.cpp answers some inputs
with ``abort()``: the harness runs such work in a fresh interpreter. Every runner (the scenario
matrix, the fuzzer, the benchmark workers, the guarded native calls) goes through :func:`run`,
and the JSON jobs through :func:`run_job` on the parent side and :func:`job_main` on the child's.
A child that dies is reported, never fatal to the parent: its signal by name, the native assert
line it printed (``GGML_ASSERT``/``GGML_ABORT``) and its last log lines. Many small jobs of one
variant go through :func:`run_batch` (one interpreter for all of them, :func:`batch_main` on the
child's side), which costs a crash no more than the job it happened in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import short_native_line
from ...files import atomic_write_json
from ...words import Status

CRASH, ERROR = Status.CRASH, Status.ERROR  # a child that died or timed out; a Python error inside a child
DID_NOT_RUN = (CRASH, ERROR)  # a run that never got to an answer: it judges nothing, and its logs are kept

# what ggml_abort prints (GGML_ASSERT and GGML_ABORT both go through it): "<file>:<line>: <message>"
_ABORT = re.compile(r"GGML_ASSERT|GGML_ABORT|^\S+\.(?:c|cc|cpp|cu|h):\d+: ")
# the lines worth quoting from a dead child's output, best first
_FATAL = (_ABORT, *(re.compile(p) for p in (r"terminate called|what\(\):", r"Fatal Python error", r"(?i)\berror\b")))


@dataclass(frozen=True)
class Finished:
    """How a child ended. ``rc`` is None when it ran past its timeout and was killed."""

    rc: int | None
    wall_s: float
    log: Path  # its stdout and stderr together
    timeout_s: float | None

    @property
    def signal(self) -> str | None:
        if self.rc is None or self.rc >= 0:
            return None
        return signal.Signals(-self.rc).name if -self.rc in signal.valid_signals() else str(-self.rc)

    @property
    def died(self) -> bool:
        return self.rc is None or self.rc < 0

    @property
    def how(self) -> str:
        """``SIGABRT``, ``exit 3`` or ``timed out after 60s``."""
        if self.rc is None:
            return f"timed out after {self.timeout_s:g}s"
        return self.signal or f"exit {self.rc}"

    def tail(self, n: int = 12) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()[-n:]
        except FileNotFoundError:
            return []

    def why(self, n_tail: int = 8) -> list[str]:
        """The lines that say why it died: the native assert (and the like) first, then the tail."""
        lines = [ln for ln in self.tail(100_000) if ln.strip()]
        fatal = list(dict.fromkeys(ln for pattern in _FATAL for ln in lines if pattern.search(ln)))[:3]
        return fatal + [ln for ln in lines[-n_tail:] if ln not in fatal]

    def crash(self) -> dict:
        """The result of a child that produced none: CRASH (died, timed out) or ERROR (exited)."""
        why = self.why()
        fatal = next((short_native_line(ln) for ln in why if _ABORT.search(ln.strip())), None)
        if self.rc is None:
            first = f"timed out after {self.timeout_s:.0f}s"
        elif self.rc < 0:
            first = f"child killed by {self.signal}" + (f": {fatal}" if fatal else "")
        else:
            first = f"child exited {self.rc} without a result" + (f": {fatal}" if fatal else "")
        out = {
            "status": CRASH if self.rc is None or self.rc != 0 else ERROR,
            "first_failure": first,
            "calls": [],
            "log": str(self.log),
            "log_tail": self.tail(),
            "wall_s": round(self.wall_s, 3),
        }
        if self.signal:
            out["signal"] = self.signal
        return out


class Scratch:
    """The folder a run's children work in: their jobs, results and logs. A folder the caller gives
    is the caller's to keep. A temporary one is removed when the run ends, unless a child crashed
    or erred there: the results name its log, and that log is what someone reads next."""

    def __init__(self, prefix: str, given: Path | None = None) -> None:
        self.owned = given is None
        self.path = Path(given) if given is not None else Path(tempfile.mkdtemp(prefix=prefix))
        self.path.mkdir(parents=True, exist_ok=True)

    def close(self, results: Iterable[dict]) -> None:
        if self.owned and not any(r.get("status") in DID_NOT_RUN for r in results):
            shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM (a CI runner's cancel, ``kill PID``) ends the program as Ctrl-C does: a
    KeyboardInterrupt in the main thread, so :func:`run` kills the child it waits on and the tool's
    ``finally`` blocks remove its scratch builds and folders. Without it the process dies at once
    and its children run on, orphaned. A command (command.py) then exits 130, as for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cmd: list[str], *, log: Path, timeout: float | None, env: dict[str, str] | None = None) -> Finished:
    """Run cmd with its output in log; kill it at the timeout. Never raises for how the child ended."""
    merged = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    # else ggml attaches gdb to itself before it aborts: slow and noisy
    merged.setdefault("GGML_NO_BACKTRACE", "1")
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=merged)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        except BaseException:  # Ctrl-C in the parent: the child goes too
            proc.kill()
            proc.wait()
            raise
    return Finished(rc, time.monotonic() - t0, log, timeout)


def run_job(
    module: str, job: dict, work_dir: Path, name: str, *, timeout: float | None, env: dict[str, str] | None = None
) -> dict:
    """``python -m module JOB OUT`` in a child: the job goes in as JSON, the result comes back as JSON.

    The result gains ``log`` and ``wall_s``; a child that leaves no result gives :meth:`Finished.crash`.
    """
    job_file, out_file, log_file = (work_dir / f"{name}.{ext}" for ext in ("job.json", "result.json", "log"))
    atomic_write_json(job_file, job)
    out_file.unlink(missing_ok=True)
    done = run([sys.executable, "-m", module, str(job_file), str(out_file)], log=log_file, timeout=timeout, env=env)
    if done.died:
        return done.crash()
    try:
        result = json.loads(out_file.read_text())
    except (FileNotFoundError, ValueError):
        return done.crash()
    result.update({"log": str(log_file), "wall_s": round(done.wall_s, 3)})
    if result.get("status") == ERROR:
        result["log_tail"] = done.tail()
    return result


def job_main(argv: list[str], run_one: Callable[[dict], dict]) -> int:
    """The child side of :func:`run_job`: ``argv`` is [JOB, OUT].

    An exception in run_one (a refused input, a harness error) is not a verdict: the result is
    ERROR with its traceback. The result is written atomically, so the parent never reads half.
    """
    if argv and argv[0] == "--batch":
        return batch_main(argv[1:], run_one)
    job_path, out_path = Path(argv[0]), Path(argv[1])
    atomic_write_json(out_path, _one(run_one, json.loads(job_path.read_text())))
    return 0


def run_batch(
    module: str,
    jobs: list[dict],
    work_dir: Path,
    name: str,
    *,
    timeout_per_job: float,
    env: dict[str, str] | None = None,
) -> list[dict]:
    """``python -m module --batch JOBS OUT_DIR``: the jobs in one child, in order; their results in order.

    Starting an interpreter and loading a variant's libraries costs more than a tiny scenario, so
    jobs that share a variant share a child. The child writes each result as it finishes it, so a
    child that dies costs only the job it died in: the jobs before it keep their results, that one
    gets :meth:`Finished.crash`, and the jobs after it run again in a fresh child. The timeout is
    ``timeout_per_job`` for each job the child was given.
    """
    results: list[dict] = []
    part = 0
    while len(results) < len(jobs):
        todo = jobs[len(results) :]
        tag = f"{name}.{part}"
        batch_file, log_file = work_dir / f"{tag}.batch.json", work_dir / f"{tag}.log"
        out_dir = work_dir / f"{tag}.results"
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("*.json"):
            stale.unlink()
        atomic_write_json(batch_file, {"jobs": todo})
        done = run(
            [sys.executable, "-m", module, "--batch", str(batch_file), str(out_dir)],
            log=log_file,
            timeout=timeout_per_job * len(todo),
            env=env,
        )
        for i in range(len(todo)):
            try:
                result = json.loads((out_dir / f"{i}.json").read_text())
            except (FileNotFoundError, ValueError):
                break
            result.update({"log": str(log_file), "batch_wall_s": round(done.wall_s, 3)})
            if result.get("status") == ERROR:
                result["log_tail"] = done.tail()
            results.append(result)
        else:
            continue  # every job of this part has its result
        # the first job without a result is the one the child was in when it ended
        results.append(done.crash())
        part += 1
    return results


def batch_main(argv: list[str], run_one: Callable[[dict], dict]) -> int:
    """The child side of :func:`run_batch`: ``argv`` is [JOBS, OUT_DIR]; each job's result is written
    to ``OUT_DIR/<index>.json`` (atomically) as soon as it is known, as :func:`job_main` would."""
    jobs = json.loads(Path(argv[0]).read_text())["jobs"]
    out_dir = Path(argv[1])
    for i, job in enumerate(jobs):
        t0 = time.monotonic()
        atomic_write_json(out_dir / f"{i}.json", _one(run_one, job) | {"wall_s": round(time.monotonic() - t0, 3)})
    return 0


def _one(run_one: Callable[[dict], dict], job: dict) -> dict:
    """run_one(job), or for an exception in it (a refused input, a harness error) ERROR with its traceback."""
    try:
        return run_one(job)
    except Exception as e:
        return {
            "status": ERROR,
            "first_failure": f"{type(e).__name__}: {e}",
            "calls": [],
            "traceback": traceback.format_exc(),
        }
