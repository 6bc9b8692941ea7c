"""The llama-server slot loop in miniature: one :class:`Session` per run, over the bindings.

What a session is given and keeps: its config (``config``), the models it runs on (``models``) and
those shared by every session of a process (``loaded``), the operations it did (``ops``), what it
records (``record``) and each sequence's bookkeeping (``state``, ``rows``). The loop itself
(``session``), its drafting rounds (``drafting``), its request boundaries (``slots``), the modes it
runs a reference in (``reference_modes``), and the greedy replay of a run's operations (``replay``).
"""

from .config import DEFAULT_CONFIG, SessionConfig
from .drafting import DRAFT_REFUSED
from .replay import replay_reference
from .session import Session
from .state import SavedSlot, SeqState

__all__ = [
    "DEFAULT_CONFIG",
    "DRAFT_REFUSED",
    "SavedSlot",
    "SeqState",
    "Session",
    "SessionConfig",
    "replay_reference",
]
