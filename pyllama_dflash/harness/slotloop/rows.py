"""The rows a sequence's target holds, and those a draft with positions of its own holds (patch 0007).

Each row has an identity that chains its content onto the row before it, so two sessions that fed
the same prefix hold equal identities; the draft's rows are a list of those identities, in the
draft's positions' order. :class:`Rows` is mixed into :class:`~.session.Session`, whose state it keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ...product.api import kv_cells
from .record import DRAFT_ROWS, Call
from .state import SeqState


class Rows:
    """The session's row bookkeeping: its target rows' identities and its draft's rows under 0007."""

    def _check_draft_rows(self, seq: int, step: str) -> None:
        """A draft with positions of its own holds the rows it took at 0..N-1 (0007), each once: a failing
        check where its memory of seq holds any other set of positions, a gap inside included. A row at
        -1, say, breaks no batch check (llama.cpp skips it for an empty sequence), and a random head may
        draft the same tokens over it."""
        if not self.own_positions:
            return
        n = len(self.seqs[seq].draft_ids)
        held = kv_cells.held(self.draft, seq)
        if sorted(held) != list(range(n)):
            why = f"the draft's memory of seq {seq} holds positions {spans(held)}, not its {n} rows' 0..{n - 1}"
            pos = (min(held), max(held)) if held else (-1, -1)
            self.record.add(Call(step, "draft", DRAFT_ROWS, seq, False, pos=pos, n=n, log=[why]))

    def _add_rows(self, st: SeqState, positions: Sequence[int], contents: Sequence[int], image: bool = False) -> None:
        """Rows the target now holds for st's sequence, at the target's positions. A row's identity chains
        its content (a token, or its image's digest) and position onto the row before it: the target's
        features of a row depend on its prefix alone, so equal identities are equal rows, in any session."""
        prev = st.row_ids[-1] if st.row_ids else 0
        for p, c in zip(positions, contents, strict=True):
            prev = chain(prev, int(c), int(p))
            st.rows.append(int(p))
            st.row_ids.append(prev)
            if image:
                self._image_rows.add(prev)

    def _draft_took(self, st: SeqState, n: int, image: bool = False) -> None:
        """A draft with positions of its own took st's last n rows, after every row it held (an image's
        rows: not a draft that holds the text rows only)."""
        if self.own_positions and not (image and self.text_rows_only):
            st.draft_ids.extend(st.row_ids[-n:])

    def _draft_rows(self, row_ids: Sequence[int]) -> list[int]:
        """Of a sequence's rows (their identities), those a draft with positions of its own holds, in
        its positions' order: every row, or the text rows only (0007's EAGLE3)."""
        if self.text_rows_only:
            return [r for r in row_ids if r not in self._image_rows]
        return list(row_ids)

    def _draft_trimmed(self, seq: int, end: int) -> None:
        """The draft's rows of seq from ``end`` on were removed (a draft with positions of its own)."""
        if self.own_positions:
            del self.seqs[seq].draft_ids[end:]


def digest(image: np.ndarray | bytes) -> int:
    data = image if isinstance(image, bytes) else np.ascontiguousarray(image).tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def chain(prev: int, content: int, pos: int) -> int:
    """The identity of a row after the row ``prev``: a stable hash, the same in every process."""
    data = b"".join(x.to_bytes(16, "little", signed=True) for x in (prev, content, pos))
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items a and b share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def spans(positions: Sequence[int]) -> str:
    """Positions as runs, in order: [0, 1, 2, 5, 5, 6] -> '0..2, 5, 5..6'; 'none' for none."""
    runs: list[list[int]] = []
    for p in sorted(positions):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs) or "none"
