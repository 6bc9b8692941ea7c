"""The session config: the sizes and switches of one slot loop (:class:`SessionConfig`), a plain
frozen dataclass that a job carries to a child process as itself, serialised only in the job file.

No native code and no numpy here, so the schedules and the parents of child processes can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...codec import Coded
from ...product.llamabuild.variants import variant as variant_of


@dataclass(frozen=True)
class SessionConfig(Coded):
    n_ctx: int = 512
    n_batch: int = 16  # small, so a modest image spans several sub-batches (S3)
    n_ubatch: int = 16
    n_seq: int = 1
    n_max: int = 3  # draft tokens per round (--spec-draft-n-max)
    n_gpu_layers: int = 0
    # what the variant's llama-server does with POST /slots/N?action=save|restore: b11434 saves and
    # loads the target's state alone; with patch 0005 the draft's goes with it (see save_slot)
    server_saves_draft: bool = False
    # the draft context's own sizes (llama-server: --batch-size-draft and the like); None: the target's
    draft_n_batch: int | None = None
    draft_n_ubatch: int | None = None
    # the projector's smallest image, in merged tokens (mtmd's image_min_tokens); None: its default,
    # which turns the tiny qwen2vl projector's 1x1 image into 3x3 (llama-server: --image-min-tokens)
    image_min_tokens: int | None = None
    # the drafting cut-offs and sampling (llama-server: --spec-draft-n-min, --spec-draft-p-min and
    # the draft's backend sampling); None: libcommon's defaults (0, 0.0, on)
    n_min: int | None = None
    p_min: float | None = None
    backend_sampling: bool | None = None
    # the drift oracle's tie check: lay an M-RoPE draft's (the twin's) cells out as patch 0004 lays
    # a legacy draft's out, zero rows in a hole before the rows that follow it, removed right after
    # (_fill_like_the_fix: the twin takes the rows either way, only the cells' order changes), and
    # zero rows for the noise block of a round that begins behind (_round: as 0004's draft() fills)
    twin_fill_layout: bool = False
    # the drift oracle's reference follows the history a target-only restore leaves: the restored
    # conversation continued from its saved point, without what ran after it. The draft's rows past the
    # restored position belong to that undone part, so they are removed from the reference's draft
    # (baseline's M-RoPE twin would keep a cell at the restored position beside the new row: X <= Y).
    history_restores: bool = False
    # the definition reference: every round drafts in a cleared draft context fed, through the API
    # alone, the target's features of every row of the sequence's history at positions 0..N-1, the
    # noise block at N (_draft_by_definition); libcommon's process() never runs
    definition_reference: bool = False

    @property
    def cuts_drafts(self) -> bool:
        """Whether a drafting round may legitimately draft nothing: a p_min or n_min cut-off."""
        return bool(self.p_min) or bool(self.n_min)

    def check(self) -> SessionConfig:
        """Refuse sizes the pinned llama.cpp answers with an assert, before any native call; returns self.

        The target keeps n_max recurrent-state snapshots (n_rs_seq), so its last n_max + 1 rows of a
        sequence must share a ubatch; the draft decodes its noise block (n_max + 1 rows) non-causally,
        in one ubatch. The API checks the first rule itself (api.Context), for any model.
        """
        problems = []
        if min(self.n_batch, self.n_ubatch) < 1 or self.n_ubatch > self.n_batch:
            problems.append(f"n_batch {self.n_batch} and n_ubatch {self.n_ubatch}: need 1 <= n_ubatch <= n_batch")
        if self.n_ubatch <= self.n_max + 1:
            problems.append(
                f"n_ubatch {self.n_ubatch}: the target keeps n_max = {self.n_max} state snapshots, so its "
                f"last {self.n_max + 1} rows of a sequence share a ubatch and n_ubatch must exceed "
                f"{self.n_max + 1} (llama.cpp asserts n_ubatch > n_keep_tail)"
            )
        if self.draft_n_ubatch is not None and self.draft_n_ubatch < self.n_max + 1:
            problems.append(
                f"draft n_ubatch {self.draft_n_ubatch}: the noise block of {self.n_max + 1} rows is decoded "
                "non-causally in one ubatch (llama.cpp asserts n_ubatch >= n_tokens)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


# the session config the tools run the tiny models with
DEFAULT_CONFIG = SessionConfig()


def server_config(variant: str, config: SessionConfig) -> SessionConfig:
    """The session config for a variant: the slot loop mirrors what the variant's llama-server does
    with a slot file (see saves_draft_with_slot)."""
    return replace(config, server_saves_draft=variant_of(variant).saves_draft)
