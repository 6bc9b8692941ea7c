"""Does a reply come back as its tokens? The checks, through the library and through llama-server.

- **text**: text -> tokens -> text -> tokens gives the same text and the same tokens;
- **chat**: in a multi-turn chat, the prompt of every later turn tokenizes to the earlier prompt,
  then exactly the tokens the server generated for the reply, then ``<|im_end|>``.

Each returns its mismatches (empty: the round trip holds), so a test can also show that the
``test`` vocabulary of the random tiny models fails them.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mismatch:
    where: str
    text: str
    detail: str


def library_text_round_trip(model: Any, texts: Sequence[str]) -> list[Mismatch]:
    """Through ``api.Model`` (llama_tokenize and the token pieces)."""
    out = []
    for text in texts:
        ids = [int(t) for t in model.tokenize(text, add_special=False, parse_special=False)]
        back = model.detokenize(ids)
        again = [int(t) for t in model.tokenize(back, add_special=False, parse_special=False)]
        if back != text or again != ids:
            out.append(Mismatch("library", text, f"{len(ids)} ids -> {back[:60]!r} -> {len(again)} ids"))
    return out


def server_text_round_trip(client: Any, texts: Sequence[str]) -> list[Mismatch]:
    """Through ``POST /tokenize`` and ``POST /detokenize``."""
    out = []
    for text in texts:
        ids = client.tokenize(text, add_special=False, parse_special=False)
        back = client.detokenize(ids)
        again = client.tokenize(back, add_special=False, parse_special=False)
        if back != text or again != ids:
            out.append(Mismatch("server", text, f"{len(ids)} ids -> {back[:60]!r} -> {len(again)} ids"))
    return out


Question = str | tuple[str, bytes]  # a text, or a text and an image (PNG bytes) before it


def server_chat_round_trip(
    client: Any, questions: Sequence[Question], *, im_end: int, n_predict: int = 48
) -> list[Mismatch]:
    """A chat of ``questions``, greedy, through ``/apply-template``, ``/completion`` and ``/tokenize``:
    each turn's prompt must hold the previous prompt, the reply's generated tokens and ``<|im_end|>``.
    An image is sent as llama-server's chat sends it (its media marker in the rendered prompt, its bytes
    beside); ``/tokenize`` reads a marker as text, alike in both prompts compared."""
    out: list[Mismatch] = []
    images: list[bytes] = []
    messages = [_user(questions[0], images)]
    prompt = _rendered(client, messages)
    for turn, follow_up in enumerate([*questions[1:], "Thank you."], start=1):
        body = {"prompt_string": prompt, "multimodal_data": [base64.b64encode(b).decode() for b in images]}
        reply = _ok(client.completion(body if images else prompt, n_predict=n_predict), "POST /completion")
        generated = [int(t) for t in reply.tokens if int(t) != im_end]
        before = client.tokenize(prompt, add_special=False, parse_special=True)
        messages += [{"role": "assistant", "content": reply.content}, _user(follow_up, images)]
        prompt = _rendered(client, messages)
        after = client.tokenize(prompt, add_special=False, parse_special=True)
        want = before + generated + [im_end]
        if after[: len(want)] != want:
            first = next((i for i, (a, b) in enumerate(zip(after, want, strict=False)) if a != b), len(after))
            row = first - len(before)
            detail = f"turn {turn}: {len(generated)} generated tokens re-tokenize otherwise from reply row {row}"
            out.append(Mismatch("chat", reply.content, detail))
    return out


def _user(question: Question, images: list[bytes]) -> dict:
    if isinstance(question, str):
        return {"role": "user", "content": question}
    text, png = question
    images.append(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def _rendered(client: Any, messages: list[dict], generation: bool = True) -> str:
    r = _ok(
        client.post("/apply-template", {"messages": messages, "add_generation_prompt": generation}, 30.0),
        "POST /apply-template",
    )
    return r.body["prompt"]


def _ok(r: Any, call: str) -> Any:
    if not r.ok:
        raise RuntimeError(f"{call}: HTTP {r.status}: {r.error_message}")
    return r
