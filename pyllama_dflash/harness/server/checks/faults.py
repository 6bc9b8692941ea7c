"""Faults of slot files, through the real server: each ends in an exact continuation, or in a clean
error and an empty slot, and the server stays up. This module: restores of a file tampered with (parts
swapped, a draft part forged or damaged); :mod:`.save_faults`: saves that fail or are killed.

Patch 0005 binds a slot file's draft part to its target part (the draft part is saved with the
target part's tokens, and a restore compares them) and writes both parts whole under temporary
names before renaming them into place. Without 0005 a server writes no draft part: the faults of one
are no faults to it, and its continuations are exact (b11434's behaviour, the reference).
"""

from __future__ import annotations

import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .. import bodies
from ..client import Response, slot_server, without_draft
from ..draft_part import LENGTH, DraftPart, token_count
from ..expect import Expect, Result, Seen, judged
from . import check, keeps_own_positions, server_facts

SHORT = "Tell me about the small robot that paints"
LONG = bodies.RESTORE_B + " and then some more about the rivers and the valleys below them"
OTHER = "hi there"
MORE = " and what happened next"


def continued(srv, prompt: list[int]) -> Response:
    """The conversation continued: its prompt plus MORE, greedy."""
    return srv.completion(prompt + srv.tokenize(MORE, add_special=False), n_predict=bodies.N_PREDICT)


def no_draft_tokens(ctx, name: str, prompt: list[int]) -> list[int] | None:
    """The no-draft answer to the conversation ``prompt`` :func:`continued`: what the target alone
    continues it with (None where it did not answer)."""
    r = without_draft(ctx, name, lambda plain: continued(plain, prompt))
    return r.tokens if r.ok else None


def exact_continuation(last: Response, no_draft: list[int] | None, **seen) -> Seen:
    """What a check of a continuation after a restore saw: ``last`` against the no-draft answer, and
    whether the restored slot served it (``cached``); ``seen`` adds the responses and the rest."""
    return Seen(same_tokens=last.ok and last.tokens == no_draft, cached=bool(last.timings.get("cache_n")), **seen)


# the restores below meet a draft that is behind the restored target on baseline (the target comes
# back longer than what the slot held): it fails there as in slot_restore
_EXACT_OR_REFUSED = dict(
    baseline=Expect(500, "last"),
    twin=Expect(200, "every", same_tokens=True, cached=True),
    saving_draft=Expect(200, "every", same_tokens=True, restore=400, empty_after_restore=True),
)


class _Tampered(NamedTuple):
    """What a restore of a tampered slot file saw (:func:`_two_saved_one_tampered`)."""

    a: list[int]  # SHORT's tokens
    b: list[int]  # LONG's (cut to A's count, with b_as_long_as_a)
    ra: Response  # A answered
    rb: Response  # B answered
    saves_ok: bool  # both saves succeeded
    saved: list[int | None]  # each save's n_saved (None where it failed)
    parts: list[int | None]  # each draft part's token count before the tamper (None: no draft part)
    other: Response  # something else run on the slot
    restore: Response  # the restore of a.bin
    last: Response  # the conversation continued
    no_draft: list[int] | None  # what the target alone continues it with
    facts: dict


def _two_saved_one_tampered(
    ctx, name: str, tamper: Callable[[Path], None], *, continues: str, b_as_long_as_a: bool = False
) -> _Tampered:
    """The skeleton of a restore of a tampered file: save conversation A (short) as a.bin and B (long) as
    b.bin, ``tamper`` with the slot folder, run something else, restore a.bin and continue ``continues``
    ("A" or "B"), beside what the target alone continues it with. ``b_as_long_as_a``: B's prompt cut to
    A's token count, so the two parts hold as many tokens."""
    with slot_server(ctx, name) as srv:
        folder = srv.options.slot_save_path
        a, b = srv.tokenize(SHORT), srv.tokenize(LONG)
        if b_as_long_as_a:
            b = b[: len(a)]  # SHORT and LONG differ from their first word on: other tokens, as many
        ra = srv.completion(a, n_predict=bodies.N_PREDICT)
        saves = [srv.slot_save("a.bin")]
        rb = srv.completion(b, n_predict=bodies.N_PREDICT)
        saves.append(srv.slot_save("b.bin"))
        parts = [_draft_count(folder / f"{x}.bin.draft") for x in "ab"]  # None without 0005: no draft part
        tamper(folder)
        other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
        restore = srv.slot_restore("a.bin")
        prompt = (a + (ra.tokens or [])) if continues == "A" else (b + (rb.tokens or []))
        last = continued(srv, prompt)
        facts = server_facts(srv)
    no_draft = no_draft_tokens(ctx, name, prompt)
    saved = [s.body.get("n_saved") if s.ok and isinstance(s.body, dict) else None for s in saves]
    return _Tampered(a, b, ra, rb, all(s.ok for s in saves), saved, parts, other, restore, last, no_draft, facts)


def _judged_restore(ctx, name: str, t: _Tampered, *, holds: bool, **details) -> Result:
    """The judgement of a tampered restore: exact, or refused with the slot left empty (_EXACT_OR_REFUSED)."""
    cache_n = t.last.timings.get("cache_n")
    seen = exact_continuation(
        t.last,
        t.no_draft,
        responses=[t.ra, t.rb, t.other, t.last],
        restore_status=t.restore.status,
        empty_after_restore=not cache_n,
        holds=holds,
    )
    out = judged(ctx.expect(name), seen, cache_n_after_restore=cache_n, **details, **t.facts)
    out.details["restore_status"] = t.restore.status
    if not t.restore.ok:
        out.details["restore_error"] = t.restore.error_message
    return out


def _swapped_parts(ctx, name: str, *, same_length: bool) -> Result:
    """Save A as a.bin and B as b.bin, copy b.bin over a.bin (B's target part beside A's draft part), run
    something else, restore a.bin and continue B. ``same_length``: B's prompt cut to A's token count, so the
    two parts hold as many tokens, and only the tokens themselves tell them apart."""

    def swap(folder: Path) -> None:
        shutil.copyfile(folder / "b.bin", folder / "a.bin")

    t = _two_saved_one_tampered(ctx, name, swap, continues="B", b_as_long_as_a=same_length)
    # the setup as meant, with same_length: A's tokens other than B's, and as many of them in both parts
    foreign = t.a + (t.ra.tokens or []) != t.b + (t.rb.tokens or [])
    saved, parts = t.saved, t.parts
    equal = saved[0] is not None and saved[0] == saved[1] and (parts[0] is None or parts[0] == parts[1])
    holds = t.saves_ok and (foreign and equal if same_length else True)
    return _judged_restore(ctx, name, t, holds=holds, n_saved=saved, draft_part_tokens=parts)


@check("restore_swapped_parts", **_EXACT_OR_REFUSED)
def restore_swapped_parts(ctx) -> Result:
    """Save conversation A (short) as a.bin and B (long) as b.bin, copy b.bin over a.bin (B's target part
    beside A's draft part: what a copy without its sibling, or a crash between a save's two renames,
    leaves), run something else, restore a.bin and continue B. With 0005 the restore is refused."""
    return _swapped_parts(ctx, "restore_swapped_parts", same_length=False)


@check("restore_swapped_parts_same_length", **_EXACT_OR_REFUSED)
def restore_swapped_parts_same_length(ctx) -> Result:
    """restore_swapped_parts with two conversations of the same token count: A's draft part has as many
    tokens as B's target part, but A's. With 0005 the restore is refused all the same: the binding compares
    the tokens, not only their count (a binding that compared counts alone is caught only by parts of
    one length)."""
    return _swapped_parts(ctx, "restore_swapped_parts_same_length", same_length=True)


def _draft_state(part: bytes) -> bytes:
    """What follows a whole draft part's tokens (server/draft_part.py: the state's length as u64 and the
    state, and in version 2 the drafter state's length and the drafter state)."""
    return part[DraftPart.parse(part).tokens_end :]


def _draft_prefix(part: bytes) -> bytes:
    """A whole draft part's header and tokens."""
    return part[: DraftPart.parse(part).tokens_end]


def _draft_count(path: Path) -> int | None:
    """The token count a draft part's header gives, or None where there is no draft part."""
    return token_count(path.read_bytes()) if path.is_file() else None


@check("restore_draft_runs_past", **_EXACT_OR_REFUSED)
def restore_draft_runs_past(ctx) -> Result:
    """A forged draft part: A's header and tokens (so the binding holds) in front of B's longer draft state.
    0005 refuses a draft that comes back past its target, whatever the tokens say, and 0007 one that holds
    another row count than its target part's tokens; the refusal must name what it found (B's rows, A's
    tokens). Without 0005 there is no draft part to forge."""

    def forge(folder: Path) -> None:
        part_a, part_b = folder / "a.bin.draft", folder / "b.bin.draft"
        if part_a.exists() and part_b.exists():
            part_a.write_bytes(_draft_prefix(part_a.read_bytes()) + _draft_state(part_b.read_bytes()))

    t = _two_saved_one_tampered(ctx, "restore_draft_runs_past", forge, continues="A")
    holds = t.saves_ok and _names_the_counts(ctx, t.restore, t.saved)
    return _judged_restore(ctx, "restore_draft_runs_past", t, holds=holds, n_saved=t.saved)


def _names_the_counts(ctx, restore, saved: list[int | None]) -> bool:
    """A refused restore of the forged part says what it found. A draft with positions of its own (0007)
    holds one row per token, so the refusal counts them: B's rows (B's saved tokens, text only) against
    A's target part (A's); a draft at the target's positions (MTP's on 0007 too) says it runs past.
    Without 0005 there is nothing to refuse, and nothing to say."""
    v = ctx.variant
    if restore.ok or v is None or not v.saves_draft:
        return True
    if keeps_own_positions(ctx):
        return f"holds {saved[1]} rows, its target part {saved[0]} tokens" in restore.error_message
    return "runs past its target part" in restore.error_message


STATE_CUT = "cut where its state begins"  # header and tokens whole: only the frame's length tells
SPEC_CUT = "cut where its drafter state's length begins"  # version 2: the draft's state whole, no drafter state
SPEC_LONG = "a byte after its drafter state"  # version 2: more than the drafter state's frame says


def _with_u32(data: bytes, offset: int, change: int) -> bytes:
    (value,) = struct.unpack_from("<I", data, offset)
    return data[:offset] + struct.pack("<I", (value + change) & 0xFFFFFFFF) + data[offset + 4 :]


def _truncations(data: bytes) -> list[tuple[str, bytes]]:
    """The draft part cut at several points, its header's magic or version alone changed (each must be
    refused on its own), and random bytes of its length (a seeded draw)."""
    rng = random.Random(len(data))
    points = sorted({0, 8, 12, len(data) // 2, len(data) - 1})
    return (
        [(f"cut at {n} of {len(data)} bytes", data[:n]) for n in points]
        + [(STATE_CUT, data[: DraftPart.parse(data).state_at])]  # the state's u64 length kept, the state gone
        # the header is u32 magic, u32 version, u32 token count: a later format's part, or another file's
        + [("another version, its magic intact", _with_u32(data, 4, 1))]
        + [("another magic, its version intact", _with_u32(data, 0, 1))]
        + [("random bytes", bytes(rng.getrandbits(8) for _ in range(len(data))))]
        + _drafter_state_damages(data)
    )


def _drafter_state_damages(data: bytes) -> list[tuple[str, bytes]]:
    """A version-2 part's drafter state (after the draft's state) cut off or longer than its frame."""
    part = DraftPart.parse(data)
    if part.n_spec is None:
        return []
    return [(SPEC_CUT, data[: part.spec_at - LENGTH.size]), (SPEC_LONG, data + b"\0")]


def _reason(damage: str, size: int) -> str | None:
    """What 0005's restore must say of a damage of _truncations (None: not asked)."""
    return {
        f"cut at 0 of {size} bytes": "too short",
        f"cut at 8 of {size} bytes": "too short",
        f"cut at 12 of {size} bytes": "truncated in its tokens",
        STATE_CUT: "its frame says",
        SPEC_CUT: "truncated before its drafter state",
        SPEC_LONG: "its drafter state is",
        "another version, its magic intact": "not a draft part of this server's format",
        "another magic, its version intact": "not a draft part of this server's format",
    }.get(damage)


@check("restore_damaged_draft_part", **_EXACT_OR_REFUSED)
def restore_damaged_draft_part(ctx) -> Result:
    """Save a conversation, run another, damage the draft part (cut at several points, random bytes), restore
    and continue, once per damage. With 0005 each restore is refused and the next request finds the slot
    empty; without it there is no draft part to damage."""
    outcomes = []
    with slot_server(ctx, "restore_damaged_draft_part") as srv:
        part = srv.options.slot_save_path / "a.bin.draft"
        a = srv.tokenize(LONG)
        first = srv.completion(a, n_predict=bodies.N_PREDICT)
        saved = srv.slot_save("a.bin")
        responses = [first]
        original = part.read_bytes() if part.exists() else b""
        for what, data in _truncations(original) if original else [("no draft part", b"")]:
            other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
            if original:
                part.write_bytes(data)
            restore = srv.slot_restore("a.bin")
            last = continued(srv, a + (first.tokens or []))
            responses += [other, last]
            outcomes.append(
                {
                    "damage": what,
                    "restore": restore.status,
                    "restore_error": None if restore.ok else restore.error_message,
                    "cache_n": last.timings.get("cache_n"),
                    "tokens": last.tokens,
                }
            )
        facts = server_facts(srv)
    no_draft = no_draft_tokens(ctx, "restore_damaged_draft_part", a + (first.tokens or []))
    restores = {o["restore"] for o in outcomes}
    # the reason names the damage, where it is the frame's: a state cut off whole is a length the frame
    # contradicts, not short tokens; a part of the header's 12 bytes whole is short in its tokens, not short
    # (the header's own length is where a bound one byte off refuses it for the wrong reason)
    named = all(
        _reason(o["damage"], len(original)) in (o["restore_error"] or "")
        for o in outcomes
        if _reason(o["damage"], len(original))
    )
    seen = Seen(
        responses,
        same_tokens=all(o["tokens"] == no_draft for o in outcomes),
        cached=all(o["cache_n"] for o in outcomes),
        restore_status=restores.pop() if len(restores) == 1 else None,
        empty_after_restore=not any(o["cache_n"] for o in outcomes),
        holds=saved.ok and facts["server_alive"] and named,
    )
    return judged(ctx.expect("restore_damaged_draft_part"), seen, damages=outcomes, **facts)
