"""The draft as its definition has it, through llama-server: every drafting round of a conversation with an
image against the draft's first round on a fresh server given the conversation so far as one request.

**The reference, and why it is exact.** Under patch 0007 (``definition``) the draft's context for a round
is the target's features of every row of the sequence so far, image rows included, at draft positions
``0..N-1``, and the noise block ``[id_last, mask...]`` at ``N``. A fresh llama-server of the same variant
given those ``N`` rows as one new request (``cache_prompt`` off, ``--ctx-checkpoints 0``) drafts exactly
that in its first round: its draft starts empty, ``process()`` injects every row of the prefill at the
draft's next position, and no trim runs between them and the first round that could remove or keep a row
(its only trims, where the prompt starts and where the image starts, cut at the same position in both
memories, where nothing lies yet; without checkpoints no pass of the prompt begins after the image). It
runs on the variant's own llama-server, a mutant's under ``mutate``, and needs none of its trims.
The first round is drafted before the server trims anything of its own. So the reference does not rest
on any line of llama-server that trims or restores the draft, which are what the conversation's later
rounds go through: the rejected drafts of each round, a second turn reusing the first's prefix, a new
request that goes back to a context checkpoint before a cached prefix ends, a slot restored from a file.

The reference's history must be the conversation's, row for row: the same text before the image, the same
image, and after it the very token ids the conversation held (its prompt's and the target's output up to
the round). A /completion prompt with an image is text (mtmd tokenizes it), so the ids after the image are
written as text that tokenizes back into them: for the tiny models' "test" vocab (5-byte chunks hashed to
ids) five letters per id (``tiny._vocab.text_for_test_vocab``), else the server's own detokenization. Every
such text is checked with the server's ``/tokenize`` before it is sent, and each reference must sample
the conversation's anchor (the round's ``id_last``) from a prompt of the conversation's row count, or the
round counts as not comparable and the check fails: it never compares a history that is not the one.

What is compared is every candidate line the draft logs (``-lv 5``: the top three tokens of each drafted
position with their probabilities to three decimals, ``drafts.drafted_candidates``), not only the tokens
proposed: the tiny draft proposes the same token after most contexts, its probabilities move with every
row. The target's features of a generated row come from a verification batch in the conversation and
from the prefill in the reference, which round alike far below the log's precision but not bit for bit:
one probability of 162 in 18 rounds printed 0.200 in one and 0.199 in the other (measured). So a
position agrees when it proposes the same token and its three largest probabilities, in order, differ
by at most the log's last digit (:func:`positions_agree`); where the reference's top two are that close,
the proposed token is a tie and not compared (counted in ``ties``), as the matrix excludes ties it
cannot prove. A draft left with rows too many or too few is told apart all the same: the mutants of
0007's trims after an image (``mutate --variant definition``) fail here.

The library's definition reference (``SessionConfig.definition_reference``) computes the same drafts
through the API, but from features of the library's own decode batches, which are not the server's: the
server's own prefill is the reference that needs no model of the server's batching.

On a variant without 0007 (its draft at the target's positions, the image's rows skipped) the same
comparison says whether a conversation's rounds draft what a fresh request of that variant drafts for the
same history: measured, and written down per variant below.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from ....errors import PyllamaError, ServerError
from .. import bodies
from ..client import Response, slot_server, without_draft
from ..drafts import DEBUG_VERBOSITY, LOGS_NO_DRAFTS, drafted_candidates, request_logs, rounds_with_history
from ..expect import Expect, Result, Seen, judged
from . import check, server_facts

# the conversations' text; the image goes between BEFORE and the ids of TAIL
BEFORE = "<|im_start|>user\n" + bodies.PROMPT_TEXT
TAIL = bodies.PROMPT_TAIL + "<|im_end|>\n<|im_start|>assistant\n"
SECOND_TURN = "<|im_end|>\n<|im_start|>user\n" + bodies.FOLLOW_UP + "<|im_end|>\n<|im_start|>assistant\n"
OTHER_QUESTION = "<|im_end|>\n<|im_start|>user\nAnd what shape is it?<|im_end|>\n<|im_start|>assistant\n"
N_REFERENCE = 3  # a reference's n_predict: its first round drafts once the first token leaves two to go
N_KEPT = 3  # the output tokens of the first request a cut-back request keeps


@dataclass(frozen=True)
class ImagePrompt:
    """A /completion prompt: text, one image, then token ids (mtmd's own image-end token aside); without
    an image, the token ids alone (``before`` unused)."""

    before: str
    image: bytes | None
    after: tuple[int, ...]

    def then(self, ids: list[int]) -> ImagePrompt:
        return replace(self, after=self.after + tuple(ids))


class NotComparable(PyllamaError, RuntimeError):
    """The reference cannot be given the conversation's history: the check fails, and says why."""


def _tokens(srv, text: str) -> list[int]:
    try:
        return srv.tokenize(text, add_special=False, parse_special=True)
    except ServerError as e:
        raise NotComparable(str(e)) from e


def _text_of(srv, ids: tuple[int, ...]) -> str:
    """Text that the server tokenizes into exactly ``ids`` (after a special token), checked with /tokenize:
    for the tiny models five letters per id, else (or where those fail) the server's own detokenization."""
    for spelling in (_test_vocab_text, _detokenized):
        text = spelling(srv, ids)
        if text is not None and _tokens(srv, text) == list(ids):
            return text
    raise NotComparable(f"no text tokenizes back into the ids after the image ({len(ids)} ids)")


def _test_vocab_text(srv, ids: tuple[int, ...]) -> str | None:
    """The tiny models' "test" vocab spelling of ``ids`` (None for real models, or where /v1/models gives no
    vocabulary size)."""
    models = srv.get("/v1/models")
    try:
        n_vocab = int(models.body["data"][0]["meta"]["n_vocab"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not n_vocab or getattr(srv.models, "real", False):
        return None
    from pyllama_dflash.harness.tiny._vocab import text_for_test_vocab

    return text_for_test_vocab(list(ids), n_vocab)


def _detokenized(srv, ids: tuple[int, ...]) -> str:
    try:
        return srv.detokenize(ids)
    except ServerError as e:
        raise NotComparable(str(e)) from e


def _complete(srv, prompt: ImagePrompt, n_predict: int = bodies.N_PREDICT, **params: Any) -> Response:
    if prompt.image is None:
        return srv.completion(list(prompt.after), n_predict=n_predict, **params)
    body = srv.multimodal_prompt(prompt.before + "{image}" + _text_of(srv, prompt.after), [prompt.image])
    return srv.completion(body, n_predict=n_predict, **params)


@dataclass
class Turn:
    """One request of the conversation whose rounds are judged, and what it drafted."""

    prompt: ImagePrompt
    response: Response
    rounds: list[tuple[int, list]] = field(default_factory=list)  # (output ids held, candidates) per round


def fresh_server_round(ctx, name: str, prompt: ImagePrompt) -> tuple[Response, list]:
    """The first round a fresh server of the variant drafts for ``prompt`` as one request (see the module):
    the reference a round of a conversation is judged by."""
    with ctx.server(name, verbosity=DEBUG_VERBOSITY, ctx_checkpoints=0, cache_ram_mib=0, n_parallel=1) as srv:
        r = _complete(srv, prompt, n_predict=N_REFERENCE, cache_prompt=False)
    rounds = drafted_candidates(srv.log_path.read_text(errors="replace"), seq=0)
    return r, (rounds[0] if rounds else [])


def history_rows(r: Response) -> int:
    """The rows a request's sequence held once its prompt was in: the prompt's rows processed plus those
    reused from the cache (an image counts its rows)."""
    return (r.timings.get("prompt_n") or 0) + (r.timings.get("cache_n") or 0)


LOG_DIGIT = 0.001  # the log prints probabilities to three decimals
_SLACK = LOG_DIGIT * 1.5  # one last digit apart, whatever the rounding of the parsed decimals


def positions_agree(drafted: list, reference: list) -> tuple[bool, int]:
    """Whether a round drafted as its reference did, position by position (see the module): the same
    positions, the same proposed token unless the reference's top two probabilities are within a last
    digit (a tie), and the three largest probabilities in order within a last digit. Returns (agree, ties)."""

    def by_pos(cands: list) -> dict[int, list[tuple[int, float]]]:
        out: dict[int, list[tuple[int, float]]] = {}
        for pos, tok, p in cands:
            try:
                out.setdefault(pos, []).append((tok, float(p)))
            except ValueError:
                out.setdefault(pos, []).append((tok, float("nan")))
        return out

    a, b = by_pos(drafted), by_pos(reference)
    if not b or a.keys() != b.keys():
        return False, 0
    ties = 0
    for pos, ref in b.items():
        got = a[pos]
        pa, pb = sorted((p for _, p in got), reverse=True), sorted((p for _, p in ref), reverse=True)
        if len(pa) != len(pb) or any(not abs(x - y) <= _SLACK for x, y in zip(pa, pb, strict=True)):
            return False, ties
        if got[0][0] != ref[0][0]:
            if len(pb) > 1 and abs(pb[0] - pb[1]) <= _SLACK:
                ties += 1
            else:
                return False, ties
    return True, ties


def judge_rounds(ctx, name: str, turns: list[Turn]) -> dict:
    """Every round of every turn against its reference; ``{"same", "comparable", "rounds", "differing",
    "why"}``. ``same`` is None where nothing was drafted or a history could not be given."""
    n_rounds, differing, rounds_out, why, n_ties = 0, [], [], None, 0
    for i, t in enumerate(turns):
        r = t.response
        if not r.ok or not r.tokens:
            continue
        rows = history_rows(r)
        for k, (m, cands) in enumerate(t.rounds):
            if m >= len(r.tokens):
                why = why or f"request {i} round {k}: drafted after its last output id"
                continue
            try:
                ref, ref_cands = fresh_server_round(ctx, f"{name}_reference_{i}_{k}", t.prompt.then(r.tokens[:m]))
            except NotComparable as e:
                why = why or f"request {i} round {k}: {e}"
                continue
            ref_rows = history_rows(ref)
            if not ref.ok or (ref.tokens or [None])[0] != r.tokens[m] or ref_rows != rows + m:
                why = why or (
                    f"request {i} round {k}: the reference answered {ref.status}, sampled "
                    f"{(ref.tokens or [None])[0]} (anchor {r.tokens[m]}) from {ref_rows} rows (want {rows + m})"
                )
                continue
            n_rounds += 1
            same, ties = positions_agree(cands, ref_cands)
            n_ties += ties
            rounds_out.append({"request": i, "round": k, "history": rows + m, "same": same, "drafted": cands})
            if not same:
                differing.append({"request": i, "round": k, "drafted": cands, "reference": ref_cands})
    comparable = why is None
    same = comparable and n_rounds > 0 and not differing
    return {
        "same": same if comparable and n_rounds else None,
        "comparable": comparable,
        "rounds": rounds_out,
        "differing": differing[:4],
        "n_differing": len(differing),
        "ties": n_ties,
        "why": why,
    }


def _readable(ctx) -> bool:
    return getattr(ctx.models, "drafter", "dflash") not in LOGS_NO_DRAFTS


def _turns(log_text: str, prompts: list[ImagePrompt], responses: list[Response]) -> list[Turn]:
    """The turns with their rounds, the log cut per request (a request that never started has no piece)."""
    pieces = request_logs(log_text)
    turns = []
    for k, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        piece = pieces[k] if k < len(pieces) else ""
        turns.append(Turn(p, r, rounds_with_history(piece)))
    return turns


def _same_drafts(ctx, e: Expect, verdict: dict | None) -> bool | None:
    if verdict is None or not _readable(ctx):
        return e.same_drafts  # not judged here (the drafter logs no drafts): the expectation holds as set
    return verdict["same"]


# -- the rounds after an image, a second turn, a cut-back cached prefix and rejected drafts ------------


@check(
    "drafts_vs_definition",
    baseline=Expect(500, "any"),
    # without 0007 the reference is not the variant's semantics (its draft skips the image's rows), so the
    # rounds are measured, not judged (docs/server.md has what they show: 0004's fill and removal leave the
    # draft's cells in another order, so probabilities may differ in their last digits)
    twin=Expect(200, "every", cached=True),
    definition=Expect(200, "every", cached=True, same_drafts=True),
)
def drafts_vs_definition(ctx) -> Result:
    """An image request, a second turn that extends it with its output, then a request that keeps only the
    image prompt and three output ids of the first (the server goes back to a context checkpoint): every
    drafting round of the three against a fresh server given the history so far as one request."""
    return conversation_rounds(ctx, "drafts_vs_definition")


def conversation_rounds(ctx, name: str, *, image: bool = True, n_judged: int = 3) -> Result:
    """drafts_vs_definition's conversation and judgement, on whatever drafter ``ctx.models`` holds (EAGLE3's
    and MTP's checks run it too, in .siblings): a first request, a second turn that extends it with its output,
    and a cut-back cached prefix. ``image``: the first request holds the oracle's image (False: the text prompt
    alone); ``n_judged``: how many of the three requests are judged, the others measured
    (``after_a_context_checkpoint``)."""
    e = ctx.expect(name)
    prompts: list[ImagePrompt] = []
    responses: list[Response] = []
    try:
        with ctx.server(name, verbosity=DEBUG_VERBOSITY, n_parallel=1, cache_ram_mib=0) as srv:
            if image:
                first = ImagePrompt(BEFORE, bodies.oracle_image(ctx.models, ctx.images), tuple(_tokens(srv, TAIL)))
            else:
                first = ImagePrompt("", None, tuple(srv.tokenize(bodies.RAW_TEXT_PROMPT)))
            prompts.append(first)
            responses.append(_complete(srv, first))
            out = responses[0].tokens or []
            prompts.append(first.then(out + _tokens(srv, SECOND_TURN)))
            responses.append(_complete(srv, prompts[1]))
            prompts.append(first.then(out[:N_KEPT] + _tokens(srv, OTHER_QUESTION)))
            responses.append(_complete(srv, prompts[2]))
            facts = server_facts(srv)
    except NotComparable as err:
        return Result(None, False, e.describe(), {"error": str(err)})
    turns = _turns(srv.log_path.read_text(errors="replace"), prompts, responses)
    ok = all(r.ok for r in responses)
    verdict = judge_rounds(ctx, name, turns[:n_judged]) if ok else None
    measured = judge_rounds(ctx, f"{name}_cut", turns[n_judged:]) if ok and n_judged < len(turns) else None
    cache_n = [r.timings.get("cache_n") for r in responses]
    seen = Seen(
        responses,
        cached=bool(cache_n[1]) and bool(cache_n[2]),
        same_drafts=_same_drafts(ctx, e, verdict),
        holds=verdict is None or verdict["comparable"],
    )
    extra = {"after_a_context_checkpoint": measured} if measured else {}
    return judged(
        e, seen, cache_n=cache_n, definition=verdict, draft=[r.draft_stats for r in responses], **extra, **facts
    )


# -- a slot saved and restored with an image in it -----------------------------------------------------


@check(
    "restore_image_drafts",
    baseline=Expect(500, "any"),
    # b11434's restore loads the target alone: the draft keeps B's rows and drafts otherwise (all 6 rounds)
    twin=Expect(200, "every", same_tokens=True, cached=True, same_drafts=False, draft_part=False),
    # 0005 restores the draft too; its rounds are the twin's, not the definition's (measured, not judged: as
    # in drafts_vs_definition, the last digits of some probabilities)
    saving_draft=Expect(200, "every", same_tokens=True, cached=True, draft_part=True),
    definition=Expect(200, "every", same_tokens=True, cached=True, same_drafts=True, draft_part=True),
)
def restore_image_drafts(ctx) -> Result:
    """Conversation A with an image saved to a slot file, conversation B (another image) on the slot, A
    restored and continued: the continuation's output equals the target's alone, it reuses the restored
    prefix, and each of its rounds drafts what a fresh server given A's history as one request drafts."""
    return restore_image_conversation(ctx, "restore_image_drafts")


def restore_image_conversation(ctx, name: str) -> Result:
    """restore_image_drafts's conversation and judgement, on whatever drafter ``ctx.models`` holds."""
    e = ctx.expect(name)
    try:
        with slot_server(ctx, name, verbosity=DEBUG_VERBOSITY) as srv:
            a = ImagePrompt(BEFORE, ctx.image(0), tuple(_tokens(srv, TAIL)))
            ra = _complete(srv, a)
            save = srv.slot_save("a.bin")
            had_part = (srv.options.slot_save_path / "a.bin.draft").exists()
            b = ImagePrompt("<|im_start|>user\nWhat is in this other picture", ctx.image(1), a.after)
            rb = _complete(srv, b)
            restore = srv.slot_restore("a.bin")
            more = a.then((ra.tokens or []) + _tokens(srv, bodies.RESTORE_MORE))
            last = _complete(srv, more)
            facts = server_facts(srv)
        no_draft = without_draft(ctx, name, lambda plain: _complete(plain, more, cache_prompt=False))
    except NotComparable as err:
        return Result(None, False, e.describe(), {"error": str(err)})
    log = srv.log_path.read_text(errors="replace")
    pieces = request_logs(log)
    turn = Turn(more, last, rounds_with_history(pieces[2]) if len(pieces) > 2 else [])
    verdict = judge_rounds(ctx, name, [turn]) if ra.ok and last.ok else None
    cache_n = last.timings.get("cache_n")
    same = last.same_tokens_as(no_draft)
    seen = Seen(
        [ra, rb, last],
        same_tokens=same,
        cached=bool(cache_n),
        restore_status=restore.status,
        same_drafts=_same_drafts(ctx, e, verdict),
        draft_part=had_part,
        holds=save.ok and (verdict is None or verdict["comparable"]),
    )
    out = judged(
        e,
        seen,
        [r.status for r in (ra, save, rb, restore, last)],
        same_tokens_as_no_draft=same if last.ok and no_draft.ok else None,
        cache_n_after_restore=cache_n,
        draft_part=had_part,
        definition=verdict,
        draft=[r.draft_stats for r in (ra, rb, last)],
        **facts,
    )
    if not restore.ok:
        out.details["restore_error"] = restore.error_message
    return out


# -- a speculative checkpoint restored after an image --------------------------------------------------

NGRAM_DRAFT = 8  # the n-gram drafter's draft: longer than the target's rollback (n_rs_seq = --spec-draft-n-max)


@check(
    "spec_checkpoint_image",
    baseline=Expect(500, "any"),
    # the rounds are measured (agree), not judged, without 0007
    twin=Expect(200, "every", same_tokens=True, same_target_rows=True),
    definition=Expect(200, "every", same_tokens=True, same_drafts=True, same_target_rows=True),
)
def spec_checkpoint_image(ctx) -> Result:
    """``--spec-type ngram-simple,<the drafter>``: an n-gram drafter ahead of the DFlash draft, whose drafts
    (eight ids, more than the hybrid target can roll back: its n_rs_seq is --spec-draft-n-max) a rejection
    takes back through the speculative checkpoint (llama-server's ``spec_ckpt``: the target's state loaded,
    both memories trimmed to the checkpoint). After an image, so the draft's row count and the target's
    position differ there. The prompt holds half the vocabulary after the image: an output id found there
    makes the n-gram drafter propose the eight ids that follow it, any other leaves the round to the
    draft. The output must equal the target's alone; the checkpoint must have been restored at least once
    (else the check is blind); and every round the draft drafted is judged as in drafts_vs_definition.

    The target's memory must then hold one row per position, as the target's alone does: the slot saved
    after the request is as large as the no-draft server's. The checkpoint restores only the target's
    recurrent state; its attention rows of the rejected draft leave with the trim alone. Without the trim
    the replayed rows sit beside them at the same positions (``apply_ubatch`` frees no cell for another of
    the same position), which a tiny target's greedy output need not show."""
    e = ctx.expect(name := "spec_checkpoint_image")
    spec = f"ngram-simple,{getattr(ctx.models, 'spec_type', None) or 'draft-dflash'}"
    ngram = ("--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", str(NGRAM_DRAFT))
    ids = list(range(8, 128))
    random.Random(1).shuffle(ids)
    prompt = ImagePrompt("<|im_start|>user\nDescribe", ctx.image(0), tuple(ids[: len(ids) // 2]))
    try:
        with slot_server(ctx, name, verbosity=DEBUG_VERBOSITY, spec_type=spec, extra_args=ngram) as srv:
            r = _complete(srv, prompt, n_predict=2 * bodies.N_PREDICT, cache_prompt=False)
            rows = _saved_size(srv)
            facts = server_facts(srv)
        with slot_server(ctx, name, draft=False) as plain:
            no_draft = _complete(plain, prompt, n_predict=2 * bodies.N_PREDICT, cache_prompt=False)
            rows_no_draft = _saved_size(plain)
    except NotComparable as err:
        return Result(None, False, e.describe(), {"error": str(err)})
    log = srv.log_path.read_text(errors="replace")
    restored = log.count("restoring speculative checkpoint")
    pieces = request_logs(log)
    turn = Turn(prompt, r, rounds_with_history(pieces[0]) if pieces else [])
    verdict = judge_rounds(ctx, name, [turn]) if r.ok else None
    same = r.same_tokens_as(no_draft)
    seen = Seen(
        [r],
        same_tokens=same,
        same_drafts=_same_drafts(ctx, e, verdict),
        same_target_rows=rows is not None and rows == rows_no_draft,
        holds=(restored > 0 or not r.ok) and (verdict is None or verdict["comparable"]),
    )
    return judged(
        e,
        seen,
        r.status,
        same_tokens_as_no_draft=same if r.ok and no_draft.ok else None,
        checkpoints_restored=restored,
        target_slot_bytes=rows,
        target_slot_bytes_no_draft=rows_no_draft,
        definition=verdict,
        draft=r.draft_stats,
        **facts,
    )


def _saved_size(srv) -> int | None:
    """The size of the target's part of the slot ``srv`` saves now (None where the save fails): with the
    same tokens, as large as another server's where its memory holds the same rows."""
    if not srv.slot_save("after.bin").ok:
        return None
    return (srv.options.slot_save_path / "after.bin").stat().st_size
