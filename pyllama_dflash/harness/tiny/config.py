"""Sizes and vocabulary shared by the tiny target, draft and projector.

One frozen dataclass so that the three files always agree (same n_embd, same
vocab) and so that the config can be hashed into a cache fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# bump when the bytes a generator writes change for the same config
GENERATOR_VERSION = 2

# llama.cpp token types (gguf TokenType values)
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3

# Special tokens. The "test" vocab never maps text to these ids by itself; they are
# reached through special-token parsing of their exact text (CONTROL type), which the
# server does for chat prompts and mtmd does for the image wrappers.
SPECIALS: tuple[str, ...] = (
    "<unk>",  # 0  (plain filler, never used)
    "<s>",  # 1  BOS
    "</s>",  # 2  EOS (also an EOG name llama.cpp recognises)
    "<|mask|>",  # 3  DFlash mask token
    "<|im_start|>",  # 4  chat template
    "<|im_end|>",  # 5  chat template; EOG by name in llama.cpp
    "<|vision_start|>",  # 6  mtmd wraps qwen2vl images in these two
    "<|vision_end|>",  # 7
)


@dataclass(frozen=True)
class TinyConfig:
    # text model (target) sizes
    n_vocab: int = 128
    n_embd: int = 64
    n_ff: int = 128
    n_head: int = 2
    n_head_kv: int = 2
    head_dim: int = 32
    n_ctx: int = 256
    rms_eps: float = 1e-6
    rope_freq_base: float = 10000.0
    # weight scales: projection std, token_embd std, output head std
    w_std: float = 0.2
    embd_std: float = 0.5
    out_std: float = 0.5
    # target: blk.0 gated-delta-net, blk.1 attention ((i+1) % interval == 0 is attention)
    n_layer: int = 2
    full_attention_interval: int = 2
    # IMROPE sections: 4 ints summing to head_dim/2
    rope_sections: tuple[int, int, int, int] = (6, 5, 5, 0)
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16
    ssm_time_step_rank: int = 4
    ssm_group_count: int = 2
    # draft
    draft_n_layer: int = 1
    target_layer_ids: tuple[int, ...] = (0, 1)
    block_size: int = 4
    # vision tower
    v_n_embd: int = 32
    v_n_head: int = 2
    v_n_ff: int = 64
    v_n_layer: int = 1
    v_patch_size: int = 14
    v_image_size: int = 84
    v_eps: float = 1e-6
    chat_template: str = field(
        default=(
            "{%- for message in messages -%}"
            "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
        )
    )

    # token ids
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    mask_id: int = 3
    im_end_id: int = 5

    @property
    def ssm_inner_size(self) -> int:
        return self.ssm_state_size * self.ssm_time_step_rank

    @property
    def eog_ids(self) -> tuple[int, ...]:
        return (self.eos_id, self.im_end_id)

    def tokens(self) -> list[str]:
        normal = [f"<t{i:02x}>" for i in range(len(SPECIALS), self.n_vocab)]
        return list(SPECIALS) + normal

    def token_types(self) -> list[int]:
        return [TOKEN_NORMAL if i == self.unk_id else TOKEN_CONTROL for i in range(len(SPECIALS))] + [TOKEN_NORMAL] * (
            self.n_vocab - len(SPECIALS)
        )

    def validate(self) -> None:
        if self.n_vocab <= len(SPECIALS):
            raise ValueError("n_vocab too small for the special tokens")
        if sum(self.rope_sections) * 2 != self.head_dim:
            raise ValueError("rope_sections must sum to head_dim/2")
        if any(not 0 <= i < self.n_layer for i in self.target_layer_ids):
            raise ValueError("target_layer_ids must lie inside the target's layers")
        if not any((i + 1) % self.full_attention_interval != 0 for i in range(self.n_layer)):
            raise ValueError("the qwen35 target needs at least one recurrent layer")
        if self.block_size < 2:
            raise ValueError("block_size must be >= 2 (DFlash drafts block_size-1 tokens)")


def fingerprint(kind: str, cfg: TinyConfig, seed: int, **options: object) -> str:
    """Stable hash of everything that decides a generated file's bytes."""
    blob = json.dumps(
        {"generator": GENERATOR_VERSION, "kind": kind, "seed": seed, "config": asdict(cfg), "options": options},
        sort_keys=True,
        default=list,
    )
    return hashlib.sha256(blob.encode()).hexdigest()
