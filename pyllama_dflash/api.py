"""The friendly API: models, contexts, numpy batches, the DFlash speculative driver and mtmd.

Every call that llama.cpp answers with a return code returns that code (the harness asserts on
it); errors that are not return codes raise a :class:`PyllamaError`. Inputs that would make
llama.cpp abort the process (a GGML_ASSERT) are checked here first and raise ``ValueError`` or a
:class:`ContextError` instead, and so are inputs it would accept silently into a corrupt state
(negative or repeated positions, a draft with another vocab). What cannot be checked cheaply has a
guarded path that runs the native call in a child process (``pyllama_dflash.guard``):
:meth:`Model.load_checked` and :meth:`Projector.load_checked` for untrusted files, and
``guard.run_in_child`` for anything else.

Typical use::

    init(lib_dir)
    with Model(target_path) as tgt_model, Model(draft_path) as dft_model:
        target = Context(tgt_model, n_ctx=256, n_batch=64, n_ubatch=64)
        draft = Context.draft(dft_model, target)
        spec = Speculative(target, draft)          # before the target decodes anything
        batch = Batch.tokens(tgt_model.tokenize("hello"), pos0=0)
        assert target.decode(batch) == 0
        assert spec.process(batch)

Objects free their native side on ``close()``/``with``; closing a model or a target first
closes whatever depends on it (drafts, the speculative driver, projectors).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from pyllama_dflash import logs
from pyllama_dflash._internals import (
    BatchBuffers,
    ClosedError,
    ContextError,
    ImageDecodeState,
    IncompatibleModelsError,
    LlamaBatchExt,
    LlamaContext,
    LlamaModel,
    ModelLoadError,
    MtmdBitmap,
    MtmdChunks,
    MtmdContext,
    NativeHandle,
    NativeCallError,
    PyllamaError,
    Runtime,
    SpeculativeDriver,
    install_image_callback,
    runtime,
)

__all__ = [
    "Batch",
    "Chunk",
    "Chunks",
    "ClosedError",
    "Context",
    "ContextError",
    "ImageBatch",
    "ImageDecodeResult",
    "IncompatibleModelsError",
    "Model",
    "ModelLoadError",
    "NativeCallError",
    "Projector",
    "PyllamaError",
    "Speculative",
    "init",
    "system_info",
]

LogitsSpec = Literal["last", "all", "none"] | Sequence[bool] | np.ndarray


def init(lib_dir: Path | str | None = None) -> Runtime:
    """Load the native libraries from lib_dir (else $PYLLAMA_DFLASH_LIB_DIR) once per process."""
    return runtime(lib_dir)


def system_info() -> str:
    rt = runtime()
    return rt.string(rt.lib.llama_print_system_info())


THREADS_ENV = "PYLLAMA_DFLASH_THREADS"


def _default_threads() -> int:
    """Threads per context: ``$PYLLAMA_DFLASH_THREADS``, else up to 4 cores. Runners that start
    several processes at once set it, or the processes fight over the cores (seen: 50x slower)."""
    explicit = os.environ.get(THREADS_ENV)
    if explicit:
        return max(1, int(explicit))
    return max(1, min(4, os.cpu_count() or 1))


# ---- models ----------------------------------------------------------------------------------


class _Owner:
    """Deterministic freeing for the API objects: ``close()`` or ``with``. Closing an object
    first closes what was created over it (drafts, drivers, projectors); see _internals."""

    _handle: NativeHandle

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def close(self) -> None:
        self._handle.close()

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_O = TypeVar("_O", bound=_Owner)


class Model(_Owner):
    """A GGUF model. Bad paths and non-GGUF files raise ModelLoadError before native code runs."""

    def __init__(self, path: Path | str, n_gpu_layers: int = 0) -> None:
        self._rt = runtime()
        self._handle = LlamaModel(self._rt, Path(path), n_gpu_layers=n_gpu_layers)
        lib, ptr = self._rt.lib, self._handle.ptr
        self.path = Path(path)
        self.arch = self._handle.meta("general.architecture") or ""
        self.n_embd = int(lib.llama_model_n_embd(ptr))
        self.n_embd_inp = int(lib.llama_model_n_embd_inp(ptr))
        self.n_layer = int(lib.llama_model_n_layer(ptr))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._handle.vocab))
        self.rope_type = int(lib.llama_model_rope_type(ptr))
        n_ids = int(lib.pyllama_dflash_model_target_layer_ids_n(ptr))
        ids = lib.pyllama_dflash_model_target_layer_ids(ptr)
        self.target_layer_ids: list[int] = [int(ids[i]) for i in range(n_ids)] if n_ids else []

    @classmethod
    def load_checked(cls, path: Path | str, n_gpu_layers: int = 0, timeout: float | None = 600.0) -> Model:
        """Like ``Model(path)``, for a file nobody vouched for: a child process loads it first.

        llama.cpp's loader aborts the process on some malformed files (a ``GGML_ASSERT`` on the
        layer count, a division by a zero hyperparameter); here that raises ModelLoadError naming
        the file and the assertion, and this interpreter lives on. Costs one extra load.
        """
        from pyllama_dflash import guard

        guard.check_model(path, n_gpu_layers=n_gpu_layers, timeout=timeout)
        return cls(path, n_gpu_layers=n_gpu_layers)

    @property
    def is_mrope(self) -> bool:
        """True for M-RoPE/IMROPE models: embedding rows carry 4 position rows."""
        lib = self._rt.lib
        return self.rope_type in (lib.LLAMA_ROPE_TYPE_MROPE, lib.LLAMA_ROPE_TYPE_IMROPE)

    @property
    def n_pos_per_embd(self) -> int:
        return 4 if self.is_mrope else 1

    @property
    def is_draft_model(self) -> bool:
        """A DFlash draft: it reads target layers and borrows the target's embeddings."""
        return bool(self.target_layer_ids) or self.arch == "dflash"

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None if absent)."""
        return self._handle.meta(key)

    @property
    def dflash_block_size(self) -> int:
        """Block size of a DFlash draft (libcommon assumes 16 without the key); 0 for other models."""
        if not self.is_draft_model:
            return 0
        value = self.meta("dflash.block_size")
        return int(value) if value else 16

    @property
    def mask_token(self) -> int:
        return int(self._rt.lib.llama_vocab_mask(self._handle.vocab))

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> np.ndarray:
        """Token ids (int32) of text."""
        self._handle._require_open()
        lib, ffi = self._rt.lib, self._rt.ffi
        raw = text.encode()
        capacity = len(raw) + 8
        out = ffi.new("llama_token[]", capacity)
        n = lib.llama_tokenize(self._handle.vocab, raw, len(raw), out, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            out = ffi.new("llama_token[]", capacity)
            n = lib.llama_tokenize(self._handle.vocab, raw, len(raw), out, capacity, add_special, parse_special)
        if n < 0:
            raise NativeCallError("llama_tokenize", f"failed with {n}")
        return np.frombuffer(ffi.buffer(out, n * 4), dtype=np.int32).copy()

    def token_to_piece(self, token: int, special: bool = True) -> str:
        self._handle._require_open()
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token {token} outside the vocab of {self.n_vocab}")
        ffi = self._rt.ffi
        buf = ffi.new("char[]", 256)
        n = self._rt.lib.llama_token_to_piece(self._handle.vocab, token, buf, len(buf), 0, special)
        return ffi.unpack(buf, max(n, 0)).decode(errors="replace")

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, arch={self.arch!r}, n_embd={self.n_embd}, n_layer={self.n_layer})"


# ---- batches -----------------------------------------------------------------------------------


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
                f"{via}: pos of row {int(rows[k + 1])} {what} {int(t[k + 1])} after {int(t[k])} in sequence {int(seq)}: "
                "positions must increase within a sequence"
            )


class Batch:
    """Rows for one decode: token rows or embedding rows, with positions ``[n_pos, n_tokens]``.

    The arrays live in C memory that the ``llama_batch`` points at; ``tokens``/``embd``/``pos``/
    ``seq_id``/``logits`` are numpy views onto it, filled with one vectorised copy each.
    """

    def __init__(self, buffers: BatchBuffers, kind: Literal["tokens", "embd"]) -> None:
        self._buffers = buffers
        self.kind = kind

    @classmethod
    def tokens(
        cls,
        tokens: Sequence[int] | np.ndarray,
        pos: Sequence[int] | np.ndarray | None = None,
        *,
        pos0: int = 0,
        seq_id: int | Sequence[int] | np.ndarray = 0,
        logits: LogitsSpec = "last",
    ) -> Batch:
        """Token rows; positions are ``pos`` (shape [n] or [1, n]) or ``pos0, pos0+1, ...``."""
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
        return cls(buf, "tokens")

    @classmethod
    def embeddings(
        cls,
        embd: np.ndarray,
        pos: Sequence[int] | np.ndarray,
        *,
        seq_id: int | Sequence[int] | np.ndarray = 0,
        logits: LogitsSpec = "none",
    ) -> Batch:
        """Embedding rows ``embd [n, n_embd]`` with ``pos [n_pos, n]`` (n_pos 1, or 4 for M-RoPE).

        A C-contiguous float32 ``embd`` is not copied: the batch points into it and keeps it
        alive, so changing the array afterwards changes the batch.
        """
        rows = np.asarray(embd, dtype=np.float32)
        if rows.ndim != 2:
            raise ValueError(f"embd must be [n_tokens, n_embd], got shape {rows.shape}")
        n, n_embd = rows.shape
        positions = np.asarray(pos, dtype=np.int32)
        if positions.ndim == 1:
            positions = positions.reshape(1, -1)
        if positions.ndim != 2 or positions.shape[1] != n or not 1 <= positions.shape[0] <= 4:
            raise ValueError(f"pos must be [n_pos (1..4), {n}], got shape {np.shape(pos)}")
        # a C-contiguous float32 array is used in place (the batch keeps a reference to it)
        shared = rows if rows.flags.c_contiguous else None
        buf = BatchBuffers(runtime(), n, n_embd=n_embd, n_pos=positions.shape[0], embd_source=shared)
        if shared is None:
            buf.embd[:] = rows
        buf.pos[:] = positions
        buf.seq_id[:] = _seq_ids(seq_id, n)
        buf.logits[:] = _logits_flags(logits, n)
        return cls(buf, "embd")

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

    @property
    def c_struct(self) -> Any:
        """The ``llama_batch *`` (for callers that drive the raw binding)."""
        return self._buffers.struct

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        first = int(self.pos[0, 0]) if self.n_tokens else None
        return f"Batch({self.kind}, n_tokens={self.n_tokens}, n_pos={self.n_pos}, first_pos={first})"


# ---- contexts ----------------------------------------------------------------------------------


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
        optional = {
            "n_batch": n_batch,
            "n_ubatch": n_ubatch,
            "n_outputs_max": n_outputs_max,
            "n_outputs_max_per_seq": n_outputs_max_per_seq,
            "kv_unified": kv_unified,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        self._handle = LlamaContext(self._rt, model._handle, params, _target._handle if _target else None)
        self._batch_ext: LlamaBatchExt | None = None
        self.n_decode_calls = 0  # decode/process/image calls made, successful or not
        self.last_log: list[logs.LogLine] = []  # what llama.cpp logged (warnings and up) during the last call

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
        if model.n_embd != target.model.n_embd:
            raise IncompatibleModelsError(
                f"draft {model.path} has n_embd {model.n_embd} but target {target.model.path} has n_embd "
                f"{target.model.n_embd}: the draft reuses the target's token embeddings, so they must match"
            )
        if model.n_vocab != target.model.n_vocab:
            # DFlash samples the draft's vocab from logits made by the target's output head:
            # another size reads past (or short of) each row of them
            raise IncompatibleModelsError(
                f"draft {model.path} has n_vocab {model.n_vocab} but target {target.model.path} has n_vocab "
                f"{target.model.n_vocab}: the draft drafts from the target's output head, so the vocabs must match"
            )
        bad_layers = [lid for lid in model.target_layer_ids if not 0 <= lid < target.model.n_layer]
        if bad_layers:
            raise IncompatibleModelsError(
                f"draft {model.path} reads target layers {bad_layers}, but target {target.model.path} has "
                f"{target.model.n_layer} layers"
            )
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

    # -- properties --

    @property
    def is_draft(self) -> bool:
        return self.target is not None

    def _ptr(self) -> Any:
        self._handle._require_open()
        return self._handle.ptr

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
        if batch.kind != "embd":
            return
        if via == "llama_decode":
            # the compat path reads n_tokens rows of this width and n_pos_per_embd position rows
            if batch.n_embd != self.decode_embd_width:
                raise ValueError(f"{via}: embedding rows are {batch.n_embd} wide, this context reads {self.decode_embd_width}")
            if batch.n_pos != self.model.n_pos_per_embd:
                raise ValueError(
                    f"{via}: {self.model.path.name} reads {self.model.n_pos_per_embd} position row(s) per embedding, "
                    f"the batch has {batch.n_pos}"
                )
        elif batch.n_embd not in self.process_embd_widths:
            raise ValueError(f"{via}: embedding rows are {batch.n_embd} wide, this context takes {self.process_embd_widths}")

    def decode(self, batch: Batch) -> int:
        """``llama_decode``; returns its code (0 ok, 1 no KV slot, 2 aborted, -1 invalid batch, < -1 fatal)."""
        ptr = self._ptr()
        self._check_batch(batch, "llama_decode")
        with logs.Capture(min_level=logging.WARNING, poll_common=False) as cap:
            rc = int(self._rt.lib.llama_decode(ptr, batch.c_struct[0]))
        self.n_decode_calls += 1
        self.last_log = cap.lines
        return rc

    def process(self, batch: Batch) -> int:
        """``llama_process(DECODE)`` with a ``llama_batch_ext`` (the route llama-server, libcommon and
        mtmd take); same return codes as :meth:`decode`."""
        ptr = self._ptr()
        self._check_batch(batch, "llama_process")
        if self._batch_ext is None or self._batch_ext.closed:
            self._batch_ext = LlamaBatchExt(self._rt, self._handle)
        lib = self._rt.lib
        b = batch.c_struct
        with logs.Capture(min_level=logging.WARNING, poll_common=False) as cap:
            filled = lib.pyllama_dflash_batch_ext_fill(
                self._batch_ext.ptr, batch.n_tokens, b.token, b.embd, batch.n_embd, b.pos, batch.n_pos,
                batch._buffers.seq_flat, b.logits,
            )
            if filled != 0:
                raise ValueError(f"llama_process: batch rejected while filling: {self._rt.shim_error()}")
            rc = int(lib.llama_process(ptr, lib.LLAMA_PROCESS_TYPE_DECODE, self._batch_ext.ptr))
        self.n_decode_calls += 1
        self.last_log = cap.lines
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
        """The sequence's whole state (memory cells, recurrent state), as a checkpoint or a
        prompt cache entry of llama-server holds it."""
        ffi, lib, ptr = self._rt.ffi, self._rt.lib, self._ptr()
        size = int(lib.llama_state_seq_get_size(ptr, seq_id))
        buf = ffi.new("uint8_t[]", max(size, 1))
        n = int(lib.llama_state_seq_get_data(ptr, buf, size, seq_id))
        return bytes(ffi.buffer(buf, n))

    def state_seq_set(self, seq_id: int, data: bytes) -> bool:
        """Replace the sequence's state with one from :meth:`state_seq_get`; False if refused."""
        ffi, lib = self._rt.ffi, self._rt.lib
        with logs.Capture(min_level=logging.WARNING, poll_common=False) as cap:
            n = int(lib.llama_state_seq_set_data(self._ptr(), ffi.from_buffer(data), len(data), seq_id))
        self.last_log = cap.lines
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


# ---- speculative driver ------------------------------------------------------------------------


class Speculative(_Owner):
    """libcommon's speculative driver of type draft-dflash over a target and a draft context.

    Create it before the target decodes anything: its constructor turns on layer-input
    extraction on the target and non-causal attention on the draft. ``process*`` return what
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
    ) -> None:
        if draft.target is not target:
            raise ContextError("the draft context was not created over this target (use Context.draft(model, target))")
        if target.n_decode_calls or any(target.pos_max(s) >= 0 for s in range(min(n_seq, target.n_seq_max))):
            raise ContextError(
                "create Speculative before the target decodes anything: DFlash turns on the extraction of the "
                "target's layer inputs in its constructor"
            )
        if not draft.model.target_layer_ids:
            raise IncompatibleModelsError(f"{draft.model.path} has no target_layer_ids: not a DFlash draft")
        block = draft.model.dflash_block_size
        if draft.n_ubatch < block:
            # the noise block is decoded non-causally, in one ubatch: llama.cpp asserts on it
            raise ContextError(
                f"draft context n_ubatch {draft.n_ubatch} < the draft's block size {block}: DFlash decodes its "
                f"noise block of {block} rows in one non-causal ubatch (llama.cpp would abort); use n_ubatch >= {block}"
            )
        self._rt = runtime()
        self.target = target
        self.draft_ctx = draft
        params: dict[str, Any] = {"n_seq": n_seq}
        optional = {"n_max": n_max, "n_min": n_min, "p_min": p_min, "backend_sampling": backend_sampling}
        params.update({k: v for k, v in optional.items() if v is not None})
        self._handle = SpeculativeDriver(self._rt, target._handle, draft._handle, params)
        self.last_log: list[logs.LogLine] = []

    @property
    def n_max(self) -> int:
        """Max drafted tokens after libcommon clamped it to the draft's block size."""
        return self._handle.check("spec_n_max", int(self._rt.lib.pyllama_dflash_spec_n_max(self._ptr())))

    def _ptr(self) -> Any:
        self._handle._require_open()
        return self._handle.ptr

    def _run(self, call: str, fn: Callable[[], int]) -> int:
        with logs.Capture(min_level=logging.WARNING) as cap:
            rc = int(fn())
        self.last_log = cap.lines
        return self._handle.check(call, rc, cap)

    def process(self, batch: Batch) -> bool:
        """Hand the batch the target just decoded to the driver (token or embedding rows)."""
        if batch.kind == "tokens":
            return self.process_tokens(batch.token_ids, batch.pos[0], batch.seq_id, batch.logits)
        return self.process_embd(batch.embd, batch.pos, batch.seq_id)

    def process_tokens(
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
            raise ValueError(f"process_tokens: {positions.shape[0]} positions for {n} tokens")
        seqs = _seq_ids(seq_id, n)
        out = np.zeros(n, dtype=np.int8) if output is None else np.ascontiguousarray(output, dtype=np.int8)
        ffi, lib = self._rt.ffi, self._rt.lib
        rc = self._run(
            "pyllama_dflash_spec_process_tokens",
            lambda: lib.pyllama_dflash_spec_process_tokens(
                self._ptr(), n, ffi.from_buffer("llama_token[]", tok), ffi.from_buffer("llama_pos[]", positions),
                ffi.from_buffer("llama_seq_id[]", seqs), ffi.from_buffer("int8_t[]", out),
            ),
        )
        return rc == lib.PYLLAMA_DFLASH_TRUE

    def process_embd(
        self,
        embd: np.ndarray,
        pos: np.ndarray,
        seq_id: int | Sequence[int] | np.ndarray = 0,
    ) -> bool:
        rows = np.ascontiguousarray(embd, dtype=np.float32)
        if rows.ndim != 2:
            raise ValueError(f"process_embd: embd must be [n_tokens, n_embd], got {rows.shape}")
        n, n_embd = rows.shape
        positions = np.ascontiguousarray(pos, dtype=np.int32)
        if positions.ndim == 1:
            positions = positions.reshape(1, -1)
        if positions.shape[1] != n or not 1 <= positions.shape[0] <= 4:
            raise ValueError(f"process_embd: pos must be [n_pos (1..4), {n}], got {positions.shape}")
        seqs = _seq_ids(seq_id, n)
        ffi, lib = self._rt.ffi, self._rt.lib
        rc = self._run(
            "pyllama_dflash_spec_process_embd",
            lambda: lib.pyllama_dflash_spec_process_embd(
                self._ptr(), n, ffi.from_buffer("float[]", rows), n_embd,
                ffi.from_buffer("llama_pos[]", positions), positions.shape[0], ffi.from_buffer("llama_seq_id[]", seqs),
            ),
        )
        return rc == lib.PYLLAMA_DFLASH_TRUE

    def begin(self, seq_id: int, prompt: Sequence[int] | np.ndarray) -> None:
        """Start a generation for seq_id with its prompt tokens."""
        toks = np.ascontiguousarray(prompt, dtype=np.int32).reshape(-1)
        ffi, lib = self._rt.ffi, self._rt.lib
        self._run(
            "pyllama_dflash_spec_begin",
            lambda: lib.pyllama_dflash_spec_begin(self._ptr(), seq_id, ffi.from_buffer("llama_token[]", toks), toks.shape[0]),
        )

    def draft(
        self, seq_id: int, id_last: int, pos0: int, n_max: int | None = None, trim_draft: bool = True
    ) -> list[int]:
        """Draft tokens for seq_id following id_last, whose position is pos0.

        DFlash decodes its noise block [id_last, mask...] at pos0.. into the draft's memory and
        leaves it there; with trim_draft (llama-server does the same after drafting) the draft's
        memory is cut back to the target's last position, so the next process() lines up.
        """
        ffi, lib = self._rt.ffi, self._rt.lib
        cap = max(self.n_max, n_max or 0, 1)
        out = ffi.new("llama_token[]", cap)
        n = self._run(
            "pyllama_dflash_spec_draft",
            lambda: lib.pyllama_dflash_spec_draft(self._ptr(), seq_id, id_last, pos0, n_max or 0, out, cap),
        )
        if trim_draft:
            self.draft_ctx.seq_rm(seq_id, self.target.pos_max(seq_id) + 1, -1)
        return [int(out[i]) for i in range(min(n, cap))]

    def accept(self, seq_id: int, n_accepted: int) -> None:
        """Tell the driver how many drafted tokens the target accepted."""
        if not 0 <= n_accepted <= 0xFFFF:
            raise ValueError(f"n_accepted {n_accepted} out of range")
        lib = self._rt.lib
        self._run("pyllama_dflash_spec_accept", lambda: lib.pyllama_dflash_spec_accept(self._ptr(), seq_id, n_accepted))



# ---- mtmd --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageBatch:
    """One image sub-batch the target decoded, as mtmd's post-decode callback saw it (copies)."""

    n_tokens: int
    n_pos: int
    seq_id: int
    pos: np.ndarray  # [n_pos, n_tokens] int32
    embd: np.ndarray  # [n_tokens, n_embd] float32


@dataclass
class ImageDecodeResult:
    rc: int  # mtmd_helper_decode_image_chunk: 0 ok, -1 not an image chunk, otherwise the failing code
    n_past: int  # position after the image (input n_past + the chunk's n_pos) when rc == 0
    spec_results: list[int] = field(default_factory=list)  # per sub-batch: 1 true, 0 false, -1 shim error
    log: list[logs.LogLine] = field(default_factory=list)

    @property
    def spec_ok(self) -> bool | None:
        """False if the driver refused any sub-batch, None without a driver."""
        return None if not self.spec_results else all(r == 1 for r in self.spec_results)


def _image_batch_view(ffi: Any, batch: Any) -> ImageBatch:
    n, n_pos, n_embd = int(batch.n_tokens), int(batch.n_pos), int(batch.n_embd)
    pos = np.frombuffer(ffi.buffer(batch.pos, n * n_pos * 4), dtype=np.int32).reshape(n_pos, n).copy()
    embd = np.frombuffer(ffi.buffer(batch.embd, n * n_embd * 4), dtype=np.float32).reshape(n, n_embd).copy()
    return ImageBatch(n_tokens=n, n_pos=n_pos, seq_id=int(batch.seq_id), pos=pos, embd=embd)


class Chunk:
    """One chunk of a tokenized prompt: text tokens, or an image's embedding slots."""

    def __init__(self, chunks: Chunks, index: int, ptr: Any) -> None:
        self._chunks = chunks
        self.index = index
        self._ptr_ = ptr
        rt = chunks._rt
        lib = rt.lib
        kind = int(lib.mtmd_input_chunk_get_type(ptr))
        self.type = {
            int(lib.MTMD_INPUT_CHUNK_TYPE_TEXT): "text",
            int(lib.MTMD_INPUT_CHUNK_TYPE_IMAGE): "image",
            int(lib.MTMD_INPUT_CHUNK_TYPE_AUDIO): "audio",
        }.get(kind, f"unknown({kind})")
        self.n_tokens = int(lib.mtmd_input_chunk_get_n_tokens(ptr))
        self.n_pos = int(lib.mtmd_input_chunk_get_n_pos(ptr))
        self.nx = self.ny = 0
        if self.type == "image":
            image = lib.mtmd_input_chunk_get_tokens_image(ptr)
            if image != rt.ffi.NULL:
                self.nx = int(lib.pyllama_dflash_image_tokens_nx(image))
                self.ny = int(lib.pyllama_dflash_image_tokens_ny(image))

    @property
    def ptr(self) -> Any:
        self._chunks._handle._require_open()
        return self._ptr_

    @property
    def tokens(self) -> np.ndarray:
        """Token ids of a text chunk (empty for media chunks)."""
        rt = self._chunks._rt
        if self.type != "text":
            return np.zeros(0, dtype=np.int32)
        n_out = rt.ffi.new("size_t *")
        toks = rt.lib.mtmd_input_chunk_get_tokens_text(self.ptr, n_out)
        return np.frombuffer(rt.ffi.buffer(toks, n_out[0] * 4), dtype=np.int32).copy()

    def decoder_positions(self, pos0: int) -> np.ndarray:
        """Per image token (t, x, y, z) as mtmd computes them for a start position pos0: [n_tokens, 4]."""
        rt = self._chunks._rt
        image = rt.lib.mtmd_input_chunk_get_tokens_image(self.ptr)
        if image == rt.ffi.NULL:
            raise ValueError(f"chunk {self.index} is a {self.type} chunk, not an image")
        out = np.zeros((self.n_tokens, 4), dtype=np.int64)
        for i in range(self.n_tokens):
            p = rt.lib.mtmd_image_tokens_get_decoder_pos(image, pos0, i)
            out[i] = (p.t, p.x, p.y, p.z)
        return out

    def __repr__(self) -> str:
        extra = f", nx={self.nx}, ny={self.ny}" if self.type == "image" else ""
        return f"Chunk({self.index}, {self.type}, n_tokens={self.n_tokens}, n_pos={self.n_pos}{extra})"


class Chunks(_Owner, Sequence[Chunk]):
    """The chunks of one tokenized prompt; valid until closed (or its projector is)."""

    def __init__(self, rt: Runtime, handle: MtmdChunks) -> None:
        self._rt = rt
        self._handle = handle
        n = int(rt.lib.mtmd_input_chunks_size(handle.ptr))
        self._items = [Chunk(self, i, rt.lib.mtmd_input_chunks_get(handle.ptr, i)) for i in range(n)]

    def __getitem__(self, i: int) -> Chunk:  # type: ignore[override]
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self._items)



class Projector(_Owner):
    """An mtmd projector (mmproj GGUF) over a target model."""

    def __init__(
        self,
        path: Path | str,
        model: Model,
        *,
        use_gpu: bool = False,
        n_threads: int | None = None,
        warmup: bool = False,
        image_min_tokens: int | None = None,
        image_max_tokens: int | None = None,
    ) -> None:
        self._rt = runtime()
        install_image_callback(self._rt, _image_batch_view)
        self.model = model
        params: dict[str, Any] = {
            "use_gpu": use_gpu,
            "n_threads": n_threads or _default_threads(),
            "warmup": warmup,  # on: it warms up on a 1288x1288 image
            "print_timings": False,
        }
        if image_min_tokens is not None:
            params["image_min_tokens"] = image_min_tokens
        if image_max_tokens is not None:
            params["image_max_tokens"] = image_max_tokens
        self._handle = MtmdContext(self._rt, Path(path), model._handle, params)
        self.path = Path(path)

    @classmethod
    def load_checked(cls, path: Path | str, model: Model, *, timeout: float | None = 600.0, **kwargs: Any) -> Projector:
        """Like ``Projector(path, model, ...)``, for a file nobody vouched for: a child process loads
        it over ``model.path`` first, so a clip loader that aborts raises ModelLoadError here."""
        from pyllama_dflash import guard

        guard.check_projector(path, model.path, timeout=timeout)
        return cls(path, model, **kwargs)

    def _ptr(self) -> Any:
        self._handle._require_open()
        return self._handle.ptr

    @property
    def marker(self) -> str:
        return self._rt.string(self._rt.lib.mtmd_default_marker())

    @property
    def uses_mrope(self) -> bool:
        return bool(self._rt.lib.mtmd_decode_use_mrope(self._ptr()))

    @property
    def supports_vision(self) -> bool:
        return bool(self._rt.lib.mtmd_support_vision(self._ptr()))

    def tokenize(
        self,
        text: str,
        images: Sequence[np.ndarray | bytes] = (),
        add_special: bool = False,
        parse_special: bool = True,
    ) -> Chunks:
        """Split text at each media marker into text chunks and image chunks (RGB uint8 [h, w, 3]
        arrays, or an image file's bytes, decoded by mtmd)."""
        rt = self._rt
        ffi, lib = rt.ffi, rt.lib
        bitmaps = []
        for k, img in enumerate(images):
            if isinstance(img, (bytes, bytearray, memoryview)):
                bitmaps.append(MtmdBitmap.from_encoded(rt, self._handle, bytes(img), f"image {k}"))
                continue
            arr = np.asarray(img)
            if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
                raise ValueError(f"image {k} must be uint8 RGB [h, w, 3] or an image file's bytes, got {arr.dtype} {arr.shape}")
            bitmaps.append(MtmdBitmap(rt, arr))
        try:
            chunks = MtmdChunks(rt, self._handle)
            raw = text.encode()
            c_text = ffi.new("char[]", raw)
            inp = ffi.new("mtmd_input_text *", {"text": c_text, "text_len": len(raw), "add_special": add_special,
                                                "parse_special": parse_special})
            c_bitmaps = ffi.new("mtmd_bitmap *[]", [b.ptr for b in bitmaps] or 1)
            with logs.Capture(min_level=logging.WARNING, poll_common=False) as cap:
                rc = int(lib.mtmd_tokenize(self._ptr(), chunks.ptr, inp, c_bitmaps, len(bitmaps)))
            if rc != 0:
                chunks.close()
                reason = {1: "the number of images does not match the number of markers", 2: "image preprocessing failed"}
                raise NativeCallError("mtmd_tokenize", f"rc {rc}: {reason.get(rc, 'unknown error')}", cap.lines)
            return Chunks(rt, chunks)
        finally:
            for b in bitmaps:
                b.close()

    def encode(self, chunk: Chunk) -> np.ndarray:
        """Run the vision encoder on an image chunk; returns a copy of its embeddings [n_tokens, n_embd_inp]."""
        ptr = self._encode(chunk)
        width = self.model.n_embd_inp
        return np.frombuffer(self._rt.ffi.buffer(ptr, chunk.n_tokens * width * 4), dtype=np.float32).reshape(
            chunk.n_tokens, width).copy()

    def _encode(self, chunk: Chunk) -> Any:
        lib = self._rt.lib
        if chunk.type == "text":
            raise ValueError(f"chunk {chunk.index} is a text chunk; only media chunks are encoded")
        with logs.Capture(min_level=logging.WARNING, poll_common=False) as cap:
            rc = int(lib.mtmd_encode_chunk(self._ptr(), chunk.ptr))
        if rc != 0:
            raise NativeCallError("mtmd_encode_chunk", f"rc {rc}", cap.lines)
        return lib.mtmd_get_output_embd(self._ptr())

    def decode_image(
        self,
        ctx: Context,
        chunk: Chunk,
        n_past: int,
        seq_id: int = 0,
        n_batch: int | None = None,
        on_batch: Callable[[ImageBatch], None] | None = None,
        speculative: Speculative | None = None,
    ) -> ImageDecodeResult:
        """Encode chunk and decode it into ctx with ``mtmd_helper_decode_image_chunk``.

        After each decoded sub-batch, ``on_batch`` gets a copy of it, then ``speculative`` (if given)
        gets the native view through the shim, exactly as llama-server's callback hands it to
        ``common_speculative_process`` (a False stops the decode with a non-zero rc, as there).
        """
        if ctx.model is not self.model:
            raise ValueError("decode_image: ctx is not a context of this projector's model")
        if speculative is not None and speculative.target is not ctx:
            raise ValueError("decode_image: the speculative driver's target is not ctx")
        rt = self._rt
        ffi, lib = rt.ffi, rt.lib
        n_batch = n_batch or ctx.n_batch
        if n_batch > ctx.n_batch:
            raise ValueError(f"decode_image: n_batch {n_batch} > the context's n_batch {ctx.n_batch}")
        if lib.mtmd_decode_use_non_causal(self._ptr(), chunk.ptr) and min(n_batch, chunk.n_tokens) > ctx.n_ubatch:
            raise ValueError(f"decode_image: non-causal image of {chunk.n_tokens} tokens needs n_ubatch >= it")
        if chunk.n_tokens > ctx.n_ctx_seq:
            raise ValueError(
                f"decode_image: image chunk {chunk.index} of {chunk.n_tokens} tokens ({chunk.nx}x{chunk.ny}) cannot "
                f"fit in n_ctx {ctx.n_ctx_seq} per sequence: raise n_ctx or pass image_max_tokens to the Projector"
            )
        embd = self._encode(chunk)
        state = ImageDecodeState(on_batch, speculative._handle if speculative is not None else None)
        handle = ffi.new_handle(state)
        new_n_past = ffi.new("llama_pos *", n_past)
        with logs.Capture(min_level=logging.WARNING) as cap:
            rc = int(lib.mtmd_helper_decode_image_chunk(
                self._ptr(), ctx._ptr(), chunk.ptr, embd, n_past, seq_id, n_batch, new_n_past,
                lib.pyllama_dflash_on_image_batch, handle,
            ))
        ctx.n_decode_calls += 1
        ctx.last_log = cap.lines
        if speculative is not None:
            speculative.last_log = cap.lines
        if state.error is not None:
            raise state.error
        if state.shim_error:
            raise NativeCallError("pyllama_dflash_spec_process_embd_view", state.shim_error, cap.lines)
        return ImageDecodeResult(rc=rc, n_past=int(new_n_past[0]), spec_results=state.spec_results, log=cap.lines)

