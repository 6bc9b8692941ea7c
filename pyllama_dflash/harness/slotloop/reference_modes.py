"""What a session does otherwise when it runs one of the references a run is judged against.

The definition reference (``SessionConfig.definition_reference``) keeps the target's features of
every row and drafts from them in a cleared draft, at the draft's own positions; the tie check's twin
(``SessionConfig.twin_fill_layout``) lays its cells out as patch 0004 lays a legacy draft's. Both are
modes of the slot loop, not oracles of their own: the oracles (``pyllama_dflash.harness.oracles``) compare the
drafts these runs record. :class:`ReferenceModes` is mixed into :class:`~.session.Session`.
"""

from __future__ import annotations

import numpy as np

from ...product import api
from .record import Call


class ReferenceModes:
    """The definition reference's features and drafts, and the twin laid out like the fix."""

    def _keep_features(self, seq_ids: np.ndarray) -> None:
        """The definition reference keeps the target's layer features of each row it just decoded
        (one row per entry of seq_ids, in the batch's order) with the row's sequence."""
        if not self.cfg.definition_reference or self.spec is None:
            return
        fused = self.spec.target_features(len(seq_ids))
        for i, s in enumerate(seq_ids):
            self.seqs[int(s)].features.append(fused[i])

    def _draft_by_definition(self, seq: int, id_last: int, n_draft: int, step: str) -> list[int]:
        """The definition's drafts: the draft's memory cleared, the target's features of every row of
        the sequence's history injected at 0..N-1 through the API, in the draft's ubatches, and the
        noise block decoded at N by b11434's own block reader (libcommon's draft(), which places it at
        the pos0 it is given), then cleared again."""
        st = self.seqs[seq]
        if self.definition_drafter is not None:
            return self.definition_drafter(np.stack(st.features), id_last, n_draft)
        self.draft.clear()
        n = len(st.features)
        step_rows = self.draft.n_ubatch
        for p0 in range(0, n, step_rows):
            p1 = min(n, p0 + step_rows)
            pos = np.array([[p, p, p, 0] for p in range(p0, p1)], dtype=np.int32).T
            rc = self.draft.process_rc(api.Batch.embeddings(np.stack(st.features[p0:p1]), pos, seq_id=seq))
            if rc != 0:
                self.record.add(Call(step, "draft", "llama_process", seq, False, rc=rc, pos=(p0, p1 - 1), n=p1 - p0))
                self.draft.clear()
                return []
        drafted = self.spec.draft(seq, id_last, n, n_max=n_draft, trim_draft=False)
        self.draft.clear()
        return drafted

    def _fill_like_the_fix(self, batch: api.Batch) -> list[tuple[int, int, int]]:
        """What patch 0004 does to a legacy draft before it injects a batch, done to an M-RoPE draft
        (the twin, which needs none of it): zero rows in the hole between the draft's last position
        and the batch's first, to be removed right after the batch (0004 keeps them until the batch's
        last chunk is injected, so this is its layout). The twin drafts the same either way but for the
        cells' order in the KV buffer (the freed cells are reused by later rows), which is what a tie
        check needs to lay out alike. Only a batch of one sequence is laid out: the fix fills per
        sequence between their injections, which one process() call cannot interleave."""
        seqs = np.unique(batch.seq_id)
        pinned = batch.kind != "tokens" and batch.n_tokens > 1 and int(batch.pos[0].min()) == int(batch.pos[0].max())
        if len(seqs) != 1 or pinned:
            return []  # several sequences, or a pinned image batch (process() skips it)
        return self._fill_hole(int(seqs[0]), int(batch.pos[0].min()))

    def _fill_hole(self, s: int, y: int) -> list[tuple[int, int, int]]:
        """Zero rows in the draft's positions between its last one and y on sequence s, as 0004's
        prepare_draft() fills a legacy draft: [(s, p0, p1)] to remove afterwards, or [] (no hole)."""
        x = self.draft.pos_max(s)
        if x < 0 or y <= x + 1:
            return []
        # in pieces of the draft's ubatch, as the fix fills: a non-causal draft takes one ubatch at a time
        step = self.draft.n_ubatch
        for p0 in range(x + 1, y, step):
            p1 = min(y, p0 + step)
            pos = np.array([[p, p, p, 0] for p in range(p0, p1)], dtype=np.int32).T
            rows = np.zeros((p1 - p0, self.draft.decode_embd_width), np.float32)
            if self.draft.process_rc(api.Batch.embeddings(rows, pos, seq_id=s)) != 0:
                self.draft.seq_rm(s, x + 1, y)
                return []
        return [(s, x + 1, y)]
