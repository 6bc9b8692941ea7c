"""Native calls that can abort the process, run in a child process instead.

llama.cpp answers some bad inputs with ``GGML_ASSERT``/``GGML_ABORT`` (``abort()``) or a fatal
signal rather than an error code; in-process, that kills the interpreter. What the API can check
cheaply in Python it checks first (see ``api``); for the rest, these run the call in a fresh
interpreter that loads the same variant, so the caller gets an exception instead:

* :func:`check_model` (used by ``api.Model.load_checked``): ``llama_model_load_from_file`` on a
  file nobody vouched for. The loader asserts on some hyperparameters (``block_count`` above
  ``LLAMA_MAX_LAYERS``) and divides by others (``full_attention_interval`` 0 is a SIGFPE).
* :func:`check_projector` (used by ``api.Projector.load_checked``): ``mtmd_init_from_file``.
* :func:`run_in_child`: any module-level function, e.g. a whole decode loop on untrusted input.

The child's result (or exception) comes back pickled; a child that dies raises
:class:`NativeAbort` with the ``GGML_ASSERT`` line (or the last lines it wrote) and the signal.

    python -m pyllama_dflash.guard PAYLOAD RESULT    # the child side (internal)
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pyllama_dflash._internals import LIB_DIR_ENV, ModelLoadError, PyllamaError

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
# the lines worth quoting from a dead child's stderr, best first
_FATAL = tuple(re.compile(p) for p in (
    r"GGML_ASSERT|GGML_ABORT", r"terminate called|what\(\):", r"Fatal Python error", r"(?i)\berror\b"))


class NativeAbort(PyllamaError):
    """A guarded call killed its child process (GGML_ASSERT, GGML_ABORT, a signal) or timed out."""

    def __init__(self, call: str, how: str, lines: list[str]) -> None:
        self.call = call
        self.how = how  # "SIGABRT", "exit 3", "timed out after 60s"
        self.lines = lines  # the child's stderr lines that say why (GGML_ASSERT first)
        self.reason = _short(lines[0]) if lines else "no message"
        if how.startswith("timed out"):
            super().__init__(f"{call}: the child process running it {how} (last output: {self.reason})")
        else:
            super().__init__(f"{call}: llama.cpp aborted the child process running it ({how}): {self.reason}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.call, self.how, self.lines))


class ChildError(PyllamaError):
    """An exception raised in the child that could not be sent back as itself."""


def _short(line: str) -> str:
    """``/long/staged/llama.cpp/src/x.cpp:12: GGML_ASSERT(c) failed`` -> ``GGML_ASSERT(c) failed at src/x.cpp:12``."""
    m = re.match(r"^(?P<file>\S*?(?P<rel>(?:src|ggml|common|tools|include)/\S+?)):(?P<line>\d+): (?P<msg>.*)$", line.strip())
    return f"{m['msg']} at {m['rel']}:{m['line']}" if m else line.strip()


def _loaded_lib_dir() -> Path | None:
    from pyllama_dflash.bindings.ffi import loaded_lib_dir

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
        payload, result, err = Path(tmp) / "payload", Path(tmp) / "result", Path(tmp) / "stderr"
        payload.write_bytes(pickle.dumps((list(sys.path), str(libs), blob)))
        env = dict(os.environ)
        # a child that dies cannot clean its temporary files up: they go where ours are removed
        env["TMPDIR"] = str(Path(tmp) / "tmp")
        (Path(tmp) / "tmp").mkdir()
        env.setdefault("GGML_NO_BACKTRACE", "1")  # else ggml attaches gdb before it aborts: slow and noisy
        env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal then names itself and the Python call it hit
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
        with open(err, "wb") as err_fh:
            proc = subprocess.Popen([sys.executable, "-m", "pyllama_dflash.guard", str(payload), str(result)],
                                    stdin=subprocess.DEVNULL, stdout=err_fh, stderr=subprocess.STDOUT, env=env)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise NativeAbort(name, f"timed out after {timeout:g}s", _why(err)) from None
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if rc == 0 and result.is_file():
            kind, value = pickle.loads(result.read_bytes())
            if kind == "ok":
                return value
            raise value
        how = f"{signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals() else f"exit {rc}"
        raise NativeAbort(name, how, _why(err))


def _why(stderr_file: Path, n_tail: int = 8) -> list[str]:
    try:
        lines = [ln for ln in stderr_file.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return []
    fatal = [ln for pattern in _FATAL for ln in lines if pattern.search(ln)]
    fatal = list(dict.fromkeys(fatal))[:3]
    return fatal + [ln for ln in lines[-n_tail:] if ln not in fatal]


# ---- the guarded loads --------------------------------------------------------------------------


def _probe_model(path: str, n_gpu_layers: int) -> dict:
    from pyllama_dflash import api

    with api.Model(path, n_gpu_layers=n_gpu_layers) as m:
        return {"arch": m.arch, "n_embd": m.n_embd, "n_layer": m.n_layer, "n_vocab": m.n_vocab}


def _probe_projector(path: str, model_path: str, n_gpu_layers: int) -> bool:
    from pyllama_dflash import api

    with api.Model(model_path, n_gpu_layers=n_gpu_layers) as m, api.Projector(path, m):
        return True


def check_model(path: Path | str, n_gpu_layers: int = 0, timeout: float | None = DEFAULT_TIMEOUT_S) -> dict:
    """Load ``path`` in a child first; ModelLoadError names the file and why, even when llama.cpp
    aborted. Returns what the child saw (arch, n_embd, n_layer, n_vocab)."""
    from pyllama_dflash._internals import check_gguf_file

    check_gguf_file(Path(path))  # the cheap refusals need no child
    try:
        return run_in_child(_probe_model, str(path), n_gpu_layers, call=f"llama_model_load_from_file({path})",
                            timeout=timeout)
    except NativeAbort as exc:
        raise ModelLoadError(path, f"llama.cpp aborted while loading it ({exc.how}, in a child process): "
                                   f"{exc.reason}") from exc


def check_projector(path: Path | str, model_path: Path | str, n_gpu_layers: int = 0,
                    timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
    """Load the projector ``path`` over ``model_path`` in a child first (see :func:`check_model`)."""
    from pyllama_dflash._internals import check_gguf_file

    check_gguf_file(Path(path))
    try:
        run_in_child(_probe_projector, str(path), str(model_path), n_gpu_layers,
                     call=f"mtmd_init_from_file({path})", timeout=timeout)
    except NativeAbort as exc:
        raise ModelLoadError(path, f"llama.cpp aborted while loading it ({exc.how}, in a child process): "
                                   f"{exc.reason}") from exc


# ---- the child side ------------------------------------------------------------------------------


def _child(payload: Path, result: Path) -> int:
    sys_path, lib_dir, blob = pickle.loads(payload.read_bytes())
    sys.path[:] = [p for p in sys_path if p] + [p for p in sys.path if p not in sys_path]
    try:
        from pyllama_dflash import api

        api.init(lib_dir)
        fn, args, kwargs = pickle.loads(blob)
        out: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - every exception goes back to the caller
        out = ("error", exc)
    try:
        data = pickle.dumps(out)
        pickle.loads(data)  # an exception whose class cannot be rebuilt there fails here, not there
    except Exception as why:  # noqa: BLE001
        if out[0] == "error":
            text = "".join(traceback.format_exception_only(type(out[1]), out[1])).strip()
            failure = ChildError(f"raised in the child process: {text}")
        else:
            failure = ChildError(f"the child's result ({type(out[1]).__name__}) cannot be sent back: {why}")
        data = pickle.dumps(("error", failure))
    tmp = result.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, result)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
