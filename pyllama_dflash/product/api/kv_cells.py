"""The positions a sequence's KV cells hold, read from its state: llama.cpp has no call that lists them.

llama_state_seq_get_data (b11434: ``llama_context::state_seq_get_data`` and ``llama_kv_cache::state_write``)
writes, in int32 words: a magic and the sequence id; the stream count; then per stream its cell count
(an empty stream writes nothing else) and, for the one stream that holds the sequence, per cell its
position, its sequence count, on an M-RoPE model the cell extension (x, y, token), and its sequence
ids; the tensor data follows. An iSWA cache writes its full cache first, a hybrid memory its attention
cache first, so the first records are those of the cache that keeps every row.
"""

from __future__ import annotations

import numpy as np

from ...errors import PyllamaError
from .context import Context

_EXT_WORDS = 3  # llama_kv_cell_ext: x, y, tok


def positions(state: bytes, seq_id: int, *, mrope: bool) -> list[int]:
    """The positions of seq_id's cells, in cell order, from its state; PyllamaError where the state does
    not read as those records."""
    words = np.frombuffer(state[: len(state) - len(state) % 4], dtype="<i4")
    ext = _EXT_WORDS if mrope else 0

    def bad(why: str) -> PyllamaError:
        return PyllamaError(f"seq {seq_id}'s state does not read as b11434's KV cell records: {why}")

    if len(words) < 3 or int(words[1]) != seq_id:
        raise bad("no header naming the sequence")
    i, out = 3, []
    for _ in range(int(words[2])):  # streams
        if i >= len(words):
            raise bad("it ends before its streams do")
        n_cells, i = int(words[i]), i + 1
        if n_cells == 0:
            continue
        for _ in range(n_cells):
            if i + 2 + ext > len(words):
                raise bad("it ends inside its cell records")
            pos, n_seq = int(words[i]), int(words[i + 1])
            ids = words[i + 2 + ext : i + 2 + ext + n_seq]
            if n_seq != 1 or int(ids[0]) != seq_id:
                raise bad(f"a cell of position {pos} names the sequences {ids.tolist()}")
            out.append(pos)
            i += 2 + ext + n_seq
        break  # one stream holds the sequence; its tensor data follows
    return out


def held(ctx: Context, seq_id: int = 0) -> list[int]:
    """Every position seq_id's cells hold in ctx's KV cache (for an iSWA cache, the full one, which keeps
    every row), in cell order, a repeated position as often as it is held; checked against the
    memory's own first and last."""
    out = positions(ctx.state_seq_get(seq_id), seq_id, mrope=ctx.model.is_mrope)
    if out and (min(out), max(out)) != (ctx.pos_min(seq_id), ctx.pos_max(seq_id)):
        raise PyllamaError(
            f"seq {seq_id}'s cell records hold positions {min(out)}..{max(out)}, its memory "
            f"{ctx.pos_min(seq_id)}..{ctx.pos_max(seq_id)}: not b11434's format"
        )
    return out
