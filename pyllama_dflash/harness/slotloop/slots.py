"""Request boundaries: slot files, the target restored alone, and a rewind to a shared prefix.

:class:`Boundaries` is mixed into :class:`~.session.Session`. Each operation does what the variant's
llama-server does to the target's and the draft's memories there, and keeps the sequence's
bookkeeping (:class:`~.state.SeqState`) as it then is.
"""

from __future__ import annotations

import bisect

from .ops import RestoreSlot, RestoreTarget, Rewind, SaveSlot, SaveTarget
from .record import Call
from .rows import common_prefix
from .state import SavedSlot, SeqState


class Boundaries:
    """Save, restore and rewind a sequence; where its two memories end."""

    def memory_ends(self, seq: int) -> tuple[int, int]:
        """Where the draft's and the target's memories of seq end (what the fuzzer's invariant watches),
        the target's in the draft's positions: for a draft with positions of its own (0007), the
        index of the sequence's last row."""
        if self.draft is None:
            raise ValueError("memory_ends: a session without the draft has one memory")
        if self.own_positions:
            return self.draft.pos_max(seq), len(self.seqs[seq].draft_ids) - 1
        return self.draft.pos_max(seq), self.target.pos_max(seq)

    def save_slot(self, seq: int) -> SavedSlot:
        """``POST /slots/N?action=save``: the target's sequence state, and the draft's where the
        variant's server saves it too (``cfg.server_saves_draft``)."""
        self.ops.append(SaveSlot(seq))
        self._settle_history(seq)
        st = self.seqs[seq]
        draft = self.draft.state_seq_get(seq) if self.draft is not None and self.cfg.server_saves_draft else None
        return SavedSlot(self.target.state_seq_get(seq), draft, st.saved())

    def restore_slot(self, seq: int, saved: SavedSlot, step: str = "restore slot") -> None:
        """``POST /slots/N?action=restore`` as the variant's llama-server does it.

        b11434 loads the target's state alone: the draft keeps the rows of whatever ran on the
        slot in between, and the next prompt only trims them to its common prefix. With 0005 the
        draft's part is loaded too, and a file without one clears the draft's sequence.
        """
        self.ops.append(RestoreSlot(seq, step))
        ok = self.target.state_seq_set(seq, saved.target)
        self.record.add(Call(step, "target", "llama_state_seq_set_data", seq, ok, pos=(0, saved.state.n_past - 1)))
        restored = saved.state.saved()
        if self.draft is not None and self.cfg.server_saves_draft:
            if saved.draft is None:
                ok = self.draft.seq_rm(seq, -1, -1)
                restored.draft_ids = []
                self.record.add(Call(step, "draft", "llama_memory_seq_rm", seq, ok))
            else:
                ok = self.draft.state_seq_set(seq, saved.draft)
                # 0007's server refuses a draft part that holds another number of rows than its target part
                if ok and self.own_positions:
                    ok = self.draft.pos_max(seq) + 1 == len(self._draft_rows(saved.state.row_ids))
                self.record.add(Call(step, "draft", "llama_state_seq_set_data", seq, ok))
        else:  # the target alone: the draft holds what it held
            restored.draft_ids = self.seqs[seq].draft_ids
        self.seqs[seq] = restored

    def save_target(self, seq: int) -> tuple[bytes, SeqState]:
        """The target's sequence state and bookkeeping, like a context checkpoint or cached prompt."""
        self.ops.append(SaveTarget(seq))
        st = self.seqs[seq]
        saved = (self.target.state_seq_get(seq), st.saved())
        self._own_saves.add(id(saved))
        return saved

    def restore_target(self, seq: int, saved: tuple[bytes, SeqState], step: str = "restore") -> None:
        """Restore the target alone: the draft keeps whatever it holds (its tail, or a hole)."""
        # a state saved elsewhere (another request's cached prompt) travels with the op
        self.ops.append(RestoreTarget(seq, None if id(saved) in self._own_saves else saved, step))
        data, st = saved
        ok = self.target.state_seq_set(seq, data)
        self.record.add(Call(step, "target", "llama_state_seq_set_data", seq, ok, pos=(0, st.n_past - 1)))
        if (self.cfg.history_restores or self.own_positions) and self.draft is not None:
            self._history_pending[seq] = step
        restored = st.saved()
        restored.draft_ids = self.seqs[seq].draft_ids  # the draft holds what it held
        self.seqs[seq] = restored

    def _settle_history(self, seq: int) -> None:
        """The history trim of a target-only restore (``cfg.history_restores``), done when the fix trims a
        legacy draft that is ahead: at the sequence's next use, past where the target ends then. Restores
        in a row are one: the rows the first would trim can be the history the last one restores."""
        step = self._history_pending.pop(seq, None)
        if step is None:
            return
        # a careful caller keeps a draft with positions of its own only as far as its rows are the restored
        # sequence's: rows of another conversation below the restored count would be attended as this one's
        st = self.seqs[seq]
        end = common_prefix(st.draft_ids, self._draft_rows(st.row_ids)) if self.own_positions else st.n_past
        ok = self.draft.seq_rm(seq, end, -1)
        self._draft_trimmed(seq, end)
        self.record.add(Call(f"{step} (history)", "draft", "llama_memory_seq_rm", seq, ok, pos=(end, -1)))

    def rewind(
        self, seq: int, pos: int, checkpoint: tuple[bytes, SeqState] | None = None, step: str = "rewind"
    ) -> None:
        """Keep seq's positions below pos and drop the rest from the target and the draft.

        llama-server does this when a new prompt shares only a prefix with what the slot holds:
        ``slot.mem.seq_rm(slot.id, p0, -1)`` removes [p0, end) from both memories
        (``common_memory::seq_rm``). A hybrid target drops only its last n_rs_seq positions by
        itself, so further back llama-server first loads a context checkpoint (``load_tgt``, and
        ``load_dft`` for the draft: a partial-only state, but ``llama_kv_cache::state_write``
        ignores its flags, so a DFlash draft's partial state is its whole sequence, which the
        trim that follows cuts to pos anyway): pass the target's checkpoint, saved at pos (by
        :meth:`save_target`). Unlike :meth:`restore_target`, the draft is trimmed too.
        """
        self.ops.append(
            Rewind(
                seq,
                pos,
                None if checkpoint is None or id(checkpoint) in self._own_saves else checkpoint,
                checkpoint is not None,
                step,
            )
        )
        self._settle_history(seq)
        st = self.seqs[seq]
        if checkpoint is not None:
            data, saved = checkpoint
            if pos > saved.n_past:
                raise ValueError(f"rewind: pos {pos} lies past the checkpoint's end {saved.n_past}")
            ok = self.target.state_seq_set(seq, data)
            self.record.add(
                Call(f"{step} checkpoint", "target", "llama_state_seq_set_data", seq, ok, pos=(0, saved.n_past - 1))
            )
            st = saved
        ok = self.target.seq_rm(seq, pos, -1)
        self.record.add(Call(step, "target", "llama_memory_seq_rm", seq, ok, pos=(pos, -1)))
        kept = bisect.bisect_left(st.rows, pos)  # the rows below pos: the draft's end under 0007
        if self.draft is not None:
            end = len(self._draft_rows(st.row_ids[:kept])) if self.own_positions else pos
            ok = self.draft.seq_rm(seq, end, -1)
            self._draft_trimmed(seq, end)
            self.record.add(Call(step, "draft", "llama_memory_seq_rm", seq, ok, pos=(end, -1)))
        # a sampled token survives only where nothing was dropped; token indexes are positions
        # only while the sequence holds no image (text_tokens is bookkeeping, never decoded)
        whole = pos == st.n_past
        tokens = st.text_tokens if whole else st.text_tokens[:pos] if len(st.text_tokens) == st.n_past else []
        draft_ids = self.seqs[seq].draft_ids  # the draft's, trimmed above
        self.seqs[seq] = SeqState(
            pos,
            st.id_last if whole else None,
            False,
            list(tokens),
            st.rows[:kept],
            st.features[:kept],
            st.row_ids[:kept],
            draft_ids,
        )
