"""The dummy "test" tokenizer keys, shared by target and draft (same vocab)."""

from __future__ import annotations

from typing import Any

from .config import TinyConfig


def add_test_vocab(w: Any, cfg: TinyConfig, *, chat_template: bool) -> None:
    # llama.cpp's "test" vocab: text is cut into 5-byte chunks, each chunk becomes
    # (polynomial hash, base 31) % n_vocab; special tokens are matched by their text
    w.add_tokenizer_model("test")
    w.add_token_list(cfg.tokens())
    w.add_token_types(cfg.token_types())
    w.add_bos_token_id(cfg.bos_id)
    w.add_eos_token_id(cfg.eos_id)
    w.add_mask_token_id(cfg.mask_id)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(cfg.chat_template)


def tokenize_test_vocab(text: str, n_vocab: int = 128) -> list[int]:
    """What llama.cpp's "test" vocab makes of plain text (no special tokens, no BOS)."""
    data = text.encode()
    out = []
    for i in range(0, len(data), 5):
        h = 0
        for b in data[i : i + 5]:
            h = (h * 31 + b) & 0xFFFFFFFFFFFFFFFF  # uint64 wrap-around, as in C++
        out.append(h % n_vocab)
    return out


def _test_vocab_chunks(n_vocab: int) -> dict[int, str]:
    """For every token id, five lowercase letters the "test" vocab turns into that id."""
    import itertools
    import string

    out: dict[int, str] = {}
    for letters in itertools.product(string.ascii_lowercase, repeat=5):
        text = "".join(letters)
        out.setdefault(tokenize_test_vocab(text, n_vocab)[0], text)
        if len(out) == n_vocab:
            return out
    raise ValueError(f"no five-letter chunk for some of the {n_vocab} ids")  # pragma: no cover


_CHUNKS: dict[int, dict[int, str]] = {}


def text_for_test_vocab(tokens: list[int], n_vocab: int = 128) -> str:
    """Text the "test" vocab tokenizes into exactly ``tokens`` (the inverse of :func:`tokenize_test_vocab`,
    which llama.cpp's detokenizer is not: it prints ids in hex). Five lowercase letters per token, so the
    text must start a raw fragment at a multiple of five bytes (after a special token, or alone); it holds
    no special token's text. Control ids too come out of a five-byte chunk whose hash is theirs."""
    if n_vocab not in _CHUNKS:
        _CHUNKS[n_vocab] = _test_vocab_chunks(n_vocab)
    chunks = _CHUNKS[n_vocab]
    return "".join(chunks[t] for t in tokens)
