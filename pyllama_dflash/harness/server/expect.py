"""What a server check must see, what it saw, and the one rule that says whether that is enough.

Every check fills a :class:`Seen` and returns a :class:`Result`; :meth:`Expect.met_by` decides ``ok``
for all of them alike. The expectations are written next to each check (checks.py), per kind of
variant (llamabuild.variants: baseline, the zero-fill, a fix, a fix whose server saves the
draft with a slot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .client import Response

SPEC_BATCH_ERROR = "failed to process speculative batch"


@dataclass(frozen=True)
class Expect:
    """What one check must answer on one kind of variant.

    ``status``: 200, or 500 with the message ``SPEC_BATCH_ERROR``. ``where``: which of the
    check's requests with the draft must answer it: ``every`` one, ``any`` one (at least),
    the ``last`` one, or, for the exactness checks, the one with the ``draft`` while the same
    request without the draft answers 200. The rest must hold as well where set:
    ``same_tokens`` (greedy token ids, and chat text where the check compares it, equal the
    run without the draft), ``cached`` (the follow-up requests found their prompt again:
    ``timings.cache_n`` > 0), ``content`` (the answer has text).
    """

    status: Literal[200, 500]
    where: Literal["every", "any", "last", "draft"] = "every"
    same_tokens: bool = False
    cached: bool = False
    content: bool = False
    # the restore checks: what the restore request answers (400: refused, and the slot cleared),
    # whether the continuation drafts what A never interrupted drafts (True), must draft
    # otherwise (False: the bug, reproduced) or is not judged (None), whether the slot file has
    # a draft part, and whether the continuation must find the slot empty (cache_n 0)
    restore: Literal[200, 400] = 200
    same_drafts: bool | None = None
    draft_part: bool | None = None
    empty_after_restore: bool = False
    # the target's memory holds as many rows as without the draft: its slot file is as large
    same_target_rows: bool = False

    def describe(self) -> str:
        """The ``"expected"`` text of a result."""
        code = f"500 {SPEC_BATCH_ERROR!r}" if self.status == 500 else str(self.status)
        if self.where == "draft":
            if self.status == 500:
                return f"{code} with the draft, 200 without"
            return (
                f"{code} and the same token ids with and without the draft"
                if self.same_tokens
                else f"{code} with and without the draft"
            )
        if self.where == "last":
            return f"{code} on the last request"
        text = f"{code} everywhere and the same token ids as without the draft" if self.same_tokens else code
        if self.restore == 400:
            text = f"restore refused (400), then an empty slot: {text}"
        if self.same_drafts is not None:
            text += "; drafts " + ("equal to" if self.same_drafts else "other than") + " the reference's"
        if self.draft_part is not None:
            text += "; the slot file has " + ("a" if self.draft_part else "no") + " draft part"
        if self.same_target_rows:
            text += "; the target's memory as large as without the draft"
        return text

    def met_by(self, seen: Seen) -> bool:
        """The one rule: the answers' codes as ``where`` says, then every property this expects."""
        responses = seen.responses
        if self.status == 500:
            ok = _has_spec_error(responses[-1:] if self.where == "last" else responses)
        elif self.where == "any":
            ok = any(r.status == self.status for r in responses)
        elif self.where == "last":
            ok = bool(responses) and responses[-1].status == self.status
        else:
            ok = bool(responses) and all(r.status == self.status for r in responses)
        if self.where == "draft":
            ok = ok and seen.without is not None and seen.without.ok
        return (
            ok
            and seen.holds
            and (seen.same_tokens or not self.same_tokens)
            and (seen.cached or not self.cached)
            and (seen.content or not self.content)
            and (seen.restore_status is None or seen.restore_status == self.restore)
            and (self.same_drafts is None or seen.same_drafts == self.same_drafts)
            and (self.draft_part is None or seen.draft_part == self.draft_part)
            and (not self.empty_after_restore or seen.empty_after_restore is True)
            and (seen.same_target_rows or not self.same_target_rows)
        )


@dataclass
class Seen:
    """What a check saw: its requests with the draft, in order, and what it measured of them."""

    responses: list[Response]
    without: Response | None = None  # the same request without the draft ("draft" checks)
    same_tokens: bool = False
    cached: bool = False
    content: bool = False
    restore_status: int | None = None  # the restore request's code, where the check restores
    same_drafts: bool | None = None
    draft_part: bool | None = None
    empty_after_restore: bool | None = None
    same_target_rows: bool = False
    holds: bool = True  # the check's own condition, needed on every variant (the setup answered, ...)


@dataclass
class Result:
    """One check's result: ``status`` (a code, or the codes in request order), ``ok`` (it met its
    expectation), ``expected`` (that expectation in words), and what else it measured."""

    status: Any
    ok: bool
    expected: str
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"status": self.status, "ok": self.ok, "expected": self.expected, **self.details}


def judged(e: Expect, seen: Seen, status: Any = None, *, errors: bool = True, **details: Any) -> Result:
    """A Result from what a check saw (``status``: the codes of its requests with the draft). The
    failed requests' messages go under ``errors``, unless ``errors`` is False: a check that reports
    the error it cares about itself."""
    codes = status if status is not None else [r.status for r in seen.responses]
    failed = [r.error_message for r in seen.responses if not r.ok] if errors else []
    measured = {"any_500": any(r.status == 500 for r in seen.responses), **details}
    return Result(codes, e.met_by(seen), e.describe(), {**measured, **({"errors": failed} if failed else {})})


def _has_spec_error(responses: list[Response]) -> bool:
    return any(r.status == 500 and SPEC_BATCH_ERROR in r.error_message for r in responses)
