"""The drift oracle through the server, and how llama-server picks and runs the drafter."""

from __future__ import annotations

from .. import bodies
from ..client import Response
from ..drafts import DEBUG_VERBOSITY, LOGS_NO_DRAFTS, read_drafted_rounds
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts

# -- the drift oracle through the server -----------------------------------------------------


def _image_drafts(ctx, name: str, binary, models) -> tuple[Response, list[list[int]], str]:
    """One image /completion on that server and models; what its draft drafted (debug log)."""
    with ctx.server(name, binary=binary, models=models, verbosity=DEBUG_VERBOSITY) as srv:
        r = srv.completion(
            srv.multimodal_prompt(bodies.RAW_IMAGE_PROMPT, [bodies.oracle_image(ctx.models, ctx.images)]),
            n_predict=bodies.N_PREDICT,
            cache_prompt=False,
        )
    # read once the server has stopped: its logger writes from a thread of its own, and flushes at exit
    stats = r.draft_stats or {}
    if getattr(ctx.models, "drafter", "dflash") in LOGS_NO_DRAFTS:
        return r, [], str(srv.log_path)  # its draft() logs no candidates (see drafts.py)
    return r, read_drafted_rounds(srv.log_path, drafted=stats.get("draft_n"), seq=0), str(srv.log_path)


@check(
    "drafts_vs_twin",
    family=True,
    baseline=Expect(500, "any"),  # the legacy draft fails where its twin drafts
    shown=Expect(200, "every", same_drafts=False),
    twin=Expect(200, "every", same_drafts=True),  # the fix drafts what the twin drafts
    # the twin is not its oracle: the definition's drafts are judged against the definition reference,
    # through the library (the matrix and the fuzzer), not through the server's log
    definition=Expect(200, "every"),
)
def drafts_vs_twin(ctx) -> Result:
    """An image prompt's drafts against baseline's server with the draft's reconverted twin."""
    e = ctx.expect("drafts_vs_twin")
    if ctx.reference is None:
        return Result(None, False, e.describe(), {"error": "no reference given: run_server_checks(..., reference=...)"})
    r, rounds, log = _image_drafts(ctx, "drafts_vs_twin", ctx.binary, ctx.models)
    ref, ref_rounds, ref_log = _image_drafts(ctx, "drafts_vs_twin_reference", *ctx.reference)
    same = r.ok and ref.ok and bool(rounds) and rounds == ref_rounds
    # where the request failed, there are no drafts to judge (the status says it all)
    seen = Seen([r], same_drafts=same if r.ok else e.same_drafts, holds=ref.ok)
    return judged(
        e,
        seen,
        r.status,
        same_drafts=same if r.ok else None,
        drafted=rounds,
        drafted_reference=ref_rounds,
        reference_status=ref.status,
        draft=r.draft_stats,
        log=log,
        reference_log=ref_log,
    )


# -- how llama-server picks and runs the drafter ---------------------------------------------


@check("spec_type_detected", family=True, baseline=Expect(500, "any"), twin=Expect(200, "every", content=True))
def spec_type_detected(ctx) -> Result:
    """The image chat with no --spec-type: llama-server detects the type from the draft file (a Markov
    head makes draft-dspark) and logs it; it must be the drafter's type."""
    with ctx.server("spec_type_detected", spec_type="auto") as srv:
        r = srv.chat([bodies.image_message(ctx.image())], max_tokens=bodies.N_PREDICT)
        facts = server_facts(srv)
    log = srv.log_path.read_text(errors="replace")
    wanted = getattr(ctx.models, "spec_type", None) or "draft-dflash"
    detected = next((t for t in ("draft-dspark", "draft-dflash") if f"speculative type '{t}'" in log), None)
    seen = Seen([r], content=bool(r.content), holds=detected == wanted)
    return judged(ctx.expect("spec_type_detected"), seen, r.status, detected=detected, wanted=wanted, **facts)


@check("probabilistic_sampling", baseline=Expect(500, "any"), twin=Expect(200, "every", content=True))
def probabilistic_sampling(ctx) -> Result:
    """``--spec-draft-sampling probabilistic`` with a sampled request (temperature 0.8, a fixed seed):
    every call succeeds. The tokens are compared with ``greedy`` drafting on the same seeded request,
    not with decoding without the draft: at temperature > 0 the target samples, and its random draws
    follow the number of positions each round verifies. b11434 reads the flag only for draft-simple
    and draft-mtp; a DFlash-family drafter drafts by argmax either way."""
    runs = {}
    for how in ("probabilistic", "greedy"):
        with ctx.server(f"sampling_{how}", extra_args=("--spec-draft-sampling", how)) as srv:
            runs[how] = srv.chat(
                [bodies.image_message(ctx.image())], max_tokens=bodies.N_PREDICT, temperature=0.8, seed=7
            )
            if how == "probabilistic":
                facts = server_facts(srv)
    r, g = runs["probabilistic"], runs["greedy"]
    same = r.ok and g.ok and r.content == g.content
    return judged(
        ctx.expect("probabilistic_sampling"),
        Seen([r], content=bool(r.content)),
        r.status,
        same_as_greedy_drafting=same if r.ok and g.ok else None,
        draft=r.draft_stats,
        **facts,
    )
