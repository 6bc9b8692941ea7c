"""A tiny target whose recorded training context is longer: the same tensors, one key changed.

llama-server caps each slot's context at the model's training context (``n_ctx_slot()`` in b11434's
server-context.cpp), and the tiny targets record 256, so a conversation with a 256-row image is refused
there though the library runs it. The copy changes ``<arch>.context_length`` alone, so it computes what
the target computes; it is made once per target file and size, in a cache folder, atomically.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ...files import atomic_path, default_file_mode
from ...product.upgrade.gguf_stream import make_kv, read_gguf, write_with_kvs


def long_context_target(target: Path | str, n_ctx_train: int, cache_dir: Path | str) -> Path:
    """``target`` with ``<arch>.context_length`` set to ``n_ctx_train``, in ``cache_dir``; ``target`` itself
    where its context is that long already (the bench pair's 830 MB: no copy)."""
    target = Path(target).resolve()
    g = read_gguf(target)
    arch = g.get("general.architecture")
    key = f"{arch}.context_length"
    found = g.kv(key)
    if found is None:
        raise ValueError(f"{target}: no {key} to lengthen")
    if int(found.value) >= n_ctx_train:
        return target
    st = target.stat()
    stamp = hashlib.sha256(f"{target}\0{st.st_size}\0{st.st_mtime_ns}\0{n_ctx_train}".encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"{target.stem}-ctx{n_ctx_train}-{stamp}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out, mode=default_file_mode()) as tmp, open(tmp, "wb") as f:
            write_with_kvs(g, f, [make_kv(key, found.type, n_ctx_train)])
            f.flush()
            os.fsync(f.fileno())
    return out
