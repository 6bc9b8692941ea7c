"""llama.cpp, mtmd and libcommon log lines, routed into Python ``logging`` and a bounded ring.

Three native sources feed it:

* libllama and ggml (``llama_log_set``) -> logger ``pyllama_dflash.llama``
* libmtmd and its helpers (``mtmd_helper_log_set``, which also sets ``mtmd_log_set``)
  -> logger ``pyllama_dflash.mtmd``
* libcommon (the speculative driver's ``LOG_ERR`` ...), which has no callback: the shim mirrors it
  into a file that :func:`poll_common` reads -> logger ``pyllama_dflash.common``

Native code logs in pieces (``GGML_LOG_LEVEL_CONT`` continues the previous line; a line ends at
``\\n``) and from worker threads, so pieces are joined per source under a lock before a line is
published. The ring keeps the last lines so that, after a call returned an error code, a report
can quote what llama.cpp said about it (``Capture`` marks the start of a call).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import format_lines as format_lines  # the errors quote log lines too
from ..bindings.callbacks import native_callback

LOGGER_PREFIX = "pyllama_dflash"
SOURCES = ("llama", "mtmd", "common")

# ggml_log_level values (checked against the compiled module at install time)
_GGML_NONE, _GGML_DEBUG, _GGML_INFO, _GGML_WARN, _GGML_ERROR, _GGML_CONT = range(6)
_LEVELS = {
    _GGML_NONE: logging.INFO,
    _GGML_DEBUG: logging.DEBUG,
    _GGML_INFO: logging.INFO,
    _GGML_WARN: logging.WARNING,
    _GGML_ERROR: logging.ERROR,
}
_COMMON_PREFIX_LEVELS = {"E": logging.ERROR, "W": logging.WARNING, "I": logging.INFO, "D": logging.DEBUG}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class LogLine:
    """One complete native log line."""

    seq: int  # increases by one per line, across all sources
    source: str  # "llama" | "mtmd" | "common"
    level: int  # a Python logging level
    text: str  # without the trailing newline

    def __str__(self) -> str:
        return f"[{self.source}:{logging.getLevelName(self.level)}] {self.text}"


class LogRing:
    """The last ``capacity`` lines, thread-safe."""

    def __init__(self, capacity: int = 4096) -> None:
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._seq = itertools.count()
        self._next = 0
        self._lock = threading.Lock()

    def append(self, source: str, level: int, text: str) -> LogLine:
        with self._lock:
            line = LogLine(next(self._seq), source, level, text)
            self._next = line.seq + 1
            self._lines.append(line)
        return line

    def mark(self) -> int:
        """The seq the next line will get: lines() since a mark are those logged after it."""
        with self._lock:
            return self._next

    def lines(self, since: int = 0, min_level: int = logging.NOTSET, source: str | None = None) -> list[LogLine]:
        # walk back from the newest line only as far as `since`: a Capture around every native
        # call must cost what that call logged, not a scan of the whole ring
        with self._lock:
            newer = []
            for ln in reversed(self._lines):
                if ln.seq < since:
                    break
                newer.append(ln)
        newer.reverse()
        return [ln for ln in newer if ln.level >= min_level and (source is None or ln.source == source)]

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()


class _LineJoiner:
    """Joins the pieces of one source into lines; CONT pieces keep the level of the line they continue."""

    def __init__(self, source: str, ring: LogRing) -> None:
        self.source = source
        self.logger = logging.getLogger(f"{LOGGER_PREFIX}.{source}")
        self._ring = ring
        self._pending = ""
        self._level = logging.INFO
        self._lock = threading.Lock()

    def feed(self, ggml_level: int, text: str) -> None:
        complete: list[tuple[int, str]] = []
        with self._lock:
            if ggml_level != _GGML_CONT:
                if self._pending:  # a new message while a line was open: publish what we have
                    complete.append((self._level, self._pending))
                    self._pending = ""
                self._level = _LEVELS.get(ggml_level, logging.INFO)
            self._pending += text
            while "\n" in self._pending:
                head, self._pending = self._pending.split("\n", 1)
                complete.append((self._level, head))
        for level, text_line in complete:
            self.publish(level, text_line)

    def publish(self, level: int, text: str) -> None:
        text = _ANSI.sub("", text).rstrip()
        if not text:
            return
        self._ring.append(self.source, level, text)
        self.logger.log(level, "%s", text)


class _CommonFileTap:
    """Reads what libcommon appended to its mirror file since the last poll."""

    def __init__(self, lib: Any, ffi: Any, joiner: _LineJoiner) -> None:
        self._lib = lib
        self._ffi = ffi
        self._joiner = joiner
        self._dir = tempfile.TemporaryDirectory(prefix="pyllama_dflash_common_log_")
        self._path = Path(self._dir.name) / "common.log"
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()
        if lib.pyllama_dflash_common_log_to_file(str(self._path).encode()) != 0:
            raise RuntimeError(ffi.string(lib.pyllama_dflash_last_error()).decode(errors="replace"))

    def poll(self) -> None:
        with self._lock:
            self._lib.pyllama_dflash_common_log_flush()
            try:
                with self._path.open("rb") as fh:
                    fh.seek(self._offset)
                    data = fh.read()
            except FileNotFoundError:
                return
            self._offset += len(data)
            data = self._partial + data
            *lines, self._partial = data.split(b"\n")
        for raw in lines:
            text = _ANSI.sub("", raw.decode(errors="replace"))
            level = logging.INFO
            if len(text) >= 2 and text[1] == " " and text[0] in _COMMON_PREFIX_LEVELS:
                level, text = _COMMON_PREFIX_LEVELS[text[0]], text[2:]
            self._joiner.publish(level, text)

    def close(self) -> None:
        with self._lock:
            self._lib.pyllama_dflash_common_log_to_file(self._ffi.NULL)
        self._dir.cleanup()


class _State:
    def __init__(self) -> None:
        self.ring = LogRing()
        self.joiners = {source: _LineJoiner(source, self.ring) for source in SOURCES}
        self.ffi: Any = None
        self.lib: Any = None
        self.common_tap: _CommonFileTap | None = None
        self.lock = threading.Lock()


_state = _State()


def ring() -> LogRing:
    """The process-wide ring of native log lines."""
    return _state.ring


def install(ffi: Any, lib: Any) -> None:
    """Route the native loggers of this (ffi, lib) into Python. Idempotent."""
    with _state.lock:
        if _state.lib is not None:
            return
        expected = (
            lib.GGML_LOG_LEVEL_NONE,
            lib.GGML_LOG_LEVEL_DEBUG,
            lib.GGML_LOG_LEVEL_INFO,
            lib.GGML_LOG_LEVEL_WARN,
            lib.GGML_LOG_LEVEL_ERROR,
            lib.GGML_LOG_LEVEL_CONT,
        )
        if expected != tuple(range(6)):
            raise RuntimeError(
                f"ggml_log_level values changed: {expected}; update pyllama_dflash/product/process/logs.py"
            )

        llama_joiner = _state.joiners["llama"]
        mtmd_joiner = _state.joiners["mtmd"]

        # a log line that cannot be read is dropped: never worth a crash
        @native_callback(ffi, "pyllama_dflash_on_llama_log")
        def _on_llama_log(level: int, text: Any, _user_data: Any) -> None:
            llama_joiner.feed(int(level), ffi.string(text).decode(errors="replace"))

        @native_callback(ffi, "pyllama_dflash_on_mtmd_log")
        def _on_mtmd_log(level: int, text: Any, _user_data: Any) -> None:
            mtmd_joiner.feed(int(level), ffi.string(text).decode(errors="replace"))

        lib.llama_log_set(lib.pyllama_dflash_on_llama_log, ffi.NULL)
        lib.mtmd_helper_log_set(lib.pyllama_dflash_on_mtmd_log, ffi.NULL)
        _state.ffi, _state.lib = ffi, lib
        try:
            _state.common_tap = _CommonFileTap(lib, ffi, _state.joiners["common"])
        except Exception as exc:
            logging.getLogger(f"{LOGGER_PREFIX}.common").warning("libcommon log tap unavailable: %s", exc)
        atexit.register(_uninstall)


def _uninstall() -> None:
    # after interpreter teardown a Python callback cannot run: hand logging back to stderr first
    with _state.lock:
        lib, ffi = _state.lib, _state.ffi
        if lib is None:
            return
        lib.llama_log_set(ffi.NULL, ffi.NULL)
        lib.mtmd_helper_log_set(ffi.NULL, ffi.NULL)
        tap, _state.common_tap = _state.common_tap, None
        if tap is not None:
            try:
                tap.close()
            except Exception:
                pass
        _state.lib = None


def poll_common() -> None:
    """Pull libcommon's lines logged so far into the ring (a no-op before install)."""
    tap = _state.common_tap
    if tap is not None:
        tap.poll()


class Capture:
    """Marks the ring before a native call; ``lines``/``errors`` are what was logged during it.

    >>> with Capture() as cap:
    ...     rc = ctx.decode(batch)
    >>> cap.errors   # e.g. the "Y = X + 1" explanation when rc == -1
    """

    def __init__(self, min_level: int = logging.NOTSET, poll_common: bool = True) -> None:
        self.min_level = min_level
        self.poll_common = poll_common  # off for calls that never reach libcommon (saves a flush)
        self._mark = 0
        self.lines: list[LogLine] = []

    def __enter__(self) -> Capture:
        if self.poll_common:
            poll_common()
        self._mark = _state.ring.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.poll_common:
            poll_common()
        self.lines = _state.ring.lines(since=self._mark, min_level=self.min_level)

    @property
    def errors(self) -> list[LogLine]:
        return [ln for ln in self.lines if ln.level >= logging.ERROR]

    def text(self, min_level: int = logging.NOTSET) -> str:
        return "\n".join(str(ln) for ln in self.lines if ln.level >= min_level)


def recent(n: int = 20, min_level: int = logging.NOTSET, source: str | None = None) -> list[LogLine]:
    """The last n lines at min_level or above."""
    poll_common()
    return _state.ring.lines(min_level=min_level, source=source)[-n:]
