"""The schedules' jobs, as a parent hands them to a child process (run_schedule.py): a hypothesis
search (:class:`SearchJob`) or one schedule replayed (:class:`ReplayJob`) on one variant. Each
writes its defaults here once; its JSON form is the codec's, tagged with its mode, and
:func:`from_json` reads either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...codec import Coded, decode, encode
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet
from .schedule import Schedule

DEFAULT_EXAMPLES = 50  # per variant in CI; PYLLAMA_DFLASH_FUZZ_EXAMPLES raises it
DEFAULT_SEED = 0  # a fixed seed keeps CI deterministic; PYLLAMA_DFLASH_FUZZ_SEED varies it


class _Tagged(Coded):
    """A job whose JSON names its kind (``mode``), so one job file can hold either."""

    MODE = ""

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.MODE, **encode(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]):
        if d.get("mode", cls.MODE) != cls.MODE:
            raise ValueError(f"a {cls.MODE} job, not {d['mode']!r}")
        return decode(cls, {k: v for k, v in d.items() if k != "mode"})


@dataclass(frozen=True)
class SearchJob(_Tagged):
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


@dataclass(frozen=True)
class ReplayJob(_Tagged):
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


ScheduleJob = SearchJob | ReplayJob


def from_json(d: dict[str, Any]) -> ScheduleJob:
    """The job a job file holds, by its ``mode``; ValueError for another mode."""
    for kind in (SearchJob, ReplayJob):
        if d.get("mode") == kind.MODE:
            return kind.from_json(d)
    raise ValueError(f"unknown mode {d.get('mode')!r}")
