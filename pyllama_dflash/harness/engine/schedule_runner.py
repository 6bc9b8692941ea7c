"""The schedules' parent side: one child process per variant (the variants share sonames), run in
parallel; the side that runs in the child is run_schedule.py."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...env import FUZZ_EXAMPLES_ENV, FUZZ_SEED_ENV
from ...product.process import child
from ..slotloop.models import ModelSet
from .schedule import Schedule
from .schedule_job import DEFAULT_EXAMPLES, DEFAULT_SEED, ReplayJob, ScheduleJob, SearchJob


def examples_from_env() -> int:
    return int(os.environ.get(FUZZ_EXAMPLES_ENV) or DEFAULT_EXAMPLES)


def seed_from_env() -> int:
    return int(os.environ.get(FUZZ_SEED_ENV) or DEFAULT_SEED)


def run_child(job: ScheduleJob, work_dir: Path, timeout_s: float) -> dict:
    """Run one job in a fresh interpreter; a native crash becomes a CRASH result."""
    name = f"{job.MODE}-{job.variant}"
    return child.run_job("pyllama_dflash.harness.engine.run_schedule", job.to_json(), work_dir, name, timeout=timeout_s)


def _each_variant(jobs: list[ScheduleJob], parallel: int, work_dir: Path | None, timeout_s: float) -> dict[str, dict]:
    """The jobs (one per variant), one child each, ``parallel`` at once; per variant the child's result."""
    scratch = child.Scratch("pyllama-dflash-fuzz-", work_dir)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {job.variant: pool.submit(run_child, job, scratch.path, timeout_s) for job in jobs}
        results = {v: f.result() for v, f in futures.items()}
    scratch.close(results.values())
    return results


def search_variants(
    variants: list[str],
    models: ModelSet,
    *,
    parallel: int = 2,
    timeout_s: float = 600.0,
    work_dir: Path | None = None,
    **options: Any,
) -> dict[str, dict]:
    """The hypothesis search on each variant, one child each; per variant its SearchResult as JSON.
    ``options`` are :class:`SearchJob`'s fields (examples, seed, max_steps, drift, ...), its defaults
    where left out."""
    jobs = [SearchJob(v, models, **options) for v in variants]
    return _each_variant(jobs, parallel, work_dir, timeout_s)


def replay_variants(
    schedule: Schedule,
    variants: list[str],
    models: ModelSet,
    *,
    parallel: int = 2,
    timeout_s: float = 300.0,
    work_dir: Path | None = None,
    **options: Any,
) -> dict[str, dict]:
    """One schedule on each variant; per variant an Outcome as JSON (status, kind, first_failure, ...).
    ``options`` are :class:`ReplayJob`'s fields (config, backend, exact, drift), its defaults where left out."""
    jobs = [ReplayJob(v, models, schedule, **options) for v in variants]
    return _each_variant(jobs, parallel, work_dir, timeout_s)
