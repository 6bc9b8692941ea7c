"""What a bench child measures (worker.py): one task on one variant, typed, JSON at the process
boundary only, and ``measure``, which runs one in a child. Each task's defaults are written here once."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...codec import decode, encode
from ...env import CPU_ENV
from ...product.process import child


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


@dataclass(frozen=True)
class BatchCost:
    """The target's decode of a batch of k text tokens against one token, k in ``sizes``, interleaved
    round by round after a ``prompt``-token prefix (what a verify of a k-token block costs)."""

    target: str  # the GGUF's path
    sizes: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 24
    prompt: int = 256
    n_ctx: int = 4096

    TASK: ClassVar[str] = "batch_cost"


@dataclass(frozen=True)
class RoundCosts:
    """The parts of a speculative round against one plain decode, each timed on its own, round by round:
    the draft's step, the target's verify of the last token and the drafted ones, and the driver's
    process() of that verify batch (what feeds the draft the target's features). Every drafted token is
    kept, so each round costs what a fully accepted one costs; what acceptance buys is the speed model's.

    ``rollback_snapshots``: the drafting target keeps n_max recurrent-state snapshots, so that a rejected
    draft can be rolled back, as llama-server gives it (common's ``need_n_rs_seq``) and Session does,
    while the plain decode runs in a context of its own with none, as llama-server's without a draft.
    Off, both keep none: the round as if a hybrid target's rollback were free."""

    target: str
    draft: str
    rounds: int = 24
    prompt: int = 256
    n_ctx: int = 4096
    rollback_snapshots: bool = True

    TASK: ClassVar[str] = "round_costs"


Task = SpecLoop | FillCurve | BindingsFill | BatchCost | RoundCosts
TASKS: dict[str, type[Task]] = {cls.TASK: cls for cls in (SpecLoop, FillCurve, BindingsFill, BatchCost, RoundCosts)}


@dataclass(frozen=True)
class BenchJob:
    variant: str
    task: Task

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "task": self.task.TASK, "args": encode(self.task)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchJob:
        return cls(d["variant"], decode(TASKS[d["task"]], d.get("args", {})))


def measure(variant: str, task: Task, timeout: float = 1800, cpu: str | None = None) -> dict:
    """One measurement in a child process of its own, for one variant (see worker.py); ``cpu``
    picks that variant's native or portable build."""
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-bench-") as tmp:
        result = child.run_job(
            "pyllama_dflash.lab.bench.worker",
            BenchJob(variant, task).to_json(),
            Path(tmp),
            f"{variant}-{task.TASK}",
            timeout=timeout,
            env={CPU_ENV: cpu} if cpu else None,
        )
    if result.get("status") != "OK":
        tail = "\n".join(result.get("log_tail", []))
        raise RuntimeError(f"bench worker {variant} {task.TASK}: {result.get('first_failure')}\n{tail}")
    return result["result"]
