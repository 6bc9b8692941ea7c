"""Conversations the target is trained on and served: prose chats, captions, and both mixed.

A conversation is a list of turns; a turn is a user message (optionally led by an image, the
way llama-server renders an OpenAI image part: the media marker, then the text with no newline
between) and the assistant's reply. Rendered with the chat template, it becomes one row per
token or image row, each with its M-RoPE position (forward.py), and a loss weight that is 1 on
the reply's tokens and on the ``<|im_end|>`` that ends it.

The shapes follow what the bench serves: ``prose`` (one question, one paragraph), ``caption``
(an image and what it shows) and ``mixed`` (text, an image, text, a second image).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .forward import image_positions, text_positions
from .prose import Paragraph
from .scenes import SIDE_FOR_ROWS, Scene, draw_scene
from .vocab import IM_END, IM_START, VISION_END, VISION_START, VOCAB

CAPTION_QUESTION = "What is in the picture?"
MIXED_REPLY = 160  # characters of a mixed conversation's prose replies, at most about


def _first_sentences(text: str, limit: int) -> str:
    end = text.find(". ", limit // 3)
    return text if end < 0 or end > limit else text[: end + 1]


@dataclass(frozen=True)
class Image:
    scene: Scene
    side: int  # pixels each way: SIDE_FOR_ROWS gives the row counts
    seed: int

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        return (self.scene.colour, self.scene.shape, self.scene.place, self.side, self.seed)

    def pixels(self) -> np.ndarray:
        return self.scene.render(self.side, self.seed)


@dataclass(frozen=True)
class Turn:
    user: str
    reply: str
    image: Image | None = None


def prose_turn(p: Paragraph) -> Turn:
    return Turn(f"Tell me about {p.subject}.", p.text)


def caption_turn(image: Image) -> Turn:
    return Turn(CAPTION_QUESTION, f"I see {image.scene.caption()}.", image)


def draw_conversation(
    kind: str, rng: np.random.Generator, paragraphs: Sequence[Paragraph], rows: int, seeds: Sequence[int]
) -> list[Turn]:
    """One conversation of ``kind``; its images have ``rows`` rows each and one of ``seeds``. A mixed
    conversation's paragraphs are cut to their first sentences, so its two images fit the window."""
    side = SIDE_FOR_ROWS[rows]

    def image() -> Image:
        return Image(draw_scene(rng), side, int(seeds[int(rng.integers(len(seeds)))]))

    def prose(limit: int | None = None) -> Turn:
        p = paragraphs[int(rng.integers(len(paragraphs)))]
        return prose_turn(Paragraph(p.subject, _first_sentences(p.text, limit)) if limit else p)

    if kind == "prose":
        return [prose()]
    if kind == "caption":
        return [caption_turn(image())]
    if kind == "mixed":
        return [prose(MIXED_REPLY), caption_turn(image()), prose(MIXED_REPLY), caption_turn(image())]
    raise ValueError(f"unknown conversation kind {kind!r} (known: prose, caption, mixed)")


@dataclass
class Rendered:
    """One conversation as the target reads it: a row per token or image row."""

    tokens: np.ndarray  # [n] int32; -1 at an image row
    image_rows: list[tuple[int, Image]]  # (first row, image) for each image, in order
    pos: np.ndarray  # [4, n] int32
    weight: np.ndarray  # [n] float32: 1 where the *next* row is a reply token to learn

    @property
    def n(self) -> int:
        return len(self.tokens)


def render(turns: Sequence[Turn], grid: dict[int, tuple[int, int]] | None = None) -> Rendered:
    """The rows of ``turns`` under the chat template. ``grid`` maps an image side to its (nx, ny);
    by default a square side/28 grid, which is what mtmd makes of the sides in SIDE_FOR_ROWS."""
    tokens: list[int] = []
    pos: list[np.ndarray] = []
    learn: list[bool] = []
    images: list[tuple[int, Image]] = []
    n_pos = 0

    def text(ids: list[int], reply: bool = False) -> None:
        nonlocal n_pos
        tokens.extend(ids)
        pos.append(text_positions(len(ids), n_pos))
        learn.extend([reply] * len(ids))
        n_pos += len(ids)

    for turn in turns:
        text([IM_START, *VOCAB.encode("user\n")])
        if turn.image is not None:
            text([VISION_START])
            nx, ny = (grid or {}).get(turn.image.side, (turn.image.side // 28, turn.image.side // 28))
            images.append((len(tokens), turn.image))
            tokens.extend([-1] * (nx * ny))
            pos.append(image_positions(nx, ny, n_pos))
            learn.extend([False] * (nx * ny))
            n_pos += max(nx, ny)
            text([VISION_END])
        text([*VOCAB.encode(turn.user), IM_END, *VOCAB.encode("\n"), IM_START, *VOCAB.encode("assistant\n")])
        text([*VOCAB.encode(turn.reply), IM_END], reply=True)
        text(VOCAB.encode("\n"))
    arr = np.array(tokens, np.int32)
    weight = np.zeros(len(arr), np.float32)
    weight[:-1] = np.array(learn[1:], np.float32)  # row i learns the token at i + 1
    return Rendered(arr, images, np.concatenate(pos, axis=1).astype(np.int32), weight)


def prompt_text(turns: Sequence[Turn], marker: str) -> str:
    """The same conversation as the text llama-server renders, images as ``marker``."""
    out = []
    for turn in turns:
        media = marker if turn.image is not None else ""
        out.append(f"<|im_start|>user\n{media}{turn.user}<|im_end|>\n<|im_start|>assistant\n{turn.reply}<|im_end|>\n")
    return "".join(out)
