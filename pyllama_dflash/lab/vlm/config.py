"""The trained target's shape: a qwen35 graph whose recurrent layers are exact identities.

qwen35 needs at least one gated-delta-net layer (the hybrid memory asserts without one). Here every
other layer is one, with its output projection ``ssm_out`` all zero, so its mixer adds exactly
nothing to the residual stream: llama.cpp still runs it (and streams its weights), and the
reference forward may leave it out. Its FFN is trained like any other. The attention layers carry
all the mixing across positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .vocab import VOCAB


@dataclass(frozen=True)
class CoreConfig:
    n_embd: int = 256
    n_ff: int = 512
    n_layer: int = 6  # blk 0, 2, 4 gated delta net (identity mixers), blk 1, 3, 5 attention
    full_attention_interval: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)  # Qwen's split of 32 rotary pairs
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-6
    n_ctx: int = 4096
    # the identity mixers' own sizes: small, since their output projection is zero
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16
    ssm_time_step_rank: int = 2
    ssm_group_count: int = 1

    @property
    def n_vocab(self) -> int:
        return VOCAB.n_vocab

    def is_attention(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval == 0

    @property
    def attention_layers(self) -> list[int]:
        return [il for il in range(self.n_layer) if self.is_attention(il)]

    def validate(self) -> None:
        if sum(self.rope_sections) * 2 != self.head_dim:
            raise ValueError(f"rope_sections {self.rope_sections} must sum to head_dim/2 = {self.head_dim // 2}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} must be a multiple of n_head_kv {self.n_head_kv}")
        if all(self.is_attention(il) for il in range(self.n_layer)):
            raise ValueError("qwen35 needs at least one gated-delta-net layer")

    def as_dict(self) -> dict:
        return asdict(self)


CORE = CoreConfig()
TOY = CoreConfig(n_embd=64, n_ff=128, n_layer=2, n_head=2, n_head_kv=1, head_dim=32, rope_sections=(6, 5, 5, 0))
