"""The conversation acceptance is measured on, and the phase each drafting round belongs to.

One seeded conversation, on one sequence, as a chat client drives llama-server:

1. a text turn (phase ``text``: before any image);
2. a turn with an image (``after image``: its first rounds; ``later``: the rest);
3. a turn with a second image (``after second image``, then ``later``);
4. the slot is saved, another conversation runs on it, the slot is restored, and a text turn
   follows (``after restore``, then ``later``).

The text-only ceiling is the same conversation with its images left out. The words and images come
from the corpus's drawing (draftmodel.corpus), the distribution the trained drafts learnt.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..draftmodel.corpus import Turn, draw_turns, user_text
from ..scenarios.session import Session

PHASES = ("text", "after image", "later", "after second image", "after restore")
FIRST_ROUNDS = 2  # the rounds of a turn that count as "after" its image or restore
N_GENERATE = 24  # tokens per reply


@dataclass(frozen=True)
class RoundResult:
    seed: int
    phase: str
    drafted: int
    accepted: int


def turns_for(seed: int, images: bool = True) -> list[Turn]:
    """The conversation's four turns: text, image, image, text (and the interlude's)."""
    drawn = draw_turns(seed, n_turns=5, n_generate=N_GENERATE)
    text = [t.text for t in drawn]
    pics = [t.images for t in drawn]
    keep = (lambda ims: ims) if images else (lambda ims: ())
    return [
        Turn(text[0], (), N_GENERATE),
        Turn(text[1], keep(pics[1]), N_GENERATE),
        Turn(text[2], keep(pics[2]), N_GENERATE),
        Turn(text[3], (), N_GENERATE),
        Turn(text[4], (), N_GENERATE),  # the other conversation that runs on the slot in between
    ]


def run_conversation(s: Session, seed: int, out: list[RoundResult], images: bool = True, restore: bool = True) -> None:
    """Drive the conversation through a session's slot loop (sequence 0), its rounds added to ``out``
    by phase as they run (a conversation the variant fails keeps the rounds before the failure).
    Without ``restore`` it ends after the third turn."""
    turns = turns_for(seed, images)
    marker = s.projector.marker if s.projector is not None else ""

    def turn(t: Turn, after: str | None, step: str) -> None:
        s.prompt(0, user_text(t, marker), list(t.images), step=step)
        start = len(s.record.rounds)
        s.generate(0, t.n_generate, step=f"{step} reply")
        for k, r in enumerate(s.record.rounds[start:]):
            phase = "text" if after is None else after if k < FIRST_ROUNDS else "later"
            out.append(RoundResult(seed, phase, r.drafted, r.accepted))

    turn(turns[0], None, "turn 1")
    # phases by the turn's place, images or not: the text-only ceiling's rounds line up with them
    turn(turns[1], "after image", "turn 2")
    turn(turns[2], "after second image", "turn 3")
    if not restore:
        return
    saved = s.save_slot(0)
    interlude = len(s.record.rounds)
    s.rewind(0, 0, step="another conversation")
    s.prompt(0, user_text(turns[4], marker), step="another conversation")
    s.generate(0, 8, step="another conversation reply")
    del s.record.rounds[interlude:]  # not this conversation's
    s.restore_slot(0, saved)
    turn(turns[3], "after restore", "turn 4")
