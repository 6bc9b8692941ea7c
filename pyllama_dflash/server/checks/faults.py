"""Faults of slot files, through the real server: each ends in an exact continuation, or in a clean
error and an empty slot, and the server stays up.

Patch 0005 binds a slot file's draft part to its target part (the draft part is saved with the
target part's tokens, and a restore compares them) and writes both parts whole under temporary
names before renaming them into place. Without 0005 a server writes no draft part: the faults of one
are no faults to it, and its continuations are exact (b11434's behaviour, the reference).
"""

from __future__ import annotations

import random
import resource
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .. import bodies
from ..client import Response
from ..draft_part import LENGTH, DraftPart, token_count
from ..drafts import DEBUG_VERBOSITY, LOGS_NO_DRAFTS, read_drafted_rounds
from ..expect import Expect, Result, Seen, judged
from . import check, keeps_own_positions, server_facts

SHORT = "Tell me about the small robot that paints"
LONG = bodies.RESTORE_B + " and then some more about the rivers and the valleys below them"
OTHER = "hi there"
MORE = " and what happened next"


def _session(ctx, name: str, **options):
    save_dir = ctx.work_dir / f"{name}-slots"
    shutil.rmtree(save_dir, ignore_errors=True)
    save_dir.mkdir(parents=True)
    # the RAM prompt cache off: a restored slot is then the only place a prefix can come back from
    return ctx.server(name, n_parallel=1, slot_save_path=save_dir, cache_ram_mib=0, **options), save_dir


def _continue(srv, prompt: list[int]):
    """The conversation continued: its prompt plus MORE, greedy."""
    return srv.completion(prompt + srv.tokenize(MORE, add_special=False), n_predict=bodies.N_PREDICT)


def _reference(ctx, name: str, prompt: str | list[int], first_tokens: list[int]) -> list[int] | None:
    """What the target alone continues the same conversation (its text, or its tokens) with (a server
    without the draft)."""
    with ctx.server(name + "_no_draft", draft=False) as srv:
        r = _continue(srv, (srv.tokenize(prompt) if isinstance(prompt, str) else prompt) + first_tokens)
        return r.tokens if r.ok else None


def _save(srv, filename: str):
    return srv.slot_action("save", filename)


def _restore(srv, filename: str):
    return srv.slot_action("restore", filename)


# the restores below meet a draft that is behind the restored target on baseline (the target comes
# back longer than what the slot held): it fails there as in slot_restore
_EXACT_OR_REFUSED = dict(
    baseline=Expect(500, "last"),
    fix=Expect(200, "every", same_tokens=True, cached=True),
    slots=Expect(200, "every", same_tokens=True, restore=400, empty_after_restore=True),
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
    ref: list[int] | None  # what the target alone continues it with
    facts: dict


def _two_saved_one_tampered(
    ctx, name: str, tamper: Callable[[Path], None], *, continues: str, b_as_long_as_a: bool = False
) -> _Tampered:
    """The skeleton of a restore of a tampered file: save conversation A (short) as a.bin and B (long) as
    b.bin, ``tamper`` with the slot folder, run something else, restore a.bin and continue ``continues``
    ("A" or "B"), beside what the target alone continues it with. ``b_as_long_as_a``: B's prompt cut to
    A's token count, so the two parts hold as many tokens."""
    srv, folder = _session(ctx, name)
    with srv:
        a, b = srv.tokenize(SHORT), srv.tokenize(LONG)
        if b_as_long_as_a:
            b = b[: len(a)]  # SHORT and LONG differ from their first word on: other tokens, as many
        ra = srv.completion(a, n_predict=bodies.N_PREDICT)
        saves = [_save(srv, "a.bin")]
        rb = srv.completion(b, n_predict=bodies.N_PREDICT)
        saves.append(_save(srv, "b.bin"))
        parts = [_draft_count(folder / f"{x}.bin.draft") for x in "ab"]  # None without 0005: no draft part
        tamper(folder)
        other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
        restore = _restore(srv, "a.bin")
        prompt, ref_prompt, first = (a, SHORT, ra) if continues == "A" else (b, b, rb)
        last = _continue(srv, prompt + (first.tokens or []))
        facts = server_facts(srv)
    ref = _reference(ctx, name, ref_prompt, first.tokens or [])
    saved = [s.body.get("n_saved") if s.ok and isinstance(s.body, dict) else None for s in saves]
    return _Tampered(a, b, ra, rb, all(s.ok for s in saves), saved, parts, other, restore, last, ref, facts)


def _judged_restore(ctx, name: str, t: _Tampered, *, holds: bool, **details) -> Result:
    """The judgement of a tampered restore: exact, or refused with the slot left empty (_EXACT_OR_REFUSED)."""
    cache_n = t.last.timings.get("cache_n")
    seen = Seen(
        [t.ra, t.rb, t.other, t.last],
        same_tokens=t.last.ok and t.last.tokens == t.ref,
        cached=bool(cache_n),
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
    srv, folder = _session(ctx, "restore_damaged_draft_part")
    part = folder / "a.bin.draft"
    outcomes = []
    with srv:
        a = srv.tokenize(LONG)
        first = srv.completion(a, n_predict=bodies.N_PREDICT)
        saved = _save(srv, "a.bin")
        responses = [first]
        original = part.read_bytes() if part.exists() else b""
        for what, data in _truncations(original) if original else [("no draft part", b"")]:
            other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
            if original:
                part.write_bytes(data)
            restore = _restore(srv, "a.bin")
            last = _continue(srv, a + (first.tokens or []))
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
    ref = _reference(ctx, "restore_damaged_draft_part", LONG, first.tokens or [])
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
        same_tokens=all(o["tokens"] == ref for o in outcomes),
        cached=all(o["cache_n"] for o in outcomes),
        restore_status=restores.pop() if len(restores) == 1 else None,
        empty_after_restore=not any(o["cache_n"] for o in outcomes),
        holds=saved.ok and facts["server_alive"] and named,
    )
    return judged(ctx.expect("restore_damaged_draft_part"), seen, damages=outcomes, **facts)


class _BlockedSave(NamedTuple):
    prompt: list[int]  # LONG's tokens
    first: Response  # LONG answered
    saved: Response  # the first save, which succeeds
    before: dict[str, bytes]  # the slot folder's files after it
    more: Response  # the conversation continued
    blocked: Response  # the save of the continuation, with the blocker in place
    after: dict[str, bytes]  # the slot folder's files after that save, the blocker gone
    other: Response  # something else run on the slot
    restore: Response  # the restore of the file the first save wrote
    last: Response  # the conversation continued from it
    left: list[str]  # the slot folder's names at the end
    facts: dict
    ref: list[int] | None  # what the target alone continues the conversation with


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


class _Blocker(NamedTuple):
    """What makes the second save fail, put in place after the first save and taken away after it."""

    block: Callable[[object, Path], None]
    unblock: Callable[[object, Path], None]
    short_writes: bool = False  # the server must survive a failed write (see ServerProcess.short_writes)


def _directory_at(name: str) -> _Blocker:
    """A directory where the save writes one part (a temporary name): it cannot even open the part."""
    return _Blocker(lambda srv, folder: (folder / name).mkdir(), lambda srv, folder: (folder / name).rmdir())


def _file_size_limit(cut: str) -> _Blocker:
    """A file-size limit on the server that cuts one part's write short (``cut``: "draft" or "target"),
    measured by saving the same state under another name first: half the draft part's size, or between
    the draft part's size and the target part's, so that the draft part is written whole and the target
    part is not. The write fails partway (EFBIG: the server runs with SIGXFSZ ignored), leaving a
    half-written temporary file for the save to remove. Without a draft part (no 0005), half the target
    part's size either way."""
    before: list[int] = []  # the soft limit to put back

    def block(srv, folder: Path) -> None:
        probe = _save(srv, "probe.bin")
        target, draft_part = folder / "probe.bin", folder / "probe.bin.draft"
        if not probe.ok:
            raise ValueError(f"the probe save failed: {probe.describe()}")
        full, draft = target.stat().st_size, draft_part.stat().st_size if draft_part.is_file() else 0
        limit = full // 2 if not draft else draft // 2 if cut == "draft" else (draft + full) // 2
        if cut == "target" and draft and not draft < limit:
            raise ValueError(f"{draft_part}: not below the size of the target part {target}")
        target.unlink()
        draft_part.unlink(missing_ok=True)
        soft, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE)
        before.append(soft)
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (limit, hard))  # the soft limit only

    def unblock(srv, folder: Path) -> None:
        _, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (before.pop(), hard))

    return _Blocker(block, unblock, short_writes=True)


def _save_blocked(
    ctx, name: str, filename: str, blocker: _Blocker, then: Callable[[object, Path], None] = lambda srv, folder: None
) -> _BlockedSave:
    """The skeleton of a save that cannot write one part: save LONG's conversation as filename, continue it,
    save it again while ``blocker`` stands in the way of one part; ``then``, run something else, restore the
    file and continue the conversation, beside what the target alone continues it with."""
    srv, folder = _session(ctx, name, short_writes=blocker.short_writes)
    with srv:
        a = srv.tokenize(LONG)
        first = srv.completion(a, n_predict=bodies.N_PREDICT)
        saved = _save(srv, filename)
        before = _files(folder)
        more = srv.completion(
            a + (first.tokens or []) + srv.tokenize(MORE, add_special=False), n_predict=bodies.N_PREDICT
        )
        blocker.block(srv, folder)
        blocked = _save(srv, filename)
        blocker.unblock(srv, folder)
        after = _files(folder)
        then(srv, folder)
        other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
        restore = _restore(srv, filename)
        last = _continue(srv, a + (first.tokens or []))
        left = sorted(p.name for p in folder.iterdir())
        facts = server_facts(srv)
    ref = _reference(ctx, name, LONG, first.tokens or [])
    return _BlockedSave(a, first, saved, before, more, blocked, after, other, restore, last, left, facts, ref)


def _fresh_save(directory: str) -> tuple[Callable[[object, Path], None], list[Response]]:
    """A ``then`` for _save_blocked: a save under the fresh name ``fresh.bin`` while a directory stands at
    ``directory`` (one of its parts' own names), and the list its answer goes into."""
    answers: list[Response] = []

    def then(srv, folder: Path) -> None:
        (folder / directory).mkdir()
        answers.append(_save(srv, "fresh.bin"))
        (folder / directory).rmdir()

    return then, answers


def _judged_blocked(ctx, name: str, r: _BlockedSave, *, refused_well: bool, accepted: bool, **details) -> Result:
    """With 0005 (the server writes a draft part) the blocked save must be refused well and the first save
    restore, else ``accepted`` must hold (what the check asks of a server without 0005); the continuation
    is exact either way."""
    writes_draft = bool(ctx.variant and ctx.variant.saves_draft)  # 0005: the server writes a draft part
    cache_n = r.last.timings.get("cache_n")
    seen = Seen(
        [r.first, r.more, r.other, r.last],
        same_tokens=r.last.ok and r.last.tokens == r.ref,
        cached=bool(cache_n),
        holds=r.saved.ok and (r.restore.ok and refused_well if writes_draft else accepted),
    )
    return judged(
        ctx.expect(name),
        seen,
        blocked_save=[r.blocked.status, r.blocked.error_message or None],
        **details,
        files_left=r.left,
        cache_n_after_restore=cache_n,
        **r.facts,
    )


@check(
    "save_draft_part_unwritable",
    # without 0005 the second save succeeds and the file holds the longer state, which the continuation
    # does not extend (a hybrid target cannot trim back): exact, but not served from the slot
    fix=Expect(200, "every", same_tokens=True),
    slots=Expect(200, "every", same_tokens=True, cached=True),
)
def save_draft_part_unwritable(ctx) -> Result:
    """A save whose draft part cannot be written (a directory stands at ``<file>.draft.tmp``) fails with an
    error that names the draft part, leaves the previous pair as it was and restorable, and leaves no
    temporary file; a directory at ``<file>.draft`` itself fails the same way on a fresh name. Without
    0005 the server writes no draft part, and both saves succeed."""
    fresh_save, fresh = _fresh_save("fresh.bin.draft")
    r = _save_blocked(ctx, "save_draft_part_unwritable", "e.bin", _directory_at("e.bin.draft.tmp"), fresh_save)
    (fresh_r,) = fresh
    refused_well = (
        not r.blocked.ok
        # the part it could not write, by its temporary name (not a later step's failure: a save that went
        # on past the failed write fails at the draft part's rename instead)
        and "draft's part of the slot (" in r.blocked.error_message
        and "e.bin.draft.tmp" in r.blocked.error_message
        and r.after == r.before  # the previous pair, byte for byte
        and not fresh_r.ok
        and "draft" in fresh_r.error_message
        and "fresh.bin" not in r.left
        and not any(n.endswith(".tmp") for n in r.left)
    )
    return _judged_blocked(
        ctx,
        "save_draft_part_unwritable",
        r,
        refused_well=refused_well,
        accepted=r.restore.ok and r.blocked.ok and fresh_r.ok,
        fresh_save=[fresh_r.status, fresh_r.error_message or None],
    )


@check(
    "save_target_part_unwritable",
    # without 0005 the server writes the file itself, not a temporary one, and the save succeeds (see
    # save_draft_part_unwritable for what the continuation then finds)
    fix=Expect(200, "every", same_tokens=True),
    slots=Expect(200, "every", same_tokens=True, cached=True),
)
def save_target_part_unwritable(ctx) -> Result:
    """A save whose target part cannot be written (a directory stands at ``<file>.tmp``) fails with an
    error that names the target part, not the draft's, leaves the previous pair as it was and
    restorable, and leaves no temporary file; a directory at ``<file>`` itself, on a fresh name, fails
    the target part's rename, which names it and removes the written temporary target part. Without 0005
    the server writes no temporary file, and the save succeeds."""
    fresh_save, fresh = _fresh_save("fresh.bin")
    r = _save_blocked(ctx, "save_target_part_unwritable", "t.bin", _directory_at("t.bin.tmp"), fresh_save)
    (fresh_r,) = fresh
    refused_well = (
        not r.blocked.ok
        and "Unable to save slot" in r.blocked.error_message
        and "draft" not in r.blocked.error_message  # the part that failed is named, not the other one
        and r.after == r.before  # the previous pair, byte for byte
        and not fresh_r.ok
        and "cannot rename the target's part" in fresh_r.error_message
        and not any(n.endswith(".tmp") for n in r.left)
    )
    return _judged_blocked(
        ctx,
        "save_target_part_unwritable",
        r,
        refused_well=refused_well,
        accepted=r.restore.ok and r.blocked.ok,
        fresh_save=[fresh_r.status, fresh_r.error_message or None],
    )


@check(
    "save_draft_part_short_write",
    # without 0005 there is no draft part: the limit cuts the file itself short (see the target's check)
    fix=Expect(200, "every", same_tokens=True),
    slots=Expect(200, "every", same_tokens=True, cached=True),
)
def save_draft_part_short_write(ctx) -> Result:
    """A save whose draft part's write fails partway (a file-size limit on the server at half its size)
    fails naming the draft part, leaves the previous pair as it was and restorable, and removes the
    half-written temporary draft part (only a failed write that created its file can leave one)."""
    return _short_write(ctx, "save_draft_part_short_write", "d.bin", "draft", "draft's part of the slot (")


@check(
    "save_small_draft_part_short_write",
    fix=Expect(200, "every"),  # without 0005: no draft part, the file itself cut short; the server goes on
    slots=Expect(200, "every"),
)
def save_small_draft_part_short_write(ctx) -> Result:
    """A draft part under 1 KiB (a conversation of two tokens) whose write fails: libstdc++ keeps so small
    a part in the stream's buffer until the stream is closed, so only the close's flush can fail, and the
    save must still refuse it naming the draft part (without the close, the flush fails unseen after the
    check, and the save fails later on the target part). A file-size
    limit at half the draft part's size, measured by a probe save of the same state."""
    name = "save_small_draft_part_short_write"
    srv, folder = _session(ctx, name, short_writes=True)
    blocker = _file_size_limit("draft")
    with srv:
        first = srv.completion(srv.tokenize(OTHER)[:2], n_predict=1)
        blocker.block(srv, folder)
        blocked = _save(srv, "s.bin")
        blocker.unblock(srv, folder)
        left = sorted(p.name for p in folder.iterdir())
        after = srv.completion(srv.tokenize(OTHER)[:2], n_predict=1)
        facts = server_facts(srv)
    writes_draft = bool(ctx.variant and ctx.variant.saves_draft)
    refused_well = (
        not blocked.ok and "draft's part of the slot (" in blocked.error_message and not any(".tmp" in n for n in left)
    )
    seen = Seen([first, after], holds=facts["server_alive"] and (refused_well if writes_draft else True))
    return judged(
        ctx.expect(name), seen, blocked_save=[blocked.status, blocked.error_message or None], files_left=left, **facts
    )


@check(
    "save_target_part_short_write",
    # without 0005 the server writes the file itself: the limit cuts it short, the save fails, and the
    # first save's file is gone (a half-written one in its place); the continuation is exact all the same
    fix=Expect(200, "every", same_tokens=True),
    slots=Expect(200, "every", same_tokens=True, cached=True),
)
def save_target_part_short_write(ctx) -> Result:
    """A save whose target part's write fails partway (a file-size limit on the server: the draft part fits,
    the target part does not) fails, leaves the previous pair as it was and restorable, and removes the
    half-written temporary target part (the draft part's twin of save_draft_part_short_write). Without 0005
    b11434 writes the file in place: the failed save destroys the previous one, and its restore fails."""
    return _short_write(ctx, "save_target_part_short_write", "w.bin", "target", "Unable to save slot")


def _short_write(ctx, name: str, filename: str, cut: str, message: str) -> Result:
    """The two short-write checks: with 0005, the save refused with ``message`` and the previous pair kept
    and restored; without it, only an exact continuation and a live server."""
    r = _save_blocked(ctx, name, filename, _file_size_limit(cut))
    refused_well = (
        not r.blocked.ok
        and message in r.blocked.error_message
        and r.after == r.before  # the previous pair, byte for byte
        and not any(n.endswith(".tmp") for n in r.left)
    )
    return _judged_blocked(
        ctx,
        name,
        r,
        refused_well=refused_well,
        accepted=r.facts["server_alive"],  # without 0005 nothing is promised of the file, only a live server
        restore=[r.restore.status, r.restore.error_message or None],
    )


@check(
    "save_killed",
    baseline=Expect(200, "every"),
    fix=Expect(200, "every", same_tokens=True),
)
def save_killed(ctx, rounds: int = 3) -> Result:
    """The server killed (SIGKILL) while it saves a slot again and again, each save of a longer conversation;
    a new server on the same slot folder restores the file and continues. Each restore must either give an
    exact continuation or fail cleanly (then the slot is empty): never a mix of parts served."""
    save_dir = ctx.work_dir / "save_killed-slots"
    shutil.rmtree(save_dir, ignore_errors=True)
    save_dir.mkdir(parents=True)
    rng = random.Random(7)
    outcomes, responses = [], []
    for k in range(rounds):
        with ctx.server(f"save_killed_{k}", n_parallel=1, slot_save_path=save_dir, cache_ram_mib=0) as srv:
            prompt = srv.tokenize(LONG)
            stop = threading.Event()

            def saves(srv=srv, prompt=prompt, stop=stop):
                grown = list(prompt)
                while not stop.is_set():
                    r = srv.completion(grown, n_predict=2)
                    if not r.ok:
                        return
                    grown += r.tokens or []
                    if not _save(srv, "k.bin").ok:
                        return

            worker = threading.Thread(target=saves, daemon=True)
            worker.start()
            time.sleep(0.3 + rng.random() * 0.7)
            srv.proc.kill()  # SIGKILL: no handler runs, a write in progress stays as it is
            stop.set()
            worker.join(30)
        if not (save_dir / "k.bin").exists():
            continue
        with ctx.server(f"save_killed_{k}_restart", n_parallel=1, slot_save_path=save_dir, cache_ram_mib=0) as srv:
            restore = _restore(srv, "k.bin")
            # the saved conversation's first part and MORE: a restored slot serves its common prefix
            last = srv.completion(prompt + srv.tokenize(MORE, add_special=False), n_predict=bodies.N_PREDICT)
            alive = srv.alive
        with ctx.server(f"save_killed_{k}_no_draft", draft=False) as ref_srv:
            ref = ref_srv.completion(prompt + ref_srv.tokenize(MORE, add_special=False), n_predict=bodies.N_PREDICT)
        responses.append(last)
        outcomes.append(
            {
                "restore": restore.status,
                "restore_error": None if restore.ok else restore.error_message,
                "cache_n": last.timings.get("cache_n"),
                "exact": last.ok and ref.ok and last.tokens == ref.tokens,
                "server_alive": alive,
                "left": sorted(p.name for p in save_dir.iterdir()),
            }
        )
    clean = all(o["restore"] == 200 or not o["cache_n"] for o in outcomes)
    seen = Seen(
        responses,
        same_tokens=all(o["exact"] for o in outcomes),
        holds=bool(outcomes) and clean and all(o["server_alive"] for o in outcomes),
    )
    return judged(ctx.expect("save_killed"), seen, rounds=outcomes)


@check(
    "restore_clears_without_draft_part",
    fix=Expect(200, "every", same_tokens=True),
    slots=Expect(200, "every", same_tokens=True, same_drafts=True),
)
def restore_clears_without_draft_part(ctx) -> Result:
    """0005's promise: a slot file without a draft part clears the draft's sequence. Conversation A is saved,
    its draft part removed, B runs on the slot, A is restored and continued: with 0005 its drafts must equal
    those of the same restore on a fresh server, where the draft had nothing to keep. Without 0005 the
    draft keeps B's rows (not judged: that is restore_drafts' finding)."""
    runs = {}
    for label, between in (("after_b", True), ("fresh", False)):
        srv, folder = _session(ctx, f"restore_clears_{label}", verbosity=DEBUG_VERBOSITY)
        with srv:
            a = srv.tokenize(SHORT)
            first = srv.completion(a, n_predict=bodies.N_PREDICT)
            saved = _save(srv, "a.bin")
            (folder / "a.bin.draft").unlink(missing_ok=True)
            if between:
                srv.completion(srv.tokenize(LONG), n_predict=bodies.N_PREDICT)
            else:
                srv.post("/slots/0?action=erase", {})  # nothing of A left on the slot, draft included
            restore = _restore(srv, "a.bin")
            since = srv.log_path.stat().st_size
            last = _continue(srv, a + (first.tokens or []))
            facts = server_facts(srv)
        rounds = _rounds(ctx, srv.log_path, since, last)
        runs[label] = {"first": first, "saved": saved, "restore": restore, "last": last, "rounds": rounds, **facts}
    after, fresh = runs["after_b"], runs["fresh"]
    readable = after["rounds"] is not None
    same = readable and bool(after["rounds"]) and after["rounds"] == fresh["rounds"]
    seen = Seen(
        [after["first"], after["restore"], after["last"]],
        same_tokens=after["last"].ok and fresh["last"].ok and after["last"].tokens == fresh["last"].tokens,
        same_drafts=same if readable else ctx.expect("restore_clears_without_draft_part").same_drafts,
        holds=after["saved"].ok and fresh["restore"].ok,
    )
    return judged(
        ctx.expect("restore_clears_without_draft_part"),
        seen,
        drafted=after["rounds"],
        drafted_fresh=fresh["rounds"],
        server_alive=after["server_alive"],
        log=after["log"],
    )


def _rounds(ctx, log: Path, since: int, last) -> list[list[int]] | None:
    if getattr(ctx.models, "drafter", "dflash") in LOGS_NO_DRAFTS:
        return None
    stats = last.draft_stats or {}
    return read_drafted_rounds(log, since=since, drafted=stats.get("draft_n"), seq=0)


@check("save_without_draft_removes_stale_part", fix=Expect(200, "every"))
def save_without_draft_removes_stale_part(ctx) -> Result:
    """0005's promise: a server without a draft that saves over a slot file removes the draft part an
    earlier save left under that name, so a restore never pairs it with the new target part."""
    srv, folder = _session(ctx, "stale_part_with_draft")
    with srv:
        first = srv.completion(srv.tokenize(SHORT), n_predict=bodies.N_PREDICT)
        with_draft = _save(srv, "s.bin")
    had_part = (folder / "s.bin.draft").exists()
    srv = ctx.server("stale_part_without_draft", draft=False, n_parallel=1, slot_save_path=folder, cache_ram_mib=0)
    with srv:
        second = srv.completion(srv.tokenize(LONG), n_predict=bodies.N_PREDICT)
        without = _save(srv, "s.bin")
        facts = server_facts(srv)
    left = (folder / "s.bin.draft").exists()
    writes_draft = bool(ctx.variant and ctx.variant.saves_draft)
    seen = Seen([first, with_draft, second, without], holds=(had_part and not left) if writes_draft else not left)
    return judged(
        ctx.expect("save_without_draft_removes_stale_part"),
        seen,
        draft_part_after_the_draft_save=had_part,
        draft_part_after_the_plain_save=left,
        **facts,
    )
