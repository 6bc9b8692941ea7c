"""The drafters that share DFlash's code in b11434, as forms of one tiny draft.

``common_speculative_impl_draft_dflash`` (common/speculative.cpp) serves three drafters, and
src/models/dflash.cpp reads more forms of the draft than the plain one:

- DFlash: the plain, non-causal block-diffusion draft (``--spec-type draft-dflash``);
- DFlash2: ``selector_top_k > 0``, with ``selector_*`` tensors and per-layer conv tensors; it
  reads a candidate lattice from ``llama_get_embeddings_nextn`` and never samples on the backend;
- DSpark: a ``markov_w1`` head (``--spec-type draft-dspark``, which llama-server also detects from
  the file); its block is anchor-first when ``dflash.sample_from_anchor`` is true (the converter's
  default for DFlash-lineage exports), and an optional confidence head cuts drafts below p_min;
- a causal draft (``dflash.attention.causal`` true);
- a reduced draft vocabulary: ``d2t`` (absolute target ids, I64) and an own output head of that
  size, as the converter writes for a DSpark export with ``draft_vocab_size``.

Every form keeps the plain draft's tensors (drawn from the same stream, in the same order) and
adds its own from a stream of its own, so the forms differ only where the drafter does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drafter:
    name: str
    title: str
    spec_type: str  # llama-server's --spec-type, and the driver type libcommon is given
    causal: bool = False
    selector: bool = False  # DFlash2: candidate selector and conv tensors
    markov: bool = False  # DSpark: the Markov head
    sample_from_anchor: bool | None = None  # DSpark: dflash.sample_from_anchor (None: key absent)
    confidence: bool = False  # DSpark: conf_proj, and dflash.has_confidence_head
    vocab_draft: int | None = None  # reduced draft vocabulary (d2t + own output head)

    @property
    def refuses_p_min(self) -> bool:
        """libcommon refuses p_min > 0 for a DSpark draft without a confidence head (llama-server does not
        start with it: "DSpark draft has no confidence head: please set --spec-draft-p-min 0")."""
        return self.markov and not self.confidence

    @property
    def n_block_extra(self) -> int:
        """Rows of the noise block beyond n_max: the anchor, except for an anchor-first DSpark block."""
        return 0 if self.markov and self.sample_from_anchor is not False else 1

    def n_draft_max(self, block_size: int) -> int:
        """libcommon's clamp of n_max: block_size - 1, or block_size for an anchor-first DSpark."""
        return block_size - 1 if self.n_block_extra else block_size

    def options(self) -> dict:
        """What decides the file's bytes beyond the config (for the fingerprint); empty for DFlash."""
        return {} if self.name == DFLASH.name else {"drafter": self.name}


DFLASH = Drafter("dflash", "DFlash", "draft-dflash")

DRAFTERS: dict[str, Drafter] = {
    d.name: d
    for d in (
        DFLASH,
        Drafter("dflash-causal", "DFlash, causal", "draft-dflash", causal=True),
        Drafter("dflash2", "DFlash2 (selector lattice)", "draft-dflash", selector=True),
        Drafter(
            "dspark",
            "DSpark, anchor-first, confidence head",
            "draft-dspark",
            markov=True,
            sample_from_anchor=True,
            confidence=True,
        ),
        Drafter(
            "dspark-bonus",
            "DSpark, bonus anchor, confidence head",
            "draft-dspark",
            markov=True,
            sample_from_anchor=False,
            confidence=True,
        ),
        Drafter(
            "dspark-vocab",
            "DSpark, reduced vocabulary (d2t)",
            "draft-dspark",
            markov=True,
            sample_from_anchor=True,
            vocab_draft=64,
        ),
    )
}


def drafter(name: str) -> Drafter:
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ValueError(f"unknown drafter {name!r} (known: {', '.join(DRAFTERS)})") from None


# the DFlash2 selector and conv sizes: top_k * (top_k + 1) must fit in n_embd, n_embd must be a
# multiple of the conv group (src/models/dflash.cpp checks both)
SELECTOR_TOP_K = 4
SELECTOR_RANK = 8
CONV_KERNEL = 3
CONV_GROUP = 16
MARKOV_RANK = 8
