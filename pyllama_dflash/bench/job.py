"""What a bench child measures (worker.py): one task on one variant, typed, JSON at the process
boundary only. Each task's defaults are written here once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..codec import decode, encode


@dataclass(frozen=True)
class SpecLoop:
    """Tokens per second of a text-only speculative loop, ``repeats`` times after a warm-up."""

    n_tokens: int = 64
    repeats: int = 5

    TASK: ClassVar[str] = "spec_loop"


@dataclass(frozen=True)
class FillCurve:
    """The draft fill and removal for holes of each size, against the image decode that makes them."""

    holes: tuple[int, ...]
    repeats: int = 5
    draft: str = "plain"  # or "swa": the sliding-window draft

    TASK: ClassVar[str] = "fill_curve"


@dataclass(frozen=True)
class BindingsFill:
    """The vectorised batch fill against the per-row one (bindings_fill.py)."""

    rows: int = 4096
    n_embd: tuple[int, ...] = (64, 2048)
    repeats: int = 7

    TASK: ClassVar[str] = "bindings_fill"


Task = SpecLoop | FillCurve | BindingsFill
TASKS: dict[str, type[Task]] = {cls.TASK: cls for cls in (SpecLoop, FillCurve, BindingsFill)}


@dataclass(frozen=True)
class BenchJob:
    variant: str
    task: Task

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "task": self.task.TASK, "args": encode(self.task)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchJob:
        return cls(d["variant"], decode(TASKS[d["task"]], d.get("args", {})))
