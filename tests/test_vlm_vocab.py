"""The character vocabulary: a reply comes back as its tokens, through the library and llama-server.

The same checks fail on the random tiny models' ``test`` vocabulary, whose detokenizer prints ids in
hex: the reason the trained target has a vocabulary of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllama_dflash.harness.server.server_process import ServerOptions, serve
from pyllama_dflash.harness.tiny.image import png_bytes
from pyllama_dflash.lab.vlm.config import TOY
from pyllama_dflash.lab.vlm.corpus import CAPTION_QUESTION
from pyllama_dflash.lab.vlm.judge import held_out_images
from pyllama_dflash.lab.vlm.roundtrip import library_text_round_trip, server_chat_round_trip, server_text_round_trip
from pyllama_dflash.lab.vlm.vocab import IM_END, SPECIALS, VOCAB
from pyllama_dflash.lab.vlm.weights import init_params, write_target
from pyllama_dflash.product import api

COMMITTED = Path(__file__).parent / "data" / "vlm"
TEXTS = (
    "Hello, world!",
    'The "assert" statement\n\tis  a    statement.',
    "naïve café, 10°C; “quotes” — and ß",
    "a red circle at the top",
    "  leading and trailing  ",
    "<|im_end|> is text here, not a token",
)


@pytest.fixture(scope="module")
def toy_target(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vlm") / "toy.gguf"
    write_target(path, TOY, init_params(TOY, 0), name="toy")
    return path


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\u2581"), max_size=80))
def test_text_round_trips_through_the_python_tokenizer(text):
    assert VOCAB.decode(VOCAB.encode(text)) == text


@settings(max_examples=300)
@given(st.lists(st.integers(len(SPECIALS), VOCAB.n_vocab - 1), max_size=40))
def test_every_token_sequence_that_prints_utf8_re_tokenizes_to_itself(ids):
    raw = VOCAB.decode_bytes(ids)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return  # a server could not send it as text either; the trained target never writes a split byte
    if "\u2581" in text:
        return  # SPM reads a literal ▁ as a space: the one character that is not its own token
    assert VOCAB.encode(text) == ids


def test_llama_cpp_tokenizes_as_the_python_tokenizer(lib_dir, toy_target):
    with api.Model(toy_target) as model:
        assert model.n_vocab == VOCAB.n_vocab
        for text in (*TEXTS, "a\u2581b"):  # SPM reads a literal ▁ as the space it escapes to
            assert [int(t) for t in model.tokenize(text)] == VOCAB.encode(text), text
        chat = "<|im_start|>user\nhi<|im_end|>\n"
        assert [int(t) for t in model.tokenize(chat, parse_special=True)] == [
            SPECIALS.index("<|im_start|>"),
            *VOCAB.encode("user\nhi"),
            IM_END,
            *VOCAB.encode("\n"),
        ]


def test_library_round_trip_holds_for_characters_and_fails_for_the_test_vocabulary(lib_dir, toy_target, models):
    with api.Model(toy_target) as model:
        assert library_text_round_trip(model, TEXTS) == []
    with api.Model(models.target) as model:
        assert len(library_text_round_trip(model, TEXTS)) == len(TEXTS)


@dataclass(frozen=True)
class _Served:
    target: Path
    mmproj: Path | None = None
    draft: Path | None = None


def _bench_chats(n: int) -> list[list]:
    """Conversations of the bench's shape (text, an image, text, a second image), held-out topics and images."""
    images = held_out_images(4 * n, 64)
    topics = ("assert", "lambda", "the with statement", "classes", "exceptions", "modules")
    return [
        [
            f"Tell me about {topics[(2 * k) % len(topics)]}.",
            (CAPTION_QUESTION, png_bytes(images[4 * k].pixels())),
            f"Tell me about {topics[(2 * k + 1) % len(topics)]}.",
            (CAPTION_QUESTION, png_bytes(images[4 * k + 3].pixels())),
        ]
        for k in range(n)
    ]


@pytest.mark.server
def test_the_bench_chats_through_llama_server_re_tokenize_every_reply_to_its_tokens(variants):
    served = _Served(COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf")
    with serve("baseline", served, ServerOptions(draft=False, n_ctx=4096)) as srv:
        assert server_text_round_trip(srv, TEXTS) == []
        for chat in _bench_chats(3):
            assert server_chat_round_trip(srv, chat, im_end=IM_END, n_predict=96) == []


@pytest.mark.server
def test_the_test_vocabulary_fails_the_same_checks_through_llama_server(variants, models):
    with serve("baseline", _Served(models.target, models.mmproj), ServerOptions(draft=False, n_ctx=1024)) as srv:
        assert len(server_text_round_trip(srv, TEXTS)) == len(TEXTS)
        assert server_chat_round_trip(srv, _bench_chats(1)[0], im_end=5, n_predict=24) != []
