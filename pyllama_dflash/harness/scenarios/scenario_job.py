"""One scenario on one variant, as a parent hands it to a child process (:mod:`.child`):
:class:`ScenarioJob`, its defaults written here once, and its JSON form for the job file."""

from __future__ import annotations

from dataclasses import dataclass

from ...codec import Coded
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet, case_name


@dataclass(frozen=True)
class ScenarioJob(Coded):
    """A scenario on a variant with the models and session config; ``twin`` runs the draft's
    reconverted twin instead (the drift reference), ``definition`` drafts as the draft's definition
    has it (the definition reference). ``timeout_s`` is the parent's: how long the child may take."""

    scenario: str
    variant: str
    models: ModelSet
    config: SessionConfig = DEFAULT_CONFIG
    backend: str | None = None
    check_exact: bool = True  # replay the run without the draft: the output must be the same
    timeout_s: float = 300.0
    twin: bool = False
    definition: bool = False

    @property
    def case(self) -> str:
        """``<drafter>/<target kind>``: which models the job runs on."""
        return case_name(self.models)

    @property
    def column(self) -> str:
        """The variant, or ``<variant>+twin`` / ``<variant>+definition`` for a reference run."""
        return self.variant + ("+twin" if self.twin else "+definition" if self.definition else "")

    @property
    def key(self) -> tuple[str, str]:
        """(scenario, column)."""
        return self.scenario, self.column
