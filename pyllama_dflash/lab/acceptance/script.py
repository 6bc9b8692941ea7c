"""The conversation acceptance is measured on, and the phase each drafting round belongs to.

One seeded conversation, on one sequence, as a chat client drives llama-server:

1. a text turn (phase ``text``: before any image);
2. a turn with an image (``after image``: its first rounds; ``later``: the rest);
3. a turn with a second image (``after second image``, then ``later``);
4. the slot is saved, another conversation runs on it, the slot is restored, and a text turn
   follows (``after restore``, then ``later``).

The text-only ceiling is the same conversation with its images left out. The words and images come
from the corpus's drawing (draftmodel.corpus), the distribution the trained drafts learnt; an image
size (``image_px``) replaces the drawn images by ones of that size, seeded alike.

Two ways to drive the replies: round by round, as llama-server serves them (each column's rounds fall
on its own tokens), or paired (``Session.generate_paired``): the draft drafts at every position of the
target's reply from the target's own history, and the accepted length at that position is the
measure, so every column is judged on the same tokens. A paired position's phase goes by its index in
the reply: the first ``FIRST_POSITIONS`` after an image or a restore, ``later`` after them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ...errors import PyllamaError
from ...harness.slotloop import Session
from ...harness.tiny.image import rgb
from ..draftmodel.corpus import Turn, draw_turns, user_text

PHASES = ("text", "after image", "later", "after second image", "after restore", "later after restore")
FIRST_ROUNDS = 2  # the rounds of a turn that count as "after" its image or restore
N_GENERATE = 24  # tokens per reply
FIRST_POSITIONS = 8  # a paired reply's positions that count as "after" its image or restore
# the image sizes of the paired table: 8x8, 16x16 and 32x32 merged tokens through the tiny qwen2vl projector
IMAGE_ROWS_PX = {64: 224, 256: 448, 1024: 896}
T = TypeVar("T")
_END = object()  # an iterator's end, for side_by_side


@dataclass(frozen=True)
class RoundResult:
    seed: int
    phase: str
    drafted: int
    accepted: int
    index: int = -1  # paired: the anchor's index in its reply (-1: a round as llama-server serves it)
    turn: str = ""  # paired: what the reply follows (``text``, ``after image``, ...), its phase at index 0


def turns_for(seed: int, images: bool = True, image_px: int | None = None) -> list[Turn]:
    """The conversation's four turns: text, image, image, text (and the interlude's)."""
    drawn = draw_turns(seed, n_turns=5, n_generate=N_GENERATE)
    text = [t.text for t in drawn]
    pics = [t.images for t in drawn]
    if image_px is not None:  # the drawn images' place and seed, at that size
        pics = [(rgb(image_px, image_px, seed=seed * 8 + k),) for k in range(len(drawn))]
    keep = (lambda ims: ims) if images else (lambda ims: ())
    return [
        Turn(text[0], (), N_GENERATE),
        Turn(text[1], keep(pics[1]), N_GENERATE),
        Turn(text[2], keep(pics[2]), N_GENERATE),
        Turn(text[3], (), N_GENERATE),
        Turn(text[4], (), N_GENERATE),  # the other conversation that runs on the slot in between
    ]


TRAINING_IMAGE_PX = (IMAGE_ROWS_PX[64], IMAGE_ROWS_PX[256])  # 1024 rows: see draftmodel.__main__


def training_turns(seed: int, with_images: bool) -> list[Turn]:
    """A training conversation shaped as the bench's: its four turns (a restore that restores the draft
    changes nothing the draft sees, so the fourth turn follows the third), each image turn keeping its
    image with probability 0.5 (text after no image is in distribution too), of 64 or 256 rows at even odds."""
    rng = np.random.default_rng([seed, 11])
    turns = turns_for(seed)[:4]
    out = []
    for k, t in enumerate(turns):
        px = int(rng.choice(TRAINING_IMAGE_PX))
        keep = with_images and k in (1, 2) and rng.random() < 0.5
        out.append(Turn(t.text, (rgb(px, px, seed=seed * 8 + k),) if keep else (), t.n_generate))
    return out


def phase_of(after: str | None, k: int, first: int) -> str:
    """The phase of a turn's k-th round or position: ``text`` before any image, ``after`` for its
    first ones, and ``later`` after them (past a restore, ``later after restore``: a draft restored
    with the slot and one that was not hold different rows there)."""
    if after is None:
        return "text"
    if k < first:
        return after
    return "later after restore" if after == "after restore" else "later"


def paired_results(seed: int, after: str | None, reply: list[int], rounds: list, n_max: int) -> list[RoundResult]:
    """A paired reply's positions judged on the target's tokens: ``reply`` is the anchor of its first
    position followed by the tokens generated; positions whose next ``n_max`` tokens are all in the reply."""
    out = []
    for i, r in enumerate(rounds[: len(reply) - n_max]):
        truth = reply[i + 1 : i + 1 + n_max]
        k = 0
        while k < min(len(r.tokens), n_max) and r.tokens[k] == truth[k]:
            k += 1
        out.append(RoundResult(seed, phase_of(after, i, FIRST_POSITIONS), n_max, k, index=i, turn=after or "text"))
    return out


def _timed_turn(seed: int, after: str | None, times: tuple[float, float, float], reply: list[int], rounds) -> dict:
    """A turn much as llama-server's ``timings`` count it (the served table's keys): ``times`` are the
    prompt's start, the reply's start and its end (perf_counter seconds); ``reply``, the tokens generated
    after the first, which the prompt's last decode sampled (the server counts that one in its reply)."""
    return {
        "seed": seed,
        "phase": after or "text",
        "prompt_ms": (times[1] - times[0]) * 1e3,
        "predicted_n": len(reply),
        "predicted_ms": (times[2] - times[1]) * 1e3,
        "drafted": sum(r.drafted for r in rounds),
        "accepted": sum(r.accepted for r in rounds),
        "generated": reply,  # with the draft and without, it must be the same
    }


@dataclass(frozen=True)
class Plan:
    """A conversation as the script drives it: each turn with what it follows (None: nothing, the
    ``text`` phase), the other conversation that runs on the slot between the save and the restore (before
    the turn that follows ``after restore``), and how a reply ends: at ``stop`` (a chat's end of turn), or
    after its ``n_generate`` tokens, the next prompt then written on as ``after_stop`` or ``after_cut``."""

    turns: tuple[tuple[str | None, Turn], ...]
    interlude: Turn
    stop: int | None = None
    after_stop: str = ""
    after_cut: str = ""


def tiny_plan(seed: int, images: bool = True, image_px: int | None = None) -> Plan:
    """The bench's conversation on the tiny corpus: text, an image, a second image, a restore."""
    t = turns_for(seed, images, image_px)
    return Plan(((None, t[0]), ("after image", t[1]), ("after second image", t[2]), ("after restore", t[3])), t[4])


def run_conversation(s: Session, seed: int, out: list[RoundResult], **how) -> None:
    """The whole conversation at once; ``how``: :func:`conversation`'s keywords."""
    for _ in conversation(s, seed, out, **how):
        pass


def conversation(
    s: Session,
    seed: int,
    out: list[RoundResult],
    images: bool = True,
    restore: bool = True,
    paired: bool = False,
    image_px: int | None = None,
    replies: list[list[int]] | None = None,
    timings: list[dict] | None = None,
    plan: Plan | None = None,
) -> Iterator[None]:
    """Drive the conversation (``plan``; by default the tiny corpus's, :func:`tiny_plan`) through a
    session's slot loop (sequence 0), a counted turn per step (the save, the other conversation and the
    restore go with the turn after them), its rounds (or, ``paired``, its positions) added to ``out`` by
    phase as they run (a conversation the variant fails keeps the ones before the failure), and each
    reply's tokens to ``replies``. Without ``restore`` it ends before the restore. ``timings`` gets each
    turn much as llama-server's ``timings`` count it, phase by the turn's place (chat.TURN_PHASES): its
    prompt's wall time (``prompt_ms``, the draft's part included) and its reply's (``predicted_n`` tokens
    in ``predicted_ms``), with the reply and what it drafted and had accepted."""
    plan = plan or tiny_plan(seed, images, image_px)
    marker = s.projector.marker if s.projector is not None else ""
    last_reply: list[int] = []

    def written_on() -> str:
        if not last_reply:
            return ""
        return plan.after_stop if plan.stop is not None and last_reply[-1] == plan.stop else plan.after_cut

    def turn(t: Turn, after: str | None, step: str) -> None:
        t0 = time.perf_counter()
        s.prompt(0, written_on() + user_text(t, marker), list(t.images), step=step)
        t1 = time.perf_counter()
        start = len(s.record.rounds)
        anchor = s.seqs[0].id_last
        if paired:
            reply = [anchor, *s.generate_paired(0, t.n_generate, step=f"{step} reply", stop=plan.stop)]
            out.extend(paired_results(seed, after, reply, s.record.rounds[start:], s.cfg.n_max))
        else:
            reply = [anchor, *s.generate(0, t.n_generate, step=f"{step} reply")]
            for k, r in enumerate(s.record.rounds[start:]):
                out.append(RoundResult(seed, phase_of(after, k, FIRST_ROUNDS), r.drafted, r.accepted))
        if timings is not None:
            timings.append(_timed_turn(seed, after, (t0, t1, time.perf_counter()), reply[1:], s.record.rounds[start:]))
        if replies is not None:
            replies.append(reply)
        last_reply[:] = reply[1:]

    # phases by the turn's place, images or not: the text-only ceiling's rounds line up with them
    for k, (after, t) in enumerate(plan.turns):
        if after == "after restore":
            if not restore:
                return
            _other_conversation_between(s, plan.interlude, marker)
        turn(t, after, f"turn {k + 1}")
        yield


def _other_conversation_between(s: Session, other: Turn, marker: str) -> None:
    """Save the slot, run another conversation on it (its rounds not this conversation's), restore it."""
    saved = s.save_slot(0)
    interlude = len(s.record.rounds)
    s.rewind(0, 0, step="another conversation")
    s.prompt(0, user_text(other, marker), list(other.images), step="another conversation")
    s.generate(0, 8, step="another conversation reply")  # drafted round by round either way
    del s.record.rounds[interlude:]  # not this conversation's
    s.restore_slot(0, saved)


class WithoutDraftFailed(PyllamaError, RuntimeError):
    """The run of a conversation without the draft failed: the harness's failure, not the draft's."""


def side_by_side(drafted: Iterator[T], plain: Iterator[T], conversation_index: int) -> Iterator[tuple[T, T]]:
    """One conversation with the draft and without it, a turn at a time: each step runs one turn of each
    side, the side that goes first alternating with the turn and the conversation (A B, B A, ...), so that
    the machine's drift weighs on both sides alike (run whole, one side after the other, the two sides
    of a turn are a minute apart). The draft's side raises what it raises (what llama-server answers
    with 500 after an image); a failure without the draft is raised as :class:`WithoutDraftFailed`.
    Both sides are closed when this ends, the other one's turns left unrun."""

    def step(side: Iterator[T], without_draft: bool, turn: int) -> object:
        if not without_draft:
            return next(side, _END)
        try:
            return next(side, _END)
        except Exception as e:
            raise WithoutDraftFailed(f"the conversation without the draft failed at turn {turn + 1}: {e}") from e

    try:
        for turn in itertools.count():
            first_drafted = (turn + conversation_index) % 2 == 0
            order = ((drafted, False), (plain, True)) if first_drafted else ((plain, True), (drafted, False))
            got = [step(side, without_draft, turn) for side, without_draft in order]
            ended = [g is _END for g in got]
            if any(ended):
                if not all(ended):
                    raise RuntimeError(f"side_by_side: one side ended at turn {turn + 1}, the other not")
                return
            yield (got[0], got[1]) if first_drafted else (got[1], got[0])
    finally:
        for side in (drafted, plain):
            close = getattr(side, "close", None)
            if close is not None:
                close()
