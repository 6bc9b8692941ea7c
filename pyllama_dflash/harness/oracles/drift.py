"""The drift oracle: what a run drafted, against what its reference drafted.

The reference of a run is the same schedule on ``baseline`` with the draft's reconverted twin:
the same tensors plus the ``rope.dimension_sections [head_dim/2, 0, 0, 0]`` that llama.cpp's
converter now writes for a DFlash draft of an M-RoPE target. The twin accepts the position jump
after an image as it is, so on the unpatched tree it never meets the hole. A fixed legacy draft
must draft exactly what the twin drafts, round by round; an M-RoPE draft is its own twin, so
the same comparison says that the fix leaves it as it was. (What the oracle cannot require is the
KV buffer's layout: the fix's freed fill cells are reused by later rows, so attention can sum in
another order and a round whose candidates tie to rounding can differ; see patch 0004.)

A run whose calls all succeeded and whose output is exact, but whose drafts differ, is
``DRIFT``. A run that is already worse (``DEGRADED``, ``FAIL``, ...) keeps its status; the
comparison is still reported for a ``DEGRADED`` one.

Ties are proven, not excused: where the drafts differ, the reference is replayed once more with
the fix's cell layout (``SessionConfig.twin_fill_layout``: zero rows in each hole of the twin
before the rows after it, removed right after, as patch 0004 does to a legacy draft; and, where a
round begins with the draft behind, zero rows in the hole for that round's noise block, removed
after it, as 0004's draft() does). The twin's
cells then hold the same values in the fix's order. Where that replay drafts exactly what the run
drafted, the difference was a tie broken by the order attention sums in: ``TIE``, counted and
reported with its round, not a violation. Where it does not, ``DRIFT``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..slotloop.record import DEGRADED, DRIFT, PASS, TIE

COMPARABLE = (PASS, DEGRADED)  # statuses of a run whose rounds ran to the end of the schedule
# A reference must also have drafted in every round: a twin whose draft() was refused (DEGRADED:
# its memory ran past the target's, a state the fix trims with a warning) cannot say what the
# draft should have drafted there. Found by the fuzzer: restore the target alone to an earlier
# checkpoint, then generate; the fix drafts, the twin on baseline drafts nothing.
REFERENCE_OK = (PASS,)


@dataclass(frozen=True)
class Drift:
    round: int  # 1-based index of the first pair of rounds (the run's, the reference's) that differs
    seq: int
    pos0: int
    run: list[int]  # what the run drafted there
    reference: list[int]  # what the reference drafted there
    differing: int  # pairs that differ, out of
    total: int  # the pairs compared
    # every differing pair began with the draft behind the target (see Round.draft_behind), or was moved
    # to other positions by such a round before it in its generate() call (see compare)
    behind_only: bool = False

    def summary(self) -> str:
        why = " (only where draft() met a draft behind the target)" if self.behind_only else ""
        return (
            f"drafts differ from the reference in {self.differing}/{self.total} rounds{why}; first in round "
            f"{self.round} (seq {self.seq} at pos {self.pos0}): drafted {self.run}, reference {self.reference}"
        )

    def to_json(self) -> dict:
        return asdict(self)


_COMPARED = ("seq", "pos0", "tokens")


def drafts(rounds: list[dict]) -> list[dict]:
    """The drafting rounds of a result, reduced to what the oracle compares (and whether the
    draft was behind when the round began, and which generate() call drafted it)."""
    return [
        {
            "seq": r["seq"],
            "pos0": r["pos0"],
            "tokens": list(r.get("tokens", [])),
            "behind": bool(r.get("draft_behind", False)),
            "generate_call": int(r.get("generate_call", 0)),
        }
        for r in rounds
    ]


def _by_generate_call(rounds: list[tuple[int, dict]]) -> list[list[tuple[int, dict]]]:
    """A sequence's rounds (with their order) split by the generate() call that drafted them, in order."""
    calls: dict[int, list[tuple[int, dict]]] = {}
    for i, r in rounds:
        calls.setdefault(r.get("generate_call", 0), []).append((i, r))
    for call in calls.values():
        # a call drafts each position once: rounds of two calls under one counter would be paired wrongly
        if len({r["pos0"] for _, r in call}) != len(call):
            raise ValueError(f"two rounds of seq {call[0][1]['seq']} at one position in one generate() call")
    return list(calls.values())


def compare(run: list[dict], reference: list[dict]) -> Drift | None:
    """None when both drafted the same tokens at the same positions in every round.

    A sequence's j-th generate() call is paired with the reference's j-th call of that sequence (by
    ordinal: S12 pairs a call of one session with a call of another), and within a call a round with
    the reference's round at the same position: the target's history there is the same (the output is
    exact), so the drafts must be. A round one side drafted at a position the other did not is excused
    where a round of the call before it began behind on the run's side (a behind round that accepted
    otherwise moves every later round of its call), and differs otherwise. Pairs are reported in the
    run's order (a round the run did not draft, right after the run's last round before it)."""
    missing = {"seq": -1, "pos0": -1, "tokens": [], "behind": False}
    keyed = []  # (order, run round, reference round, excused where they differ)
    for seq in dict.fromkeys([r["seq"] for r in run] + [r["seq"] for r in reference]):
        mine = _by_generate_call([(i, r) for i, r in enumerate(run) if r["seq"] == seq])
        theirs = _by_generate_call([(i, r) for i, r in enumerate(reference) if r["seq"] == seq])
        for j in range(max(len(mine), len(theirs))):
            ours, refs = (mine[j] if j < len(mine) else []), (theirs[j] if j < len(theirs) else [])
            at = {r["pos0"]: (i, r) for i, r in refs}
            # rounds past the call's first behind round may sit at other positions than the reference's
            first_behind = min((r["pos0"] for _, r in ours if r["behind"]), default=math.inf)
            for i, a in ours:
                b = at.pop(a["pos0"], (None, missing))[1]
                keyed.append(((i, 0), a, b, a["behind"] or (b is missing and first_behind < a["pos0"])))
            for i, b in at.values():
                before = [k for k, a in ours if a["pos0"] < b["pos0"]]
                order = (before[-1], 1 + i) if before else ((ours[0][0] if ours else i), -1)
                keyed.append((order, missing, b, first_behind < b["pos0"]))
    keyed.sort(key=lambda t: t[0])
    pairs = [(a, b, excused) for _, a, b, excused in keyed]
    differ = [i for i, (a, b, _) in enumerate(pairs) if any(a[k] != b[k] for k in _COMPARED)]
    if not differ:
        return None
    first = differ[0]
    a, b, _ = pairs[first]
    where = a if a["seq"] >= 0 else b
    behind_only = all(pairs[i][2] for i in differ)
    return Drift(first + 1, where["seq"], where["pos0"], a["tokens"], b["tokens"], len(differ), len(pairs), behind_only)


def judge(result: dict, reference: dict | None, layout: dict | None = None) -> dict:
    """Add the drift verdict to a run's result (in place) from its reference run's result, and
    from ``layout``, the reference replayed with the fix's cell layout, where there is one.

    The result gains ``drafts``, ``reference`` (the reference's status and drafts, or why there
    is none) and ``drift`` (None, or where the drafts first differ); a drift that the layout
    replay drafts too becomes ``TIE`` (with ``tie``: the layout replay's verdict).
    """
    result["drafts"] = drafts(result.get("rounds", []))
    result["drift"] = None
    if reference is None:
        result["reference"] = {"status": None, "note": "no reference run (no twin draft for these models)"}
        return result
    ref_status = reference.get("status")
    result["reference"] = {"status": ref_status, "drafts": drafts(reference.get("rounds", []))}
    if ref_status not in REFERENCE_OK:
        result["reference"]["note"] = (
            f"the reference itself is {ref_status}: {reference.get('first_failure') or 'no drafts to compare'}"
        )
        return result
    if result.get("status") not in COMPARABLE:
        return result
    drift = compare(result["drafts"], result["reference"]["drafts"])
    if drift is not None:
        result["drift"] = drift.to_json()
        if result["status"] == PASS:
            result["status"] = DRIFT
            result["first_failure"] = drift.summary()
            # a drift confined to rounds that began behind is the documented draft()-side exception and
            # stays DRIFT; past those rounds, the layout replay (which fills a behind twin in draft() too,
            # as the fix does) must draft what the run drafted
            if layout is not None and not drift.behind_only and is_tie(result["drafts"], layout):
                result["status"] = TIE
                behind = sum(1 for r in result["drafts"] if r["behind"])
                result["tie"] = {"round": drift.round, "layout_replay": layout.get("status"), "rounds_behind": behind}
                result["first_failure"] = "a tie broken by the KV cells' order: " + drift.summary()
    return result


def is_tie(run_drafts: list[dict], layout: dict) -> bool:
    """Whether the reference replayed with the fix's cell layout drafted exactly what the run did."""
    return layout.get("status") in REFERENCE_OK and compare(run_drafts, drafts(layout.get("rounds", []))) is None
