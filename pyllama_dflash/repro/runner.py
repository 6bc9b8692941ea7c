"""Running the scenario matrix: one child process per (scenario, variant), in parallel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..api import THREADS_ENV
from ..build.fsutil import atomic_write_json
from ..build.patchset import BASELINE
from ..scenarios.drift import judge
from ..scenarios.models import ModelSet
from ..scenarios.record import CRASH, ERROR

REFERENCE = f"{BASELINE}+twin"  # the drift oracle's column: baseline with the draft's reconverted twin


@dataclass
class Job:
    scenario: str
    variant: str
    models: ModelSet
    config: dict = field(default_factory=dict)
    backend: str | None = None
    check_exact: bool = True
    timeout_s: float = 300.0
    threads: int = 1  # per context; run_matrix sets cores // parallel children
    twin: bool = False  # run the draft's reconverted twin instead (the drift reference)

    @property
    def key(self) -> tuple[str, str]:
        """(scenario, column): the column is the variant, or ``<variant>+twin`` for a reference run."""
        return self.scenario, self.variant + ("+twin" if self.twin else "")


def run_child(job: Job, work_dir: Path) -> dict:
    """Run one job in a fresh interpreter; a native crash becomes a CRASH result, not ours."""
    name = "-".join(job.key)
    job_file, out_file, log_file = (work_dir / f"{name}.{ext}" for ext in ("job.json", "result.json", "log"))
    atomic_write_json(job_file, {
        "scenario": job.scenario, "variant": job.variant, "models": job.models.to_json(),
        "config": job.config, "backend": job.backend, "check_exact": job.check_exact, "twin": job.twin,
    })
    cmd = [sys.executable, "-m", "pyllama_dflash.scenarios.child", str(job_file), str(out_file)]
    t0 = time.monotonic()
    # children share the cores: each context gets its share of threads, not all of them
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", THREADS_ENV: os.environ.get(THREADS_ENV, str(job.threads))}
    with open(log_file, "wb") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=job.timeout_s, env=env)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = round(time.monotonic() - t0, 3)
    tail = _tail(log_file)
    if rc is None:
        return {"status": CRASH, "first_failure": f"timed out after {job.timeout_s:.0f}s", "calls": [],
                "log": str(log_file), "log_tail": tail, "wall_s": wall}
    if rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        return {"status": CRASH, "signal": sig, "first_failure": f"child killed by {sig}", "calls": [],
                "log": str(log_file), "log_tail": tail, "wall_s": wall}
    try:
        result = json.loads(out_file.read_text())
    except (FileNotFoundError, ValueError):
        return {"status": CRASH if rc else ERROR, "first_failure": f"child exited {rc} without a result",
                "calls": [], "log": str(log_file), "log_tail": tail, "wall_s": wall}
    result.update({"log": str(log_file), "wall_s": wall})
    if result["status"] in (ERROR,):
        result["log_tail"] = tail
    return result


def _tail(path: Path, n: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return []


def run_matrix(jobs: list[Job], parallel: int, work_dir: Path | None = None) -> dict[tuple[str, str], dict]:
    """Every job in a child of its own, ``parallel`` at once; the results keyed by :attr:`Job.key`."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="pyllama-dflash-repro-"))
    work.mkdir(parents=True, exist_ok=True)
    share = max(1, (os.cpu_count() or 1) // max(1, parallel))
    for j in jobs:
        j.threads = share
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {j.key: pool.submit(run_child, j, work) for j in jobs}
        return {key: f.result() for key, f in futures.items()}


def run_table(scenarios: list[str], variants: list[str], models: ModelSet, config: dict, *, parallel: int,
              drift: bool = True, work_dir: Path | None = None, **job_options) -> dict[str, dict[str, dict]]:
    """The matrix as ``table[scenario][variant]``; with drift, every run judged by the drift oracle.

    With drift, each scenario also runs once on baseline with the draft's reconverted twin (the
    reference, in column :data:`REFERENCE`), and every variant's drafts are compared with it
    (:func:`pyllama_dflash.scenarios.drift.judge`). ``job_options`` go to every :class:`Job`.
    """
    jobs = [Job(sid, v, models, config, **job_options) for sid in scenarios for v in variants]
    if drift:
        jobs += [Job(sid, BASELINE, models, config, twin=True, **job_options) for sid in scenarios]
    results = run_matrix(jobs, parallel, work_dir)
    table = {sid: {v: results[(sid, v)] for v in variants} for sid in scenarios}
    if drift:
        for sid, row in table.items():
            reference = results[(sid, REFERENCE)]
            for v in variants:
                judge(row[v], reference)
            row[REFERENCE] = reference
    return table
