"""Faults of a save, through the real server: a part that cannot be written, a write cut short, the
server killed while it saves; and what 0005 promises of a slot file without a draft part. Each save that
fails must leave the previous pair as it was and restorable, and no temporary file (:mod:`.faults` says
what 0005 writes, and what a server without it does).
"""

from __future__ import annotations

import random
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .. import bodies
from ..client import Response, fresh_slot_folder, slot_server, without_draft
from ..drafts import DEBUG_VERBOSITY, LOGS_NO_DRAFTS, read_drafted_rounds
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts
from .faults import LONG, OTHER, SHORT, continued, exact_continuation, no_draft_tokens

# a blocked save: with 0005 the previous pair is restored and serves the continuation; without it the
# continuation is exact, served from the slot or not (each check says what b11434 does with the file)
_KEPT_AND_RESTORED = dict(
    twin=Expect(200, "every", same_tokens=True),
    saving_draft=Expect(200, "every", same_tokens=True, cached=True),
)


def _writes_draft(ctx) -> bool:
    """Whether the variant's server writes a draft part with a slot (0005)."""
    return bool(ctx.variant and ctx.variant.saves_draft)


class _BlockedSave(NamedTuple):
    first: Response  # LONG answered
    saved: Response  # the first save, which succeeds
    before: dict[str, bytes]  # the slot folder's files after it
    more: Response  # the conversation continued
    blocked: Response  # the save of the continuation, with the blocker in place
    after: dict[str, bytes]  # the slot folder's files after that save, the blocker gone
    fresh: Response | None  # a save under a fresh name with one of its parts' names taken (fresh_in_the_way)
    other: Response  # something else run on the slot
    restore: Response  # the restore of the file the first save wrote
    last: Response  # the conversation continued from it
    left: list[str]  # the slot folder's names at the end
    facts: dict
    no_draft: list[int] | None  # what the target alone continues the conversation with


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
        probe = srv.slot_save("probe.bin")
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
    ctx, name: str, filename: str, blocker: _Blocker, *, fresh_in_the_way: str | None = None
) -> _BlockedSave:
    """The skeleton of a save that cannot write one part: save LONG's conversation as filename, continue it,
    save it again while ``blocker`` stands in the way of one part; with ``fresh_in_the_way``, save under
    the fresh name ``fresh.bin`` while a directory stands at that name (one of its parts' own); then run
    something else, restore the file and continue the conversation, beside the no-draft answer."""
    with slot_server(ctx, name, short_writes=blocker.short_writes) as srv:
        folder = srv.options.slot_save_path
        a = srv.tokenize(LONG)
        first = srv.completion(a, n_predict=bodies.N_PREDICT)
        saved = srv.slot_save(filename)
        before = _files(folder)
        more = continued(srv, a + (first.tokens or []))
        blocker.block(srv, folder)
        blocked = srv.slot_save(filename)
        blocker.unblock(srv, folder)
        after = _files(folder)
        fresh = None
        if fresh_in_the_way:
            (folder / fresh_in_the_way).mkdir()
            fresh = srv.slot_save("fresh.bin")
            (folder / fresh_in_the_way).rmdir()
        other = srv.completion(srv.tokenize(OTHER), n_predict=bodies.N_PREDICT)
        restore = srv.slot_restore(filename)
        last = continued(srv, a + (first.tokens or []))
        left = sorted(p.name for p in folder.iterdir())
        facts = server_facts(srv)
    no_draft = no_draft_tokens(ctx, name, a + (first.tokens or []))
    return _BlockedSave(first, saved, before, more, blocked, after, fresh, other, restore, last, left, facts, no_draft)


def _kept_the_pair(r: _BlockedSave, says: str) -> bool:
    """The blocked save refused, saying ``says``, the previous pair kept byte for byte, no temporary file left."""
    return (
        not r.blocked.ok
        and says in r.blocked.error_message
        and r.after == r.before
        and not any(n.endswith(".tmp") for n in r.left)
    )


def _answer(r: Response) -> list:
    """An answer as a report gives it: its status and its error (None where it has none)."""
    return [r.status, r.error_message or None]


def _fresh_refused(r: _BlockedSave, says: str) -> bool:
    return r.fresh is not None and not r.fresh.ok and says in r.fresh.error_message


def _judged_blocked(ctx, name: str, r: _BlockedSave, *, refused_well: bool, accepted: bool, **details) -> Result:
    """With 0005 (the server writes a draft part) the blocked save must be refused well and the first save
    restore, else ``accepted`` must hold (what the check asks of a server without 0005); the continuation
    is exact either way."""
    seen = exact_continuation(
        r.last,
        r.no_draft,
        responses=[r.first, r.more, r.other, r.last],
        holds=r.saved.ok and (r.restore.ok and refused_well if _writes_draft(ctx) else accepted),
    )
    if r.fresh is not None:
        details["fresh_save"] = _answer(r.fresh)
    return judged(
        ctx.expect(name),
        seen,
        blocked_save=_answer(r.blocked),
        **details,
        files_left=r.left,
        cache_n_after_restore=r.last.timings.get("cache_n"),
        **r.facts,
    )


@check(
    "save_draft_part_unwritable",
    # without 0005 the second save succeeds and the file holds the longer state, which the continuation
    # does not extend (a hybrid target cannot trim back): exact, but not served from the slot
    **_KEPT_AND_RESTORED,
)
def save_draft_part_unwritable(ctx) -> Result:
    """A save whose draft part cannot be written (a directory stands at ``<file>.draft.tmp``) fails with an
    error that names the draft part, leaves the previous pair as it was and restorable, and leaves no
    temporary file; a directory at ``<file>.draft`` itself fails the same way on a fresh name. Without
    0005 the server writes no draft part, and both saves succeed."""
    name = "save_draft_part_unwritable"
    r = _save_blocked(ctx, name, "e.bin", _directory_at("e.bin.draft.tmp"), fresh_in_the_way="fresh.bin.draft")
    refused_well = (
        # the part it could not write, by its temporary name (not a later step's failure: a save that went
        # on past the failed write fails at the draft part's rename instead)
        _kept_the_pair(r, "draft's part of the slot (")
        and "e.bin.draft.tmp" in r.blocked.error_message
        and _fresh_refused(r, "draft")
        and "fresh.bin" not in r.left
    )
    accepted = r.restore.ok and r.blocked.ok and r.fresh is not None and r.fresh.ok
    return _judged_blocked(ctx, name, r, refused_well=refused_well, accepted=accepted)


@check(
    "save_target_part_unwritable",
    # without 0005 the server writes the file itself, not a temporary one, and the save succeeds (see
    # save_draft_part_unwritable for what the continuation then finds)
    **_KEPT_AND_RESTORED,
)
def save_target_part_unwritable(ctx) -> Result:
    """A save whose target part cannot be written (a directory stands at ``<file>.tmp``) fails with an
    error that names the target part, not the draft's, leaves the previous pair as it was and
    restorable, and leaves no temporary file; a directory at ``<file>`` itself, on a fresh name, fails
    the target part's rename, which names it and removes the written temporary target part. Without 0005
    the server writes no temporary file, and the save succeeds."""
    name = "save_target_part_unwritable"
    r = _save_blocked(ctx, name, "t.bin", _directory_at("t.bin.tmp"), fresh_in_the_way="fresh.bin")
    refused_well = (
        _kept_the_pair(r, "Unable to save slot")
        and "draft" not in r.blocked.error_message  # the part that failed is named, not the other one
        and _fresh_refused(r, "cannot rename the target's part")
    )
    return _judged_blocked(ctx, name, r, refused_well=refused_well, accepted=r.restore.ok and r.blocked.ok)


@check(
    "save_draft_part_short_write",
    # without 0005 there is no draft part: the limit cuts the file itself short (see the target's check)
    **_KEPT_AND_RESTORED,
)
def save_draft_part_short_write(ctx) -> Result:
    """A save whose draft part's write fails partway (a file-size limit on the server at half its size)
    fails naming the draft part, leaves the previous pair as it was and restorable, and removes the
    half-written temporary draft part (only a failed write that created its file can leave one)."""
    return _short_write(ctx, "save_draft_part_short_write", "d.bin", "draft", "draft's part of the slot (")


@check(
    "save_small_draft_part_short_write",
    twin=Expect(200, "every"),  # without 0005: no draft part, the file itself cut short; the server goes on
    saving_draft=Expect(200, "every"),
)
def save_small_draft_part_short_write(ctx) -> Result:
    """A draft part under 1 KiB (a conversation of two tokens) whose write fails: libstdc++ keeps so small
    a part in the stream's buffer until the stream is closed, so only the close's flush can fail, and the
    save must still refuse it naming the draft part (without the close, the flush fails unseen after the
    check, and the save fails later on the target part). A file-size
    limit at half the draft part's size, measured by a probe save of the same state."""
    name = "save_small_draft_part_short_write"
    blocker = _file_size_limit("draft")
    with slot_server(ctx, name, short_writes=True) as srv:
        folder = srv.options.slot_save_path
        first = srv.completion(srv.tokenize(OTHER)[:2], n_predict=1)
        blocker.block(srv, folder)
        blocked = srv.slot_save("s.bin")
        blocker.unblock(srv, folder)
        left = sorted(p.name for p in folder.iterdir())
        after = srv.completion(srv.tokenize(OTHER)[:2], n_predict=1)
        facts = server_facts(srv)
    refused_well = (
        not blocked.ok and "draft's part of the slot (" in blocked.error_message and not any(".tmp" in n for n in left)
    )
    seen = Seen([first, after], holds=facts["server_alive"] and (refused_well if _writes_draft(ctx) else True))
    return judged(ctx.expect(name), seen, blocked_save=_answer(blocked), files_left=left, **facts)


@check(
    "save_target_part_short_write",
    # without 0005 the server writes the file itself: the limit cuts it short, the save fails, and the
    # first save's file is gone (a half-written one in its place); the continuation is exact all the same
    **_KEPT_AND_RESTORED,
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
    return _judged_blocked(
        ctx,
        name,
        r,
        refused_well=_kept_the_pair(r, message),
        accepted=r.facts["server_alive"],  # without 0005 nothing is promised of the file, only a live server
        restore=_answer(r.restore),
    )


@check(
    "save_killed",
    baseline=Expect(200, "every"),
    twin=Expect(200, "every", same_tokens=True),
)
def save_killed(ctx, rounds: int = 3) -> Result:
    """The server killed (SIGKILL) while it saves a slot again and again, each save of a longer conversation;
    a new server on the same slot folder restores the file and continues. Each restore must either give an
    exact continuation or fail cleanly (then the slot is empty): never a mix of parts served."""
    folder = fresh_slot_folder(ctx.work_dir / "save_killed-slots")
    rng = random.Random(7)
    outcomes, responses = [], []
    for k in range(rounds):
        with slot_server(ctx, f"save_killed_{k}", folder=folder) as srv:
            prompt = srv.tokenize(LONG)
            _kill_while_saving(srv, prompt, 0.3 + rng.random() * 0.7)
        if not (folder / "k.bin").exists():
            continue
        with slot_server(ctx, f"save_killed_{k}_restart", folder=folder) as srv:
            restore = srv.slot_restore("k.bin")
            # the saved conversation's first part and MORE: a restored slot serves its common prefix
            last = continued(srv, prompt)
            alive = srv.alive
        no_draft = without_draft(ctx, f"save_killed_{k}", lambda plain, prompt=prompt: continued(plain, prompt))
        responses.append(last)
        outcomes.append(
            {
                "restore": restore.status,
                "restore_error": None if restore.ok else restore.error_message,
                "cache_n": last.timings.get("cache_n"),
                "exact": last.same_tokens_as(no_draft),
                "server_alive": alive,
                "left": sorted(p.name for p in folder.iterdir()),
            }
        )
    clean = all(o["restore"] == 200 or not o["cache_n"] for o in outcomes)
    seen = Seen(
        responses,
        same_tokens=all(o["exact"] for o in outcomes),
        holds=bool(outcomes) and clean and all(o["server_alive"] for o in outcomes),
    )
    return judged(ctx.expect("save_killed"), seen, rounds=outcomes)


def _kill_while_saving(srv, prompt: list[int], after_s: float) -> None:
    """The conversation grown and saved as k.bin again and again, until the server is killed (SIGKILL: no
    handler runs, a write in progress stays as it is) after ``after_s``."""
    stop = threading.Event()

    def saves() -> None:
        grown = list(prompt)
        while not stop.is_set():
            r = srv.completion(grown, n_predict=2)
            if not r.ok:
                return
            grown += r.tokens or []
            if not srv.slot_save("k.bin").ok:
                return

    worker = threading.Thread(target=saves, daemon=True)
    worker.start()
    time.sleep(after_s)
    srv.proc.kill()
    stop.set()
    worker.join(30)


@check(
    "restore_clears_without_draft_part",
    twin=Expect(200, "every", same_tokens=True),
    saving_draft=Expect(200, "every", same_tokens=True, same_drafts=True),
)
def restore_clears_without_draft_part(ctx) -> Result:
    """0005's promise: a slot file without a draft part clears the draft's sequence. Conversation A is saved,
    its draft part removed, B runs on the slot, A is restored and continued: with 0005 its drafts must equal
    those of the same restore on a fresh server, where the draft had nothing to keep. Without 0005 the
    draft keeps B's rows (not judged: that is restore_drafts' finding)."""
    runs = {}
    for label, between in (("after_b", True), ("fresh", False)):
        with slot_server(ctx, f"restore_clears_{label}", verbosity=DEBUG_VERBOSITY) as srv:
            a = srv.tokenize(SHORT)
            first = srv.completion(a, n_predict=bodies.N_PREDICT)
            saved = srv.slot_save("a.bin")
            (srv.options.slot_save_path / "a.bin.draft").unlink(missing_ok=True)
            if between:
                srv.completion(srv.tokenize(LONG), n_predict=bodies.N_PREDICT)
            else:
                srv.slot_erase()
            restore = srv.slot_restore("a.bin")
            since = srv.log_path.stat().st_size
            last = continued(srv, a + (first.tokens or []))
            facts = server_facts(srv)
        rounds = _rounds(ctx, srv.log_path, since, last)
        runs[label] = {"first": first, "saved": saved, "restore": restore, "last": last, "rounds": rounds, **facts}
    after, fresh = runs["after_b"], runs["fresh"]
    readable = after["rounds"] is not None
    same = readable and bool(after["rounds"]) and after["rounds"] == fresh["rounds"]
    seen = Seen(
        [after["first"], after["restore"], after["last"]],
        same_tokens=after["last"].same_tokens_as(fresh["last"]),
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


@check("save_without_draft_removes_stale_part", twin=Expect(200, "every"))
def save_without_draft_removes_stale_part(ctx) -> Result:
    """0005's promise: a server without a draft that saves over a slot file removes the draft part an
    earlier save left under that name, so a restore never pairs it with the new target part."""
    with slot_server(ctx, "stale_part") as srv:
        folder = srv.options.slot_save_path
        first = srv.completion(srv.tokenize(SHORT), n_predict=bodies.N_PREDICT)
        with_draft = srv.slot_save("s.bin")
    had_part = (folder / "s.bin.draft").exists()
    with slot_server(ctx, "stale_part", draft=False, folder=folder) as srv:
        second = srv.completion(srv.tokenize(LONG), n_predict=bodies.N_PREDICT)
        without = srv.slot_save("s.bin")
        facts = server_facts(srv)
    left = (folder / "s.bin.draft").exists()
    seen = Seen([first, with_draft, second, without], holds=(had_part and not left) if _writes_draft(ctx) else not left)
    return judged(
        ctx.expect("save_without_draft_removes_stale_part"),
        seen,
        draft_part_after_the_draft_save=had_part,
        draft_part_after_the_plain_save=left,
        **facts,
    )
