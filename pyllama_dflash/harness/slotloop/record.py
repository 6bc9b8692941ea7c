"""What a scenario run records: every native call with its return code, every drafting round.

A run stops at the first failing call, as llama-server does (it answers HTTP 500 and
drops the slot), so the first failure is also the last call recorded.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from ...product.process.child import CRASH, DID_NOT_RUN, ERROR  # noqa: F401 (every status of a run is importable from here)
from ...words import Status

# every status of a run, by its name (words.Status says what each means)
PASS, SKIP, TIE, DRIFT, DEGRADED, FAIL = (
    Status.PASS,
    Status.SKIP,
    Status.TIE,
    Status.DRIFT,
    Status.DEGRADED,
    Status.FAIL,
)

# the api of a failing Call that is the session's own check, not a native call's answer: a draft with
# positions of its own holds its rows other than once each at 0..N-1, a gap inside included
# (Session._check_draft_rows, which reads every position the draft holds: api.kv_cells.held)
DRAFT_ROWS = "draft rows at 0..N-1"

# the log lines worth quoting next to a failing rc (the batch check, the driver's own report)
_POSITION = re.compile(r"\b[XY] = \d+")
_KEY_LINES = re.compile(r"X = |Y = |Y = X|X < Y|X <= Y|not continuous|failed|returned|error", re.IGNORECASE)


@dataclass
class Call:
    step: str  # where in the scenario: "prompt#2 text", "round 3", ...
    who: str  # target | draft | spec
    api: str  # llama_process | mtmd_helper_decode_image_chunk | common_speculative_process | ...
    seq: int
    ok: bool
    rc: int | None = None  # the native return code, where the call has one
    pos: tuple[int, int] | None = None  # first and last position (temporal row) of the rows it carried
    n: int = 0  # rows carried, or tokens drafted
    log: list[str] = field(default_factory=list)  # what llama.cpp logged (warnings and errors)

    def summary(self) -> str:
        where = f" at pos {self.pos[0]}..{self.pos[1]}" if self.pos else ""
        rc = f" rc={self.rc}" if self.rc is not None else ""
        verdict = "" if self.rc is not None else (" -> true" if self.ok else " -> false")
        key = [line.strip() for line in self.log if _KEY_LINES.search(line)]
        # the batch check's two positions first (they say where the hole is), then the rest
        positions = [line for line in key if _POSITION.search(line)]
        rest = [line for line in key if line not in positions]
        quoted = " | ".join(positions[-2:] + rest[-3:])
        return (
            f"{self.step}: {self.who} {self.api}{rc}{verdict} (seq {self.seq}{where}){': ' + quoted if quoted else ''}"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["pos"] = list(self.pos) if self.pos else None
        return d


@dataclass
class Round:
    """One speculative round: draft from pos0, verify on the target, accept."""

    seq: int
    pos0: int
    drafted: int
    accepted: int
    after_image: bool  # the first round after an image chunk of this sequence
    tokens: list[int] = field(default_factory=list)  # what the draft drafted (len == drafted)
    # the draft's memory ended before pos0 - 1 when drafting started (not empty): the target's
    # state was restored without the draft's, and draft() met the hole before process() did
    draft_behind: bool = False
    # the draft's own decode of the noise block was refused (draft() logged "llama_process
    # returned"): a round that drafted nothing because it could not, even where a cut-off allows
    # drafting nothing
    refused: bool = False
    # which generate() call of its record drafted it (a counter): the oracle pairs a run's rounds with
    # its reference's within one call, as a behind round that accepted otherwise moves the rest of it
    generate_call: int = 0


class StopScenario(Exception):
    """Raised by the recorder at the first failing call; the runner catches it."""

    def __init__(self, call: Call):
        super().__init__(call.summary())
        self.call = call


@dataclass
class Record:
    calls: list[Call] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    generated: dict[int, list[int]] = field(default_factory=dict)  # per sequence
    # a scenario that compares drafts within its own run (S12) says here where they differed
    drift: str | None = None
    # a p_min or n_min cut-off makes a round that drafts nothing an answer, not starvation
    empty_rounds_allowed: bool = False
    # generate() calls recorded so far, by every session writing here (Round.generate_call)
    generate_calls: int = 0

    def add(self, call: Call) -> Call:
        self.calls.append(call)
        if not call.ok:
            raise StopScenario(call)
        return call

    @property
    def first_failure(self) -> Call | None:
        return next((c for c in self.calls if not c.ok), None)

    @property
    def starved_rounds(self) -> list[Round]:
        """Rounds where the draft produced nothing although every call succeeded (and no cut-off
        allowed it to)."""
        return [r for r in self.rounds if r.drafted == 0 and (r.refused or not self.empty_rounds_allowed)]

    def status(self) -> str:
        if self.first_failure is not None:
            return FAIL
        if self.starved_rounds:
            return DEGRADED
        if self.drift:
            return DRIFT
        return PASS

    def drafted_after_image(self) -> int | None:
        after = [r.drafted for r in self.rounds if r.after_image]
        return after[0] if after else None
