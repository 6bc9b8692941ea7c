"""A llama-server slot loop in miniature, over the bindings, recording every return code.

It makes the calls llama-server makes when a prompt with images meets a DFlash drafter:
text batches go to the target (``llama_process``) and then to ``common_speculative_process``;
an image chunk goes through ``mtmd_helper_decode_image_chunk`` whose post-decode callback hands
each sub-batch to ``common_speculative_process``; generation drafts from the last sampled token,
verifies the draft on the target, feeds the verified batch to the driver, trims both memories
past the accepted tokens (llama-server's ``slot.mem.seq_rm``) and tells the driver how many were
accepted. Sampling is greedy, so the output must equal plain greedy decoding (checked by
:func:`replay_reference`).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import api
from ..api import kv_cells
from .config import DEFAULT_CONFIG as DEFAULT_CONFIG  # where the commands found it before config.py
from .config import SessionConfig
from .loaded import Loaded
from .models import ModelSet
from .ops import Generate, Op, Prompt, RestoreSlot, RestoreTarget, Rewind, SaveSlot, SaveTarget, TextBatch
from .record import DRAFT_ROWS, Call, Record, Round

log = logging.getLogger(__name__)


# what libcommon's DFlash draft() logs when the draft's decode of the noise block is refused
DRAFT_REFUSED = "llama_process returned"


@dataclass
class SeqState:
    n_past: int = 0  # the target's next position (llama-server: slot.prompt.tokens.pos_next())
    id_last: int | None = None  # the last sampled token, the anchor of the next draft
    image_pending: bool = False  # an image was decoded since the last drafting round
    text_tokens: list[int] = field(default_factory=list)
    # the target's position of each row the target holds (an image: a row per token, all at its
    # pinned position): the sequence's expanded token list, whose length is llama-server's
    # server_tokens::size() and a row's index its draft position under patch 0007
    rows: list[int] = field(default_factory=list)
    # the target's layer features of each row (the definition reference only)
    features: list[np.ndarray] = field(default_factory=list)
    # each row's identity (a session-wide counter), and, for a draft with positions of its own (0007),
    # the identities of the rows the draft holds, in its positions' order: equal while the draft holds
    # the sequence; shorter where a target-only restore left it behind (the restored rows' features
    # exist nowhere)
    row_ids: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)

    def saved(self) -> SeqState:
        """The state as a save keeps it: no image pending, lists of its own."""
        return SeqState(
            self.n_past,
            self.id_last,
            False,
            list(self.text_tokens),
            list(self.rows),
            list(self.features),
            list(self.row_ids),
            list(self.draft_ids),
        )

    def keep_rows(self, n: int) -> None:
        """Keep the first n rows (their identities and features): what the target still holds."""
        del self.rows[n:]
        del self.row_ids[n:]
        del self.features[n:]


class Session:
    """Target, draft, speculative driver and projector for one scenario run (one variant)."""

    def __init__(
        self,
        models: ModelSet,
        cfg: SessionConfig,
        record: Record,
        *,
        speculative: bool = True,
        loaded: Loaded | None = None,
        definition_drafter: Callable[[np.ndarray, int, int], list[int]] | None = None,
    ):
        self.models = models
        # the definition reference's drafts from another implementation of the draft (the reference
        # model, pyllama_dflash.draftmodel): given the features of every row, id_last and n_draft
        self.definition_drafter = definition_drafter
        self.cfg = cfg.check()
        self.record = record
        self.speculative = speculative
        # models and projectors shared with the process's other sessions (see loaded.py), or our own
        self._loaded = loaded
        self._image_rows: set[int] = set()  # the identities of the image rows the target was given
        self._stack = contextlib.ExitStack()
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        self.seqs = [SeqState() for _ in range(cfg.n_seq)]
        self.ops: list[Op] = []  # what happened, for the reference replay (ops.py)
        self._own_saves: set[int] = set()
        # seq -> the step of a target-only restore whose history trim waits for the seq's next use
        self._history_pending: dict[int, str] = {}

    def _open(self) -> None:
        cfg, m, enter = self.cfg, self.models, self._stack.enter_context
        loaded = self._loaded or enter(Loaded())
        # draft-mtp drafts with the target's own MTP head: the target is loaded with it
        mtp = self.speculative and m.target_head
        self.target_model = loaded.model(m.target, cfg.n_gpu_layers, load_mtp=mtp)
        self.target = enter(
            api.Context(
                self.target_model,
                n_ctx=cfg.n_ctx,
                n_batch=cfg.n_batch,
                n_ubatch=cfg.n_ubatch,
                n_seq_max=cfg.n_seq,
                # llama-server: recurrent-state snapshots so a rejected draft can be rolled back (kept
                # in the reference run too: saved sequence states then fit either context)
                n_rs_seq=cfg.n_max,
            )
        )
        self.spec: api.Speculative | None = None
        self.draft: api.Context | None = None
        self.own_positions = False
        self.text_rows_only = False
        if self.speculative:
            self._open_draft(loaded, mtp)
            self._open_speculative()
        self.projector = (
            loaded.projector(
                m.mmproj, self.target_model, use_gpu=cfg.n_gpu_layers != 0, image_min_tokens=cfg.image_min_tokens
            )
            if m.mmproj
            else None
        )

    def _open_draft(self, loaded: Loaded, mtp: bool) -> None:
        """The draft context: the target's own MTP head (draft-mtp), or the draft model's."""
        cfg, enter = self.cfg, self._stack.enter_context
        if mtp:
            self.draft_model = self.target_model
            self.draft = enter(api.Context.mtp(self.target))
        else:
            self.draft_model = loaded.model(self.models.draft, cfg.n_gpu_layers)
            self.draft = enter(
                api.Context.draft(
                    self.draft_model,
                    self.target,
                    n_batch=cfg.draft_n_batch or cfg.n_batch,
                    n_ubatch=cfg.draft_n_ubatch or cfg.draft_n_batch or cfg.n_ubatch,
                )
            )

    def _open_speculative(self) -> None:
        """libcommon's driver over the target and the draft."""
        cfg, m, enter = self.cfg, self.models, self._stack.enter_context
        # before the target decodes anything: the driver turns on layer-input extraction
        self.spec = enter(
            api.Speculative(
                self.target,
                self.draft,
                n_seq=cfg.n_seq,
                n_max=cfg.n_max,
                n_min=cfg.n_min,
                p_min=cfg.p_min,
                backend_sampling=cfg.backend_sampling,
                spec_type=m.spec_type,
            )
        )
        # patch 0007: libcommon says the draft keeps positions of its own, row k of a sequence's
        # expanded token list at draft position k; the slot loop then trims and restores the draft by
        # the sequence's row count, as that variant's llama-server does (server_tokens::size()), and
        # a target-only restore is followed by the trim of the next request's common prefix. The
        # definition reference feeds a draft of its own and trims nothing.
        self.own_positions = self.spec.own_positions and not cfg.definition_reference
        # 0007's EAGLE3 keeps positions of its own over the text rows only (as libcommon answers,
        # common_speculative_own_positions_text): an image's rows are not in its context, and its
        # memory of a sequence ends at the sequence's text rows' count, as that variant's llama-server
        # trims it (server_draft_pos)
        self.text_rows_only = self.own_positions and self.spec.own_positions_text
        # with a cut-off, a round that drafts nothing is the drafter's answer, judged by the drift
        # oracle against the twin's, not a starved round
        self.record.empty_rounds_allowed |= cfg.cuts_drafts

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- prompts -------------------------------------------------------------------------------

    def prompt(self, seq: int, text: str, images: Sequence[np.ndarray] = (), step: str = "prompt") -> None:
        """Tokenize text with its media markers and evaluate the chunks in order, like a slot's prompt."""
        self.ops.append(Prompt(seq, text, tuple(images), step))
        self._settle_history(seq)
        if not images:
            self._text(seq, self.tokenize(text), step)
            return
        if self.projector is None:
            raise ValueError("a prompt with images needs an mmproj")
        digests = iter(_digest(img) for img in images)  # each image's rows' contents, in the chunks' order
        with self.projector.tokenize(text, images) as chunks:
            for k, chunk in enumerate(chunks):
                if chunk.type == "text":
                    if chunk.n_tokens:
                        self._text(seq, chunk.tokens, f"{step} chunk {k} text")
                else:
                    self._image(seq, chunk, f"{step} chunk {k} image {chunk.nx}x{chunk.ny}", next(digests))

    def tokenize(self, text: str) -> np.ndarray:
        return self.target_model.tokenize(text, add_special=False, parse_special=True)

    def text_batch(self, parts: Sequence[tuple[int, str]], step: str = "batch") -> None:
        """Several sequences' text in one target batch, as llama-server batches its slots."""
        self.ops.append(TextBatch(tuple(parts), step))
        for seq, _ in parts:
            self._settle_history(seq)
        toks, pos, seqs = [], [], []
        for seq, text in parts:
            t = self.tokenize(text)
            st = self.seqs[seq]
            toks.append(t)
            pos.append(np.arange(st.n_past, st.n_past + len(t), dtype=np.int32))
            seqs.append(np.full(len(t), seq, dtype=np.int32))
        tokens, positions, seq_ids = np.concatenate(toks), np.concatenate(pos), np.concatenate(seqs)
        if len(tokens) > self.cfg.n_batch:
            raise ValueError(f"text_batch: {len(tokens)} tokens exceed n_batch {self.cfg.n_batch}")
        # each sequence's last row gives the logits it samples from
        last = np.zeros(len(tokens), dtype=bool)
        ends = np.cumsum([len(t) for t in toks]) - 1
        last[ends] = True
        batch = api.Batch.tokens(tokens, positions, seq_id=seq_ids, logits=last)
        self._decode_target(batch, step, seq=-1)
        for (seq, _), end, t in zip(parts, ends, toks, strict=True):
            st = self.seqs[seq]
            self._add_rows(st, range(st.n_past, st.n_past + len(t)), t)
            st.n_past += len(t)
            st.text_tokens.extend(int(x) for x in t)
            st.id_last = self.target.argmax(int(end))
        self._spec_process(batch, step, seq=-1)

    def _text(self, seq: int, tokens: np.ndarray, step: str) -> None:
        st = self.seqs[seq]
        n_batch = self.cfg.n_batch
        for off in range(0, len(tokens), n_batch):
            part = np.asarray(tokens[off : off + n_batch], dtype=np.int32)
            batch = api.Batch.tokens(part, pos0=st.n_past, seq_id=seq, logits="last")
            self._decode_target(batch, step, seq)
            self._add_rows(st, range(st.n_past, st.n_past + len(part)), part)
            st.n_past += len(part)
            st.text_tokens.extend(int(x) for x in part)
            st.id_last = self.target.argmax(len(part) - 1)
            self._spec_process(batch, step, seq)

    def _image(self, seq: int, chunk: api.Chunk, step: str, digest: int) -> None:
        st = self.seqs[seq]
        sub_batches: list[tuple[int, int, int]] = []

        def on_batch(b: api.ImageBatch) -> None:
            sub_batches.append((int(b.pos[0].min()), int(b.pos[0].max()), b.n_tokens))
            self._add_rows(st, [int(p) for p in b.pos[0]], [digest] * b.n_tokens, image=True)
            self._keep_features(np.full(b.n_tokens, seq))
            self._draft_took(st, b.n_tokens, image=True)  # the driver gets the sub-batch next

        # the definition reference feeds its draft itself, at drafting time (_draft_by_definition)
        spec = None if self.cfg.definition_reference else self.spec
        res = self.projector.decode_image(
            self.target, chunk, st.n_past, seq_id=seq, speculative=spec, on_batch=on_batch
        )
        lines = [str(x) for x in res.log]
        # one call per sub-batch the driver saw (llama-server's post-decode callback), then the decode
        for k, (lo, hi, n) in enumerate(sub_batches):
            if k < len(res.spec_results):
                self.record.add(
                    Call(
                        f"{step} sub-batch {k + 1}/{len(sub_batches)}",
                        "spec",
                        "common_speculative_process",
                        seq,
                        res.spec_results[k] == 1,
                        pos=(lo, hi),
                        n=n,
                        log=lines if res.spec_results[k] != 1 else [],
                    )
                )
        self.record.add(
            Call(
                step,
                "target",
                "mtmd_helper_decode_image_chunk",
                seq,
                res.rc == 0,
                rc=res.rc,
                pos=(st.n_past, res.n_past - 1),
                n=chunk.n_tokens,
                log=lines if res.rc else [],
            )
        )
        if spec is not None and sub_batches:
            self._check_draft_rows(seq, step)
        st.n_past = res.n_past
        st.image_pending = True

    def _decode_target(self, batch: api.Batch, step: str, seq: int) -> None:
        rc = self.target.process_rc(batch)
        self.record.add(
            Call(
                step,
                "target",
                "llama_process",
                seq,
                rc == 0,
                rc=rc,
                pos=_span(batch),
                n=batch.n_tokens,
                log=[str(x) for x in self.target.last_log] if rc else [],
            )
        )

    def _spec_process(self, batch: api.Batch, step: str, seq: int) -> None:
        if self.spec is None:
            return
        if self.cfg.definition_reference:
            self._keep_features(batch.seq_id)
            return
        filled = self._fill_like_the_fix(batch) if self.cfg.twin_fill_layout else []
        ok = self.spec.process_ok(batch)
        seqs, counts = np.unique(batch.seq_id, return_counts=True)
        if ok:
            for s, k in zip(seqs, counts, strict=True):
                self._draft_took(self.seqs[int(s)], int(k))
        for s, p0, p1 in filled:
            self.draft.seq_rm(s, p0, p1)
        self.record.add(
            Call(
                step,
                "spec",
                "common_speculative_process",
                seq,
                ok,
                pos=_span(batch),
                n=batch.n_tokens,
                log=[str(x) for x in self.spec.last_log],
            )
        )
        for s in seqs:
            self._check_draft_rows(int(s), step)

    def _check_draft_rows(self, seq: int, step: str) -> None:
        """A draft with positions of its own holds the rows it took at 0..N-1 (0007), each once: a failing
        check where its memory of seq holds any other set of positions, a gap inside included. A row at
        -1, say, breaks no batch check (llama.cpp skips it for an empty sequence), and a random head may
        draft the same tokens over it."""
        if not self.own_positions:
            return
        n = len(self.seqs[seq].draft_ids)
        held = kv_cells.held(self.draft, seq)
        if sorted(held) != list(range(n)):
            why = f"the draft's memory of seq {seq} holds positions {_spans(held)}, not its {n} rows' 0..{n - 1}"
            pos = (min(held), max(held)) if held else (-1, -1)
            self.record.add(Call(step, "draft", DRAFT_ROWS, seq, False, pos=pos, n=n, log=[why]))

    def _add_rows(self, st: SeqState, positions: Sequence[int], contents: Sequence[int], image: bool = False) -> None:
        """Rows the target now holds for st's sequence, at the target's positions. A row's identity chains
        its content (a token, or its image's digest) and position onto the row before it: the target's
        features of a row depend on its prefix alone, so equal identities are equal rows, in any session."""
        prev = st.row_ids[-1] if st.row_ids else 0
        for p, c in zip(positions, contents, strict=True):
            prev = _chain(prev, int(c), int(p))
            st.rows.append(int(p))
            st.row_ids.append(prev)
            if image:
                self._image_rows.add(prev)

    def _draft_took(self, st: SeqState, n: int, image: bool = False) -> None:
        """A draft with positions of its own took st's last n rows, after every row it held (an image's
        rows: not a draft that holds the text rows only)."""
        if self.own_positions and not (image and self.text_rows_only):
            st.draft_ids.extend(st.row_ids[-n:])

    def _draft_rows(self, row_ids: Sequence[int]) -> list[int]:
        """Of a sequence's rows (their identities), those a draft with positions of its own holds, in
        its positions' order: every row, or the text rows only (0007's EAGLE3)."""
        if self.text_rows_only:
            return [r for r in row_ids if r not in self._image_rows]
        return list(row_ids)

    def _draft_trimmed(self, seq: int, end: int) -> None:
        """The draft's rows of seq from ``end`` on were removed (a draft with positions of its own)."""
        if self.own_positions:
            del self.seqs[seq].draft_ids[end:]

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

    # -- generation ----------------------------------------------------------------------------

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

    def generate_paired(self, seq: int, n_tokens: int, step: str = "generate") -> list[int]:
        """Greedy generation of n_tokens, one a round: at every position the draft drafts ``n_max``
        tokens from the target's own history, and the round keeps none of them (as a round whose draft
        is rejected whole, without the rejected rows' decode). The rounds record what was drafted at
        each position; the tokens the target generated judge them afterwards, so every column run on
        the same conversation is judged on the same tokens (paired acceptance)."""
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

    # -- request boundaries ----------------------------------------------------------------------

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
        end = _common_prefix(st.draft_ids, self._draft_rows(st.row_ids)) if self.own_positions else st.n_past
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


@dataclass(frozen=True)
class SavedSlot:
    """A slot file: the target's part, the draft's part (None: the server saved none), the bookkeeping."""

    target: bytes
    draft: bytes | None
    state: SeqState


def _digest(image: np.ndarray | bytes) -> int:
    data = image if isinstance(image, bytes) else np.ascontiguousarray(image).tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def _chain(prev: int, content: int, pos: int) -> int:
    """The identity of a row after the row ``prev``: a stable hash, the same in every process."""
    data = b"".join(x.to_bytes(16, "little", signed=True) for x in (prev, content, pos))
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items a and b share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _span(batch: api.Batch) -> tuple[int, int]:
    return int(batch.pos[0].min()), int(batch.pos[0].max())


def replay_reference(
    models: ModelSet, cfg: SessionConfig, ops: Sequence[Op], loaded: Loaded | None = None
) -> dict[int, list[int]]:
    """Replay a run's prompts on the target alone and generate greedily one token at a time.

    The speculative run's output must equal this: drafted tokens are only ever kept where the
    target agrees. Returns the generated tokens per sequence.
    """
    record = Record()
    saved: dict[int, tuple[bytes, SeqState]] = {}
    slots: dict[int, SavedSlot] = {}
    with Session(models, cfg, record, speculative=False, loaded=loaded) as ref:
        for op in ops:
            match op:
                case Prompt(seq, text, images, step):
                    ref.prompt(seq, text, images, step)
                case TextBatch(parts, step):
                    ref.text_batch(parts, step)
                case Generate(seq, n_tokens, step):
                    ref.generate(seq, n_tokens, step)
                case SaveTarget(seq):
                    saved[seq] = ref.save_target(seq)
                case SaveSlot(seq):
                    slots[seq] = ref.save_slot(seq)
                case RestoreSlot(seq, step):
                    ref.restore_slot(seq, slots[seq], step)
                case RestoreTarget(seq, external, step):
                    ref.restore_target(seq, external or saved[seq], step)
                case Rewind(seq, pos, external, has_checkpoint, step):
                    # like restore: a checkpoint of this session is the sequence's latest save
                    ref.rewind(seq, pos, (external or saved[seq]) if has_checkpoint else None, step)
                case _:
                    raise TypeError(f"not a session operation: {op!r}")
    return record.generated


def _spans(positions: Sequence[int]) -> str:
    """Positions as runs, in order: [0, 1, 2, 5, 5, 6] -> '0..2, 5, 5..6'; 'none' for none."""
    runs: list[list[int]] = []
    for p in sorted(positions):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs) or "none"
