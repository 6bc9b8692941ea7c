"""``Speculative``: libcommon's speculative driver (draft-dflash, draft-dspark) over a target and a draft context."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import (
    ContextError,
    IncompatibleModelsError,
    PyllamaError,
)
from ..owning import (
    SpeculativeDriver,
    runtime,
)
from ..process import logs
from ._base import _Owner
from .batch import Batch, _seq_ids, embd_rows
from .context import Context


class Speculative(_Owner):
    """libcommon's speculative driver over a target and a draft context.

    ``spec_type`` is llama-server's ``--spec-type``: ``draft-dflash`` or ``draft-dspark`` (one
    implementation serves both, and DFlash2 is a ``draft-dflash`` draft with a selector), or the
    siblings that keep a memory of the conversation too: ``draft-eagle3`` (a draft context made with
    Context.draft) and ``draft-mtp`` (Context.mtp, over the target's own MTP head, or Context.assistant,
    over an assistant model that reads the target's memory). Without it, the
    type is what llama-server detects from the draft file (:func:`detect_spec_type`).
    Create it before the target decodes anything: its constructor turns on layer-input
    extraction on the target and non-causal attention on the draft. ``process*_ok`` return what
    ``common_speculative_process`` answered (False is what makes llama-server answer HTTP 500);
    the log lines of the last call are in ``last_log``.
    """

    def __init__(
        self,
        target: Context,
        draft: Context,
        n_seq: int = 1,
        n_max: int | None = None,
        n_min: int | None = None,
        p_min: float | None = None,
        backend_sampling: bool | None = None,
        spec_type: str | None = None,
    ) -> None:
        if draft.target is not target:
            raise ContextError("the draft context was not created over this target (use Context.draft(model, target))")
        if target.n_decode_calls or any(target.pos_max(s) >= 0 for s in range(min(n_seq, target.n_seq_max))):
            raise ContextError(
                "create Speculative before the target decodes anything: DFlash turns on the extraction of the "
                "target's layer inputs in its constructor"
            )
        self._rt = runtime()
        spec_type = spec_type or detect_spec_type(draft.model.path)
        if spec_type in BLOCK_DRAFTERS + ("draft-eagle3",) and not draft.model.target_layer_ids:
            raise IncompatibleModelsError(f"{draft.model.path} has no target_layer_ids: not a {spec_type} draft")
        block = draft.model.dflash_block_size
        if spec_type in BLOCK_DRAFTERS and draft.n_ubatch < block:
            # the noise block is decoded non-causally, in one ubatch: llama.cpp asserts on it
            raise ContextError(
                f"draft context n_ubatch {draft.n_ubatch} < the draft's block size {block}: DFlash decodes its "
                f"noise block of {block} rows in one non-causal ubatch (llama.cpp would abort); use n_ubatch >= {block}"
            )
        self._rt = runtime()
        self.target = target
        self.draft_ctx = draft
        self.spec_type = spec_type
        params: dict[str, Any] = {"n_seq": n_seq, "type": spec_type_id(self.spec_type)}
        optional = {"n_max": n_max, "n_min": n_min, "p_min": p_min, "backend_sampling": backend_sampling}
        params.update({k: v for k, v in optional.items() if v is not None})
        self._handle = SpeculativeDriver(self._rt, target._handle, draft._handle, params)
        self.last_log: list[logs.LogLine] = []

    @property
    def n_max(self) -> int:
        """Max drafted tokens after libcommon clamped it to the draft's block size."""
        return self._handle.check("spec_n_max", int(self._rt.lib.pyllama_dflash_spec_n_max(self._ptr())))

    @property
    def own_positions(self) -> bool:
        """Whether the draft keeps positions of its own, row k of a sequence at draft position k (patch
        0007): the caller then trims and restores it by the sequence's row count, not the target's
        position. False on a libcommon without that query."""
        rc = int(self._rt.lib.pyllama_dflash_spec_own_positions(self._ptr()))
        return bool(self._handle.check("spec_own_positions", rc))

    @property
    def own_positions_text(self) -> bool:
        """Whether those positions count the text rows only, an image's rows left out of the draft's
        context (0007's EAGLE3). False on a libcommon without that query."""
        rc = int(self._rt.lib.pyllama_dflash_spec_own_positions_text(self._ptr()))
        return bool(self._handle.check("spec_own_positions_text", rc))

    def _run(self, call: str, fn: Callable[[], int]) -> int:
        """A shim call: its log captured (libcommon's included), a shim error raised (see product/owning.py)."""
        rc, cap = self._logged(lambda: int(fn()), poll_common=True)
        return self._handle.check(call, rc, cap)

    def process_ok(self, batch: Batch) -> bool:
        """Hand the batch the target just decoded to the driver (token or embedding rows): whether
        ``common_speculative_process`` took it."""
        if batch.kind == "tokens":
            return self.process_tokens_ok(batch.token_ids, batch.pos[0], batch.seq_id, batch.logits)
        return self.process_embd_ok(batch.embd, batch.pos, batch.seq_id)

    def process_tokens_ok(
        self,
        tokens: np.ndarray | Sequence[int],
        pos: np.ndarray | Sequence[int],
        seq_id: int | Sequence[int] | np.ndarray = 0,
        output: np.ndarray | Sequence[bool] | None = None,
    ) -> bool:
        tok = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n = tok.shape[0]
        positions = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1)
        if positions.shape != (n,):
            raise ValueError(f"process_tokens_ok: {positions.shape[0]} positions for {n} tokens")
        seqs = _contiguous_seqs(_seq_ids(seq_id, n), "process_tokens_ok")
        out = np.zeros(n, dtype=np.int8) if output is None else np.ascontiguousarray(output, dtype=np.int8)
        ffi, lib = self._rt.ffi, self._rt.lib
        rc = self._run(
            "pyllama_dflash_spec_process_tokens",
            lambda: lib.pyllama_dflash_spec_process_tokens(
                self._ptr(),
                n,
                ffi.from_buffer("llama_token[]", tok),
                ffi.from_buffer("llama_pos[]", positions),
                ffi.from_buffer("llama_seq_id[]", seqs),
                ffi.from_buffer("int8_t[]", out),
            ),
        )
        return rc == lib.PYLLAMA_DFLASH_TRUE

    def process_embd_ok(
        self,
        embd: np.ndarray,
        pos: np.ndarray,
        seq_id: int | Sequence[int] | np.ndarray = 0,
    ) -> bool:
        rows, positions = embd_rows(embd, pos, "process_embd_ok: ")
        rows, positions = np.ascontiguousarray(rows), np.ascontiguousarray(positions)  # handed to C as they are
        n, n_embd = rows.shape
        seqs = _contiguous_seqs(_seq_ids(seq_id, n), "process_embd_ok")
        ffi, lib = self._rt.ffi, self._rt.lib
        rc = self._run(
            "pyllama_dflash_spec_process_embd",
            lambda: lib.pyllama_dflash_spec_process_embd(
                self._ptr(),
                n,
                ffi.from_buffer("float[]", rows),
                n_embd,
                ffi.from_buffer("llama_pos[]", positions),
                positions.shape[0],
                ffi.from_buffer("llama_seq_id[]", seqs),
            ),
        )
        return rc == lib.PYLLAMA_DFLASH_TRUE

    def begin(self, seq_id: int, prompt: Sequence[int] | np.ndarray) -> None:
        """Start a generation for seq_id with its prompt tokens."""
        toks = np.ascontiguousarray(prompt, dtype=np.int32).reshape(-1)
        ffi, lib = self._rt.ffi, self._rt.lib
        self._run(
            "pyllama_dflash_spec_begin",
            lambda: lib.pyllama_dflash_spec_begin(
                self._ptr(), seq_id, ffi.from_buffer("llama_token[]", toks), toks.shape[0]
            ),
        )

    def draft(
        self,
        seq_id: int,
        id_last: int,
        pos0: int,
        n_max: int | None = None,
        trim_draft: bool = True,
        trim_at: int | None = None,
    ) -> list[int]:
        """Draft tokens for seq_id following id_last, whose position is pos0.

        DFlash decodes its noise block [id_last, mask...] into the draft's memory and leaves it
        there; with trim_draft (llama-server does the same after drafting) the draft's memory is cut
        back from ``trim_at`` on: by default the target's next position, so the next process_ok() lines
        up. A draft that keeps positions of its own (patch 0007) is cut back at the sequence's row
        count instead, which the caller knows (llama-server: the checkpoint's n_tokens).
        """
        ffi, lib = self._rt.ffi, self._rt.lib
        cap = max(self.n_max, n_max or 0, 1)
        out = ffi.new("llama_token[]", cap)
        n = self._run(
            "pyllama_dflash_spec_draft",
            lambda: lib.pyllama_dflash_spec_draft(self._ptr(), seq_id, id_last, pos0, n_max or 0, out, cap),
        )
        if trim_draft:
            self.draft_ctx.seq_rm(seq_id, self.target.pos_max(seq_id) + 1 if trim_at is None else trim_at, -1)
        return [int(out[i]) for i in range(min(n, cap))]

    def target_features(self, n_rows: int) -> np.ndarray:
        """The target's features of its last batch's first ``n_rows`` rows, as the driver feeds them to a
        DFlash draft: the input of each of the draft's target layers, side by side,
        ``[n_rows, n_layers * n_embd]`` (a copy). The driver turned their extraction on."""
        ffi, lib, ctx = self._rt.ffi, self._rt.lib, self.target._ptr()
        n_embd, layers = self.target.model.n_embd, []
        for lid in self.draft_ctx.model.target_layer_ids:
            ptr = lib.pyllama_dflash_get_embeddings_layer_inp(ctx, lid)
            if ptr == ffi.NULL:
                raise PyllamaError(f"target layer {lid}'s input was not extracted")
            rows = np.frombuffer(ffi.buffer(ptr, n_rows * n_embd * 4), dtype=np.float32)
            layers.append(rows.reshape(n_rows, n_embd))
        return np.concatenate(layers, axis=1)

    def target_hidden_states(self, n_rows: int) -> np.ndarray:
        """The target's hidden states (``h_nextn``, before the output norm) of its last batch's first
        ``n_rows`` rows, as the MTP driver pairs them with the next rows: ``[n_rows, n_embd]`` (a copy;
        the Qwen3.5 targets' output width is their n_embd). The MTP driver turned their extraction on,
        one per row."""
        ffi, lib = self._rt.ffi, self._rt.lib
        ptr = lib.pyllama_dflash_get_embeddings_nextn(self.target._ptr())
        if ptr == ffi.NULL:
            raise PyllamaError(f"the target's hidden states were not extracted: {self._rt.shim_error()}")
        n_embd = self.target.model.n_embd
        return np.frombuffer(ffi.buffer(ptr, n_rows * n_embd * 4), dtype=np.float32).reshape(n_rows, n_embd).copy()

    def accept(self, seq_id: int, n_accepted: int) -> None:
        """Tell the driver how many drafted tokens the target accepted."""
        if not 0 <= n_accepted <= 0xFFFF:
            raise ValueError(f"n_accepted {n_accepted} out of range")
        lib = self._rt.lib
        self._run("pyllama_dflash_spec_accept", lambda: lib.pyllama_dflash_spec_accept(self._ptr(), seq_id, n_accepted))

    def get_state(self, seq_id: int) -> bytes:
        """What the driver keeps of seq_id besides the draft's memory (``common_speculative_get_state``:
        EAGLE3's pending row, which llama-server saves with a context checkpoint); b"" for none."""
        ffi, lib = self._rt.ffi, self._rt.lib
        n = self._run(
            "pyllama_dflash_spec_get_state", lambda: lib.pyllama_dflash_spec_get_state(self._ptr(), seq_id, ffi.NULL, 0)
        )
        if n == 0:
            return b""
        out = ffi.new("uint8_t[]", n)
        again = self._run(
            "pyllama_dflash_spec_get_state", lambda: lib.pyllama_dflash_spec_get_state(self._ptr(), seq_id, out, n)
        )
        if again != n:  # nothing runs in between: a driver whose state changes size on its own
            raise PyllamaError(f"get_state: the driver's state of seq {seq_id} was {n} bytes, then {again}")
        return bytes(ffi.buffer(out, n))

    def set_state(self, seq_id: int, data: bytes = b"") -> None:
        """``common_speculative_set_state``: give seq_id back what get_state() returned, or, with b"", make
        the driver forget what it kept (llama-server after a slot restore or a prompt-cache load)."""
        lib = self._rt.lib
        buf = self._rt.ffi.from_buffer("uint8_t[]", data) if data else self._rt.ffi.NULL
        self._run(
            "pyllama_dflash_spec_set_state",
            lambda: lib.pyllama_dflash_spec_set_state(self._ptr(), seq_id, buf, len(data)),
        )


def spec_type_id(name: str) -> int:
    """libcommon's common_speculative_type for a --spec-type name; ValueError for an unknown one."""
    rt = runtime()
    value = int(rt.lib.pyllama_dflash_spec_type_from_name(name.encode()))
    if value == rt.lib.PYLLAMA_DFLASH_ERROR:
        raise ValueError(rt.shim_error())
    return value


def detect_spec_type(path: str | Path) -> str:
    """The --spec-type llama-server picks for a draft file given without one (libcommon's
    common_speculative_types_from_gguf: a Markov head makes draft-dspark, another dflash draft
    draft-dflash); IncompatibleModelsError when it picks none."""
    rt = runtime()
    value = int(rt.lib.pyllama_dflash_spec_type_from_gguf(str(path).encode()))
    if value == rt.lib.PYLLAMA_DFLASH_ERROR:
        raise IncompatibleModelsError(f"{path}: llama-server detects no speculative type in it ({rt.shim_error()})")
    return SPEC_TYPE_NAMES[value]


# the drafters that decode a block of positions at once (common_speculative_impl_draft_dflash)
BLOCK_DRAFTERS = ("draft-dflash", "draft-dspark")

# common_speculative_type's values in b11434 (common/common.h), by name
SPEC_TYPE_NAMES = {
    1: "draft-simple",
    2: "draft-eagle3",
    3: "draft-mtp",
    4: "draft-dflash",
    5: "draft-dspark",
}


def _contiguous_seqs(seqs: np.ndarray, via: str) -> np.ndarray:
    """libcommon's driver takes each sequence's rows of a batch as one run (it keeps the first and the
    last row of each): rows of a sequence split by another's would be read as the other's. Refused."""
    for seq in np.unique(seqs):
        rows = np.flatnonzero(seqs == seq)
        if rows[-1] - rows[0] + 1 != len(rows):
            gap = int(rows[np.flatnonzero(np.diff(rows) > 1)[0] + 1])
            raise ValueError(
                f"{via}: the rows of sequence {int(seq)} are not contiguous in the batch (row {gap} follows "
                f"another sequence's); the speculative driver reads each sequence's rows as one run"
            )
    return seqs
