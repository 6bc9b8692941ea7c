"""Running the scenario matrix: one child process per (scenario, variant), in parallel."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import child
from ..env import THREADS_ENV
from ..llamabuild import saves_draft_with_slot
from ..llamabuild.patchset import BASELINE
from ..scenarios.drift import judge
from ..scenarios.models import ModelSet

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
    spec = {
        "scenario": job.scenario,
        "variant": job.variant,
        "models": job.models.to_json(),
        "config": job.config,
        "backend": job.backend,
        "check_exact": job.check_exact,
        "twin": job.twin,
    }
    # children share the cores: each context gets its share of threads, not all of them
    threads = os.environ.get(THREADS_ENV, str(job.threads))
    return child.run_job(
        "pyllama_dflash.scenarios.child",
        spec,
        work_dir,
        "-".join(job.key),
        timeout=job.timeout_s,
        env={THREADS_ENV: threads},
    )


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


def server_config(variant: str, config: dict) -> dict:
    """The session config for a variant: the slot loop mirrors what the variant's llama-server does
    with a slot file (see saves_draft_with_slot)."""
    return {**config, "server_saves_draft": saves_draft_with_slot(variant)}


def run_table(
    scenarios: list[str],
    variants: list[str],
    models: ModelSet,
    config: dict,
    *,
    parallel: int,
    drift: bool = True,
    work_dir: Path | None = None,
    **job_options,
) -> dict[str, dict[str, dict]]:
    """The matrix as ``table[scenario][variant]``; with drift, every run judged by the drift oracle.

    With drift, each scenario also runs once on baseline with the draft's reconverted twin (the
    reference, in column :data:`REFERENCE`), and every variant's drafts are compared with it
    (:func:`pyllama_dflash.scenarios.drift.judge`). ``job_options`` go to every :class:`Job`.
    """
    jobs = [Job(sid, v, models, server_config(v, config), **job_options) for sid in scenarios for v in variants]
    if drift:
        jobs += [
            Job(sid, BASELINE, models, server_config(BASELINE, config), twin=True, **job_options) for sid in scenarios
        ]
    results = run_matrix(jobs, parallel, work_dir)
    table = {sid: {v: results[(sid, v)] for v in variants} for sid in scenarios}
    if drift:
        for sid, row in table.items():
            reference = results[(sid, REFERENCE)]
            for v in variants:
                judge(row[v], reference)
            row[REFERENCE] = reference
    return table
