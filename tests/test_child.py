"""child.py: jobs batched into one child, and what a crash in the middle of a batch costs."""

from __future__ import annotations

import os
from pathlib import Path

from pyllama_dflash import child

# a job module: "abort" kills the process the native way (SIGABRT), "raise" is a Python error
JOB_MODULE = """
import os, sys
from pyllama_dflash.child import job_main

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
