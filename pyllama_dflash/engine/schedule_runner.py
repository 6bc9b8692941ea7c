"""The schedules' parent side: one child process per variant (the variants share sonames), run in
parallel; the child side is schedule_child.py."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import child
from ..env import FUZZ_EXAMPLES_ENV, FUZZ_SEED_ENV
from ..scenarios.models import ModelSet
from ..scenarios.session import DEFAULT_CONFIG
from .schedule import Schedule

DEFAULT_EXAMPLES = 50  # per variant in CI; PYLLAMA_DFLASH_FUZZ_EXAMPLES raises it
DEFAULT_SEED = 0  # a fixed seed keeps CI deterministic; PYLLAMA_DFLASH_FUZZ_SEED varies it


def examples_from_env() -> int:
    return int(os.environ.get(FUZZ_EXAMPLES_ENV) or DEFAULT_EXAMPLES)


def seed_from_env() -> int:
    return int(os.environ.get(FUZZ_SEED_ENV) or DEFAULT_SEED)


def run_child(job: dict, work_dir: Path, name: str, timeout_s: float) -> dict:
    """Run one job in a fresh interpreter; a native crash becomes a CRASH result."""
    return child.run_job("pyllama_dflash.engine.schedule_child", job, work_dir, name, timeout=timeout_s)


def _each_variant(
    mode: str, variants: list[str], job: dict, parallel: int, work_dir: Path | None, timeout_s: float
) -> dict[str, dict]:
    """The job (``mode``: search or replay) on each variant, one child each, ``parallel`` at once;
    per variant the child's result."""
    scratch = child.Scratch("pyllama-dflash-fuzz-", work_dir)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {
            v: pool.submit(run_child, {"mode": mode, "variant": v, **job}, scratch.path, f"{mode}-{v}", timeout_s)
            for v in variants
        }
        results = {v: f.result() for v, f in futures.items()}
    scratch.close(results.values())
    return results


def search_variants(
    variants: list[str],
    models: ModelSet,
    *,
    examples: int,
    seed: int = DEFAULT_SEED,
    max_steps: int = 8,
    exact: bool = False,
    ignore: tuple[str, ...] = (),
    backend: str | None = None,
    parallel: int = 2,
    timeout_s: float = 600.0,
    work_dir: Path | None = None,
    drift: bool = True,
    weighted: bool = True,
    drafters: tuple[str, ...] = (),
    targets: tuple[str, ...] = (),
) -> dict[str, dict]:
    """The hypothesis search on each variant, one child each; per variant its SearchResult as JSON.
    Each schedule draws its drafter and target kind from those given (none: ``models`` as they are)."""
    job = {
        "backend": backend,
        "models": models.to_json(),
        "config": DEFAULT_CONFIG,
        "examples": examples,
        "seed": seed,
        "max_steps": max_steps,
        "exact": exact,
        "ignore": list(ignore),
        "drift": drift,
        "weighted": weighted,
        "drafters": list(drafters),
        "targets": list(targets),
    }
    return _each_variant("search", variants, job, parallel, work_dir, timeout_s)


def replay_variants(
    schedule: Schedule,
    variants: list[str],
    models: ModelSet,
    *,
    config: dict | None = None,
    backend: str | None = None,
    exact: bool = True,
    parallel: int = 2,
    timeout_s: float = 300.0,
    work_dir: Path | None = None,
    drift: bool = True,
) -> dict[str, dict]:
    """One schedule on each variant; per variant an Outcome as JSON (status, kind, first_failure, ...)."""
    job = {
        "backend": backend,
        "models": models.to_json(),
        "config": config or DEFAULT_CONFIG,
        "schedule": schedule.to_json(),
        "exact": exact,
        "drift": drift,
    }
    return _each_variant("replay", variants, job, parallel, work_dir, timeout_s)
