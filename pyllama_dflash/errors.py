"""Every error pyllama_dflash raises on purpose, under one root: ``except PyllamaError`` catches them all.

Each keeps the built-in class the code around it relies on (``ValueError`` for bad input,
``RuntimeError`` for a tool or process that failed), so existing ``except ValueError`` still
works. Messages name the file or parameter and the reason. Errors that carry fields define
``__reduce__``, so that a guarded child process can send them back as themselves (guard.py).

:func:`check_error` is the one place where a native return code becomes an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class PyllamaError(Exception):
    """Base of every error raised by pyllama_dflash."""


class _PathError(PyllamaError):
    """An error about one file: ``path`` and ``reason``, ``"<prefix><path>: <reason>"``-style."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        return f"{self.path}: {self.reason}"

    def __reduce__(self) -> tuple:
        return (type(self), (self.path, self.reason))


# ---- the native library ----------------------------------------------------------------------


class BindingLoadError(PyllamaError, RuntimeError):
    """The compiled module is missing, unloadable, or from another variant than the one loaded."""


class ModelLoadError(_PathError):
    """A model or projector file could not be loaded; names the path and the reason."""

    def _message(self) -> str:
        return f"cannot load {self.path}: {self.reason}"


class ContextError(PyllamaError):
    """A context (or a draft context) could not be created, or was refused before creation."""


class IncompatibleModelsError(ContextError, ValueError):
    """Draft and target (or projector and target) do not fit together."""


class NativeCallError(PyllamaError):
    """A native call failed in a way that is not a plain return code (shim error, NULL result)."""

    def __init__(self, call: str, message: str, log_lines: list[Any] | None = None) -> None:
        self.call = call
        self.message = message
        self.log_lines = log_lines or []
        detail = f"{call}: {message}"
        if self.log_lines:
            detail += "\n" + format_lines(self.log_lines)
        super().__init__(detail)

    def __reduce__(self) -> tuple:
        return (type(self), (self.call, self.message, self.log_lines))


class ClosedError(PyllamaError):
    """The native object was already freed."""


class NativeAbort(PyllamaError):
    """A guarded call killed its child process (GGML_ASSERT, GGML_ABORT, a signal) or timed out."""

    def __init__(self, call: str, how: str, lines: list[str]) -> None:
        self.call = call
        self.how = how  # "SIGABRT", "exit 3", "timed out after 60s"
        self.lines = lines  # the child's output lines that say why (GGML_ASSERT first)
        self.reason = short_native_line(lines[0]) if lines else "no message"
        if how.startswith("timed out"):
            super().__init__(f"{call}: the child process running it {how} (last output: {self.reason})")
        else:
            super().__init__(f"{call}: llama.cpp aborted the child process running it ({how}): {self.reason}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.call, self.how, self.lines))


def short_native_line(line: str) -> str:
    """``/long/staged/llama.cpp/src/x.cpp:12: GGML_ASSERT(c) failed`` -> ``GGML_ASSERT(c) failed at src/x.cpp:12``."""
    m = re.match(
        r"^(?P<file>\S*?(?P<rel>(?:src|ggml|common|tools|include)/\S+?)):(?P<line>\d+): (?P<msg>.*)$", line.strip()
    )
    return f"{m['msg']} at {m['rel']}:{m['line']}" if m else line.strip()


def format_lines(lines: Iterable[Any]) -> str:
    """Native log lines (``logs.LogLine``, or their text) one per line, as an error quotes them."""
    return "\n".join(str(ln) for ln in lines)


class ChildError(PyllamaError):
    """An exception raised in a child process that could not be sent back as itself."""


def check_error(call: str, ok: bool, message: str, log_lines: list[Any] | None = None) -> None:
    """Raise :class:`NativeCallError` for a native call that did not succeed.

    The one place where the API turns a failed native call into an exception; where a return
    code is the answer (``llama_process``, ``common_speculative_process``) it is returned instead.
    """
    if not ok:
        raise NativeCallError(call, message, log_lines)


# ---- builds ------------------------------------------------------------------------------------


class BuildError(PyllamaError, RuntimeError):
    """A build step failed in a way the user can act on."""


class SourceError(BuildError):
    """The llama.cpp source could not be found, fetched or verified."""


class PatchError(BuildError):
    """A patch in the series is malformed or does not apply."""


class ToolchainError(BuildError):
    """The requested backend cannot be built on this machine."""


class VariantNotBuilt(BuildError):
    """A variant was asked for by name but no valid build of it exists."""


# ---- files, schedules, processes ---------------------------------------------------------------


class GgufUnavailable(PyllamaError, RuntimeError):
    """No usable gguf-py with DFlash support could be found."""


class GGUFError(_PathError, ValueError):
    """The file is not a GGUF the streaming reader can read; names the file and the reason."""


class DraftUpgradeError(_PathError, ValueError):
    """A draft (or target) cannot be inspected or upgraded; names the file and the reason."""


class ScheduleError(PyllamaError, ValueError):
    """A schedule that llama-server could not produce (or that does not parse)."""


class ServerError(PyllamaError, RuntimeError):
    """The server died, never became healthy, or could not be stopped; carries the log tail."""

    def __init__(self, message: str, log_tail: str = "", log_path: Path | None = None):
        self.log_tail = log_tail
        self.log_path = log_path
        where = f"\nlog: {log_path}" if log_path else ""
        tail = f"\n--- last lines of the server log ---\n{log_tail}" if log_tail else ""
        super().__init__(message + where + tail)


class UsageError(PyllamaError, ValueError):
    """A command's flags or inputs that it cannot run with: its error line, exit 2 (command.py)."""


class ReferenceDied(PyllamaError, RuntimeError):
    """An oracle's reference did not run: the drift oracle's reference process exited or answered
    nonsense, or a mutation run's references errored. A harness error, never a verdict."""
