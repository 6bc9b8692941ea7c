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
    The cross-request case: ``POST /slots/0?action=restore`` restores the *target* only, so
    the draft keeps the state of whatever ran on the slot in between. Restoring a long
    conversation over a short one leaves the draft behind the target (baseline: 500, even
    with no image); restoring a short one over a long one leaves it ahead, which the
    server's own trim at the start of the next prompt (``slot.mem.seq_rm``) resolves.
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
from ..llamabuild.manifest import Manifest
from .process import (
    Response,
    ServerModels,
    ServerOptions,
    ServerProcess,
    resolve_binary,
)

__all__ = ["CHECKS", "EXPECTED", "SPEC_BATCH_ERROR", "Expect", "expectation", "run_server_checks"]

BASELINE = "baseline"
PATCHED = "patched"  # every other variant, unknown ones included
SPEC_BATCH_ERROR = "failed to process speculative batch"

CHECKS = ("chat_image", "exact_text", "exact_image", "two_turn", "concurrent", "alternating",
          "slot_restore", "slot_restore_ahead")


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

    def describe(self) -> str:
        """The ``"expected"`` text of a result."""
        code = f"500 {SPEC_BATCH_ERROR!r}" if self.status == 500 else str(self.status)
        if self.where == "draft":
            if self.status == 500:
                return f"{code} with the draft, 200 without"
            return f"{code} and the same token ids with and without the draft" if self.same_tokens \
                else f"{code} with and without the draft"
        if self.where == "last":
            return f"{code} on the last request"
        return f"{code} everywhere and the same token ids as without the draft" if self.same_tokens else code


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
    },
}
assert all(tuple(table) == CHECKS for table in EXPECTED.values())


def expectation(variant: str | None, check: str) -> Expect:
    """The row of ``EXPECTED`` for ``variant``: baseline's, or the patched one for any other name."""
    return EXPECTED[BASELINE if variant == BASELINE else PATCHED][check]

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

    def __init__(self, binary: Path, models: ServerModels, variant: str | None, base: ServerOptions,
                 work_dir: Path, images: list[bytes]):
        self.binary, self.models, self.variant, self.base = binary, models, variant, base
        self.work_dir, self.images = work_dir, images

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
    return {"role": "user", "content": [{"type": "text", "text": text}, _image_part(png),
                                        {"type": "text", "text": PROMPT_TAIL}]}


def _two_turn(first: dict, reply: str) -> list[dict]:
    return [first, {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]


# -- result helpers --------------------------------------------------------------------

def _draft_stats(responses: Iterable[Response]) -> list[dict | None]:
    return [r.draft_stats for r in responses]


def _has_spec_error(responses: Iterable[Response]) -> bool:
    return any(r.status == 500 and SPEC_BATCH_ERROR in r.error_message for r in responses)


def _meets(e: Expect, responses: list[Response], *, without: Response | None = None, same: bool = False,
           cached: bool = False, content: bool = False) -> bool:
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


def _outcome(ctx: _Ctx, check: str, responses: list[Response], srv: ServerProcess, *, cached: bool = False,
             content: bool = False) -> dict:
    """Status list, draft stats, errors; ``ok``: the answers meet the check's row of ``EXPECTED``."""
    statuses = [r.status for r in responses]
    e = ctx.expect(check)
    out: dict[str, Any] = {
        "status": statuses, "ok": _meets(e, responses, cached=cached, content=content),
        "expected": e.describe(),
        "any_500": any(s == 500 for s in statuses),
        "draft": _draft_stats(responses),
        "server_alive": srv.alive, "log": str(srv.log_path),
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
                srv.completion(srv.multimodal_prompt(RAW_IMAGE_PROMPT, [ctx.image()]),
                               n_predict=N_PREDICT, cache_prompt=False),
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
        out = {"status": [d.status, n.status], "ok": _meets(e, [d], without=n, same=same_output),
               "expected": e.describe(),
               "same_tokens": same if comparable else None,
               "tokens": {"draft": d.tokens, "no_draft": n.tokens},
               "draft": d.draft_stats, "log": logs, "server_alive": alive}
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
        r2 = srv.chat(_two_turn(first, r1.content if r1.ok and r1.content else "It is a picture."),
                      max_tokens=N_PREDICT)
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


def _slot_restore_run(ctx: _Ctx, name: str, first: str, between: str, draft: bool) -> tuple[list[Response], ServerProcess]:
    """first -> save slot 0 -> between -> restore slot 0 -> first + its output + more (token ids).

    Returns the five responses in that order (completion, save, completion, restore, completion).
    """
    save_dir = ctx.work_dir / f"{name}-slots"
    save_dir.mkdir(parents=True, exist_ok=True)
    with ctx.server(name, draft=draft, n_parallel=1, slot_save_path=save_dir) as srv:
        def tokens(text: str) -> list[int]:
            r = srv.post("/tokenize", {"content": text, "add_special": True})
            return r.body["tokens"] if r.ok else []
        a, b, more = tokens(first), tokens(between), tokens(" and then")[1:]  # no second BOS
        r1 = srv.completion(a, n_predict=N_PREDICT)
        save = srv.post("/slots/0?action=save", {"filename": "first.bin"})
        r2 = srv.completion(b, n_predict=N_PREDICT)
        restore = srv.post("/slots/0?action=restore", {"filename": "first.bin"})
        # extends exactly what the restored slot holds, so the restored prefix is reused
        r3 = srv.completion(a + (r1.tokens or []) + more, n_predict=N_PREDICT)
        return [r1, save, r2, restore, r3], srv


def check_slot_restore(ctx: _Ctx, *, ahead: bool = False) -> dict:
    name = "slot_restore_ahead" if ahead else "slot_restore"
    first, between = (SHORT_TEXT, LONG_TEXT) if ahead else (LONG_TEXT, SHORT_TEXT)
    with_draft, srv = _slot_restore_run(ctx, name, first, between, draft=True)
    without, _ = _slot_restore_run(ctx, name + "_no_draft", first, between, draft=False)
    last, ref = with_draft[-1], without[-1]
    same = last.ok and ref.ok and last.tokens == ref.tokens
    e = ctx.expect(name)
    out = {"status": [r.status for r in with_draft],
           "ok": _meets(e, with_draft, same=same, cached=bool(last.timings.get("cache_n"))),
           "expected": e.describe(),
           "any_500": any(r.status == 500 for r in with_draft),
           "draft_vs_target": "ahead" if ahead else "behind",
           "cache_n_after_restore": last.timings.get("cache_n"),
           "same_tokens_as_no_draft": same if last.ok and ref.ok else None,
           "draft": _draft_stats(with_draft[0::2]),  # the three completions
           "server_alive": srv.alive, "log": str(srv.log_path)}
    if not last.ok:
        out["error"] = last.error_message
    return out


_RUNNERS: dict[str, Callable[[_Ctx], dict]] = {
    "chat_image": check_chat_image,
    "two_turn": check_two_turn,
    "concurrent": check_concurrent,
    "alternating": check_alternating,
    "slot_restore": check_slot_restore,
    "slot_restore_ahead": lambda ctx: check_slot_restore(ctx, ahead=True),
}


def _default_images(models: ServerModels) -> list[bytes]:
    files = list(getattr(models, "image_files", ()) or ())
    if files:
        return [Path(f).read_bytes() for f in files]
    from ..tiny.image import png_bytes, rgb
    # 84 px -> a 3x3 grid on the tiny qwen2vl projector: a 3-position hole after the image
    return [png_bytes(rgb(84, 84, seed)) for seed in range(4)]


def run_server_checks(server: Manifest | str | os.PathLike, models: ServerModels, *,
                      variant: str | None = None, checks: Iterable[str] | None = None,
                      options: ServerOptions | None = None, work_dir: Path | None = None,
                      images: list[bytes] | None = None) -> dict[str, dict]:
    """Run the checks on one variant; returns ``{check: {"status", "ok", "expected", ...}}``.

    ``server``: a manifest (its ``variant`` sets the expectations), a variant name, or a
    ``llama-server`` path (then pass ``variant``; unknown variants are expected to pass).
    ``options``: the base server options (default: one thread and ``-c 256`` for the tiny
    models; up to 8 threads and ``-c 4096`` for real ones). ``images``: encoded images
    (default: ``models.image_files``, else synthetic PNGs). ``work_dir``: where the server
    logs go (default: a new temporary directory, kept so that the logs can be read).
    """
    binary = resolve_binary(server)
    if variant is None:
        variant = server.variant if isinstance(server, Manifest) else (
            str(server) if isinstance(server, str) and os.sep not in str(server) else None)
    wanted = list(checks) if checks is not None else list(CHECKS)
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown server checks {unknown}; known: {', '.join(CHECKS)}")
    real = bool(getattr(models, "real", False))
    base = options or (ServerOptions(n_ctx=4096, threads=min(8, os.cpu_count() or 1)) if real else ServerOptions())
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="pyllama-dflash-server-"))
    work = work / (variant or "server")
    work.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(binary, models, variant, base, work, images or _default_images(models))

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
