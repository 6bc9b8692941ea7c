"""Checks of one request, of exactness with and without the draft, and of conversations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import bodies
from ..client import Response, without_draft
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts, stats

# -- one request, and exactness ------------------------------------------------------------


@check("chat_image", family=True, baseline=Expect(500, "any"), twin=Expect(200, "every", content=True))
def chat_image(ctx) -> Result:
    """``/v1/chat/completions`` with a text part, a base64 PNG part and a text part."""
    with ctx.server("chat_image") as srv:
        r = srv.chat([bodies.image_message(ctx.image())], max_tokens=bodies.N_PREDICT)
        facts = server_facts(srv)
    return judged(
        ctx.expect("chat_image"),
        Seen([r], content=bool(r.content)),
        r.status,
        content=r.content,
        draft=r.draft_stats,
        **facts,
    )


def _exact_runs(ctx) -> dict:
    """Greedy /completion (token ids) with and without the draft, text-only, then an image prompt, then
    the image chat; each request from an empty slot (cache_prompt off), on both servers alike."""

    def ask(srv) -> tuple[list[Response], str, bool]:
        image_prompt = srv.multimodal_prompt(bodies.RAW_IMAGE_PROMPT, [ctx.image()])
        answers = [
            srv.completion(bodies.RAW_TEXT_PROMPT, n_predict=bodies.N_PREDICT, cache_prompt=False),
            srv.completion(image_prompt, n_predict=bodies.N_PREDICT, cache_prompt=False),
            srv.chat([bodies.image_message(ctx.image())], max_tokens=bodies.N_PREDICT, cache_prompt=False),
        ]
        return answers, str(srv.log_path), srv.alive

    with ctx.server("exact_draft") as srv:
        runs = {"draft": ask(srv)}
    runs["no_draft"] = without_draft(ctx, "exact", ask)
    return {
        "runs": {label: run[0] for label, run in runs.items()},
        "log": {label: run[1] for label, run in runs.items()},
        "server_alive": {label: run[2] for label, run in runs.items()},
    }


def _exactness(ctx, name: str, i: int) -> Result:
    shared = ctx.once("exact", lambda: _exact_runs(ctx))
    runs = shared["runs"]
    d, n = runs["draft"][i], runs["no_draft"][i]
    comparable = d.ok and n.ok
    same = comparable and d.tokens == n.tokens and d.tokens is not None
    details: dict[str, Any] = {}
    if name == "exact_image":  # the image check's output includes the chat answer to the same image
        chat_d, chat_n = runs["draft"][2], runs["no_draft"][2]
        same_chat = (chat_d.content == chat_n.content) if chat_d.ok and chat_n.ok else None
        same = same and same_chat is True
        details = {"chat_status": [chat_d.status, chat_n.status], "same_chat_content": same_chat}
    result = judged(
        ctx.expect(name),
        Seen([d], without=n, same_tokens=same),
        [d.status, n.status],
        same_tokens=same if comparable else None,
        tokens={"draft": d.tokens, "no_draft": n.tokens},
        draft=d.draft_stats,
        log=shared["log"],
        server_alive=shared["server_alive"],
        **details,
    )
    if not d.ok:
        result.details["error"] = d.error_message
    return result


@check("exact_text", family=True, twin=Expect(200, "draft", same_tokens=True))
def exact_text(ctx) -> Result:
    """Greedy token ids with the draft equal those without it, on a text prompt."""
    return _exactness(ctx, "exact_text", 0)


@check("exact_image", family=True, baseline=Expect(500, "draft"), twin=Expect(200, "draft", same_tokens=True))
def exact_image(ctx) -> Result:
    """The same on an image prompt, and the image chat's text with and without the draft."""
    return _exactness(ctx, "exact_image", 1)


# -- conversations -------------------------------------------------------------------------


@check("two_turn", family=True, baseline=Expect(500, "any"), twin=Expect(200, "every", cached=True))
def two_turn(ctx) -> Result:
    """An image turn, then a text turn that repeats it plus the reply: the second reuses the first's prompt."""
    first = bodies.image_message(ctx.image())
    with ctx.server("two_turn") as srv:
        r1 = srv.chat([first], max_tokens=bodies.N_PREDICT)
        # the real reply when there is one: the second prompt then extends the cached one exactly
        reply = r1.content if r1.ok and r1.content else "It is a picture."
        r2 = srv.chat(bodies.two_turn(first, reply), max_tokens=bodies.N_PREDICT)
        cached = r2.timings.get("cache_n")
        facts = server_facts(srv)
    seen = Seen([r1, r2], cached=bool(cached))
    return judged(ctx.expect("two_turn"), seen, cache_n_second_turn=cached, draft=stats([r1, r2]), **facts)


@check("concurrent", baseline=Expect(500, "any"), twin=Expect(200, "every"))
def concurrent(ctx, n_requests: int = 4, n_parallel: int = 2) -> Result:
    """Four image requests at once on ``--parallel 2``."""
    with ctx.server("concurrent", n_parallel=n_parallel) as srv:

        def one(i: int) -> Response:
            message = bodies.image_message(ctx.image(i), f"{bodies.PROMPT_TEXT} number {i}")
            return srv.chat([message], max_tokens=bodies.N_PREDICT)

        with ThreadPoolExecutor(n_requests) as pool:
            responses = list(pool.map(one, range(n_requests)))
        facts = server_facts(srv)
    return judged(ctx.expect("concurrent"), Seen(responses), n_parallel=n_parallel, draft=stats(responses), **facts)


@check("alternating", baseline=Expect(500, "any"), twin=Expect(200, "every", cached=True))
def alternating(ctx) -> Result:
    """Two image conversations taking turns on one slot with the RAM prompt cache on: each comes back."""
    a = bodies.image_message(ctx.image(0))
    b = bodies.image_message(ctx.image(1), "What is in this other picture")
    with ctx.server("alternating", n_parallel=1, cache_ram_mib=64, cache_prompt=True) as srv:
        ra1 = srv.chat([a], max_tokens=bodies.N_PREDICT, cache_prompt=True)
        rb1 = srv.chat([b], max_tokens=bodies.N_PREDICT, cache_prompt=True)
        ra2 = srv.chat(bodies.two_turn(a, ra1.content or "x"), max_tokens=bodies.N_PREDICT, cache_prompt=True)
        rb2 = srv.chat(bodies.two_turn(b, rb1.content or "x"), max_tokens=bodies.N_PREDICT, cache_prompt=True)
        responses = [ra1, rb1, ra2, rb2]
        cache_n = [r.timings.get("cache_n") for r in responses]
        facts = server_facts(srv)
    # A2 and B2 must have found their conversation again (the other one ran in between)
    seen = Seen(responses, cached=bool(cache_n[2]) and bool(cache_n[3]))
    return judged(ctx.expect("alternating"), seen, cache_n=cache_n, draft=stats(responses), **facts)
