"""What an acceptance child runs: one column of the table over some conversations (typed, JSON at
the process boundary only)."""

from __future__ import annotations

from dataclasses import dataclass

from ...codec import Coded
from ...harness.slotloop.config import SessionConfig
from ...harness.slotloop.models import ModelSet

# how a column drafts: the variant's libcommon (``variant``), baseline drafting as the definition has it
# through llama.cpp (``definition``) or through the reference model (``model``)
MODES = ("variant", "definition", "model")


@dataclass(frozen=True)
class Column:
    name: str
    variant: str  # the build whose libraries run it
    twin: bool = False  # the trained draft's reconverted twin instead of the legacy draft
    mode: str = "variant"
    images: bool = True  # False: the text-only ceiling, the same conversations without their images

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"column {self.name}: mode {self.mode!r} is not one of {', '.join(MODES)}")


@dataclass(frozen=True)
class AcceptanceJob(Coded):
    column: Column
    models: ModelSet
    seeds: tuple[int, ...]
    session: SessionConfig  # before the column's own: its variant's slot loop, or the definition's
    paired: bool = False  # drafts at every position of the target's replies (script.run_conversation)
    image_px: int | None = None  # the images' size (None: the corpus's drawn sizes)
    # the speed through the library: each conversation run with the draft and without it (a session of the
    # same variant with no draft at all), side by side a turn at a time, each turn timed (script.side_by_side)
    timed: bool = False
