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
