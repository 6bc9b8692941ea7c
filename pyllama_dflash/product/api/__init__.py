"""The friendly API: models, contexts, numpy batches, the DFlash speculative driver and mtmd.

Every call that llama.cpp answers with a return code returns that code (the harness asserts on
it); errors that are not return codes raise a :class:`PyllamaError`. Inputs that would make
llama.cpp abort the process (a GGML_ASSERT) are checked here first and raise ``ValueError`` or a
:class:`ContextError` instead, and so are inputs it would accept silently into a corrupt state
(negative or repeated positions, a draft with another vocab). What cannot be checked cheaply has a
guarded path that runs the native call in a child process (``pyllama_dflash.product.process.guard``):
:meth:`Model.load_checked` and :meth:`Projector.load_checked` for untrusted files, and
``guard.run_in_child`` for anything else.

Typical use (docs/api.md has the same, with notes)::

    import pyllama_dflash
    from pyllama_dflash import api

    pyllama_dflash.load()  # the default --must-pass variant; load("slots") names one
    with api.Model("target.gguf") as tm, api.Model("draft.gguf") as dm:
        target = api.Context(tm, n_ctx=512, n_batch=64, n_ubatch=64)
        draft = api.Context.draft(dm, target)  # ctx_other = target
        spec = api.Speculative(target, draft, n_max=3)  # before the target decodes anything
        batch = api.Batch.tokens(tm.tokenize("hello"), pos0=0)
        assert target.process_rc(batch) == 0  # return codes, not exceptions
        assert spec.process_ok(batch)

(``init(lib_dir)`` loads the libraries of a folder instead of a built variant.)

Objects free their native side on ``close()``/``with``; closing a model or a target first
closes whatever depends on it (drafts, the speculative driver, projectors).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import (
    ClosedError,
    ContextError,
    IncompatibleModelsError,
    ModelLoadError,
    NativeCallError,
    PyllamaError,
)
from ..owning import Runtime, runtime
from ._base import THREADS_ENV
from .batch import Batch
from .context import Context
from .model import Model
from .mtmd import Chunk, Chunks, ImageBatch, ImageDecodeResult, Projector
from .speculative import Speculative, detect_spec_type

__all__ = [
    "THREADS_ENV",
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
    "detect_spec_type",
    "devices",
    "init",
    "system_info",
]


def init(lib_dir: Path | str | None = None) -> Runtime:
    """Load the native libraries from lib_dir (else $PYLLAMA_DFLASH_LIB_DIR) once per process."""
    return runtime(lib_dir)


_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def devices() -> list[dict]:
    """The devices ggml's loaded backends registered: name, description and type (cpu, gpu, ...).
    A CUDA build on a machine without a GPU or driver registers none of its own."""
    rt = runtime()
    out = []
    for i in range(int(rt.lib.ggml_backend_dev_count())):
        dev = rt.lib.ggml_backend_dev_get(i)
        kind = int(rt.lib.ggml_backend_dev_type(dev))
        out.append(
            {
                "name": rt.string(rt.lib.ggml_backend_dev_name(dev)),
                "description": rt.string(rt.lib.ggml_backend_dev_description(dev)),
                "type": _DEVICE_TYPES.get(kind, str(kind)),
            }
        )
    return out


def system_info() -> str:
    rt = runtime()
    return rt.string(rt.lib.llama_print_system_info())
