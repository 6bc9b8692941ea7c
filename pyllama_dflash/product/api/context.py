"""``Context``: a llama_context (target or draft), its decode calls and its memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ContextError, PyllamaError
from ..owning import LlamaBatchExt, LlamaContext, runtime
from ..process import logs
from ._base import _default_threads, _Owner
from .batch import Batch, _check_positions
from .model import Model
from .pairing import check_draft_pair


class Context(_Owner):
    """A llama_context. Use :meth:`draft` for a draft context over a target."""

    def __init__(
        self,
        model: Model,
        n_ctx: int = 256,
        n_batch: int | None = None,
        n_ubatch: int | None = None,
        n_seq_max: int = 1,
        n_rs_seq: int = 0,
        n_threads: int | None = None,
        embeddings: bool = False,
        n_outputs_max: int | None = None,
        n_outputs_max_per_seq: int | None = None,
        kv_unified: bool | None = None,
        *,
        mtp: bool = False,
        _target: Context | None = None,
    ) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a Model, not {type(model).__name__}")
        if model.is_draft_model and _target is None:
            raise ContextError(
                f"{model.path} is a DFlash draft ({model.arch}): it borrows the target's embeddings and "
                "output through ctx_other; create it with Context.draft(model, target)"
            )
        self._rt = runtime()
        self.model = model
        self.target = _target
        threads = n_threads or _default_threads()
        params: dict[str, Any] = {
            "n_ctx": n_ctx,
            "n_seq_max": n_seq_max,
            "n_rs_seq": n_rs_seq,
            "n_threads": threads,
            "n_threads_batch": threads,
            "embeddings": embeddings,
        }
        if mtp:  # a context over the model's MTP head (nextn layers), for draft-mtp
            params["ctx_type"] = self._rt.lib.LLAMA_CONTEXT_TYPE_MTP
        optional = {
            "n_batch": n_batch,
            "n_ubatch": n_ubatch,
            "n_outputs_max": n_outputs_max,
            "n_outputs_max_per_seq": n_outputs_max_per_seq,
            "kv_unified": kv_unified,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        self._handle = LlamaContext(self._rt, model._handle, params, _target._handle if _target else None)
        keep_tail, n_ubatch_used = self._keep_tail(n_rs_seq), self.n_ubatch
        if keep_tail and n_ubatch_used <= keep_tail:
            self._handle.close()
            raise ValueError(
                f"n_ubatch {n_ubatch_used} with n_rs_seq {n_rs_seq}: {model.path} has recurrent layers, whose "
                f"last n_rs_seq + 1 = {keep_tail} rows of a sequence must share a ubatch, so n_ubatch must be "
                f"larger than {keep_tail} (llama.cpp asserts n_ubatch > n_keep_tail in src/llama-batch.cpp)"
            )
        self._batch_ext: LlamaBatchExt | None = None
        self.n_decode_calls = 0  # decode/process/image calls made, successful or not
        self.last_log: list[logs.LogLine] = []  # what llama.cpp logged (warnings and up) during the last call

    def _keep_tail(self, n_rs_seq: int) -> int:
        """The rows llama.cpp keeps together at the end of a sequence (0: no such rule)."""
        lib, model = self._rt.lib, self.model._handle.ptr
        recurrent = bool(lib.llama_model_is_hybrid(model)) or bool(lib.llama_model_is_recurrent(model))
        return n_rs_seq + 1 if recurrent and n_rs_seq > 0 else 0

    @classmethod
    def draft(
        cls,
        model: Model,
        target: Context | None,
        n_ctx: int | None = None,
        n_batch: int | None = None,
        n_ubatch: int | None = None,
        n_seq_max: int | None = None,
        n_threads: int | None = None,
        n_outputs_max: int | None = None,
        n_outputs_max_per_seq: int | None = None,
    ) -> Context:
        """A draft context over target, set up like libcommon's draft context: ctx_other = target,
        n_ctx and n_seq_max taken from the target, no recurrent-state snapshots, and room for one
        noise block (anchor + masks = the draft's block size) of outputs per sequence, which the
        backend sampler checks per sequence."""
        if target is None:
            raise ContextError(
                "a draft context needs a target context: DFlash reads the target's token embeddings, "
                "output and layer inputs through ctx_other"
            )
        if not isinstance(target, Context):
            raise TypeError(f"target must be a Context, not {type(target).__name__}")
        target._handle._require_open()
        if target.is_draft:
            raise ContextError("the target of a draft context cannot itself be a draft context")
        check_draft_pair(model, target.model)
        seqs = n_seq_max if n_seq_max is not None else target.n_seq_max
        per_seq = max(1, model.dflash_block_size)  # libcommon: n_max + 1, and n_max < block size
        return cls(
            model,
            n_ctx=n_ctx if n_ctx is not None else target.n_ctx,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_seq_max=seqs,
            n_rs_seq=0,
            n_threads=n_threads,
            n_outputs_max=n_outputs_max if n_outputs_max is not None else seqs * per_seq,
            n_outputs_max_per_seq=n_outputs_max_per_seq if n_outputs_max_per_seq is not None else per_seq,
            _target=target,
        )

    @classmethod
    def mtp(cls, target: Context, n_threads: int | None = None) -> Context:
        """The draft context of draft-mtp: a context of type MTP over the target's own model (loaded with
        ``load_mtp``), as libcommon's common_speculative_init_result makes it without a -md file:
        n_ctx of the target, no recurrent-state snapshots, one output per sequence."""
        if not isinstance(target, Context):
            raise TypeError(f"target must be a Context, not {type(target).__name__}")
        target._handle._require_open()
        if not target.model.load_mtp:
            raise ContextError(
                f"{target.model.path} was loaded without its MTP head: load it with Model(path, load_mtp=True)"
            )
        return cls._mtp_over(target.model, target, n_threads)

    @classmethod
    def assistant(cls, model: Model, target: Context, n_threads: int | None = None) -> Context:
        """:meth:`mtp`'s context over an assistant that reads the target's memory (Gemma 4's), as libcommon
        makes it from a -md file. Make it before the target decodes: llama.cpp resets the target's cells."""
        if not isinstance(target, Context):
            raise TypeError(f"target must be a Context, not {type(target).__name__}")
        target._handle._require_open()
        if target.n_decode_calls:
            raise ContextError(
                f"{model.path}: make the assistant's context before the target decodes: it shares the target's "
                "memory, whose cells llama.cpp resets when the assistant's context is made"
            )
        return cls._mtp_over(model, target, n_threads)

    @classmethod
    def _mtp_over(cls, model: Model, target: Context, n_threads: int | None) -> Context:
        return cls(
            model,
            n_ctx=target.n_ctx,
            n_batch=target.n_batch,
            n_ubatch=target.n_ubatch,
            n_seq_max=target.n_seq_max,
            n_rs_seq=0,
            n_threads=n_threads,
            n_outputs_max=target.n_seq_max,
            n_outputs_max_per_seq=1,
            mtp=True,
            _target=target,
        )

    # -- properties --

    @property
    def is_draft(self) -> bool:
        return self.target is not None

    @property
    def n_ctx(self) -> int:
        return int(self._rt.lib.llama_n_ctx(self._ptr()))

    @property
    def n_batch(self) -> int:
        return int(self._rt.lib.llama_n_batch(self._ptr()))

    @property
    def n_ubatch(self) -> int:
        return int(self._rt.lib.llama_n_ubatch(self._ptr()))

    @property
    def n_rs_seq(self) -> int:
        """Recurrent-state snapshots per sequence: how many rows a hybrid target can drop by itself (0
        where its arch has no partial rollback, whatever was asked)."""
        return int(self._rt.lib.llama_n_rs_seq(self._ptr()))

    @property
    def n_seq_max(self) -> int:
        return int(self._rt.lib.llama_n_seq_max(self._ptr()))

    @property
    def n_ctx_seq(self) -> int:
        """KV cells one sequence can hold (llama.cpp splits n_ctx between sequences unless kv_unified)."""
        return int(self._rt.lib.llama_n_ctx_seq(self._ptr()))

    @property
    def causal_attn(self) -> bool:
        return bool(self._rt.lib.llama_get_causal_attn(self._ptr()))

    @property
    def decode_embd_width(self) -> int:
        """Row width llama_decode reads for embedding batches: the model's input width, or for a
        DFlash draft the fused target-feature width (target layers x n_embd)."""
        if self.model.arch == "dflash" and self.model.target_layer_ids:
            return len(self.model.target_layer_ids) * self.model.n_embd
        return self.model.n_embd_inp

    @property
    def process_embd_widths(self) -> tuple[int, ...]:
        """Row widths a llama_batch_ext accepts here (input width or encoder-feature width)."""
        return tuple(dict.fromkeys((self.model.n_embd_inp, self.decode_embd_width)))

    # -- decoding --

    def _check_batch(self, batch: Batch, via: str) -> None:
        n = batch.n_tokens
        if n > self.n_batch:
            raise ValueError(f"{via}: batch of {n} rows exceeds n_batch {self.n_batch} (llama.cpp would abort)")
        if not self.causal_attn and n > self.n_ubatch:
            raise ValueError(
                f"{via}: non-causal context needs the batch in one ubatch: {n} rows > n_ubatch {self.n_ubatch}"
            )
        _check_positions(batch, via)
        if batch.state is not None and via == "llama_decode":
            raise ValueError(f"{via}: a llama_batch has no slot for the rows' hidden states; use process_rc()")
        if batch.kind != "embd":
            return
        if via == "llama_decode":
            # the compat path reads n_tokens rows of this width and n_pos_per_embd position rows
            if batch.n_embd != self.decode_embd_width:
                raise ValueError(
                    f"{via}: embedding rows are {batch.n_embd} wide, this context reads {self.decode_embd_width}"
                )
            if batch.n_pos != self.model.n_pos_per_embd:
                raise ValueError(
                    f"{via}: {self.model.path.name} reads {self.model.n_pos_per_embd} position row(s) per embedding, "
                    f"the batch has {batch.n_pos}"
                )
        elif batch.n_embd not in self.process_embd_widths:
            raise ValueError(
                f"{via}: embedding rows are {batch.n_embd} wide, this context takes {self.process_embd_widths}"
            )

    def decode(self, batch: Batch) -> int:
        """``llama_decode``; returns its code (0 ok, 1 no KV slot, 2 aborted, -1 invalid batch, < -1 fatal)."""
        ptr = self._ptr()
        self._check_batch(batch, "llama_decode")
        rc, _ = self._logged(lambda: int(self._rt.lib.llama_decode(ptr, batch.c_struct[0])))
        self.n_decode_calls += 1
        return rc

    def process_rc(self, batch: Batch) -> int:
        """``llama_process(DECODE)`` with a ``llama_batch_ext`` (the route llama-server, libcommon and
        mtmd take); its return code, as :meth:`decode` returns llama_decode's (0: done)."""
        ptr = self._ptr()
        self._check_batch(batch, "llama_process")
        if self._batch_ext is None or self._batch_ext.closed:
            self._batch_ext = LlamaBatchExt(self._rt, self._handle)
        lib = self._rt.lib
        b = batch.c_struct
        ext = self._batch_ext.ptr

        def fill_and_process() -> int:
            filled = lib.pyllama_dflash_batch_ext_fill(
                ext,
                batch.n_tokens,
                b.token,
                b.embd,
                batch.n_embd,
                b.pos,
                batch.n_pos,
                batch._buffers.seq_flat,
                b.logits,
                *batch.c_state(self._rt.ffi),
            )
            if filled != 0:
                raise ValueError(f"llama_process: batch rejected while filling: {self._rt.shim_error()}")
            return int(lib.llama_process(ptr, lib.LLAMA_PROCESS_TYPE_DECODE, ext))

        rc, _ = self._logged(fill_and_process)
        self.n_decode_calls += 1
        return rc

    # -- memory --

    def _memory(self) -> Any:
        mem = self._rt.lib.llama_get_memory(self._ptr())
        if mem == self._rt.ffi.NULL:
            raise PyllamaError("this context has no memory")
        return mem

    def pos_min(self, seq_id: int = 0) -> int:
        """Smallest position held for seq_id, -1 if empty."""
        return int(self._rt.lib.llama_memory_seq_pos_min(self._memory(), seq_id))

    def pos_max(self, seq_id: int = 0) -> int:
        """Largest position held for seq_id, -1 if empty."""
        return int(self._rt.lib.llama_memory_seq_pos_max(self._memory(), seq_id))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove [p0, p1) of seq_id (negative: open end); False if a partial removal is impossible."""
        return bool(self._rt.lib.llama_memory_seq_rm(self._memory(), seq_id, p0, p1))

    def clear(self, data: bool = True) -> None:
        self._rt.lib.llama_memory_clear(self._memory(), data)

    def state_seq_get(self, seq_id: int = 0) -> bytes:
        """The sequence's whole state (memory cells, recurrent state), as llama-server's checkpoints hold it."""
        ffi, lib, ptr = self._rt.ffi, self._rt.lib, self._ptr()
        size = int(lib.llama_state_seq_get_size(ptr, seq_id))
        buf = ffi.new("uint8_t[]", max(size, 1))
        n = int(lib.llama_state_seq_get_data(ptr, buf, size, seq_id))
        return bytes(ffi.buffer(buf, n))

    def state_seq_set(self, seq_id: int, data: bytes) -> bool:
        """Replace the sequence's state with one from :meth:`state_seq_get`; False if refused."""
        ffi, lib = self._rt.ffi, self._rt.lib
        n, _ = self._logged(
            lambda: int(lib.llama_state_seq_set_data(self._ptr(), ffi.from_buffer(data), len(data), seq_id))
        )
        return n == len(data) and n > 0

    # -- outputs --

    def logits(self, i: int = -1) -> np.ndarray:
        """A copy of the logits of output row i (negative counts from the end)."""
        ptr = self._rt.lib.llama_get_logits_ith(self._ptr(), i)
        if ptr == self._rt.ffi.NULL:
            raise IndexError(f"no logits for output {i} (was it marked as an output?)")
        return np.frombuffer(self._rt.ffi.buffer(ptr, self.model.n_vocab * 4), dtype=np.float32).copy()

    def argmax(self, i: int = -1) -> int:
        """Greedy pick from the logits of output row i."""
        return int(np.argmax(self.logits(i)))

    # -- lifetime --

    def __repr__(self) -> str:
        kind = "draft " if self.is_draft else ""
        return f"<{kind}Context of {self.model.path.name}>"
