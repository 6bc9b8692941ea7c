"""A slot that goes idle, saved to the RAM prompt cache with its draft and brought back from there.

llama-server (b11434, ``--cache-idle-slots``, on by default) saves every idle slot to the prompt cache when
a task starts on another slot, and with a unified KV cache clears it to make room: the slot's target and
draft state go into one cache entry (``server_slot::prompt_save``, which 0007 gives the drafter too, so
that the entry carries the drafter's own state). A request that later finds that entry loads both back.
The check is upstream's ``test_kv_keep_only_active.py`` with an image and a draft: conversation A with an
image on slot 0, another request on slot 1 (slot 0 saved and cleared), then A continued on whatever slot
the server picks, which it fills from the cache. Every round of the continuation is judged as in
:mod:`.definition`, against a fresh server given A's history as one request.

The save is seen by b11434's own test tags, at debug level, as upstream's test sees it: the feature's
``__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__`` at start-up, and ``__TEST_TAG_CACHE_IDLE_SLOT__`` when a save
succeeded, just before the cache trims itself to its limits (``server_prompt_cache::update``). It must be
in the part of the log written while B ran and not in A's part: A's start finds slot 1 idle but empty, and
its save fails. The continuation must find A's entry (``found better prompt``). The check is blind without
these.
"""

from __future__ import annotations

from .. import bodies
from ..drafts import DEBUG_VERBOSITY, PROMPT_CACHE_FOUND, request_logs, rounds_with_history
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts
from .definition import BEFORE, TAIL, ImagePrompt, NotComparable, Turn, _complete, _same_drafts, _tokens, judge_rounds

IDLE_SLOT_SAVED = "__TEST_TAG_CACHE_IDLE_SLOT__"
IDLES_SLOTS_ENABLED = "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__"  # logged at start-up when the feature is on
OTHER_PROMPT = "The quick brown fox"  # shares no prefix with A: the continuation cannot pick slot 1 by it


@check(
    "idle_slot_cache_drafts",
    baseline=Expect(500, "any"),
    # without 0007 the reference is not the variant's semantics: the rounds are measured, not judged
    twin=Expect(200, "every", cached=True),
    definition=Expect(200, "every", cached=True, same_drafts=True),
)
def idle_slot_cache_drafts(ctx) -> Result:
    """Two slots, unified KV: A with an image on slot 0, another prompt on slot 1 (slot 0 saved to the prompt
    cache and cleared), A continued: it comes back from the cache, and every round drafts as a fresh server's."""
    name = "idle_slot_cache_drafts"
    e = ctx.expect(name)
    try:
        with ctx.server(
            name,
            verbosity=DEBUG_VERBOSITY,
            n_parallel=2,
            kv_unified=True,
            cache_ram_mib=64,
            extra_args=("--cache-idle-slots",),  # b11434's default, said so that a change of it cannot blind this
        ) as srv:
            a = ImagePrompt(BEFORE, ctx.image(0), tuple(_tokens(srv, TAIL)))
            ra = _complete(srv, a, id_slot=0)
            before_b = len(srv.log_path.read_text(errors="replace"))
            rb = srv.completion(OTHER_PROMPT, n_predict=bodies.N_PREDICT, id_slot=1)
            before_c = len(srv.log_path.read_text(errors="replace"))
            c = a.then((ra.tokens or []) + _tokens(srv, bodies.RESTORE_MORE))
            rc = _complete(srv, c)
            facts = server_facts(srv)
    except NotComparable as err:
        return Result(None, False, e.describe(), {"error": str(err)})
    log = srv.log_path.read_text(errors="replace")
    # A's start tries to save slot 1, which is empty: no tag; B's start saves slot 0, which holds A: the tag
    saves = {"a": IDLE_SLOT_SAVED in log[:before_b], "b": IDLE_SLOT_SAVED in log[before_b:before_c]}
    saved = IDLES_SLOTS_ENABLED in log and saves == {"a": False, "b": True}
    loaded = PROMPT_CACHE_FOUND in log[before_c:]  # C found A's entry in the cache
    pieces = request_logs(log)  # A's, B's and C's, in order
    slot = rc.body.get("id_slot", 0) if isinstance(rc.body, dict) else 0  # the slot the server gave C
    turn = Turn(c, rc, rounds_with_history(pieces[2], seq=slot) if len(pieces) > 2 else [])
    verdict = judge_rounds(ctx, name, [turn]) if ra.ok and rc.ok else None
    cache_n = rc.timings.get("cache_n")
    seen = Seen(
        [ra, rb, rc],
        cached=bool(cache_n),
        same_drafts=_same_drafts(ctx, e, verdict),
        # slot 0 saved when B started and only then, and loaded back for C (A failed on baseline: nothing to save)
        holds=not ra.ok or (saved and loaded and (verdict is None or verdict["comparable"])),
    )
    return judged(
        e,
        seen,
        idle_slot_saved=saved,
        saved_while=saves,
        loaded_from_cache=loaded,
        cache_n_after_load=cache_n,
        continued_on_slot=slot,
        definition=verdict,
        draft=[r.draft_stats for r in (ra, rb, rc)],
        **facts,
    )
