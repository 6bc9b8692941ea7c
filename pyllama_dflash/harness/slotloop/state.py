"""A sequence's bookkeeping in the slot loop (:class:`SeqState`) and a slot file (:class:`SavedSlot`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SeqState:
    n_past: int = 0  # the target's next position (llama-server: slot.prompt.tokens.pos_next())
    id_last: int | None = None  # the last sampled token, the anchor of the next draft
    image_pending: bool = False  # an image was decoded since the last drafting round
    text_tokens: list[int] = field(default_factory=list)
    # the target's position of each row the target holds (an image: a row per token, all at its
    # pinned position): the sequence's expanded token list, whose length is llama-server's
    # server_tokens::size() and a row's index its draft position under patch 0007
    rows: list[int] = field(default_factory=list)
    # the target's layer features of each row (the definition reference only)
    features: list[np.ndarray] = field(default_factory=list)
    # each row's identity (a session-wide counter), and, for a draft with positions of its own (0007),
    # the identities of the rows the draft holds, in its positions' order: equal while the draft holds
    # the sequence; shorter where a target-only restore left it behind (the restored rows' features
    # exist nowhere)
    row_ids: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)

    def saved(self) -> SeqState:
        """The state as a save keeps it: no image pending, lists of its own."""
        return SeqState(
            self.n_past,
            self.id_last,
            False,
            list(self.text_tokens),
            list(self.rows),
            list(self.features),
            list(self.row_ids),
            list(self.draft_ids),
        )

    def keep_rows(self, n: int) -> None:
        """Keep the first n rows (their identities and features): what the target still holds."""
        del self.rows[n:]
        del self.row_ids[n:]
        del self.features[n:]


@dataclass(frozen=True)
class SavedSlot:
    """A slot file: the target's part, the draft's part (None: the server saved none), the bookkeeping."""

    target: bytes
    draft: bytes | None
    state: SeqState
