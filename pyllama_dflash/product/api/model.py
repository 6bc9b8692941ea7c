"""``Model``: a GGUF model, its metadata and its vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import (
    NativeCallError,
)
from ..owning import (
    LlamaModel,
    runtime,
)
from ..process import guard
from ..upgrade.draft import BLOCK_SIZE_KEY, DEFAULT_BLOCK_SIZE
from ._base import _Owner


class Model(_Owner):
    """A GGUF model. Bad paths and non-GGUF files raise ModelLoadError before native code runs."""

    def __init__(self, path: Path | str, n_gpu_layers: int = 0, *, load_mtp: bool = False) -> None:
        """``load_mtp``: also load the model's MTP head (nextn layers), which draft-mtp drafts with."""
        self._rt = runtime()
        self._handle = LlamaModel(self._rt, Path(path), n_gpu_layers=n_gpu_layers, load_mtp=load_mtp)
        self.load_mtp = load_mtp
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
        guard.check_load(_probe_model, path, n_gpu_layers, call=f"llama_model_load_from_file({path})", timeout=timeout)
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
        value = self.meta(BLOCK_SIZE_KEY)
        return int(value) if value else DEFAULT_BLOCK_SIZE

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
        return self.token_bytes(token, special).decode(errors="replace")

    def token_bytes(self, token: int, special: bool = True) -> bytes:
        """The bytes llama.cpp prints for one token: part of a character where a byte token holds one."""
        self._handle._require_open()
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token {token} outside the vocab of {self.n_vocab}")
        ffi = self._rt.ffi
        buf = ffi.new("char[]", 256)
        n = self._rt.lib.llama_token_to_piece(self._handle.vocab, token, buf, len(buf), 0, special)
        return ffi.unpack(buf, max(n, 0))

    def detokenize(self, tokens: Sequence[int] | np.ndarray, special: bool = True) -> str:
        """The text of ``tokens``: their pieces' bytes joined, then decoded (a character split across
        byte tokens comes back whole)."""
        return b"".join(self.token_bytes(int(t), special) for t in tokens).decode(errors="replace")

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, arch={self.arch!r}, n_embd={self.n_embd}, n_layer={self.n_layer})"


def _probe_model(path: str, n_gpu_layers: int) -> dict:
    """What :meth:`Model.load_checked` runs in its child: the load, and what it saw."""
    with Model(path, n_gpu_layers=n_gpu_layers) as m:
        return {"arch": m.arch, "n_embd": m.n_embd, "n_layer": m.n_layer, "n_vocab": m.n_vocab}
