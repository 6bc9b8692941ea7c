"""Generation: the drafting rounds of a slot, as llama-server makes them.

:class:`Drafting` is mixed into :class:`~.session.Session`: each round drafts from the last sampled
token (libcommon's ``draft()``, or the definition's), verifies the draft on the target, keeps the
accepted tokens and trims the rejected ones from both memories.
"""

from __future__ import annotations

from ...product import api
from .ops import Generate
from .record import Call, Round

# what libcommon's DFlash draft() logs when the draft's decode of the noise block is refused
DRAFT_REFUSED = "llama_process returned"


class Drafting:
    """``generate`` and ``generate_paired``, and the round they are made of."""

    def generate(self, seq: int, n_tokens: int, step: str = "generate") -> list[int]:
        """Greedy generation of n_tokens with drafting rounds; returns the tokens generated."""
        self.ops.append(Generate(seq, n_tokens, step))
        self._settle_history(seq)
        st = self.seqs[seq]
        if st.id_last is None:
            raise ValueError(f"generate: sequence {seq} has no sampled token yet (its prompt ended without logits)")
        self.record.generate_calls += 1  # the record's: a scenario may run several sessions into it
        out: list[int] = []
        r = 0
        while len(out) < n_tokens:
            r += 1
            out.extend(self._round(seq, f"{step} round {r}", n_tokens - len(out)))
        assert len(out) == n_tokens
        self.record.generated.setdefault(seq, []).extend(out)
        return out

    def _round(self, seq: int, step: str, n_left: int) -> list[int]:
        """One round as llama-server's slot makes it: draft, verify on the target, keep the accepted
        tokens and trim the rejected ones from both memories; the tokens the round yields."""
        st = self.seqs[seq]
        pos0, id_last = st.n_past, st.id_last
        drafted: list[int] = []
        # like llama-server's get_n_draft_max: a round yields at most n_draft + 1 tokens, so draft
        # no more than what is left to generate (a round with one token left does not draft)
        n_draft = min(self.cfg.n_max, n_left - 1)
        behind = refused = False
        if self.spec is not None and n_draft > 0:
            drafted, behind, refused = self._draft(seq, step, n_draft)
        verify = api.Batch.tokens([id_last, *drafted], pos0=pos0, seq_id=seq, logits="all")
        self._decode_target(verify, step, seq)
        picks = [self.target.argmax(i) for i in range(len(drafted) + 1)]
        accepted = 0
        while accepted < len(drafted) and picks[accepted] == drafted[accepted]:
            accepted += 1
        self._add_rows(st, range(pos0, pos0 + 1 + len(drafted)), [id_last, *drafted])  # the target holds them
        self._spec_process(verify, step, seq)
        new_tokens = [*drafted[:accepted], picks[accepted]]
        st.keep_rows(len(st.rows) - (len(drafted) - accepted))  # until the rejected rows leave it
        st.n_past = pos0 + 1 + accepted
        st.id_last = picks[accepted]
        if self.spec is not None:
            self._after_verify(seq, step, drafted, accepted)
            if n_draft > 0:
                self.record.rounds.append(
                    Round(
                        seq,
                        pos0,
                        len(drafted),
                        accepted,
                        st.image_pending,
                        list(drafted),
                        behind,
                        refused,
                        generate_call=self.record.generate_calls,
                    )
                )
                st.image_pending = False
        return new_tokens

    def generate_paired(self, seq: int, n_tokens: int, step: str = "generate", stop: int | None = None) -> list[int]:
        """Greedy generation of n_tokens (fewer where the target samples ``stop``, which ends the reply as
        a chat's end of turn does), one a round: at every position the draft drafts ``n_max`` tokens from
        the target's own history, and the round keeps none of them (as a round whose draft is rejected
        whole, without the rejected rows' decode). The rounds record what was drafted at each position;
        the tokens the target generated judge them afterwards, so every column run on the same
        conversation is judged on the same tokens (paired acceptance)."""
        op = len(self.ops)
        self.ops.append(Generate(seq, n_tokens, step))
        self._settle_history(seq)
        st = self.seqs[seq]
        if st.id_last is None or self.spec is None:
            raise ValueError(f"generate_paired: sequence {seq} needs a sampled token and a draft")
        self.record.generate_calls += 1
        out = []
        for r in range(n_tokens):
            pos0, id_last = st.n_past, st.id_last
            drafted, behind, refused = self._draft(seq, f"{step} position {r}", self.cfg.n_max)
            verify = api.Batch.tokens([id_last], pos0=pos0, seq_id=seq, logits="all")
            self._decode_target(verify, step, seq)
            self._add_rows(st, [pos0], [id_last])
            self._spec_process(verify, step, seq)
            st.n_past, st.id_last = pos0 + 1, self.target.argmax(0)
            self._after_verify(seq, step, [], 0)
            if drafted and self.definition_drafter is None:
                self.spec.accept(seq, 0)
            rnd = Round(seq, pos0, len(drafted), 0, st.image_pending, drafted, behind, refused)
            rnd.generate_call = self.record.generate_calls
            self.record.rounds.append(rnd)
            st.image_pending = False
            out.append(st.id_last)
            if st.id_last == stop:
                self.ops[op] = Generate(seq, len(out), step)  # what a replay generates
                break
        self.record.generated.setdefault(seq, []).extend(out)
        return out

    def _draft(self, seq: int, step: str, n_draft: int) -> tuple[list[int], bool, bool]:
        """The round's drafts (libcommon's, or the definition's): (drafted, the draft was behind, libcommon
        refused to draft)."""
        st = self.seqs[seq]
        pos0, id_last = st.n_past, st.id_last
        if self.own_positions:
            behind = st.draft_ids != self._draft_rows(st.row_ids)
        else:
            behind = 0 <= self.draft.pos_max(seq) < pos0 - 1
        # the tie check's twin is filled as 0004's draft() fills a legacy draft that is behind: for
        # the noise block's decode only (its rows attend to the zero rows too), removed right after
        filled = self._fill_hole(seq, pos0) if behind and self.cfg.twin_fill_layout else []
        if self.cfg.definition_reference:
            drafted = self._draft_by_definition(seq, id_last, n_draft, step)
        else:  # trims the noise block like llama-server
            # 0007: back to where the draft ended (the row count, llama-server's checkpoint n_tokens,
            # unless a target-only restore left the draft behind)
            trim_at = self.draft.pos_max(seq) + 1 if self.own_positions else None
            drafted = self.spec.draft(seq, id_last, pos0, n_max=n_draft, trim_at=trim_at)
        for s, p0, p1 in filled:
            self.draft.seq_rm(s, p0, p1)
        lines = [str(x) for x in self.spec.last_log]
        refused = any(DRAFT_REFUSED in line for line in lines)
        span = (pos0, pos0 + n_draft)
        self.record.add(Call(step, "spec", "common_speculative_draft", seq, True, pos=span, n=len(drafted), log=lines))
        return drafted, behind, refused

    def _after_verify(self, seq: int, step: str, drafted: list[int], accepted: int) -> None:
        """llama-server's slot.mem.seq_rm(pos_next, -1): the rejected tail leaves both memories; a draft
        with positions of its own loses its rows past the accepted ones (the row count, where the draft
        is not behind: llama-server's slot.prompt.n_tokens())."""
        st = self.seqs[seq]
        rejected = len(drafted) - accepted
        draft_end = len(st.draft_ids) - rejected if self.own_positions else st.n_past
        self._draft_trimmed(seq, draft_end)
        if not self.target.seq_rm(seq, st.n_past, -1) or not self.draft.seq_rm(seq, draft_end, -1):
            self.record.add(Call(step, "target", "llama_memory_seq_rm", seq, False, pos=(st.n_past, -1)))
        if drafted and self.definition_drafter is None:  # libcommon drafted them
            self.spec.accept(seq, accepted)
