"""Stage-by-stage progress lines with elapsed times, for humans watching a build."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, variant: str, stream: TextIO | None = None, quiet: bool = False):
        self.variant = variant
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}
        self._stage: str | None = None
        self._stage_t0 = self.t0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def stage(self, name: str, detail: str = "") -> None:
        """Start a stage; the previous one's duration is recorded."""
        self._close_stage()
        self._stage, self._stage_t0 = name, time.monotonic()
        self.say(f"{name}{': ' + detail if detail else ''}")

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.variant} {self.elapsed():7.1f}s] {msg}", file=self.stream, flush=True)

    def finish(self) -> dict[str, float]:
        self._close_stage()
        self.timings["total"] = round(self.elapsed(), 3)
        return self.timings

    def _close_stage(self) -> None:
        if self._stage is not None:
            self.timings[self._stage] = round(self.timings.get(self._stage, 0.0) + time.monotonic() - self._stage_t0, 3)
            self._stage = None
