"""The draft's hyperparameters and tensors, read from the GGUF files llama.cpp loads.

The authority on the layout is b11434's loader (``llama_model_dflash::load_arch_hparams`` and
``load_arch_tensors`` in src/models/dflash.cpp): tensors come out of gguf-py in numpy order, the
reverse of ggml's ``ne``, so a projection ``W`` maps ``x`` as ``x @ W.T``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import GGUFError
from ...harness.tiny._gguf import gguf_module

ARCH = "dflash"


@dataclass(frozen=True)
class DraftHparams:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_freq_base: float
    block_size: int
    target_layers: tuple[int, ...]
    causal: bool
    # degenerate M-RoPE sections [head_dim/2, 0, 0, 0] on a reconverted draft; () on a legacy one
    rope_sections: tuple[int, ...]
    mask_id: int
    # DSpark: anchor-first block (True) or a bonus anchor at slot 0 (False); None without a Markov head
    sample_from_anchor: bool | None

    @property
    def n_draft_max(self) -> int:
        """libcommon's clamp of n_max: block_size - 1, or block_size for an anchor-first DSpark."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1


@dataclass(frozen=True)
class DraftWeights:
    hp: DraftHparams
    params: dict[str, np.ndarray]  # the draft's own tensors, by GGUF name
    tok_embd: np.ndarray  # [n_vocab, n_embd], the target's
    output: np.ndarray  # [n_vocab_draft, n_embd]: the draft's own head, else the target's
    d2t: np.ndarray | None  # reduced vocabulary: draft row -> target token id

    @property
    def n_vocab(self) -> int:
        return int(self.tok_embd.shape[0])

    def float64(self) -> DraftWeights:
        """The same draft in float64, converted once (the reference computes in float64)."""
        wide = lambda a: a.astype(np.float64) if a.dtype.kind == "f" else a
        return DraftWeights(
            self.hp, {k: wide(v) for k, v in self.params.items()}, wide(self.tok_embd), wide(self.output), self.d2t
        )


def _fields(reader: Any) -> dict[str, Any]:
    out = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except Exception:  # a field gguf-py cannot render (not one the draft needs)
            continue
    return out


def _tensors(reader: Any) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in reader.tensors}


def _require(fields: dict[str, Any], key: str, path: Path) -> Any:
    if key not in fields:
        raise GGUFError(path, f"no {key!r}, which the DFlash draft needs")
    return fields[key]


# the tensors of the forms this reference implements; a draft with others (DFlash2's conv and
# selector, DSV4 stages) is refused rather than run as if they were absent
_UNSUPPORTED = ("selector_hidden.weight", "hc_head_fn.weight", "blk.0.attn_sinks.weight", "blk.0.attn_post_norm.weight")


def load_draft(draft: Path | str, target: Path | str) -> DraftWeights:
    """Read a DFlash-family draft and the target it drafts for, as llama.cpp loads them."""
    g = gguf_module()
    draft, target = Path(draft), Path(target)
    dr, tr = g.GGUFReader(draft), g.GGUFReader(target)
    f = _fields(dr)
    if f.get("general.architecture") != ARCH:
        raise GGUFError(draft, f"architecture {f.get('general.architecture')!r}, not {ARCH!r}")
    params = _tensors(dr)
    odd = [n for n in _UNSUPPORTED if n in params]
    if odd:
        raise GGUFError(draft, f"the reference model does not implement the form with {', '.join(odd)}")
    n_head = int(_require(f, f"{ARCH}.attention.head_count", draft))
    hp = DraftHparams(
        n_embd=int(_require(f, f"{ARCH}.embedding_length", draft)),
        n_layer=int(_require(f, f"{ARCH}.block_count", draft)),
        n_head=n_head,
        n_head_kv=int(f.get(f"{ARCH}.attention.head_count_kv", n_head)),
        head_dim=int(_require(f, f"{ARCH}.attention.key_length", draft)),
        rms_eps=float(_require(f, f"{ARCH}.attention.layer_norm_rms_epsilon", draft)),
        rope_freq_base=float(f.get(f"{ARCH}.rope.freq_base", 10000.0)),
        block_size=int(f.get(f"{ARCH}.block_size", 16)),
        target_layers=tuple(int(x) for x in _require(f, f"{ARCH}.target_layers", draft)),
        causal=bool(f.get(f"{ARCH}.attention.causal", False)),
        rope_sections=tuple(int(x) for x in f.get(f"{ARCH}.rope.dimension_sections", ())),
        mask_id=int(_require(f, "tokenizer.ggml.mask_token_id", draft)),
        sample_from_anchor=(bool(f.get(f"{ARCH}.sample_from_anchor", True)) if "markov_w1.weight" in params else None),
    )
    if hp.rope_sections and any(hp.rope_sections[1:]):
        raise GGUFError(draft, f"rope sections {hp.rope_sections} are not the degenerate [n_rot/2, 0, 0, 0]")
    targets = _tensors(tr)
    if "token_embd.weight" not in targets:
        raise GGUFError(target, "no token_embd.weight for the draft to borrow")
    output = params.get("output.weight", targets.get("output.weight", targets["token_embd.weight"]))
    d2t = params.get("d2t")
    return DraftWeights(hp, params, targets["token_embd.weight"], output, None if d2t is None else d2t.astype(np.int64))
