"""Measurements that need native code, each run in a child process for one variant.

``python -m pyllama_dflash.bench.worker JOB OUT`` (``pyllama_dflash.process.child``'s job protocol: the
job is a job.BenchJob, a variant and its task). The parent (bench/__main__.py) interleaves
children of different variants, so both sides of a ratio see the same machine weather.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from .. import api, load
from ..process.child import job_main
from ..slotloop import Session, SessionConfig
from ..slotloop.models import ModelSet, tiny_models
from ..slotloop.record import Record
from ..tiny.image import rgb
from .job import BenchJob, BindingsFill, FillCurve, SpecLoop

TEXT = "hello world and more text here to read"


def spec_loop(args: SpecLoop) -> dict:
    """Tokens per second of a text-only speculative loop: target decode, process, draft, verify."""
    os.environ.setdefault(api.THREADS_ENV, "1")  # steadier: one spinning pool per core, not two
    models = tiny_models()
    n_tokens, repeats = args.n_tokens, args.repeats
    cfg = SessionConfig(n_ctx=512, n_batch=64, n_ubatch=64)
    rates = []
    for r in range(repeats + 1):  # the first one warms caches and is dropped
        with Session(models, cfg, Record()) as s:
            s.prompt(0, TEXT)
            t0 = time.perf_counter()
            s.generate(0, n_tokens)
            dt = time.perf_counter() - t0
        if r:
            rates.append(n_tokens / dt)
    return {"tok_per_s": rates}


def _contexts(models: ModelSet, draft_path, n_ctx: int, n_batch: int):
    tm = api.Model(models.target)
    dm = api.Model(draft_path)
    target = api.Context(tm, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_rs_seq=3)
    draft = api.Context.draft(dm, target, n_batch=n_batch, n_ubatch=n_batch)
    spec = api.Speculative(target, draft, n_max=3)
    return tm, dm, target, draft, spec


def fill_curve(args: FillCurve) -> dict:
    """Time of the draft fill and the removal of the filled positions for holes of h positions,
    against the target's decode of the image chunk that makes such a hole (an h x 3 grid), on the
    patched variant."""
    repeats = args.repeats
    bench = _FillBench(args.draft, 4 * max(args.holes) + 256)
    out = []
    base = _median(lambda: bench.process_after(0), repeats)
    for h in args.holes:
        fills, removals = zip(*(bench.fill_direct(h) for _ in range(repeats)), strict=True)
        fill, removal = float(np.median(fills)), float(np.median(removals))
        both = fill + removal
        # cross-check: fill, injection and removal seen from outside, as the extra time of
        # process() after a hole
        delta = _median(lambda h=h: bench.process_after(h), repeats) - base
        encs, alls = zip(*(bench.image_decode(h) for _ in range(max(1, repeats // 2))), strict=True)
        enc, total = float(np.median(encs)), float(np.median(alls))
        out.append(
            {
                "hole": h,
                "fill_s": fill,
                "remove_s": removal,
                "fill_remove_s": both,
                "process_delta_s": delta,
                "per_position_us": 1e6 * both / h,
                "image_encode_s": enc,
                "image_decode_s": max(total - enc, 0.0),
                "image_total_s": total,
                "fill_over_decode": both / max(total - enc, 1e-9),
                "fill_over_total": both / total,
            }
        )
    bench.close()
    return {"no_hole_process_s": base, "points": out}


class _FillBench:
    """The tiny target, the draft (plain or ``swa``) and the projector, loaded once for every hole."""

    N_BATCH = 512

    def __init__(self, draft: str, n_ctx: int) -> None:
        models = tiny_models()
        draft_path = models.draft_swa if draft == "swa" else models.draft
        self.tm, self.dm, self.target, self.draft, self.spec = _contexts(models, draft_path, n_ctx, self.N_BATCH)
        self.projector = api.Projector(models.mmproj, self.tm)
        self.prefix = self.tm.tokenize(TEXT)
        self.text = self.tm.tokenize("in a few words")

    def process_after(self, hole: int) -> float:
        """spec.process_ok of a text batch that starts `hole` positions past the draft's memory."""
        target, draft, spec = self.target, self.draft, self.spec
        target.clear(), draft.clear()
        b0 = api.Batch.tokens(self.prefix, pos0=0)
        assert target.process_rc(b0) == 0 and spec.process_ok(b0)
        b1 = api.Batch.tokens(self.text, pos0=len(self.prefix) + hole)  # an M-RoPE target accepts the jump
        assert target.process_rc(b1) == 0
        t0 = time.perf_counter()
        ok = spec.process_ok(b1)
        dt = time.perf_counter() - t0
        assert ok and draft.pos_max(0) == target.pos_max(0)
        return dt

    def image_decode(self, hole: int) -> tuple[float, float]:
        """(encode, encode + decode) seconds of an image chunk whose hole is `hole` positions."""
        projector = self.projector
        with projector.tokenize(projector.marker, [rgb(28 * hole, 84, 0)]) as chunks:
            chunk = next(c for c in chunks if c.type != "text")
            assert chunk.n_pos == hole, (chunk.nx, chunk.ny)
            t0 = time.perf_counter()
            projector.encode(chunk)
            t_enc = time.perf_counter() - t0
            self.target.clear(), self.draft.clear()
            t0 = time.perf_counter()
            res = projector.decode_image(self.target, chunk, 0, n_batch=self.N_BATCH)
            t_all = time.perf_counter() - t0
            assert res.rc == 0
            return t_enc, t_all

    def fill_direct(self, hole: int) -> tuple[float, float]:
        """What the patch's prepare_draft/remove_filled do around the rows after a hole, timed
        alone: llama_process on the draft with rows of zero features at the missing positions,
        n_ubatch rows at a time, then llama_memory_seq_rm of them. Returns (fill, removal)."""
        draft = self.draft
        width = draft.decode_embd_width  # target layers x n_embd: the fused feature rows DFlash injects
        n_ubatch = draft.n_ubatch
        draft.clear()
        k = len(self.prefix)
        assert draft.process_rc(api.Batch.embeddings(np.zeros((k, width), np.float32), np.arange(k)[None])) == 0
        t0 = time.perf_counter()
        for off in range(0, hole, n_ubatch):
            n = min(n_ubatch, hole - off)
            rows = api.Batch.embeddings(np.zeros((n, width), np.float32), np.arange(k + off, k + off + n)[None])
            assert draft.process_rc(rows) == 0
        t1 = time.perf_counter()
        assert draft.seq_rm(0, k, k + hole)
        t2 = time.perf_counter()
        assert draft.pos_max(0) == k - 1
        return t1 - t0, t2 - t1

    def close(self) -> None:
        for obj in (self.projector, self.spec, self.draft, self.target, self.dm, self.tm):
            obj.close()


def bindings_fill(args: BindingsFill) -> dict:
    from .bindings_fill import measure_embd_batch_fill

    res = []
    for n_embd in args.n_embd:
        t = measure_embd_batch_fill(args.rows, n_embd, 4, args.repeats)
        res.append({"rows": t.n_rows, "n_embd": t.n_embd, "numpy_s": t.numpy_s, "loop_s": t.loop_s, "ratio": t.ratio})
    return {"points": res}


def _median(fn: Callable[[], float], repeats: int) -> float:
    return float(np.median([fn() for _ in range(repeats)]))


TASKS = {SpecLoop.TASK: spec_loop, FillCurve.TASK: fill_curve, BindingsFill.TASK: bindings_fill}


def run_one(raw: dict) -> dict:
    job = BenchJob.from_json(raw)
    load(job.variant)
    return {"status": "OK", "result": TASKS[job.task.TASK](job.task)}


def main(argv: list[str]) -> int:
    return job_main(argv, run_one)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
