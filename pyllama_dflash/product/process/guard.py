"""Native calls that can abort the process, run in a child process instead.

llama.cpp answers some bad inputs with ``GGML_ASSERT``/``GGML_ABORT`` (``abort()``) or a fatal
signal rather than an error code; in-process, that kills the interpreter. What the API can check
cheaply in Python it checks first (see ``api``); for the rest, these run the call in a fresh
interpreter that loads the same variant, so the caller gets an exception instead:

* :func:`check_load`: a loader on a file nobody vouched for. ``api.Model.load_checked`` and
  ``api.Projector.load_checked`` pass their probe (``llama_model_load_from_file``,
  ``mtmd_init_from_file``): the model loader asserts on some hyperparameters (``block_count``
  above ``LLAMA_MAX_LAYERS``) and divides by others (``full_attention_interval`` 0 is a SIGFPE).
* :func:`run_in_child`: any module-level function, e.g. a whole decode loop on untrusted input.

The probes live next to the loaders they guard, so imports run one way: ``api`` imports this
module, never the reverse. The child process itself is started by ``pyllama_dflash.product.process.child``.

The child's result (or exception) comes back pickled; a child that dies raises
:class:`NativeAbort` with the ``GGML_ASSERT`` line (or the last lines it wrote) and the signal.

    python -m pyllama_dflash.product.process.guard PAYLOAD RESULT    # the child side (internal)
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...env import LIB_DIR_ENV
from ...errors import ChildError, ModelLoadError, NativeAbort, PyllamaError
from ...files import atomic_write_bytes
from ..bindings.ffi import loaded_lib_dir
from ..owning import check_gguf_file, runtime
from . import child

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0
# the folder that holds the package (process/ sits one level inside it): the child imports it from there
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


def _loaded_lib_dir() -> Path | None:
    found = loaded_lib_dir()
    if found is None and os.environ.get(LIB_DIR_ENV):
        found = Path(os.environ[LIB_DIR_ENV])
    return found


def run_in_child(
    fn: Callable[..., T],
    *args: Any,
    call: str | None = None,
    lib_dir: Path | str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)`` in a fresh interpreter with the same variant loaded; returns its result.

    ``fn`` must be importable by reference (a module-level function) and its arguments and result
    picklable. The child gets this process's ``sys.path`` and loads ``lib_dir`` (default: the
    variant loaded here, else ``$PYLLAMA_DFLASH_LIB_DIR``) before calling. An exception raised by
    ``fn`` is re-raised here; a child that dies raises :class:`NativeAbort`.
    """
    name = call or getattr(fn, "__qualname__", repr(fn))
    libs = Path(lib_dir) if lib_dir is not None else _loaded_lib_dir()
    if libs is None:
        raise PyllamaError(f"{name}: no variant loaded to run it with: call pyllama_dflash.load(...) first")
    blob = pickle.dumps((fn, args, kwargs))
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-guard-") as tmp:
        payload, result, log = Path(tmp) / "payload", Path(tmp) / "result", Path(tmp) / "output"
        payload.write_bytes(pickle.dumps((list(sys.path), str(libs), blob)))
        (Path(tmp) / "tmp").mkdir()
        env = {
            # a child that dies cannot clean its temporary files up: they go where ours are removed
            "TMPDIR": str(Path(tmp) / "tmp"),
            "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p),
        }
        done = child.run(
            [sys.executable, "-m", "pyllama_dflash.product.process.guard", str(payload), str(result)],
            log=log,
            timeout=timeout,
            env=env,
        )
        if done.rc == 0 and result.is_file():
            kind, value = pickle.loads(result.read_bytes())
            if kind == "ok":
                return value
            raise value
        raise NativeAbort(name, done.how, done.why())


def check_load(
    probe: Callable[..., T], path: Path | str, *args: Any, call: str, timeout: float | None = DEFAULT_TIMEOUT_S
) -> T:
    """``probe(str(path), *args)`` in a child first: ModelLoadError names the file and why, even when
    llama.cpp aborted. The cheap refusals (no file, not a GGUF) need no child."""
    check_gguf_file(Path(path))
    try:
        return run_in_child(probe, str(path), *args, call=call, timeout=timeout)
    except NativeAbort as exc:
        raise ModelLoadError(
            path, f"llama.cpp aborted while loading it ({exc.how}, in a child process): {exc.reason}"
        ) from exc


# ---- the child side ------------------------------------------------------------------------------


def _child(payload: Path, result: Path) -> int:
    sys_path, lib_dir, blob = pickle.loads(payload.read_bytes())
    sys.path[:] = [p for p in sys_path if p] + [p for p in sys.path if p not in sys_path]
    try:
        runtime(lib_dir)
        fn, args, kwargs = pickle.loads(blob)
        out: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException as exc:
        out = ("error", exc)
    try:
        data = pickle.dumps(out)
        pickle.loads(data)  # an exception whose class cannot be rebuilt there fails here, not there
    except Exception as why:
        if out[0] == "error":
            text = "".join(traceback.format_exception_only(type(out[1]), out[1])).strip()
            failure = ChildError(f"raised in the child process: {text}")
        else:
            failure = ChildError(f"the child's result ({type(out[1]).__name__}) cannot be sent back: {why}")
        data = pickle.dumps(("error", failure))
    atomic_write_bytes(result, data)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
