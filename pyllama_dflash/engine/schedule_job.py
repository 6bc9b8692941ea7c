"""The schedules' jobs, as a parent hands them to a child process (run_schedule.py): a hypothesis
search (:class:`SearchJob`) or one schedule replayed (:class:`ReplayJob`) on one variant. Each
writes its defaults here once, and its JSON form for the job file; :func:`from_json` reads either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet
from .schedule import Schedule

DEFAULT_EXAMPLES = 50  # per variant in CI; PYLLAMA_DFLASH_FUZZ_EXAMPLES raises it
DEFAULT_SEED = 0  # a fixed seed keeps CI deterministic; PYLLAMA_DFLASH_FUZZ_SEED varies it


@dataclass(frozen=True)
class SearchJob:
    """The hypothesis search on one variant: up to ``examples`` schedules, each drawing its drafter
    and target kind from ``drafters`` and ``targets`` (none: ``models`` as they are). With ``drift``
    every completed run is also checked against the drift oracle's reference; kinds in ``ignore``
    end a run but do not fail it."""

    variant: str
    models: ModelSet
    config: SessionConfig = DEFAULT_CONFIG
    backend: str | None = None
    examples: int = DEFAULT_EXAMPLES
    seed: int = DEFAULT_SEED
    max_steps: int = 8
    exact: bool = False
    ignore: tuple[str, ...] = ()
    drift: bool = True
    weighted: bool = True
    drafters: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    threads: int = 1  # per context: ggml's spinning pools in two children on two cores starve each other

    MODE = "search"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.MODE,
            **_common(self),
            "examples": self.examples,
            "seed": self.seed,
            "max_steps": self.max_steps,
            "exact": self.exact,
            "ignore": list(self.ignore),
            "drift": self.drift,
            "weighted": self.weighted,
            "drafters": list(self.drafters),
            "targets": list(self.targets),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SearchJob:
        return cls(
            **_common_from_json(d),
            examples=d["examples"],
            seed=d["seed"],
            max_steps=d["max_steps"],
            exact=d["exact"],
            ignore=tuple(d["ignore"]),
            drift=d["drift"],
            weighted=d["weighted"],
            drafters=tuple(d["drafters"]),
            targets=tuple(d["targets"]),
        )


@dataclass(frozen=True)
class ReplayJob:
    """One schedule on one variant; with ``exact`` the output is compared with greedy decoding, with
    ``drift`` the drafts with the drift oracle's reference."""

    variant: str
    models: ModelSet
    schedule: Schedule
    config: SessionConfig = DEFAULT_CONFIG
    backend: str | None = None
    exact: bool = True
    drift: bool = True
    threads: int = 1

    MODE = "replay"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.MODE,
            **_common(self),
            "schedule": self.schedule.to_json(),
            "exact": self.exact,
            "drift": self.drift,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplayJob:
        return cls(
            schedule=Schedule.from_json(d["schedule"]), exact=d["exact"], drift=d["drift"], **_common_from_json(d)
        )


ScheduleJob = SearchJob | ReplayJob


def from_json(d: dict[str, Any]) -> ScheduleJob:
    """The job a job file holds, by its ``mode``; ValueError for another mode."""
    for kind in (SearchJob, ReplayJob):
        if d.get("mode") == kind.MODE:
            return kind.from_json(d)
    raise ValueError(f"unknown mode {d.get('mode')!r}")


def _common(job: ScheduleJob) -> dict[str, Any]:
    return {
        "variant": job.variant,
        "models": job.models.to_json(),
        "config": job.config.to_json(),
        "backend": job.backend,
        "threads": job.threads,
    }


def _common_from_json(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "variant": d["variant"],
        "models": ModelSet.from_json(d["models"]),
        "config": SessionConfig.from_json(d["config"]),
        "backend": d["backend"],
        "threads": d["threads"],
    }
