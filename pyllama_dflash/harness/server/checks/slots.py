"""Checks of POST /slots/N?action=save|restore: what a restored slot's draft holds and drafts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from .. import bodies
from ..client import Response, slot_server
from ..draft_part import as_version_1
from ..drafts import DEBUG_VERBOSITY, LOGS_NO_DRAFTS, NEW_PROMPT, read_drafted_rounds
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts, stats

# -- slot save and restore -----------------------------------------------------------------

# what a check does to the slot file's draft part before the restore
Damage = Literal["none", "remove", "corrupt", "version_1"]
# the log line of a restore of a version-1 draft part: it carries no drafter state
NO_DRAFTER_STATE = "carries no drafter state"


def restore_run(
    ctx,
    name: str,
    *,
    first: str = bodies.RESTORE_A,
    between: str = bodies.RESTORE_B,
    more: str = bodies.RESTORE_MORE,
    draft: bool,
    interrupt: bool = True,
    damage: Damage = "none",
    read_drafts: bool = False,
) -> dict:
    """``first``, then (with interrupt) save slot 0, ``between``, restore slot 0; then ``first``
    continued: its tokens, its output and ``more``, so the restored prefix is reused. Without ``draft``
    on the variant's server without the draft (``<name>_no_draft``).

    ``damage`` does that to the slot file's draft part before the restore: ``remove`` it (an
    older file), write garbage over it, or write it again in format ``version_1`` (no drafter
    state). With ``read_drafts`` the server logs its drafts and runs without the RAM prompt cache:
    the restored slot is then the only place the prefix can come back from (the prompt cache keeps
    it when ``between`` takes the slot, and would serve it, draft included, on its own). Returns
    the responses (completion, save, completion, restore, completion), whether the file had a draft
    part, what the draft drafted in the continuation, and whether the log says a restored draft part
    carried no drafter state.
    """
    logged = {"verbosity": DEBUG_VERBOSITY} if read_drafts else {}
    with slot_server(ctx, name, draft=draft, prompt_cache=not read_drafts, **logged) as srv:
        part = srv.options.slot_save_path / "slot.bin.draft"
        a, b, extra = srv.tokenize(first), srv.tokenize(between), srv.tokenize(more, add_special=False)
        responses = [srv.completion(a, n_predict=bodies.N_PREDICT)]
        had_part = None
        if interrupt:
            responses.append(srv.slot_save("slot.bin"))
            had_part = part.exists()
            responses.append(srv.completion(b, n_predict=bodies.N_PREDICT))
            _damage(part, damage)
            responses.append(srv.slot_restore("slot.bin"))
        since = srv.log_path.stat().st_size
        last = srv.completion(a + (responses[0].tokens or []) + extra, n_predict=bodies.N_PREDICT)
        responses.append(last)
        facts = server_facts(srv)
    # read once the server has stopped: its logger writes from a thread of its own, and flushes at exit, so
    # the log's size before the last request may not hold the request before it whole yet; the last request
    # begins at its own new-prompt line
    stats = last.draft_stats or {}
    readable = draft and read_drafts and getattr(ctx.models, "drafter", "dflash") not in LOGS_NO_DRAFTS
    log_bytes = srv.log_path.read_bytes()
    since = max(since, log_bytes.rfind(NEW_PROMPT.encode()))
    rounds = read_drafted_rounds(srv.log_path, since=since, drafted=stats.get("draft_n"), seq=0) if readable else []
    return {
        "responses": responses,
        "draft_part": had_part,
        "rounds": rounds,
        "said_no_drafter_state": NO_DRAFTER_STATE.encode() in log_bytes,
        **facts,
    }


def _damage(part: Path, damage: Damage) -> None:
    """Do ``damage`` to a slot file's draft part (restore_run)."""
    if damage == "remove":
        part.unlink(missing_ok=True)
    elif damage == "corrupt":
        part.write_bytes(b"not a llama.cpp sequence state")
    elif damage == "version_1" and part.exists():
        part.write_bytes(as_version_1(part.read_bytes()))


def _with_and_without_draft(ctx, name: str, **how) -> tuple[dict, Response]:
    """restore_run with the draft, and the last answer of the same run without it (the no-draft answer)."""
    return restore_run(ctx, name, draft=True, **how), restore_run(ctx, name, draft=False, **how)["responses"][-1]


def _judged_run(e: Expect, seen: Seen, run: dict, error_of: tuple[str, Response], **details) -> Result:
    """A restore_run judged, with its server's facts; the one failed request the check reports is
    ``error_of`` (its key and answer)."""
    result = judged(e, seen, errors=False, **details, server_alive=run["server_alive"], log=run["log"])
    key, r = error_of
    if not r.ok:
        result.details[key] = r.error_message
    return result


def _slot_restore(ctx, name: str, *, ahead: bool) -> Result:
    first, between = (bodies.SHORT_TEXT, bodies.LONG_TEXT) if ahead else (bodies.LONG_TEXT, bodies.SHORT_TEXT)
    run, no_draft = _with_and_without_draft(ctx, name, first=first, between=between, more=bodies.SLOT_RESTORE_MORE)
    with_draft = run["responses"]
    last = with_draft[-1]
    same = last.same_tokens_as(no_draft)
    return _judged_run(
        ctx.expect(name),
        Seen(with_draft, same_tokens=same, cached=bool(last.timings.get("cache_n"))),
        run,
        ("error", last),
        draft_vs_target="ahead" if ahead else "behind",
        cache_n_after_restore=last.timings.get("cache_n"),
        same_tokens_as_no_draft=same if last.ok and no_draft.ok else None,
        draft=stats(with_draft[0::2]),  # the three completions
    )


# b11434's POST /slots/N?action=restore restores the *target* only, so the draft keeps the state of
# whatever ran on the slot in between. Restoring a long conversation over a short one leaves the
# draft behind the target (baseline: 500 on the next rows, even with no image; the fix fills the
# hole); restoring a short one over a long one leaves it ahead, which the server's own trim at the
# start of the next prompt (slot.mem.seq_rm) resolves, so baseline passes it too.
@check(
    "slot_restore",
    family=True,
    baseline=Expect(500, "last"),
    twin=Expect(200, "every", same_tokens=True, cached=True),  # cached: the restored prefix
)
def slot_restore(ctx) -> Result:
    """A slot restore that leaves the draft behind the target."""
    return _slot_restore(ctx, "slot_restore", ahead=False)


@check(
    "slot_restore_ahead",
    baseline=Expect(200, "every", same_tokens=True, cached=True),
    twin=Expect(200, "every", same_tokens=True, cached=True),
)
def slot_restore_ahead(ctx) -> Result:
    """A slot restore that leaves the draft ahead of the target."""
    return _slot_restore(ctx, "slot_restore_ahead", ahead=True)


def restore_judged(ctx, name: str, damage: Damage) -> Result:
    """restore_run with and without the draft (and uninterrupted, where the drafts are judged), judged."""
    e = ctx.expect(name)
    run, no_draft = _with_and_without_draft(ctx, name, damage=damage, read_drafts=True)
    responses = run["responses"]
    completions, save, restore, last = responses[0::2], responses[1], responses[3], responses[-1]
    same = last.same_tokens_as(no_draft)
    cache_n = last.timings.get("cache_n")
    details: dict[str, Any] = {}
    same_drafts = None
    if e.same_drafts is not None:
        uninterrupted = restore_run(ctx, name + "_uninterrupted", draft=True, interrupt=False, read_drafts=True)
        same_drafts = run["rounds"] == uninterrupted["rounds"] and bool(run["rounds"])
        details = {"drafted_uninterrupted": uninterrupted["rounds"], "same_drafts": same_drafts}
        if not uninterrupted["rounds"]:
            same_drafts = None  # nothing to compare with: the expectation fails, as it should
    seen = Seen(
        completions,
        same_tokens=same,
        cached=bool(cache_n),
        restore_status=restore.status,
        same_drafts=same_drafts,
        draft_part=run["draft_part"],
        empty_after_restore=not cache_n,
        # a version-1 part restores, and the log says what it lacks
        holds=save.ok and (damage != "version_1" or not run["draft_part"] or run["said_no_drafter_state"]),
    )
    return _judged_run(
        e,
        seen,
        run,
        ("restore_error", restore),
        status=[r.status for r in responses],
        same_tokens_as_no_draft=same,
        cache_n_after_restore=cache_n,
        draft_part=run["draft_part"],
        drafted=run["rounds"],
        draft=stats(completions),
        **details,
    )


# b11434's restore loads the target alone: the continuation's drafts attend to B (a text conversation
# longer than A, so the draft is ahead and the server's trim lines it up). The libcommon patches
# cannot help; with 0005 the slot file carries the draft, and A drafts as if never left.
RESTORE_TARGET_ONLY = Expect(200, "every", same_tokens=True, cached=True, same_drafts=False, draft_part=False)


@check(
    "restore_drafts",
    family=True,
    twin=RESTORE_TARGET_ONLY,
    saving_draft=Expect(200, "every", same_tokens=True, cached=True, same_drafts=True, draft_part=True),
)
def restore_drafts(ctx) -> Result:
    """Save A, run B, restore A, continue A: its drafts against A never interrupted (the debug log)."""
    return restore_judged(ctx, "restore_drafts", "none")


@check(
    "restore_no_draft_part",
    twin=Expect(200, "every", same_tokens=True, cached=True, draft_part=False),
    saving_draft=Expect(200, "every", same_tokens=True, cached=True, draft_part=True),  # then removed
)
def restore_no_draft_part(ctx) -> Result:
    """A slot file whose draft part was removed (an older file) restores; the draft starts empty."""
    return restore_judged(ctx, "restore_no_draft_part", "remove")


@check(
    "restore_corrupt_draft_part",
    twin=Expect(200, "every", same_tokens=True, cached=True),  # the file is ignored
    saving_draft=Expect(200, "every", same_tokens=True, restore=400, empty_after_restore=True, draft_part=True),
)
def restore_corrupt_draft_part(ctx) -> Result:
    """Garbage in the draft part: with 0005 the restore is refused and the slot left empty."""
    return restore_judged(ctx, "restore_corrupt_draft_part", "corrupt")


@check(
    "restore_version_1_draft_part",
    twin=Expect(200, "every", same_tokens=True, cached=True, draft_part=False),  # no draft part to rewrite
    saving_draft=Expect(200, "every", same_tokens=True, cached=True, same_drafts=True, draft_part=True),
)
def restore_version_1_draft_part(ctx) -> Result:
    """A draft part written in format version 1 (no drafter state) still restores, the drafts as A's never
    interrupted (the DFlash family keeps no drafter state), and the log says what the part lacks."""
    return restore_judged(ctx, "restore_version_1_draft_part", "version_1")
