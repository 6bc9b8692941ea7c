"""The bench pair: the tiny target's architecture at a size whose decode is memory-bound on a CPU.

Drafting pays only where the target's verify of a block costs about what one token costs, which on a
CPU holds once the weights are well beyond the last-level cache: each decode then streams every weight
from memory whatever the batch, and the arithmetic of a few rows more hides in that stream. The tiny
models (<1 MB) sit in the cache, so there a block costs its rows and the draft never pays. This target
keeps what the tiny one has (gated delta net and attention layers, IMROPE, the same vocabulary and
chat template, a projector) at about 830 MB of F32 weights, with a training context of 4096, and
sixteen layers to its draft's one, so that a draft step streams about a tenth of what a decode does.

Written deterministically into the cache, like the tiny models, and never committed.
"""

from __future__ import annotations

from pathlib import Path

from .config import TinyConfig

# twelve gated-delta-net layers and four attention layers (every fourth); the draft reads four of the sixteen
# layers. The weight scale decides whether a draft can learn the replies: at w_std 0.05 they were as
# predictable as chance (draftmodel.predictability: 1.5% of tokens follow their predecessor's most frequent
# successor) and the draft trained for them accepted 0.01 tokens a round; at 0.018, 33% (the tiny target's
# 26%), and its draft's held-out mean accepted length is 0.20 tokens a round (tests/data/trained/bench-pair.json)
BENCH_PAIR = TinyConfig(
    n_embd=1024,
    n_ff=3072,
    n_head=8,
    n_head_kv=2,
    head_dim=128,
    n_ctx=4096,
    w_std=0.018,
    n_layer=16,
    full_attention_interval=4,
    rope_sections=(24, 20, 20, 0),
    ssm_state_size=128,
    ssm_time_step_rank=8,
    ssm_group_count=4,
    target_layer_ids=(3, 7, 11, 15),
)

# the target file write_models(..., config=BENCH_PAIR) writes with seed 0 (tests/test_speed_costs.py)
BENCH_PAIR_TARGET_SHA256 = "8c540fc99b5b256f13b8dd32c1de8aa164d3d4cf44d906aabd619c0251970e34"


def weight_bytes(path: Path) -> int:
    """The bytes of a GGUF file's tensor data (what a decode streams), from its header alone."""
    from ._gguf import gguf_module

    reader = gguf_module().GGUFReader(str(path))
    return int(sum(t.n_bytes for t in reader.tensors))
