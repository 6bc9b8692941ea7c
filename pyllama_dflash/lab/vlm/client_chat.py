"""A three-turn chat with two images through the ``openai`` client, as an operator's program sends it.

Text first, then an image and its question, then a second image: the trained target's greedy replies,
each ended by its own ``<|im_end|>``. Run once on a server with a draft and once without, the replies
must be the same (speculative decoding never changes greedy output), and the captions must name what
the images show.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import PyllamaError
from ...harness.server.bodies import image_part
from ...harness.server.client import openai_client
from ...harness.tiny.image import png_bytes
from .corpus import CAPTION_QUESTION, Image

FIRST_QUESTION = "Tell me about the assert statement."


class ChatRefused(PyllamaError, RuntimeError):
    """A request was not answered with 200: its status and message."""

    def __init__(self, turn: int, status: int | None, message: str) -> None:
        self.turn, self.status = turn, status
        super().__init__(f"turn {turn}: HTTP {status}: {message[:300]}")


def three_turns(base_url: str, model: str, images: Sequence[Image], max_tokens: int = 160) -> list[str]:
    """The replies to a text turn and one caption question per image, each turn carrying the history."""
    import openai

    client = openai_client(base_url, timeout=300.0)
    history: list[dict] = []
    replies = []
    turns = [(FIRST_QUESTION, None), *((CAPTION_QUESTION, im) for im in images)]
    try:
        for k, (text, image) in enumerate(turns, start=1):
            content = text if image is None else [image_part(png_bytes(image.pixels())), {"type": "text", "text": text}]
            history.append({"role": "user", "content": content})
            try:
                out = client.chat.completions.create(
                    model=model, messages=history, max_tokens=max_tokens, temperature=0, seed=0
                )
            except openai.APIError as e:
                raise ChatRefused(k, getattr(e, "status_code", None), str(e)) from e
            reply = out.choices[0].message.content or ""
            history.append({"role": "assistant", "content": reply})
            replies.append(reply)
    finally:
        client.close()
    return replies
