"""The acceptance conversation as a chat client drives llama-server, and what the server reports of it.

The same seeded turns as the library's (``script.turns_for``), sent to ``/v1/chat/completions`` through
the ``openai`` client with the whole history each time, as a chat client does: a text turn, a turn with an
image, a turn with a second image, then the slot saved, another conversation on it, the slot restored and a
text turn. Each answer's ``timings`` give what the server drafted and had accepted (``draft_n``,
``draft_n_accepted``) and how fast it generated (``predicted_n``, ``predicted_ms``). The server counts per
request, not per drafting round, so a turn is one phase here: the whole turn, not its first rounds.

The prompts are the library's up to the chat template: the server renders the assistant's reply as text
closed by ``<|im_end|>``, where the library's slot holds the generated tokens themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import PyllamaError
from ...harness.server import ServerProcess
from ...harness.server.bodies import image_part
from ...harness.server.client import fresh_slot_folder, openai_client
from ...harness.tiny.image import png_bytes
from .script import turns_for

# a turn's phase, by its place in the conversation (the library's names, for the whole turn)
TURN_PHASES = ("text", "after image", "after second image", "after restore")
SLOT_FILE = "acceptance.bin"


@dataclass(frozen=True)
class TurnResult:
    seed: int
    phase: str
    status: int | None
    drafted: int
    accepted: int
    predicted_n: int
    predicted_ms: float
    reply: str  # the answer's text: with the draft and without, it must be the same
    prompt_ms: float = 0.0  # the prompt's processing (the draft's prefill included): time to first token


class ChatFailed(PyllamaError, RuntimeError):
    """A request of the conversation was not answered with 200 (b11434 answers 500 after an image)."""


def _user(turn) -> dict:
    parts = [image_part(png_bytes(img)) for img in turn.images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": turn.text}]}


@dataclass(frozen=True)
class Completion:
    """What a turn needs of a chat completion: its text and llama-server's ``timings`` (an extra field of
    the answer, beside the OpenAI ones)."""

    content: str
    timings: dict


def ask(srv: ServerProcess, messages: list[dict], n_predict: int, ignore_eos: bool = True) -> Completion:
    """One chat completion through the ``openai`` client, as an operator's client sends it (greedy, the
    slot's prompt cache on, the reply's length fixed unless ``ignore_eos`` is off)."""
    import openai

    client = openai_client(srv.base_url, timeout=300.0, api_key="bench")
    try:
        out = client.chat.completions.create(
            model=srv.models.target.name,
            messages=messages,
            max_tokens=n_predict,
            temperature=0,
            seed=0,
            extra_body={"ignore_eos": ignore_eos, "cache_prompt": True},
        )
    except openai.APIError as e:  # a status (500 after an image on b11434), or no answer at all (its cause)
        why = f"{getattr(e, 'status_code', None)} {str(e)[:300]}" + (f" ({e.__cause__!r})" if e.__cause__ else "")
        raise ChatFailed(f"{srv.binary.parent.name}: {why}") from e
    finally:
        client.close()
    timings = (out.model_extra or {}).get("timings")
    if not isinstance(timings, dict):  # the figures come from there: a server without them measures nothing
        raise ChatFailed(f"{srv.binary.parent.name}: the chat answer has no llama-server timings")
    return Completion(out.choices[0].message.content or "", timings)


def chat_turns(srv: ServerProcess, seed: int, images: bool = True, image_px: int | None = None) -> Iterator[TurnResult]:
    """One conversation on slot 0 of ``srv`` (started with one slot and ``--slot-save-path``), its counted
    turns yielded as they are answered (the save, the other conversation and the restore go with the
    fourth). Raises :class:`ChatFailed` at the first request not answered with 200."""
    turns = turns_for(seed, images, image_px)
    history: list[dict] = []

    def turn(t, phase: str) -> TurnResult:
        history.append(_user(t))
        r = ask(srv, history, t.n_generate)
        history.append({"role": "assistant", "content": r.content})
        tm = r.timings
        return TurnResult(
            seed,
            phase,
            200,  # ask raises on anything else
            int(tm.get("draft_n", 0)),
            int(tm.get("draft_n_accepted", 0)),
            int(tm.get("predicted_n", 0)),
            float(tm.get("predicted_ms", 0.0)),
            r.content,
            float(tm.get("prompt_ms", 0.0)),
        )

    yield turn(turns[0], "text")
    yield turn(turns[1], "after image")
    yield turn(turns[2], "after second image")
    for action in ("save", None, "restore"):
        if action is None:  # another conversation on the slot in between, not counted
            ask(srv, [_user(turns[4])], 8)
            continue
        r = srv.slot_action(action, SLOT_FILE)
        if not r.ok:
            raise ChatFailed(f"slot {action} of {SLOT_FILE}: {r.describe()}")
    yield turn(turns[3], "after restore")


def fresh_slot_dir(work: Path, name: str) -> Path:
    return fresh_slot_folder(work / name.replace(" ", "_"))
