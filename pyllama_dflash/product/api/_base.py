"""What every API object shares: ownership of one native handle, and the default thread count."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ...env import THREADS_ENV
from ..owning import NativeHandle
from ..process import logs

T = TypeVar("T")


def _default_threads() -> int:
    """Threads per context: ``$PYLLAMA_DFLASH_THREADS``, else up to 4 cores. Runners that start
    several processes at once set it, or the processes fight over the cores (seen: 50x slower)."""
    explicit = os.environ.get(THREADS_ENV)
    if explicit:
        return max(1, int(explicit))
    return max(1, min(4, os.cpu_count() or 1))


class _Owner:
    """Deterministic freeing for the API objects: ``close()`` or ``with``. Closing an object
    first closes what was created over it (drafts, drivers, projectors); see product/owning.py.

    Also the plumbing every object's native calls share: the pointer of an open handle, and what
    llama.cpp logged (warnings and up) during the last call, kept in ``last_log``.
    """

    _handle: NativeHandle
    last_log: list[logs.LogLine] = []

    def _ptr(self) -> Any:
        self._handle._require_open()
        return self._handle.ptr

    def _logged(self, fn: Callable[[], T], *, poll_common: bool = False) -> tuple[T, logs.Capture]:
        """``fn()`` with its native log lines captured into ``last_log``; returns (result, capture).

        poll_common also reads libcommon's log, which goes through a file (see logs.py)."""
        with logs.Capture(min_level=logging.WARNING, poll_common=poll_common) as cap:
            out = fn()
        self.last_log = cap.lines
        return out, cap

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def close(self) -> None:
        self._handle.close()

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_O = TypeVar("_O", bound=_Owner)
