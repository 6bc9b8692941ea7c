"""Shared plumbing for the generators: seeded weights, atomic cached writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...files import atomic_path, default_file_mode
from ._gguf import gguf_module

# stored in every generated file; equal value => the file is up to date
FINGERPRINT_KEY = "pyllama_dflash.tiny.fingerprint"


class Weights:
    """Deterministic tensor source: one numpy Generator per file kind and seed.

    Tensors are drawn in call order, so a generator must always request them in
    the same order (it does: the code path is fixed for a given config).
    """

    def __init__(self, seed: int, stream: int) -> None:
        self.rng = np.random.default_rng([seed, stream])

    def normal(self, shape: tuple[int, ...], std: float, dtype: Any = np.float32) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(dtype)

    def ggml(self, ne: tuple[int, ...], std: float, dtype: Any = np.float32) -> np.ndarray:
        """A normal tensor of ggml shape ``ne`` (the order llama.cpp's loaders name: numpy's shape reversed)."""
        return self.normal(tuple(reversed(ne)), std, dtype)

    def norm(self, n: int) -> np.ndarray:
        # norm gains near 1 keep activations at unit scale through the layers
        return (1.0 + self.rng.standard_normal(n) * 0.05).astype(np.float32)

    def uniform(self, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, shape).astype(np.float32)


def write_gguf(path: Path, arch: str, fp: str, build: Callable[[Any, Any], None], gguf: Any = None) -> bool:
    """Write a GGUF at `path` unless one with fingerprint `fp` is already there.

    `build(writer, gguf)` adds the keys and tensors. The file is written to a temp
    file in the same directory and renamed into place, so readers never see a
    partial file. Returns True when it wrote, False when it skipped.
    """
    g = gguf if gguf is not None else gguf_module()
    path = Path(path)
    if _stored_fingerprint(path, g) == fp:
        return False
    with atomic_path(path, mode=default_file_mode()) as tmp:
        writer = g.GGUFWriter(tmp, arch)
        try:
            build(writer, g)
            writer.add_string(FINGERPRINT_KEY, fp)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file(progress=False)
        finally:
            writer.close()
    return True


def _stored_fingerprint(path: Path, g: Any) -> str | None:
    if not path.is_file():
        return None
    try:
        field = g.GGUFReader(path).get_field(FINGERPRINT_KEY)
        return None if field is None else str(field.contents())
    except Exception:
        return None  # truncated or foreign file: regenerate it


def stored_fingerprint(path: Path, gguf: Any = None) -> str | None:
    """The fingerprint stored in an existing generated file, or None."""
    return _stored_fingerprint(Path(path), gguf if gguf is not None else gguf_module())


def add_text_hparams(w: Any, cfg: Any, n_layer: int, *, n_embd: int | None = None, n_ff: int | None = None) -> None:
    """The size keys the target and the draft share (the draft's n_embd must equal the target's; a Gemma 4
    assistant's must not, so it passes its own)."""
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(n_embd or cfg.n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff or cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_freq_base)
