"""What the server checks send: prompts, chat messages with images, the images themselves."""

from __future__ import annotations

import base64
from pathlib import Path

N_PREDICT = 8  # small: the tiny models generate a few tokens per millisecond, real ones do not
PROMPT_TEXT = "Describe this image please"
PROMPT_TAIL = "in a few words"
FOLLOW_UP = "And what colour is it?"
# the tiny target's chat template is ChatML; for a raw /completion prompt we write it out
RAW_IMAGE_PROMPT = "<|im_start|>user\n" + PROMPT_TEXT + "{image}" + PROMPT_TAIL + "<|im_end|>\n<|im_start|>assistant\n"
RAW_TEXT_PROMPT = "<|im_start|>user\n" + PROMPT_TEXT + " " + PROMPT_TAIL + "<|im_end|>\n<|im_start|>assistant\n"
LONG_TEXT = "Tell me a long story about a small robot that learns to paint the sea at night"
SHORT_TEXT = "hi there"

# the restore checks: conversation A, conversation B run on the slot in between, A's continuation
RESTORE_A = "Tell me about the small robot that paints"
RESTORE_B = "A much longer and unrelated conversation about the weather in the mountains over a whole week of rain"
RESTORE_MORE = " and what did it paint next"
SLOT_RESTORE_MORE = " and then"


def image_part(image: bytes) -> dict:
    # mtmd decodes by content; the mime type is only for the data URL to be well formed
    mime = "image/jpeg" if image[:2] == b"\xff\xd8" else "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(image).decode()}}


def image_message(png: bytes, text: str = PROMPT_TEXT) -> dict:
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, image_part(png), {"type": "text", "text": PROMPT_TAIL}],
    }


def two_turn(first: dict, reply: str) -> list[dict]:
    return [first, {"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]


def default_images(models) -> list[bytes]:
    """The images of the models (real ones), else synthetic PNGs: 84 px, a 3x3 grid on the tiny
    qwen2vl projector, a 3-position hole after the image."""
    files = list(getattr(models, "image_files", ()) or ())
    if files:
        return [Path(f).read_bytes() for f in files]
    from pyllama_dflash.harness.tiny.image import png_bytes, rgb

    return [png_bytes(rgb(84, 84, seed)) for seed in range(4)]


def oracle_image(models, images: list[bytes]) -> bytes:
    """The image drafts_vs_twin sends: a given one, else a 168 px square, a 6x6 grid on the tiny
    projector. Its 6-position hole moves the tiny draft's argmax under the zero-fill's rows; the
    3x3 grid of the other checks leaves it where it was (measured), so the oracle would be blind."""
    if getattr(models, "image_files", None):
        return images[0]
    from pyllama_dflash.harness.tiny.image import png_bytes, rgb

    return png_bytes(rgb(168, 168, 0))
