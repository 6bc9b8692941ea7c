"""End-to-end checks through ``llama-server``, one variant at a time, as plain dicts.

:func:`run_server_checks` starts the variant's server once per check (so that a failure
in one cannot leave state behind for the next) and returns ``{check: result}`` where every
result has ``status`` (an HTTP code, or a list of them in request order), ``ok`` (the
variant behaved as expected) and ``expected``, plus details: contents, token ids, draft
statistics (``timings.draft_n`` / ``draft_n_accepted``), the server log path. It is what
``python -m pyllama_dflash.repro --server`` adds under ``"server"``.

Expectations (the table ``EXPECTED``): ``baseline`` must answer an image request on the
draft with HTTP 500 "failed to process speculative batch" (the reproduction); every patched
variant must answer 200, and greedy output with the draft must equal greedy output without it.

The checks:

``chat_image``
    ``/v1/chat/completions`` with a text part, a base64 PNG part and a text part.
``exact_text`` / ``exact_image``
    ``/completion`` (``return_tokens``, temperature 0, fixed ``n_predict``) with and without
    the draft, on the same binary and models: the token ids must be equal. ``exact_image``
    also compares the chat answer of ``chat_image``'s request.
``two_turn``
    An image turn, then a text turn that repeats it plus the reply (the prompt is reused).
``concurrent``
    Four image requests at once on ``--parallel 2``.
``alternating``
    Two image conversations taking turns on one slot with the prompt cache on
    (``--cache-ram``, ``cache_prompt``): each comes back through the prompt cache.
``slot_restore`` / ``slot_restore_ahead``
    The cross-request case: b11434's ``POST /slots/0?action=restore`` restores the *target*
    only, so the draft keeps the state of whatever ran on the slot in between. Restoring a long
    conversation over a short one leaves the draft behind the target (baseline: 500, even
    with no image); restoring a short one over a long one leaves it ahead, which the
    server's own trim at the start of the next prompt (``slot.mem.seq_rm``) resolves.
``restore_drafts``
    Save conversation A, run B on the slot, restore A, continue it; the drafts of the
    continuation (read from the server's debug log, ``drafts.py``) against those of A never
    interrupted, on a second server. Without patch 0003 they differ: the draft attends to B's
    rows (the reproduction). With it the slot file has a draft part and they are equal.
``drafts_vs_twin``
    The drafting-exactness oracle through the server: an image prompt's drafts, read from the
    debug log, against those of baseline's server with the draft's reconverted twin (the same
    tensors with rope.dimension_sections). Needs ``reference`` (baseline's llama-server and the
    twin); without one the check says so and fails.
``restore_no_draft_part`` / ``restore_corrupt_draft_part``
    The same restore from a file whose draft part was removed (an older file): it loads, and
    the draft's sequence is cleared; or replaced by garbage: with 0003 the restore fails, the
    slot is left empty (the next request reuses nothing), and nothing is served from half of it.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import ServerError
from ..llamabuild import saves_draft_with_slot
from ..llamabuild.manifest import Manifest
from ..llamabuild.patchset import BASELINE
from .drafts import DEBUG_VERBOSITY, read_drafted_rounds
from .process import (
    Response,
    ServerModels,
    ServerOptions,
    ServerProcess,
    resolve_binary,
)

__all__ = ["CHECKS", "EXPECTED", "SPEC_BATCH_ERROR", "Expect", "expectation", "run_server_checks"]


PATCHED = "patched"  # every other variant, unknown ones included
SPEC_BATCH_ERROR = "failed to process speculative batch"

SLOTS = "slots"  # a variant whose server saves and restores the draft with a slot (0003)
ZERO_FILL = "zero-fill"  # the seed's fill: it ends the 500s, but its zero rows stay and the drafts drift

CHECKS = (
    "chat_image",
    "exact_text",
    "exact_image",
    "two_turn",
    "concurrent",
    "alternating",
    "slot_restore",
    "slot_restore_ahead",
    "restore_drafts",
    "restore_no_draft_part",
    "restore_corrupt_draft_part",
    "drafts_vs_twin",
)


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
        return text


_RESTORE_TARGET_ONLY = Expect(200, "every", same_tokens=True, cached=True, same_drafts=False, draft_part=False)

# What each check must answer (the test suite asserts it through each result's "ok"). Only the
# unpatched tree is expected to fail; every other variant is judged as patched.
EXPECTED: dict[str, dict[str, Expect]] = {
    # The reproduction: wherever an image meets the draft, the request fails (the server survives).
    # One 500 is enough on the checks that send several requests: what follows the first failure
    # depends on what the server kept of it. Without an image nothing fails, except
    # slot_restore: restoring a long conversation over a short one restores the target alone and
    # leaves the draft behind it, and the unpatched draft rejects the next rows (Y = X + 1).
    # The draft ahead of the target (slot_restore_ahead) is trimmed by the server itself
    # (slot.mem.seq_rm at the start of the next prompt), so baseline passes it too.
    BASELINE: {
        "chat_image": Expect(500, "any"),
        "exact_text": Expect(200, "draft", same_tokens=True),
        "exact_image": Expect(500, "draft"),
        "two_turn": Expect(500, "any"),
        "concurrent": Expect(500, "any"),
        "alternating": Expect(500, "any"),
        "slot_restore": Expect(500, "last"),
        "slot_restore_ahead": Expect(200, "every", same_tokens=True, cached=True),
        # b11434's restore loads the target alone: the continuation's drafts attend to B (a text
        # conversation longer than A, so the draft is ahead and the server's trim lines it up)
        "restore_drafts": _RESTORE_TARGET_ONLY,
        "restore_no_draft_part": Expect(200, "every", same_tokens=True, cached=True, draft_part=False),
        "restore_corrupt_draft_part": Expect(200, "every", same_tokens=True, cached=True),  # the file is ignored
        "drafts_vs_twin": Expect(500, "any"),  # the legacy draft fails where its twin drafts
    },
    # Every request answers 200 with what the target alone would generate, and the prompt cache
    # still finds each conversation again.
    PATCHED: {
        "chat_image": Expect(200, "every", content=True),
        "exact_text": Expect(200, "draft", same_tokens=True),
        "exact_image": Expect(200, "draft", same_tokens=True),  # token ids and the chat answer's text
        "two_turn": Expect(200, "every", cached=True),  # the second turn reuses the first's prompt
        "concurrent": Expect(200, "every"),
        "alternating": Expect(200, "every", cached=True),  # both second turns
        "slot_restore": Expect(200, "every", same_tokens=True, cached=True),  # cached: the restored prefix
        "slot_restore_ahead": Expect(200, "every", same_tokens=True, cached=True),
        # the libcommon patches cannot help: the server restores the target alone
        "restore_drafts": _RESTORE_TARGET_ONLY,
        "restore_no_draft_part": Expect(200, "every", same_tokens=True, cached=True, draft_part=False),
        "restore_corrupt_draft_part": Expect(200, "every", same_tokens=True, cached=True),
        "drafts_vs_twin": Expect(200, "every", same_drafts=True),  # the fix drafts what the twin drafts
    },
}
EXPECTED[ZERO_FILL] = {**EXPECTED[PATCHED], "drafts_vs_twin": Expect(200, "every", same_drafts=False)}
# With 0003 the slot file carries the draft: the restored conversation drafts as if never left. A
# file without a draft part still restores (the draft starts empty); a corrupt one is refused and
# the slot cleared, so the next request starts from nothing, with the same tokens.
EXPECTED[SLOTS] = {
    **EXPECTED[PATCHED],
    "restore_drafts": Expect(200, "every", same_tokens=True, cached=True, same_drafts=True, draft_part=True),
    "restore_no_draft_part": Expect(200, "every", same_tokens=True, cached=True, draft_part=True),  # then removed
    "restore_corrupt_draft_part": Expect(
        200, "every", same_tokens=True, restore=400, empty_after_restore=True, draft_part=True
    ),
}
assert all(tuple(table) == CHECKS for table in EXPECTED.values())


def expectation(variant: str | None, check: str) -> Expect:
    """The row of ``EXPECTED`` for ``variant``: baseline's; the slots one where the variant's server
    saves the draft with a slot (patch 0003); the patched one for any other name."""
    if variant in (BASELINE, ZERO_FILL):
        return EXPECTED[variant][check]
    return EXPECTED[SLOTS if variant and saves_draft_with_slot(variant) else PATCHED][check]


N_PREDICT = 8  # small: the tiny models generate a few tokens per millisecond, real ones do not
PROMPT_TEXT = "Describe this image please"
PROMPT_TAIL = "in a few words"
FOLLOW_UP = "And what colour is it?"
# the tiny target's chat template is ChatML; for a raw /completion prompt we write it out
RAW_IMAGE_PROMPT = "<|im_start|>user\n" + PROMPT_TEXT + "{image}" + PROMPT_TAIL + "<|im_end|>\n<|im_start|>assistant\n"
RAW_TEXT_PROMPT = "<|im_start|>user\n" + PROMPT_TEXT + " " + PROMPT_TAIL + "<|im_end|>\n<|im_start|>assistant\n"
LONG_TEXT = "Tell me a long story about a small robot that learns to paint the sea at night"
SHORT_TEXT = "hi there"


class _Ctx:
    """What every check needs: binary, models, variant, base options, images, where logs go."""

    def __init__(
        self,
        binary: Path,
        models: ServerModels,
        variant: str | None,
        base: ServerOptions,
        work_dir: Path,
        images: list[bytes],
        reference: tuple[Path, ServerModels] | None = None,
    ):
        self.binary, self.models, self.variant, self.base = binary, models, variant, base
        self.work_dir, self.images, self.reference = work_dir, images, reference

    def expect(self, check: str) -> Expect:
        return expectation(self.variant, check)

    def server(self, name: str, **changes: Any) -> ServerProcess:
        log = self.work_dir / f"{name}.log"
        log.unlink(missing_ok=True)
        return ServerProcess(self.binary, self.models, self.base.with_(**changes), log_path=log)

    def image(self, i: int = 0) -> bytes:
        return self.images[i % len(self.images)]


# -- request bodies --------------------------------------------------------------------


def _image_part(image: bytes) -> dict:
    # mtmd decodes by content; the mime type is only for the data URL to be well formed
    mime = "image/jpeg" if image[:2] == b"\xff\xd8" else "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(image).decode()}}


def _image_message(png: bytes, text: str = PROMPT_TEXT) -> dict:
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, _image_part(png), {"type": "text", "text": PROMPT_TAIL}],
    }


def _two_turn(first: dict, reply: str) -> list[dict]:
    return [first, {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]


# -- result helpers --------------------------------------------------------------------


def _draft_stats(responses: Iterable[Response]) -> list[dict | None]:
    return [r.draft_stats for r in responses]


def _has_spec_error(responses: Iterable[Response]) -> bool:
    return any(r.status == 500 and SPEC_BATCH_ERROR in r.error_message for r in responses)


def _meets(
    e: Expect,
    responses: list[Response],
    *,
    without: Response | None = None,
    same: bool = False,
    cached: bool = False,
    content: bool = False,
) -> bool:
    """Whether a check's answers meet ``e``: ``responses`` are its requests with the draft in order,
    ``without`` the no-draft twin of a ``draft`` check's request; the flags say what the check saw."""
    if e.status == 500:
        ok = _has_spec_error(responses[-1:] if e.where == "last" else responses)
    elif e.where == "any":
        ok = any(r.status == e.status for r in responses)
    elif e.where == "last":
        ok = bool(responses) and responses[-1].status == e.status
    else:
        ok = all(r.status == e.status for r in responses)
    if e.where == "draft":
        ok = ok and without is not None and without.ok
    return ok and (same or not e.same_tokens) and (cached or not e.cached) and (content or not e.content)


def _outcome(
    ctx: _Ctx, check: str, responses: list[Response], srv: ServerProcess, *, cached: bool = False, content: bool = False
) -> dict:
    """Status list, draft stats, errors; ``ok``: the answers meet the check's row of ``EXPECTED``."""
    statuses = [r.status for r in responses]
    e = ctx.expect(check)
    out: dict[str, Any] = {
        "status": statuses,
        "ok": _meets(e, responses, cached=cached, content=content),
        "expected": e.describe(),
        "any_500": any(s == 500 for s in statuses),
        "draft": _draft_stats(responses),
        "server_alive": srv.alive,
        "log": str(srv.log_path),
    }
    errors = [r.error_message for r in responses if not r.ok]
    if errors:
        out["errors"] = errors
    return out


# -- the checks ------------------------------------------------------------------------


def check_chat_image(ctx: _Ctx) -> dict:
    with ctx.server("chat_image") as srv:
        r = srv.chat([_image_message(ctx.image())], max_tokens=N_PREDICT)
        out = _outcome(ctx, "chat_image", [r], srv, content=bool(r.content))
    out["status"] = r.status  # a single request: a plain code
    out["content"] = r.content
    out["draft"] = r.draft_stats
    return out


def check_exactness(ctx: _Ctx) -> dict[str, dict]:
    """Greedy token ids with the draft == without it: text-only, then an image prompt (+ chat)."""
    runs: dict[str, list[Response]] = {}
    logs = {}
    alive = {}
    for label, draft in (("draft", True), ("no_draft", False)):
        with ctx.server(f"exact_{label}", draft=draft) as srv:
            # cache_prompt off: each request starts from an empty slot, on both servers alike
            runs[label] = [
                srv.completion(RAW_TEXT_PROMPT, n_predict=N_PREDICT, cache_prompt=False),
                srv.completion(
                    srv.multimodal_prompt(RAW_IMAGE_PROMPT, [ctx.image()]), n_predict=N_PREDICT, cache_prompt=False
                ),
                srv.chat([_image_message(ctx.image())], max_tokens=N_PREDICT, cache_prompt=False),
            ]
            logs[label], alive[label] = str(srv.log_path), srv.alive

    chat_d, chat_n = runs["draft"][2], runs["no_draft"][2]
    same_chat = (chat_d.content == chat_n.content) if chat_d.ok and chat_n.ok else None

    def entry(check: str, i: int) -> dict:
        d, n = runs["draft"][i], runs["no_draft"][i]
        comparable = d.ok and n.ok
        same = comparable and d.tokens == n.tokens and d.tokens is not None
        e = ctx.expect(check)
        # the image check's output includes the chat answer to the same image
        same_output = same and (check != "exact_image" or same_chat is True)
        out = {
            "status": [d.status, n.status],
            "ok": _meets(e, [d], without=n, same=same_output),
            "expected": e.describe(),
            "same_tokens": same if comparable else None,
            "tokens": {"draft": d.tokens, "no_draft": n.tokens},
            "draft": d.draft_stats,
            "log": logs,
            "server_alive": alive,
        }
        if not d.ok:
            out["error"] = d.error_message
        return out

    text, image = entry("exact_text", 0), entry("exact_image", 1)
    image["chat_status"] = [chat_d.status, chat_n.status]
    image["same_chat_content"] = same_chat
    return {"exact_text": text, "exact_image": image}


def check_two_turn(ctx: _Ctx) -> dict:
    first = _image_message(ctx.image())
    with ctx.server("two_turn") as srv:
        r1 = srv.chat([first], max_tokens=N_PREDICT)
        # the real reply when there is one: the second prompt then extends the cached one exactly
        r2 = srv.chat(
            _two_turn(first, r1.content if r1.ok and r1.content else "It is a picture."), max_tokens=N_PREDICT
        )
        cached = r2.timings.get("cache_n")
        out = _outcome(ctx, "two_turn", [r1, r2], srv, cached=bool(cached))
    out["cache_n_second_turn"] = cached
    return out


def check_concurrent(ctx: _Ctx, n_requests: int = 4, n_parallel: int = 2) -> dict:
    with ctx.server("concurrent", n_parallel=n_parallel) as srv:

        def one(i: int) -> Response:
            return srv.chat([_image_message(ctx.image(i), f"{PROMPT_TEXT} number {i}")], max_tokens=N_PREDICT)

        with ThreadPoolExecutor(n_requests) as pool:
            responses = list(pool.map(one, range(n_requests)))
        out = _outcome(ctx, "concurrent", responses, srv)
    out["n_parallel"] = n_parallel
    return out


def check_alternating(ctx: _Ctx) -> dict:
    """Conversations A and B take turns on one slot; each comes back through the prompt cache."""
    a = _image_message(ctx.image(0))
    b = _image_message(ctx.image(1), "What is in this other picture")
    with ctx.server("alternating", n_parallel=1, cache_ram_mib=64, cache_prompt=True) as srv:
        ra1 = srv.chat([a], max_tokens=N_PREDICT, cache_prompt=True)
        rb1 = srv.chat([b], max_tokens=N_PREDICT, cache_prompt=True)
        ra2 = srv.chat(_two_turn(a, ra1.content or "x"), max_tokens=N_PREDICT, cache_prompt=True)
        rb2 = srv.chat(_two_turn(b, rb1.content or "x"), max_tokens=N_PREDICT, cache_prompt=True)
        responses = [ra1, rb1, ra2, rb2]
        cache_n = [r.timings.get("cache_n") for r in responses]
        # A2 and B2 must have found their conversation again (the other one ran in between)
        out = _outcome(ctx, "alternating", responses, srv, cached=bool(cache_n[2]) and bool(cache_n[3]))
    out["cache_n"] = cache_n
    return out


RESTORE_A = "Tell me about the small robot that paints"
RESTORE_B = "A much longer and unrelated conversation about the weather in the mountains over a whole week of rain"
RESTORE_MORE = " and what did it paint next"
SLOT_RESTORE_MORE = " and then"


def check_slot_restore(ctx: _Ctx, *, ahead: bool = False) -> dict:
    name = "slot_restore_ahead" if ahead else "slot_restore"
    first, between = (SHORT_TEXT, LONG_TEXT) if ahead else (LONG_TEXT, SHORT_TEXT)
    texts = {"first": first, "between": between, "more": SLOT_RESTORE_MORE}
    run = _restore_run(ctx, name, **texts, draft=True)
    with_draft = run["responses"]
    last, ref = with_draft[-1], _restore_run(ctx, name + "_no_draft", **texts, draft=False)["responses"][-1]
    same = last.ok and ref.ok and last.tokens == ref.tokens
    e = ctx.expect(name)
    out = {
        "status": [r.status for r in with_draft],
        "ok": _meets(e, with_draft, same=same, cached=bool(last.timings.get("cache_n"))),
        "expected": e.describe(),
        "any_500": any(r.status == 500 for r in with_draft),
        "draft_vs_target": "ahead" if ahead else "behind",
        "cache_n_after_restore": last.timings.get("cache_n"),
        "same_tokens_as_no_draft": same if last.ok and ref.ok else None,
        "draft": _draft_stats(with_draft[0::2]),  # the three completions
        "server_alive": run["alive"],
        "log": run["log"],
    }
    if not last.ok:
        out["error"] = last.error_message
    return out


def _restore_run(
    ctx: _Ctx,
    name: str,
    *,
    first: str = RESTORE_A,
    between: str = RESTORE_B,
    more: str = RESTORE_MORE,
    draft: bool,
    interrupt: bool = True,
    damage: Literal["none", "remove", "corrupt"] = "none",
    read_drafts: bool = False,
) -> dict:
    """``first``, then (with interrupt) save slot 0, ``between``, restore slot 0; then ``first``
    continued: its tokens, its output and ``more``, so the restored prefix is reused.

    ``damage`` does that to the slot file's draft part before the restore: ``remove`` it (an
    older file), or write garbage over it. With ``read_drafts`` the server logs its drafts and
    runs without the RAM prompt cache: the restored slot is then the only place the prefix can
    come back from (the prompt cache keeps it when ``between`` takes the slot, and would serve
    it, draft included, on its own). Returns the responses (completion, save, completion,
    restore, completion), whether the file had a draft part, and what the draft drafted in the
    continuation.
    """
    save_dir = ctx.work_dir / f"{name}-slots"
    save_dir.mkdir(parents=True, exist_ok=True)
    part = save_dir / "slot.bin.draft"
    part.unlink(missing_ok=True)
    logged = {"verbosity": DEBUG_VERBOSITY, "cache_ram_mib": 0} if read_drafts else {}
    with ctx.server(name, draft=draft, n_parallel=1, slot_save_path=save_dir, **logged) as srv:

        def tokens(text: str, bos: bool = True) -> list[int]:
            r = srv.post("/tokenize", {"content": text, "add_special": bos})
            return r.body["tokens"] if r.ok else []

        a, b, extra = tokens(first), tokens(between), tokens(more, bos=False)
        responses = [srv.completion(a, n_predict=N_PREDICT)]
        had_part = None
        if interrupt:
            responses.append(srv.post("/slots/0?action=save", {"filename": "slot.bin"}))
            had_part = part.exists()
            responses.append(srv.completion(b, n_predict=N_PREDICT))
            if damage == "remove":
                part.unlink(missing_ok=True)
            elif damage == "corrupt":
                part.write_bytes(b"not a llama.cpp sequence state")
            responses.append(srv.post("/slots/0?action=restore", {"filename": "slot.bin"}))
        since = srv.log_path.stat().st_size
        last = srv.completion(a + (responses[0].tokens or []) + extra, n_predict=N_PREDICT)
        responses.append(last)
        stats = last.draft_stats or {}
        rounds = (
            read_drafted_rounds(srv.log_path, since=since, drafted=stats.get("draft_n"), seq=0)
            if draft and read_drafts
            else []
        )
        return {
            "responses": responses,
            "draft_part": had_part,
            "rounds": rounds,
            "log": str(srv.log_path),
            "alive": srv.alive,
        }


def check_restore(ctx: _Ctx, name: str, damage: Literal["none", "remove", "corrupt"]) -> dict:
    e = ctx.expect(name)
    run = _restore_run(ctx, name, draft=True, damage=damage, read_drafts=True)
    plain = _restore_run(ctx, name + "_no_draft", draft=False, damage=damage, read_drafts=True)
    responses = run["responses"]
    completions, restore, last = responses[0::2], responses[3], responses[-1]
    same = last.ok and plain["responses"][-1].ok and last.tokens == plain["responses"][-1].tokens
    cache_n = last.timings.get("cache_n")
    ok = (
        restore.status == e.restore
        and all(r.status == e.status for r in completions)
        and responses[1].ok
        and (same or not e.same_tokens)
        and (bool(cache_n) or not e.cached)
        and (not cache_n or not e.empty_after_restore)
        and (e.draft_part is None or run["draft_part"] == e.draft_part)
    )
    out: dict[str, Any] = {
        "status": [r.status for r in responses],
        "expected": e.describe(),
        "same_tokens_as_no_draft": same,
        "cache_n_after_restore": cache_n,
        "draft_part": run["draft_part"],
        "drafted": run["rounds"],
        "draft": _draft_stats(completions),
        "server_alive": run["alive"],
        "log": run["log"],
    }
    if e.same_drafts is not None:
        uninterrupted = _restore_run(ctx, name + "_uninterrupted", draft=True, interrupt=False, read_drafts=True)
        same_drafts = run["rounds"] == uninterrupted["rounds"] and bool(run["rounds"])
        out["drafted_uninterrupted"] = uninterrupted["rounds"]
        out["same_drafts"] = same_drafts
        ok = ok and same_drafts == e.same_drafts and bool(uninterrupted["rounds"])
    if not restore.ok:
        out["restore_error"] = restore.error_message
    out["ok"] = ok
    return out


def _oracle_image(ctx: _Ctx) -> bytes:
    """The image drafts_vs_twin sends: a given one, else a 168 px square, a 6x6 grid on the tiny
    projector. Its 6-position hole moves the tiny draft's argmax under the seed's zero rows; the
    3x3 grid of the other checks leaves it where it was (measured), so the oracle would be blind."""
    if getattr(ctx.models, "image_files", None):
        return ctx.image()
    from ..tiny.image import png_bytes, rgb

    return png_bytes(rgb(168, 168, 0))


def _image_drafts(ctx: _Ctx, name: str, binary: Path, models: ServerModels) -> tuple[Response, list[list[int]], str]:
    """One image /completion on that server and models; what its draft drafted (debug log)."""
    log = ctx.work_dir / f"{name}.log"
    log.unlink(missing_ok=True)
    with ServerProcess(binary, models, ctx.base.with_(verbosity=DEBUG_VERBOSITY), log_path=log) as srv:
        r = srv.completion(
            srv.multimodal_prompt(RAW_IMAGE_PROMPT, [_oracle_image(ctx)]), n_predict=N_PREDICT, cache_prompt=False
        )
        stats = r.draft_stats or {}
        return r, read_drafted_rounds(log, drafted=stats.get("draft_n"), seq=0), str(log)


def check_drafts_vs_twin(ctx: _Ctx) -> dict:
    e = ctx.expect("drafts_vs_twin")
    if ctx.reference is None:
        return {
            "status": None,
            "ok": False,
            "expected": e.describe(),
            "error": "no reference given: run_server_checks(..., reference=(baseline llama-server, twin models))",
        }
    r, rounds, log = _image_drafts(ctx, "drafts_vs_twin", ctx.binary, ctx.models)
    ref, ref_rounds, ref_log = _image_drafts(ctx, "drafts_vs_twin_reference", *ctx.reference)
    same = r.ok and ref.ok and bool(rounds) and rounds == ref_rounds
    ok = _meets(e, [r]) and ref.ok and (e.same_drafts is None or not r.ok or same == e.same_drafts)
    out = {
        "status": r.status,
        "ok": ok,
        "expected": e.describe(),
        "same_drafts": same if r.ok else None,
        "drafted": rounds,
        "drafted_reference": ref_rounds,
        "reference_status": ref.status,
        "draft": r.draft_stats,
        "log": log,
        "reference_log": ref_log,
    }
    if not r.ok:
        out["error"] = r.error_message
    return out


_RUNNERS: dict[str, Callable[[_Ctx], dict]] = {
    "chat_image": check_chat_image,
    "two_turn": check_two_turn,
    "concurrent": check_concurrent,
    "alternating": check_alternating,
    "slot_restore": check_slot_restore,
    "slot_restore_ahead": lambda ctx: check_slot_restore(ctx, ahead=True),
    "restore_drafts": lambda ctx: check_restore(ctx, "restore_drafts", "none"),
    "restore_no_draft_part": lambda ctx: check_restore(ctx, "restore_no_draft_part", "remove"),
    "restore_corrupt_draft_part": lambda ctx: check_restore(ctx, "restore_corrupt_draft_part", "corrupt"),
    "drafts_vs_twin": check_drafts_vs_twin,
}


def _default_images(models: ServerModels) -> list[bytes]:
    files = list(getattr(models, "image_files", ()) or ())
    if files:
        return [Path(f).read_bytes() for f in files]
    from ..tiny.image import png_bytes, rgb

    # 84 px -> a 3x3 grid on the tiny qwen2vl projector: a 3-position hole after the image
    return [png_bytes(rgb(84, 84, seed)) for seed in range(4)]


def run_server_checks(
    server: Manifest | str | os.PathLike,
    models: ServerModels,
    *,
    variant: str | None = None,
    checks: Iterable[str] | None = None,
    options: ServerOptions | None = None,
    work_dir: Path | None = None,
    images: list[bytes] | None = None,
    reference: tuple[Manifest | str | os.PathLike, ServerModels] | None = None,
) -> dict[str, dict]:
    """Run the checks on one variant; returns ``{check: {"status", "ok", "expected", ...}}``.

    ``server``: a manifest (its ``variant`` sets the expectations), a variant name, or a
    ``llama-server`` path (then pass ``variant``; unknown variants are expected to pass).
    ``options``: the base server options (default: one thread and ``-c 256`` for the tiny
    models; up to 8 threads and ``-c 4096`` for real ones). ``images``: encoded images
    (default: ``models.image_files``, else synthetic PNGs). ``work_dir``: where the server
    logs go (default: a new temporary directory, kept so that the logs can be read).
    ``reference``: baseline's llama-server (manifest, name or path) and the models with the draft's
    reconverted twin, for ``drafts_vs_twin``.
    """
    binary = resolve_binary(server)
    if variant is None:
        variant = (
            server.variant
            if isinstance(server, Manifest)
            else (str(server) if isinstance(server, str) and os.sep not in str(server) else None)
        )
    wanted = list(checks) if checks is not None else list(CHECKS)
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown server checks {unknown}; known: {', '.join(CHECKS)}")
    real = bool(getattr(models, "real", False))
    base = options or (ServerOptions(n_ctx=4096, threads=min(8, os.cpu_count() or 1)) if real else ServerOptions())
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="pyllama-dflash-server-"))
    work = work / (variant or "server")
    work.mkdir(parents=True, exist_ok=True)
    ref = (resolve_binary(reference[0]), reference[1]) if reference is not None else None
    ctx = _Ctx(binary, models, variant, base, work, images or _default_images(models), ref)

    results: dict[str, dict] = {}
    for name in wanted:
        if name in results:
            continue
        # the two exactness checks share their pair of servers
        names = ("exact_text", "exact_image") if name in ("exact_text", "exact_image") else (name,)
        try:
            results.update(check_exactness(ctx) if len(names) == 2 else {name: _RUNNERS[name](ctx)})
        except (ServerError, OSError) as e:  # a server that would not start: report it, run the rest
            results.update({n: {"status": None, "ok": False, "error": f"{type(e).__name__}: {e}"} for n in names})
    return {name: results[name] for name in wanted}
