"""What a session did, one frozen record per call of its slot loop, for the reference replay.

:class:`~.session.Session` appends one of these per prompt, batch, generation, save, restore and
rewind (``Session.ops``); :func:`~.session.replay_reference` replays them on the target alone,
dispatching on their type. Each holds the arguments the call was made with; a saved state that
another session made (another request's cached prompt) travels in the operation, one saved by
the session itself is found again by the replay as the sequence's latest save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Prompt:
    """:meth:`Session.prompt`: text with its media markers, and the images they stand for."""

    seq: int
    text: str
    images: tuple[np.ndarray, ...]
    step: str


@dataclass(frozen=True)
class TextBatch:
    """:meth:`Session.text_batch`: several sequences' text in one target batch."""

    parts: tuple[tuple[int, str], ...]
    step: str


@dataclass(frozen=True)
class Generate:
    """:meth:`Session.generate`: n_tokens greedy tokens on seq."""

    seq: int
    n_tokens: int
    step: str


@dataclass(frozen=True)
class SaveTarget:
    """:meth:`Session.save_target`: the target's sequence state, kept as the sequence's latest save."""

    seq: int


@dataclass(frozen=True)
class SaveSlot:
    """:meth:`Session.save_slot`: a slot file, kept as the sequence's latest slot save."""

    seq: int


@dataclass(frozen=True)
class RestoreSlot:
    """:meth:`Session.restore_slot`: the sequence's latest slot save loaded back."""

    seq: int
    step: str


@dataclass(frozen=True)
class RestoreTarget:
    """:meth:`Session.restore_target`: the target alone restored; ``external`` is a state saved by
    another session (None: the sequence's latest save in this one)."""

    seq: int
    external: tuple[bytes, Any] | None  # (the target's state, its SeqState)
    step: str


@dataclass(frozen=True)
class Rewind:
    """:meth:`Session.rewind`: seq cut back to pos, from a checkpoint when ``has_checkpoint``
    (``external`` when another session saved it, else the sequence's latest save)."""

    seq: int
    pos: int
    external: tuple[bytes, Any] | None  # (the target's state, its SeqState)
    has_checkpoint: bool
    step: str


Op = Prompt | TextBatch | Generate | SaveTarget | SaveSlot | RestoreSlot | RestoreTarget | Rewind
