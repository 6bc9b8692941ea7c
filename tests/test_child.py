"""child.py: jobs batched into one child, and what a crash in the middle of a batch costs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyllama_dflash.product.process import child

# a job module: "abort" kills the process the native way (SIGABRT), "raise" is a Python error
JOB_MODULE = """
import os, sys
from pyllama_dflash.product.process.child import job_main

def run(job):
    if job["do"] == "abort":
        os.abort()
    if job["do"] == "raise":
        raise ValueError("refused")
    return {"status": "PASS", "pid": os.getpid(), "n": job["n"]}

sys.exit(job_main(sys.argv[1:], run))
"""


def _batch(tmp_path: Path, jobs: list[dict]) -> list[dict]:
    (tmp_path / "batchjob.py").write_text(JOB_MODULE)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return child.run_batch("batchjob", jobs, tmp_path, "b", timeout_per_job=60, env=env)


def test_a_batch_runs_its_jobs_in_one_child_in_order(tmp_path):
    out = _batch(tmp_path, [{"do": "ok", "n": i} for i in range(4)])
    assert [r["n"] for r in out] == [0, 1, 2, 3]
    assert len({r["pid"] for r in out}) == 1  # one interpreter for all of them


def test_a_crash_costs_only_the_job_it_happened_in(tmp_path):
    jobs = [{"do": "ok", "n": 0}, {"do": "abort", "n": 1}, {"do": "ok", "n": 2}, {"do": "raise", "n": 3}]
    out = _batch(tmp_path, jobs)
    assert out[0]["status"] == "PASS"
    assert out[1]["status"] == "CRASH" and out[1]["signal"] == "SIGABRT"
    assert out[2]["status"] == "PASS" and out[2]["pid"] != out[0]["pid"]  # the rest ran in a fresh child
    assert out[3]["status"] == "ERROR" and "ValueError: refused" in out[3]["first_failure"]


def test_a_runs_temporary_folder_goes_unless_a_child_crashed_in_it(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    def run(jobs: list[dict], given: Path | None = None) -> tuple[child.Scratch, list[dict]]:
        scratch = child.Scratch("run-", given)
        (scratch.path / "batchjob.py").write_text(JOB_MODULE)
        env = {"PYTHONPATH": os.pathsep.join([str(scratch.path), os.environ.get("PYTHONPATH", "")])}
        out = child.run_batch("batchjob", jobs, scratch.path, "b", timeout_per_job=60, env=env)
        scratch.close(out)
        return scratch, out

    clean, _ = run([{"do": "ok", "n": 0}])
    assert not clean.path.exists()  # a run that went well leaves nothing behind

    crashed, out = run([{"do": "ok", "n": 0}, {"do": "abort", "n": 1}])
    assert crashed.path.exists() and Path(out[1]["log"]).is_file()  # the log the crash names is kept

    given, _ = run([{"do": "ok", "n": 0}], tmp_path / "mine")
    assert given.path.is_dir()  # a folder the caller gave is the caller's


# a parent that waits on a sleeping child through child.run, with or without sigterm_as_interrupt
PARENT = """
import contextlib, sys
from pathlib import Path
from pyllama_dflash.product.process import child

work, guarded = Path(sys.argv[1]), sys.argv[2] == "guarded"
sleeper = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)",
           str(work / "child.pid")]
try:
    with child.sigterm_as_interrupt() if guarded else contextlib.nullcontext():
        child.run(sleeper, log=work / "child.log", timeout=120)
finally:
    (work / "finally-ran").write_text("")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("guarded", [True, False])
def test_sigterm_stops_the_child_and_runs_the_parents_finally_only_when_guarded(tmp_path, guarded):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), "guarded" if guarded else "bare"])
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    sleeper = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    rc = parent.wait(timeout=60)
    try:
        if guarded:
            # as Ctrl-C: the child killed and reaped, the finally blocks run, and the KeyboardInterrupt
            # (which a command's runner turns into exit 130) ends this bare script as Ctrl-C would
            assert rc == -signal.SIGINT and (tmp_path / "finally-ran").exists()
            assert not _alive(sleeper)
        else:
            # what the tools did before: the parent gone at once, its child orphaned and running
            assert rc == -signal.SIGTERM and not (tmp_path / "finally-ran").exists()
            assert _alive(sleeper)
    finally:
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)
