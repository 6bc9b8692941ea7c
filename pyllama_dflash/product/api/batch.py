"""``Batch``: token or embedding rows for one decode, as numpy views onto C memory, each row with a
hidden state beside it or none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ..owning import (
    BatchBuffers,
    runtime,
)

LogitsSpec = Literal["last", "all", "none"] | Sequence[bool] | np.ndarray


def _logits_flags(spec: LogitsSpec, n: int) -> np.ndarray:
    if isinstance(spec, str):
        flags = np.zeros(n, dtype=np.int8)
        if spec == "all":
            flags[:] = 1
        elif spec == "last":
            if n:
                flags[-1] = 1
        elif spec != "none":
            raise ValueError(f"logits must be 'last', 'all', 'none' or a bool array, not {spec!r}")
        return flags
    flags = np.asarray(spec, dtype=np.int8)
    if flags.shape != (n,):
        raise ValueError(f"logits array has shape {flags.shape}, expected ({n},)")
    return flags


def _seq_ids(seq_id: int | Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    ids = np.asarray(seq_id, dtype=np.int32)
    if ids.ndim == 0:
        return np.full(n, int(ids), dtype=np.int32)
    if ids.shape != (n,):
        raise ValueError(f"seq_id array has shape {ids.shape}, expected ({n},)")
    return ids


def _check_positions(batch: Batch, via: str) -> None:
    """Refuse positions llama.cpp would store without complaint, corrupting the sequence: a negative
    one, or one that does not increase within a sequence. An M-RoPE embedding batch (an image)
    repeats its temporal row, so there only a decrease is refused."""
    pos = batch.pos
    if batch.n_tokens == 0:
        return
    negative = (pos < 0).any(axis=0)
    if negative.any():
        row = int(np.argmax(negative))
        raise ValueError(f"{via}: pos of row {row} is {pos[:, row].tolist()}: positions must be >= 0")
    strict = batch.n_pos == 1
    for seq in np.unique(batch.seq_id):
        rows = np.flatnonzero(batch.seq_id == seq)
        t = pos[0, rows]
        step = np.diff(t)
        bad = step <= 0 if strict else step < 0
        if bad.any():
            k = int(np.argmax(bad))
            what = "repeats" if step[k] == 0 else "goes back to"
            raise ValueError(
                f"{via}: pos of row {int(rows[k + 1])} {what} {int(t[k + 1])} after {int(t[k])} "
                f"in sequence {int(seq)}: "
                "positions must increase within a sequence"
            )


def _state_rows(state: np.ndarray | None, n: int) -> np.ndarray | None:
    """The rows' hidden states as C-contiguous float32 ``[n, n_state]``, checked, or None."""
    if state is None:
        return None
    rows = np.ascontiguousarray(state, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] != n or rows.shape[1] == 0:
        raise ValueError(f"state must be [{n}, n_state], one hidden state per row, got shape {np.shape(state)}")
    return rows


def embd_rows(embd: np.ndarray, pos: Sequence[int] | np.ndarray, via: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Embedding rows as float32 ``[n_tokens, n_embd]`` and their positions as int32 ``[n_pos (1..4),
    n_tokens]`` (a 1-D ``pos`` is one row), checked; neither is copied when it already fits."""
    rows = np.asarray(embd, dtype=np.float32)
    if rows.ndim != 2:
        raise ValueError(f"{via}embd must be [n_tokens, n_embd], got shape {rows.shape}")
    n = rows.shape[0]
    positions = np.asarray(pos, dtype=np.int32)
    if positions.ndim == 1:
        positions = positions.reshape(1, -1)
    if positions.ndim != 2 or positions.shape[1] != n or not 1 <= positions.shape[0] <= 4:
        raise ValueError(f"{via}pos must be [n_pos (1..4), {n}], got shape {np.shape(pos)}")
    return rows, positions


class Batch:
    """Rows for one decode: token rows or embedding rows, with positions ``[n_pos, n_tokens]``.

    The arrays live in C memory that the ``llama_batch`` points at; ``tokens``/``embd``/``pos``/
    ``seq_id``/``logits`` are numpy views onto it, filled with one vectorised copy each.
    """

    def __init__(self, buffers: BatchBuffers, kind: Literal["tokens", "embd"], state: np.ndarray | None = None) -> None:
        self._buffers = buffers
        self.kind = kind
        # each row's hidden state beside its token or embedding (MTP's second input), [n, n_state]; it
        # reaches llama.cpp through llama_batch_ext_set_embd_state, which b11434 refuses (patch 0009)
        self.state = _state_rows(state, buffers.n_tokens)

    @classmethod
    def tokens(
        cls,
        tokens: Sequence[int] | np.ndarray,
        pos: Sequence[int] | np.ndarray | None = None,
        *,
        pos0: int = 0,
        seq_id: int | Sequence[int] | np.ndarray = 0,
        logits: LogitsSpec = "last",
        state: np.ndarray | None = None,
    ) -> Batch:
        """Token rows; positions are ``pos`` (shape [n] or [1, n]) or ``pos0, pos0+1, ...``; ``state``
        ``[n, n_state]``, each row's hidden state, or None."""
        tok = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = tok.shape[0]
        if pos is None:
            positions = np.arange(pos0, pos0 + n, dtype=np.int32)
        else:
            positions = np.asarray(pos, dtype=np.int32).reshape(-1)
            if positions.shape != (n,):
                raise ValueError(f"a token batch takes one position per token: got {np.shape(pos)} for {n} tokens")
        buf = BatchBuffers(runtime(), n, n_embd=0, n_pos=1)
        buf.token[:] = tok
        buf.pos[0, :] = positions
        buf.seq_id[:] = _seq_ids(seq_id, n)
        buf.logits[:] = _logits_flags(logits, n)
        return cls(buf, "tokens", state)

    @classmethod
    def embeddings(
        cls,
        embd: np.ndarray,
        pos: Sequence[int] | np.ndarray,
        *,
        seq_id: int | Sequence[int] | np.ndarray = 0,
        logits: LogitsSpec = "none",
        state: np.ndarray | None = None,
    ) -> Batch:
        """Embedding rows ``embd [n, n_embd]`` with ``pos [n_pos, n]`` (n_pos 1, or 4 for M-RoPE), and
        ``state [n, n_state]``, each row's hidden state, or None.

        A C-contiguous float32 ``embd`` is not copied: the batch points into it and keeps it
        alive, so changing the array afterwards changes the batch.
        """
        rows, positions = embd_rows(embd, pos)
        n, n_embd = rows.shape
        # a C-contiguous float32 array is used in place (the batch keeps a reference to it)
        shared = rows if rows.flags.c_contiguous else None
        buf = BatchBuffers(runtime(), n, n_embd=n_embd, n_pos=positions.shape[0], embd_source=shared)
        if shared is None:
            buf.embd[:] = rows
        buf.pos[:] = positions
        buf.seq_id[:] = _seq_ids(seq_id, n)
        buf.logits[:] = _logits_flags(logits, n)
        return cls(buf, "embd", state)

    @property
    def n_tokens(self) -> int:
        return self._buffers.n_tokens

    @property
    def n_pos(self) -> int:
        return self._buffers.n_pos

    @property
    def n_embd(self) -> int:
        return self._buffers.n_embd

    @property
    def token_ids(self) -> np.ndarray | None:
        return self._buffers.token

    @property
    def embd(self) -> np.ndarray | None:
        return self._buffers.embd

    @property
    def pos(self) -> np.ndarray:
        return self._buffers.pos

    @property
    def seq_id(self) -> np.ndarray:
        return self._buffers.seq_id

    @property
    def logits(self) -> np.ndarray:
        return self._buffers.logits

    def c_state(self, ffi: Any) -> tuple[Any, int]:
        """The rows' hidden states for the shim: (``float *`` or NULL, the width of a state or 0)."""
        return (ffi.NULL, 0) if self.state is None else (ffi.from_buffer("float[]", self.state), self.state.shape[1])

    @property
    def c_struct(self) -> Any:
        """The ``llama_batch *`` (for callers that drive the raw binding)."""
        return self._buffers.struct

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        first = int(self.pos[0, 0]) if self.n_tokens else None
        return f"Batch({self.kind}, n_tokens={self.n_tokens}, n_pos={self.n_pos}, first_pos={first})"
