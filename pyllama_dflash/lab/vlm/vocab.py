"""The character vocabulary: one token per character, so that a reply comes back as its tokens.

Why characters and not a small BPE: with subwords, text -> tokens is a function but tokens -> text
is not injective (``t`` + ``he`` and ``the`` print the same), so a reply the model wrote in a
non-canonical split re-tokenizes into other tokens on the next turn. With one token per character
(and one byte token per byte no character token covers) every token sequence that prints valid
UTF-8 re-tokenizes to itself. b11434's byte-level BPE with the ``default`` pre-tokenizer would
also clean spaces before punctuation on detokenize (``clean_spaces``, src/llama-vocab.cpp), which
loses text. The price: a text is about four times as many tokens as with a subword vocabulary, and
a character is easier to predict than a subword, so acceptance here runs higher than a subword
draft's would at the same model quality.

The tokenizer is llama.cpp's SPM (``tokenizer.ggml.model = llama``), which turns a space into
``▁`` and looks every character up; a character with no token falls back to its UTF-8 bytes as
``<0xXX>`` tokens. So the vocabulary holds: the specials, a byte token for every byte that no
character token covers (controls, newline, DEL, and every byte of a non-ASCII character), ``▁``,
and the printable ASCII characters. No two-character token exists, so SPM's merges never fire.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

# gguf TokenType values (gguf-py constants.TokenType)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
SPACE = "\u2581"  # SPM's escaped space

# The ids the tiny models' ``test`` vocabulary uses too, so mtmd and the chat template see the same
# specials: mtmd wraps a qwen2vl image in <|vision_start|> ... <|vision_end|>.
SPECIALS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "<|mask|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
)
UNK, BOS, EOS, MASK, IM_START, IM_END, VISION_START, VISION_END = range(len(SPECIALS))

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def _printable() -> list[str]:
    return [chr(c) for c in range(0x21, 0x7F)]


def _byte_only() -> list[int]:
    """Bytes no character token covers: they are reached only through their <0xXX> token."""
    covered = {ord(c) for c in _printable()} | {0x20}  # a space is escaped to ▁ before the look-up
    return [b for b in range(256) if b not in covered]


@dataclass(frozen=True)
class CharVocab:
    """The vocabulary's tokens in id order, their types, and a Python tokenizer that does what
    b11434's SPM tokenizer does with them (held to it by the tests)."""

    @cached_property
    def tokens(self) -> tuple[str, ...]:
        return (*SPECIALS, *(f"<0x{b:02X}>" for b in _byte_only()), SPACE, *_printable())

    @cached_property
    def token_types(self) -> tuple[int, ...]:
        types = [UNKNOWN if t == "<unk>" else CONTROL for t in SPECIALS]
        types += [BYTE] * len(_byte_only())
        types += [NORMAL] * (1 + len(_printable()))
        return tuple(types)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @cached_property
    def _char_id(self) -> dict[str, int]:
        first = len(SPECIALS) + len(_byte_only())
        ids = {" ": first}
        ids.update((c, first + 1 + i) for i, c in enumerate(_printable()))
        return ids

    @cached_property
    def _byte_id(self) -> dict[int, int]:
        return {b: len(SPECIALS) + i for i, b in enumerate(_byte_only())}

    @cached_property
    def _piece(self) -> dict[int, bytes]:
        pieces = {i: c.encode() for c, i in self._char_id.items()}
        pieces.update((i, bytes([b])) for b, i in self._byte_id.items())
        return pieces

    def encode(self, text: str) -> list[int]:
        """Plain text (no special tokens parsed) to ids, as llama.cpp's SPM tokenizer does with
        ``add_space_prefix`` and BOS off. A literal ``▁`` is the space's token, as SPM reads it: the
        one character that does not come back as itself."""
        out: list[int] = []
        for ch in text:
            token = self._char_id.get(" " if ch == SPACE else ch)
            if token is not None:
                out.append(token)
            else:
                out.extend(self._byte_id[b] for b in ch.encode())
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """What llama.cpp's detokenizer prints for ``ids``, specials as their text."""
        return b"".join(self._piece.get(i, self.tokens[i].encode()) for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def add_to_gguf(self, w: Any) -> None:
        """The tokenizer keys of a target (and of its drafts: the same vocabulary)."""
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(list(self.tokens))
        w.add_token_scores([0.0] * self.n_vocab)
        w.add_token_types(list(self.token_types))
        w.add_unk_token_id(UNK)
        w.add_bos_token_id(BOS)
        w.add_eos_token_id(EOS)
        w.add_mask_token_id(MASK)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
        w.add_chat_template(CHAT_TEMPLATE)


VOCAB = CharVocab()
