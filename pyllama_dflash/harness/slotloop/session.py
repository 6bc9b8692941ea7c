"""A llama-server slot loop in miniature, over the bindings, recording every return code.

It makes the calls llama-server makes when a prompt with images meets a DFlash drafter:
text batches go to the target (``llama_process``) and then to ``common_speculative_process``;
an image chunk goes through ``mtmd_helper_decode_image_chunk`` whose post-decode callback hands
each sub-batch to ``common_speculative_process``; generation drafts from the last sampled token,
verifies the draft on the target, feeds the verified batch to the driver, trims both memories
past the accepted tokens (llama-server's ``slot.mem.seq_rm``) and tells the driver how many were
accepted. Sampling is greedy, so the output must equal plain greedy decoding (checked by
:func:`~.replay.replay_reference`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np

from ...product import api
from .config import SessionConfig
from .drafting import Drafting
from .loaded import Loaded
from .models import ModelSet
from .ops import Op, Prompt, TextBatch
from .record import Call, Record
from .reference_modes import ReferenceModes
from .rows import Rows, digest
from .slots import Boundaries
from .state import SeqState


class Session(Drafting, Boundaries, ReferenceModes, Rows):
    """Target, draft, speculative driver and projector for one scenario run (one variant).

    Opening, prompts and the driver's calls are here; generation is :class:`~.drafting.Drafting`'s,
    the request boundaries :class:`~.slots.Boundaries`', the reference runs' modes
    :class:`~.reference_modes.ReferenceModes`' and the rows' bookkeeping :class:`~.rows.Rows`'.
    """

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
        # model, pyllama_dflash.lab.draftmodel): given the features of every row, id_last and n_draft
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
        digests = iter(digest(img) for img in images)  # each image's rows' contents, in the chunks' order
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


def _span(batch: api.Batch) -> tuple[int, int]:
    return int(batch.pos[0].min()), int(batch.pos[0].max())
