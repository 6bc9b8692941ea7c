"""mtmd: the ``Projector``, its ``Chunks`` of a tokenized prompt, and image decoding with the driver."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import (
    NativeCallError,
    check_error,
)
from ..owning import (
    ImageDecodeState,
    MtmdBitmap,
    MtmdChunks,
    MtmdContext,
    Runtime,
    install_image_callback,
    runtime,
)
from ..process import guard, logs
from ._base import _default_threads, _Owner
from .context import Context
from .model import Model
from .speculative import Speculative


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
        self._encoded: Any = None  # the chunk whose embeddings mtmd's output buffer holds (see decode_image)

    @classmethod
    def load_checked(cls, path: Path | str, model: Model, *, timeout: float | None = 600.0, **kwargs: Any) -> Projector:
        """Like ``Projector(path, model, ...)``, for a file nobody vouched for: a child process loads
        it over ``model.path`` first, so a clip loader that aborts raises ModelLoadError here."""
        guard.check_load(
            _probe_projector, path, str(model.path), 0, call=f"mtmd_init_from_file({path})", timeout=timeout
        )
        return cls(path, model, **kwargs)

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
                raise ValueError(
                    f"image {k} must be uint8 RGB [h, w, 3] or an image file's bytes, got {arr.dtype} {arr.shape}"
                )
            bitmaps.append(MtmdBitmap(rt, arr))
        try:
            chunks = MtmdChunks(rt, self._handle)
            raw = text.encode()
            c_text = ffi.new("char[]", raw)
            inp = ffi.new(
                "mtmd_input_text *",
                {"text": c_text, "text_len": len(raw), "add_special": add_special, "parse_special": parse_special},
            )
            c_bitmaps = ffi.new("mtmd_bitmap *[]", [b.ptr for b in bitmaps] or 1)
            rc, cap = self._logged(
                lambda: int(lib.mtmd_tokenize(self._ptr(), chunks.ptr, inp, c_bitmaps, len(bitmaps)))
            )
            if rc != 0:
                chunks.close()
                reason = {
                    1: "the number of images does not match the number of markers",
                    2: "image preprocessing failed",
                }
                check_error("mtmd_tokenize", False, f"rc {rc}: {reason.get(rc, 'unknown error')}", cap.lines)
            return Chunks(rt, chunks)
        finally:
            for b in bitmaps:
                b.close()

    def encode(self, chunk: Chunk) -> np.ndarray:
        """Run the vision encoder on an image chunk; returns a copy of its embeddings [n_tokens, n_embd_inp]."""
        ptr = self._encode(chunk)
        width = self.model.n_embd_inp
        return (
            np.frombuffer(self._rt.ffi.buffer(ptr, chunk.n_tokens * width * 4), dtype=np.float32)
            .reshape(chunk.n_tokens, width)
            .copy()
        )

    def _encode(self, chunk: Chunk) -> Any:
        lib = self._rt.lib
        if chunk.type == "text":
            raise ValueError(f"chunk {chunk.index} is a text chunk; only media chunks are encoded")
        rc, cap = self._logged(lambda: int(lib.mtmd_encode_chunk(self._ptr(), chunk.ptr)))
        check_error("mtmd_encode_chunk", rc == 0, f"rc {rc}", cap.lines)
        self._encoded = chunk.ptr  # mtmd's output buffer holds this chunk's embeddings until the next encode
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
        *,
        encode: bool = True,
    ) -> ImageDecodeResult:
        """Encode chunk and decode it into ctx with ``mtmd_helper_decode_image_chunk``; with ``encode`` False,
        decode the embeddings the last :meth:`encode` left, which must be of this chunk (to time a decode alone).

        After each decoded sub-batch, ``on_batch`` gets a copy of it, then ``speculative`` (if given)
        gets the native view through the shim, exactly as llama-server's callback hands it to
        ``common_speculative_process`` (a False stops the decode with a non-zero rc, as there).
        """
        n_batch = self._check_decode(ctx, chunk, n_batch, speculative)
        embd = self._embeddings_for(chunk, encode)
        rt = self._rt
        ffi, lib = rt.ffi, rt.lib
        state = ImageDecodeState(on_batch, speculative._handle if speculative is not None else None)
        handle = ffi.new_handle(state)
        new_n_past = ffi.new("llama_pos *", n_past)
        with logs.Capture(min_level=logging.WARNING) as cap:
            rc = int(
                lib.mtmd_helper_decode_image_chunk(
                    self._ptr(),
                    ctx._ptr(),
                    chunk.ptr,
                    embd,
                    n_past,
                    seq_id,
                    n_batch,
                    new_n_past,
                    lib.pyllama_dflash_on_image_batch,
                    handle,
                )
            )
        ctx.n_decode_calls += 1
        ctx.last_log = cap.lines
        if speculative is not None:
            speculative.last_log = cap.lines
        if state.error is not None:
            raise state.error
        if state.shim_error:
            raise NativeCallError("pyllama_dflash_spec_process_embd_view", state.shim_error, cap.lines)
        return ImageDecodeResult(rc=rc, n_past=int(new_n_past[0]), spec_results=state.spec_results, log=cap.lines)

    def _check_decode(self, ctx: Context, chunk: Chunk, n_batch: int | None, speculative: Speculative | None) -> int:
        """decode_image's preconditions, each refused with what to change; returns the sub-batch size."""
        if ctx.model is not self.model:
            raise ValueError("decode_image: ctx is not a context of this projector's model")
        if speculative is not None and speculative.target is not ctx:
            raise ValueError("decode_image: the speculative driver's target is not ctx")
        lib = self._rt.lib
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
        return n_batch

    def _embeddings_for(self, chunk: Chunk, encode: bool) -> Any:
        """The chunk's embeddings: encoded now, or (encode False) what the last encode() of it left."""
        if encode:
            return self._encode(chunk)
        if self._encoded != chunk.ptr:
            raise ValueError(f"decode_image(encode=False): the last encode() was not of chunk {chunk.index}")
        return self._rt.lib.mtmd_get_output_embd(self._ptr())


def _probe_projector(path: str, model_path: str, n_gpu_layers: int) -> bool:
    """What :meth:`Projector.load_checked` runs in its child: the model, then the projector over it."""
    with Model(model_path, n_gpu_layers=n_gpu_layers) as m, Projector(path, m):
        return True
