"""Thin owning wrappers over the raw binding: one class per native object, nothing friendlier.

Each wrapper owns exactly one native pointer and frees it once, on ``close()``, on leaving a
``with`` block, or (as a last resort) when garbage-collected. Wrappers form a tree: a dependent keeps
its owners alive (a context its model, a draft its target, the speculative driver both), and
closing an owner first closes its living dependents, newest first. So drafts and the speculative
driver always go before their target, and models last, whatever order Python drops them in.

The friendly API (numpy in and out, checks that keep llama.cpp from aborting) is ``api.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..env import LIB_DIR_ENV
from ..errors import (
    ClosedError,
    ModelLoadError,
    NativeCallError,
    PyllamaError,
    check_error,
)
from .bindings.callbacks import native_callback
from .bindings.ffi import load_module
from .process import logs

GGUF_MAGIC = b"GGUF"


# ---- runtime: the loaded module, once per process -----------------------------------------


@dataclass(frozen=True)
class Runtime:
    ffi: Any
    lib: Any
    lib_dir: Path

    def shim_error(self) -> str:
        return self.ffi.string(self.lib.pyllama_dflash_last_error()).decode(errors="replace")

    def string(self, cdata: Any) -> str:
        return "" if cdata == self.ffi.NULL else self.ffi.string(cdata).decode(errors="replace")


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime(lib_dir: Path | str | None = None) -> Runtime:
    """Load the compiled binding (from lib_dir, else $PYLLAMA_DFLASH_LIB_DIR), route the native logs
    into Python and call ``llama_backend_init`` (once per process)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            if lib_dir is not None:
                load_module(Path(lib_dir))  # raises for a second, different lib_dir
            return _runtime
        if lib_dir is None:
            env = os.environ.get(LIB_DIR_ENV)
            if not env:
                raise PyllamaError(
                    "pyllama_dflash is not initialised: call pyllama_dflash.load(variant), "
                    f"pyllama_dflash.api.init(lib_dir) or set {LIB_DIR_ENV}"
                )
            lib_dir = env
        ffi, lib = load_module(Path(lib_dir))
        logs.install(ffi, lib)
        lib.llama_backend_init()
        _runtime = Runtime(ffi, lib, Path(lib_dir).resolve())
        return _runtime


# ---- ownership tree ------------------------------------------------------------------------


class NativeHandle:
    """Owns one native pointer; closing it first closes the handles that depend on it."""

    _kind = "native object"

    def __init__(self, rt: Runtime, owners: tuple[NativeHandle, ...] = ()) -> None:
        self.rt = rt
        self.ptr: Any = rt.ffi.NULL
        self._owners = owners  # strong refs: an owner outlives its dependents
        self._dependents: list[weakref.ref[NativeHandle]] = []
        self._n_unreleased = 0  # adopted dependents whose native side is not freed yet
        self._free_pending = False  # closed, but waiting for dependents the GC cut off
        self._closed = False
        for owner in owners:
            owner._require_open()
            owner._adopt(self)

    def _adopt(self, dependent: NativeHandle) -> None:
        self._dependents = [ref for ref in self._dependents if ref() is not None]
        self._dependents.append(weakref.ref(dependent))
        self._n_unreleased += 1

    def _living_dependents(self) -> Iterator[NativeHandle]:
        for ref in reversed(self._dependents):
            dependent = ref()
            if dependent is not None and not dependent._closed:
                yield dependent

    @property
    def closed(self) -> bool:
        return self._closed

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._kind} is closed")

    def close(self) -> None:
        if self._closed:
            return
        for dependent in list(self._living_dependents()):
            dependent.close()
        self._closed = True
        if self._n_unreleased:
            # Children we cannot reach are still unfreed: the garbage collector clears weak
            # references before it runs finalizers, in any order, on a cycle's objects (at
            # interpreter exit, say). Freeing now would let them use freed memory; the last
            # of them frees us instead (they hold strong references to their owners).
            self._free_pending = True
            return
        self._release()

    def _release(self) -> None:
        if self.ptr != self.rt.ffi.NULL:
            self._free()
        self.ptr = self.rt.ffi.NULL
        owners, self._owners = self._owners, ()
        for owner in owners:
            owner._n_unreleased -= 1
            if owner._free_pending and owner._n_unreleased == 0:
                owner._free_pending = False
                owner._release()

    def _free(self) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ---- llama ---------------------------------------------------------------------------------


def check_gguf_file(path: Path) -> None:
    """Refuse what would reach native code only to fail there: a missing path or a non-GGUF file."""
    if not path.exists():
        raise ModelLoadError(path, "no such file")
    if not path.is_file():
        raise ModelLoadError(path, "not a regular file")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(path, f"cannot read: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(path, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


class LlamaModel(NativeHandle):
    _kind = "model"

    def __init__(
        self, rt: Runtime, path: Path, n_gpu_layers: int = 0, vocab_only: bool = False, load_mtp: bool = False
    ) -> None:
        super().__init__(rt)
        self.path = path
        check_gguf_file(path)
        params = rt.lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = vocab_only
        params.load_mtp = load_mtp
        with logs.Capture(min_level=logging.WARNING) as cap:
            self.ptr = rt.lib.llama_model_load_from_file(str(path).encode(), params)
        if self.ptr == rt.ffi.NULL:
            reason = "; ".join(ln.text for ln in cap.errors) or "llama_model_load_from_file returned NULL"
            raise ModelLoadError(path, reason)
        self.vocab = rt.lib.llama_model_get_vocab(self.ptr)

    def _free(self) -> None:
        self.rt.lib.llama_model_free(self.ptr)

    def meta(self, key: str) -> str | None:
        self._require_open()
        buf = self.rt.ffi.new("char[]", 512)
        n = self.rt.lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else self.rt.ffi.string(buf).decode(errors="replace")


class LlamaContext(NativeHandle):
    _kind = "context"

    def __init__(self, rt: Runtime, model: LlamaModel, params: dict[str, Any], other: LlamaContext | None) -> None:
        super().__init__(rt, (model,) if other is None else (model, other))
        self.model = model
        self.other = other
        cparams = rt.lib.llama_context_default_params()
        for name, value in params.items():
            setattr(cparams, name, value)
        cparams.ctx_other = other.ptr if other is not None else rt.ffi.NULL
        with logs.Capture(min_level=logging.WARNING) as cap:
            self.ptr = rt.lib.llama_init_from_model(model.ptr, cparams)
        if self.ptr == rt.ffi.NULL:
            raise NativeCallError("llama_init_from_model", f"no context for {model.path}", cap.errors)

    def _free(self) -> None:
        self.rt.lib.llama_free(self.ptr)


class LlamaBatchExt(NativeHandle):
    """A llama_batch_ext bound to one context (its capacity is that context's n_batch)."""

    _kind = "llama_batch_ext"

    def __init__(self, rt: Runtime, ctx: LlamaContext) -> None:
        super().__init__(rt, (ctx,))
        self.ptr = rt.lib.llama_batch_ext_init(ctx.ptr)
        if self.ptr == rt.ffi.NULL:
            raise NativeCallError("llama_batch_ext_init", "returned NULL")

    def _free(self) -> None:
        self.rt.lib.llama_batch_ext_free(self.ptr)


_uninit_allocators: dict[int, Any] = {}


def _uninitialised(ffi: Any) -> Any:
    alloc = _uninit_allocators.get(id(ffi))
    if alloc is None:
        alloc = _uninit_allocators[id(ffi)] = ffi.new_allocator(should_clear_after_alloc=False)
    return alloc


class BatchBuffers:
    """A ``llama_batch`` whose arrays are owned here (cffi memory), with numpy views onto them.

    Not ``llama_batch_init``: it allocates ``pos`` for one row per token, while an M-RoPE
    embedding batch carries ``n_pos`` rows (section-major ``pos[j * n + i]``). Memory is
    released with the last reference (no native free function is involved).
    """

    def __init__(
        self, rt: Runtime, n_tokens: int, n_embd: int, n_pos: int, embd_source: np.ndarray | None = None
    ) -> None:
        ffi = rt.ffi
        self.n_tokens, self.n_embd, self.n_pos = n_tokens, n_embd, n_pos
        n = max(n_tokens, 1)
        self._token = ffi.new("llama_token[]", n) if n_embd == 0 else ffi.NULL
        if embd_source is not None and n_tokens > 0:
            # zero-copy: llama_batch.embd points into the caller's C-contiguous float32 array,
            # which this object keeps alive (copying megabytes of rows costs more than the rest)
            self._embd_owner = embd_source
            self._embd = ffi.from_buffer("float[]", embd_source)
        else:
            # the embedding rows are always overwritten whole, so they need no zeroing
            self._embd = _uninitialised(ffi)("float[]", n * n_embd) if n_embd > 0 else ffi.NULL
        self._pos = ffi.new("llama_pos[]", n * n_pos)
        self._n_seq_id = ffi.new("int32_t[]", n)
        self.seq_flat = ffi.new("llama_seq_id[]", n)
        self._seq_ptrs = ffi.new("llama_seq_id *[]", n)
        self._logits = ffi.new("int8_t[]", n)

        # numpy views over the C arrays: filling them is one vectorised copy per array
        self.token = None if n_embd > 0 else np.frombuffer(ffi.buffer(self._token), dtype=np.int32)[:n_tokens]
        if embd_source is not None and n_tokens > 0:
            self.embd = embd_source
        else:
            self.embd = (
                None
                if n_embd == 0
                else np.frombuffer(ffi.buffer(self._embd), dtype=np.float32)[: n_tokens * n_embd].reshape(
                    n_tokens, n_embd
                )
            )
        self.pos = np.frombuffer(ffi.buffer(self._pos), dtype=np.int32)[: n_tokens * n_pos].reshape(n_pos, n_tokens)
        self.n_seq_id = np.frombuffer(ffi.buffer(self._n_seq_id), dtype=np.int32)[:n_tokens]
        self.seq_id = np.frombuffer(ffi.buffer(self.seq_flat), dtype=np.int32)[:n_tokens]
        self.logits = np.frombuffer(ffi.buffer(self._logits), dtype=np.int8)[:n_tokens]

        # seq_id[i] -> &seq_flat[i], computed as addresses, without a loop over rows
        base = int(ffi.cast("uintptr_t", self.seq_flat))
        ptrs = np.frombuffer(ffi.buffer(self._seq_ptrs), dtype=np.uintp)
        ptrs[:] = base + np.arange(n, dtype=np.uintp) * np.uintp(ffi.sizeof("llama_seq_id"))
        self.n_seq_id[:] = 1

        self.struct = ffi.new("llama_batch *")
        self.struct.n_tokens = n_tokens
        self.struct.token = self._token
        self.struct.embd = self._embd
        self.struct.pos = self._pos
        self.struct.n_seq_id = self._n_seq_id
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self._logits


# ---- speculative driver (the shim) ------------------------------------------------------------


class SpeculativeDriver(NativeHandle):
    """libcommon's common_speculative (type draft-dflash), through the shim."""

    _kind = "speculative driver"

    def __init__(self, rt: Runtime, target: LlamaContext, draft: LlamaContext, params: dict[str, Any]) -> None:
        super().__init__(rt, (target, draft))
        sparams = rt.ffi.new("struct pyllama_dflash_spec_params *", rt.lib.pyllama_dflash_spec_default_params())
        for name, value in params.items():
            setattr(sparams, name, value)
        with logs.Capture(min_level=logging.WARNING) as cap:
            self.ptr = rt.lib.pyllama_dflash_spec_init(target.ptr, draft.ptr, sparams)
        if self.ptr == rt.ffi.NULL:
            raise NativeCallError("pyllama_dflash_spec_init", rt.shim_error(), cap.errors)
        self.n_seq = int(sparams.n_seq)

    def _free(self) -> None:
        self.rt.lib.pyllama_dflash_spec_free(self.ptr)

    def check(self, call: str, rc: int, cap: logs.Capture | None = None) -> int:
        """rc of a shim call, or NativeCallError when it is PYLLAMA_DFLASH_ERROR."""
        ok = rc != self.rt.lib.PYLLAMA_DFLASH_ERROR
        check_error(call, ok, "" if ok else self.rt.shim_error(), cap.errors if cap else None)
        return rc


# ---- mtmd ------------------------------------------------------------------------------------


class MtmdContext(NativeHandle):
    _kind = "projector"

    def __init__(self, rt: Runtime, path: Path, model: LlamaModel, params: dict[str, Any]) -> None:
        super().__init__(rt, (model,))
        self.path = path
        check_gguf_file(path)
        mparams = rt.lib.mtmd_context_params_default()
        for name, value in params.items():
            setattr(mparams, name, value)
        with logs.Capture(min_level=logging.WARNING) as cap:
            self.ptr = rt.lib.mtmd_init_from_file(str(path).encode(), model.ptr, mparams)
        if self.ptr == rt.ffi.NULL:
            reason = "; ".join(ln.text for ln in cap.errors) or "mtmd_init_from_file returned NULL"
            raise ModelLoadError(path, reason)

    def _free(self) -> None:
        self.rt.lib.mtmd_free(self.ptr)


class MtmdBitmap(NativeHandle):
    _kind = "bitmap"

    def __init__(self, rt: Runtime, rgb: np.ndarray) -> None:
        super().__init__(rt)
        ny, nx = rgb.shape[:2]
        data = rt.ffi.from_buffer("unsigned char[]", np.ascontiguousarray(rgb, dtype=np.uint8))
        self.ptr = rt.lib.mtmd_bitmap_init(nx, ny, data)  # copies the pixels
        if self.ptr == rt.ffi.NULL:
            raise NativeCallError("mtmd_bitmap_init", f"cannot make a {nx}x{ny} bitmap")

    @classmethod
    def from_encoded(cls, rt: Runtime, mtmd: MtmdContext, data: bytes, name: str) -> MtmdBitmap:
        """Decode an image file's bytes (PNG, JPEG, ...) with mtmd's own reader."""
        self = cls.__new__(cls)
        NativeHandle.__init__(self, rt)
        lib = rt.lib
        wrapper = lib.mtmd_helper_bitmap_init_from_buf(
            mtmd.ptr, rt.ffi.from_buffer("unsigned char[]", data), len(data), False, lib.mtmd_helper_init_opt_default()
        )
        if wrapper.video_ctx != rt.ffi.NULL:
            lib.mtmd_helper_video_free(wrapper.video_ctx)
            if wrapper.bitmap != rt.ffi.NULL:
                lib.mtmd_bitmap_free(wrapper.bitmap)
            raise NativeCallError("mtmd_helper_bitmap_init_from_buf", f"{name}: a video, not an image")
        if wrapper.bitmap == rt.ffi.NULL:
            raise NativeCallError("mtmd_helper_bitmap_init_from_buf", f"{name}: not an image mtmd can read")
        self.ptr = wrapper.bitmap
        return self

    def _free(self) -> None:
        self.rt.lib.mtmd_bitmap_free(self.ptr)


class MtmdChunks(NativeHandle):
    _kind = "chunks"

    def __init__(self, rt: Runtime, mtmd: MtmdContext) -> None:
        super().__init__(rt, (mtmd,))
        self.ptr = rt.lib.mtmd_input_chunks_init()
        if self.ptr == rt.ffi.NULL:
            raise NativeCallError("mtmd_input_chunks_init", "returned NULL")

    def _free(self) -> None:
        self.rt.lib.mtmd_input_chunks_free(self.ptr)


# ---- image decode callback ----------------------------------------------------------------------


class ImageDecodeState:
    """What the post-decode callback of one mtmd_helper_decode_image_chunk call needs and records."""

    def __init__(self, on_batch: Callable[[Any], None] | None, driver: SpeculativeDriver | None) -> None:
        self.on_batch = on_batch
        self.driver = driver
        self.spec_results: list[int] = []  # shim rc per sub-batch (1 true, 0 false, -1 error)
        self.error: BaseException | None = None
        self.shim_error = ""


_callbacks_installed: set[int] = set()


def install_image_callback(rt: Runtime, make_view: Callable[[Any, Any], Any]) -> None:
    """Define the extern "Python" post-decode callback once per ffi.

    make_view(ffi, batch_ptr) turns the native view into the object handed to on_batch.
    """
    if id(rt.ffi) in _callbacks_installed:
        return
    ffi, lib = rt.ffi, rt.lib

    def keep_error(exc: BaseException, _batch: Any, user_data: Any) -> None:
        ffi.from_handle(user_data).error = exc  # re-raised by the caller once C has returned

    @native_callback(ffi, "pyllama_dflash_on_image_batch", error_result=1, on_error=keep_error)
    def _on_image_batch(batch: Any, user_data: Any) -> int:
        state: ImageDecodeState = ffi.from_handle(user_data)
        if state.on_batch is not None:
            state.on_batch(make_view(ffi, batch))
        if state.driver is not None:
            # the same hand-over llama-server does from its own callback
            rc = int(lib.pyllama_dflash_spec_process_embd_view(state.driver.ptr, batch))
            state.spec_results.append(rc)
            if rc == lib.PYLLAMA_DFLASH_ERROR:
                state.shim_error = rt.shim_error()
                return 1
            if rc == lib.PYLLAMA_DFLASH_FALSE:
                return 1  # llama-server: `common_speculative_process(...) ? 0 : 1`
        return 0

    _callbacks_installed.add(id(rt.ffi))
