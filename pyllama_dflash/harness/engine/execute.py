"""Run a schedule on the loaded variant: a Session over the tiny (or given) models, checked as it goes.

Needs the native libraries (``pyllama_dflash.load(variant)`` first), not hypothesis: replaying a
schedule file works without the test extra.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from ...words import Status
from ..oracles.drift import REFERENCE_OK, compare, drafts
from ..slotloop import SeqState, Session
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet, for_schedule
from ..slotloop.record import Record, StopScenario
from ..tiny import image as tiny_image
from .invariant import CheckedRecord, DraftDrift, DraftStarved, Memories, OutputDiffers, Violation
from .schedule import Schedule, Step, image_px

Saved = tuple[bytes, SeqState]


@dataclass
class Outcome:
    status: str  # PASS | DEGRADED (a drafting round drafted nothing) | FAIL (the invariant broke) | DRIFT
    violation: Violation | None = None
    record: Record = field(default_factory=Record)
    stats: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    tie: dict | None = None  # a drift proven a tie broken by the cells' order: its round

    def to_json(self) -> dict:
        v = self.violation
        return {
            "status": self.status,
            "kind": v.kind if v else None,
            "first_failure": str(v)
            if v
            else (f"a tie broken by the KV cells' order: {self.tie['summary']}" if self.tie else None),
            "failing_call": v.call.to_json() if v and v.call else None,
            "calls": len(self.record.calls),
            "rounds": len(self.record.rounds),
            "drafted": sum(r.drafted for r in self.record.rounds),
            "drafts": drafts([asdict(r) for r in self.record.rounds]),
            "stats": self.stats,
            "wall_s": round(self.wall_s, 3),
            "tie": self.tie,
        }


@lru_cache(maxsize=64)
def _image(w: int, h: int) -> np.ndarray:
    return tiny_image.rgb(w, h, 0)


def execute(
    schedule: Schedule,
    models: ModelSet,
    config: SessionConfig = DEFAULT_CONFIG,
    *,
    exact: bool = False,
    reference: Callable[..., dict] | None = None,
    check: bool = True,
) -> Outcome:
    """Run the schedule; a broken invariant ends the run (as llama-server drops the slot) and is returned.

    With exact, a run that completed is replayed without the draft, and the generated tokens
    must be equal (drafted tokens are only kept where the target agrees). With a reference
    (see reference.py), a run that completed must also draft what the reference drafted for
    the same schedule, round by round. Without check, only the calls' results are recorded
    (a failing call ends the run as FAIL): what the reference itself runs.
    """
    t0 = time.monotonic()
    models = for_schedule(models, schedule.drafter, schedule.target)
    cfg = schedule.session_config(config)
    record = CheckedRecord() if check else Record()
    violation = None
    run = _Run()
    with Session(models, cfg, record) as session:
        if check:
            record.bind(Memories(session.memory_ends, session.cfg.n_seq, session.own_positions))
        try:
            _run_steps(session, schedule.steps, record if check else None, run)
        except Violation as v:
            violation = v
        except StopScenario as e:
            if check:
                raise
            violation = Violation(str(e), e.call)
    stats = dict(getattr(record, "stats", {}))
    if violation is None and exact:
        violation = _compare(schedule, models, cfg, run, stats)
    if violation is None and check and record.starved_rounds:
        r = record.starved_rounds[0]
        violation = DraftStarved(
            f"starved: every call succeeded, but the drafting round of seq {r.seq} at pos {r.pos0} drafted "
            f"nothing ({len(record.starved_rounds)} such round(s))"
        )
    tie = None
    if violation is None and reference is not None and record.status() == Status.PASS:
        ref = reference(schedule)
        violation = _drift(record, ref, stats)
        if isinstance(violation, DraftDrift):
            tie = _tie(record, schedule, reference, ref, stats)
            violation = None if tie else violation
    if violation is not None:
        violation.schedule = schedule.to_json()
    status = (Status.DRIFT if isinstance(violation, DraftDrift) else Status.FAIL) if violation else record.status()
    if tie:
        status = Status.TIE
    stats["starved_rounds"] = len(record.starved_rounds)
    # schedules where draft() met a draft behind the target, per sequence (S10 on seq 0, S16 on seq 1)
    for seq in (0, 1):
        stats[f"behind_on_seq{seq}"] = int(any(r.draft_behind and r.seq == seq for r in record.rounds))
    return Outcome(status, violation, record, stats, time.monotonic() - t0, tie)


def _tie(record: Record, schedule: Schedule, reference: Callable, ref: dict, stats: dict) -> dict | None:
    """A drift that the reference laid out as the fix lays the draft out drafts too: a tie broken by the
    KV cells' order (see oracles.drift). Counted, with its round; None where the layout replay differs."""
    layout = reference(schedule, layout=True)
    run_drafts = drafts([asdict(r) for r in record.rounds])
    if layout.get("status") not in REFERENCE_OK or compare(run_drafts, drafts(layout["rounds"])) is not None:
        return None
    found = compare(run_drafts, drafts(ref["rounds"]))
    stats["ties"] = stats.get("ties", 0) + 1
    return {"round": found.round if found else None, "summary": found.summary() if found else None}


def _drift(record: Record, reference: dict, stats: dict) -> Violation | None:
    """The drafts against the reference's; a reference that could not run them judges nothing."""
    if reference["status"] not in REFERENCE_OK:
        stats["no_reference"] = stats.get("no_reference", 0) + 1
        return None
    stats["drift_checked"] = stats.get("drift_checked", 0) + 1
    found = compare(drafts([asdict(r) for r in record.rounds]), drafts(reference["rounds"]))
    if found is not None and found.behind_only:
        # the documented exception: draft() met a draft behind the target (a target-only
        # restore) and filled it for the noise block alone; counted, not a violation
        stats["drift_behind_only"] = stats.get("drift_behind_only", 0) + 1
        return None
    return DraftDrift(found.summary()) if found else None


@dataclass
class _Run:
    generated: dict[int, list[int]] = field(default_factory=dict)  # step index -> the tokens it reported
    # the first generate step that put more tokens in the context than it reported: Session.generate
    # lets its last round accept past n (llama-server caps the draft at the tokens remaining), so
    # from there on the run's context and its reference's differ and the outputs are not comparable
    overshoot: int | None = None


def _compare(schedule: Schedule, models: ModelSet, cfg: SessionConfig, run: _Run, stats: dict) -> Violation | None:
    """Replay without the draft; each generate step up to the first overshoot must report the same tokens."""
    ref = _Run()
    with Session(models, cfg, Record(), speculative=False) as s:
        try:
            _run_steps(s, schedule.steps, None, ref)
        except StopScenario as e:  # the target alone failed: not the draft's doing, but not a pass
            return OutputDiffers(f"the reference run without the draft failed: {e}")
    last = run.overshoot if run.overshoot is not None else len(schedule.steps)
    compared = [i for i in run.generated if i <= last]
    stats["exact_steps"] = len(compared)
    stats["exact_cut_by_overshoot"] = int(run.overshoot is not None and len(compared) < len(run.generated))
    for i in compared:
        if run.generated[i] != ref.generated[i]:
            return OutputDiffers(f"step {i + 1} generated {run.generated[i]}, without the draft {ref.generated[i]}")
    return None


def _run_steps(s: Session, steps: list[Step], checker: CheckedRecord | None, run: _Run) -> None:
    slots: dict[str, Saved] = {}
    for i, step in enumerate(steps):
        label = f"step {i + 1} {step['op']}"
        if step["op"] == "generate":
            seq, n_past = step["seq"], s.seqs[step["seq"]].n_past
            run.generated[i] = s.generate(seq, step["n"], label)
            if s.seqs[seq].n_past - n_past > step["n"] and run.overshoot is None:
                run.overshoot = i
        else:
            _run_step(s, step, label, slots, checker)
        if checker is not None:
            checker.check_all()


def _run_step(s: Session, step: Step, label: str, slots: dict[str, Saved], checker: CheckedRecord | None) -> None:
    op = step["op"]
    if op == "prompt":
        text, images = "", []
        for part in step["parts"]:
            if isinstance(part, str):
                text += part
            else:
                text += s.projector.marker
                images.append(_image(*image_px(part["image"])))
        s.prompt(step["seq"], text, images, label)
    elif op == "batch":
        if checker is not None:
            checker.batch_seqs = tuple(seq for seq, _ in step["texts"])
        s.text_batch([(seq, text) for seq, text in step["texts"]], label)
    elif op == "save":
        slots[step["name"]] = s.save_target(step["seq"])
    elif op == "restore":
        s.restore_target(step["seq"], slots[step["name"]], label)
        if checker is not None:
            checker.restored(step["seq"])
    elif op == "rewind":
        to = step["to"]
        checkpoint = slots[to] if to is not None else None
        pos = checkpoint[1].n_past if checkpoint else 0
        s.rewind(step["seq"], pos, checkpoint, label)
        if checker is not None:
            checker.rewound(step["seq"], pos)
    else:  # Schedule.validate() refuses these first (generate is run by _run_steps)
        raise ValueError(f"unknown op {op!r}")
