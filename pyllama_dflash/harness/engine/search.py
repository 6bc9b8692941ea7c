"""The hypothesis loop on the variant loaded in this process: run schedules, shrink what fails.

Every distinct kind of violation (each :class:`~.invariant.Violation` subclass) is a separate
bug to hypothesis, shrunk on its own, and comes back with its shrunk schedule.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

try:
    from builtins import BaseExceptionGroup  # Python >= 3.11
except ImportError:  # pragma: no cover - hypothesis depends on the backport below 3.11
    from exceptiongroup import BaseExceptionGroup

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

from ..slotloop.config import SessionConfig
from ..slotloop.models import ModelSet
from .execute import execute
from .invariant import Violation
from .minimize import minimize
from .schedule import Schedule
from .schedule_job import SearchJob
from .strategy import schedules


@dataclass
class SearchResult:
    examples: int  # hypothesis's max_examples
    runs: int = 0  # schedules run, shrinking included
    failing_runs: int = 0
    first_failure_run: dict[str, int] = field(default_factory=dict)  # kind -> the run that first showed it
    failures: list[dict] = field(default_factory=list)  # one per kind: the shrunk schedule and its failure
    stats: Counter = field(default_factory=Counter)  # invariant checks over all runs (see invariant.py)
    steps_run: int = 0
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "examples": self.examples,
            "runs": self.runs,
            "failing_runs": self.failing_runs,
            "first_failure_run": self.first_failure_run,
            "failures": self.failures,
            "stats": dict(self.stats),
            "steps_run": self.steps_run,
            "wall_s": round(self.wall_s, 3),
        }


def search(job: SearchJob, *, reference: Callable[..., dict] | None = None) -> SearchResult:
    """Run up to ``job.examples`` schedules (and the shrinking of what fails) on ``job.models``.

    Kinds in ``job.ignore`` end a run as llama-server would (the slot is dropped) but do not fail it:
    hypothesis stops looking soon after its first bug, so a kind already known can hide others.
    With a reference (the drift oracle, see reference.py) every completed run is also compared
    round by round with what the reconverted twin drafts on baseline.
    """
    models, config, exact, ignore = job.models, job.config, job.exact, frozenset(job.ignore)
    result = SearchResult(job.examples)
    t0 = time.monotonic()

    @seed(job.seed)
    @settings(
        max_examples=job.examples,
        database=None,
        deadline=None,
        derandomize=False,
        print_blob=False,
        phases=(Phase.generate, Phase.shrink),
        report_multiple_bugs=True,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )
    @given(schedules(max_steps=job.max_steps, weighted=job.weighted, drafters=job.drafters, targets=job.targets))
    def holds(schedule: Schedule) -> None:
        result.runs += 1
        result.steps_run += len(schedule.steps)
        try:
            out = execute(schedule, models, config, exact=exact, reference=reference)
        except Exception as e:  # a harness error: keep the schedule that caused it
            e.schedule = schedule.to_json()  # type: ignore[attr-defined]
            raise
        result.stats.update(out.stats)
        if out.violation is not None and out.violation.kind in ignore:
            result.stats[f"ignored {out.violation.kind}"] += 1
        elif out.violation is not None:
            result.failing_runs += 1
            result.first_failure_run.setdefault(out.violation.kind, result.runs)
            raise out.violation

    try:
        holds()
    except Exception as e:
        for exc in _leaves(e):
            result.failures.append(_failure(exc))
    for failure in result.failures:
        if failure["kind"] != "error" and failure["schedule"]:
            _minimize(failure, models, config, exact, result, reference)
    result.wall_s = time.monotonic() - t0
    return result


def _minimize(
    failure: dict,
    models: ModelSet,
    config: SessionConfig,
    exact: bool,
    result: SearchResult,
    reference: Callable[..., dict] | None,
) -> None:
    """Hypothesis's shrunk schedule, then minimize()'s pass on its steps; the failure is the final run's."""
    last: list[Violation] = []

    def fails(candidate: Schedule) -> bool:
        out = execute(candidate, models, config, exact=exact, reference=reference)
        if out.violation is not None and out.violation.kind == failure["kind"]:
            last[:] = [out.violation]
            return True
        return False

    shrunk = Schedule.from_json(failure["schedule"])
    best, tries = minimize(shrunk, fails)
    result.runs += tries
    failure["hypothesis_steps"] = len(shrunk.steps)
    if best is not shrunk and last:
        failure.update(_failure(last[0]))


def _leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaves(sub)]
    return [e]


def _failure(exc: BaseException) -> dict:
    if isinstance(exc, Violation):
        return {
            "kind": exc.kind,
            "message": str(exc),
            "schedule": exc.schedule,
            "failing_call": exc.call.to_json() if exc.call else None,
        }
    # a Python error in the harness or the fuzzer itself: not a verdict on the variant
    return {
        "kind": "error",
        "message": f"{type(exc).__name__}: {exc}",
        "schedule": getattr(exc, "schedule", None),
        "failing_call": None,
    }
