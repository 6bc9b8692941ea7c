"""Measurements that need native code, each run in a child process for one variant.

``python -m pyllama_dflash.lab.bench.worker JOB OUT`` (``pyllama_dflash.product.process.child``'s job protocol: the
job is a job.BenchJob, a variant and its task). The parent (bench/__main__.py) interleaves
children of different variants, so both sides of a ratio see the same machine weather.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack

import numpy as np

from ... import load
from ...harness.slotloop import Session, SessionConfig
from ...harness.slotloop.models import ModelSet, tiny_models
from ...harness.slotloop.record import Record
from ...harness.tiny.image import rgb
from ...product import api
from ...product.process.child import job_main
from .job import BatchCost, BenchJob, BindingsFill, FillCurve, RoundCosts, SpecLoop

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
        encs, decs = zip(*(bench.image_decode(h) for _ in range(max(1, repeats // 2))), strict=True)
        enc, decode = float(np.median(encs)), float(np.median(decs))
        out.append(
            {
                "hole": h,
                "fill_s": fill,
                "remove_s": removal,
                "fill_remove_s": both,
                "process_delta_s": delta,
                "per_position_us": 1e6 * both / h,
                "image_encode_s": enc,
                "image_decode_s": decode,
                "fill_over_decode": both / decode,
                "fill_over_total": both / (enc + decode),
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
        """(encode, decode) seconds of an image chunk whose hole is `hole` positions, each timed alone."""
        projector = self.projector
        with projector.tokenize(projector.marker, [rgb(28 * hole, 84, 0)]) as chunks:
            chunk = next(c for c in chunks if c.type != "text")
            assert chunk.n_pos == hole, (chunk.nx, chunk.ny)
            t0 = time.perf_counter()
            projector.encode(chunk)
            t_enc = time.perf_counter() - t0
            self.target.clear(), self.draft.clear()
            t0 = time.perf_counter()
            res = projector.decode_image(self.target, chunk, 0, n_batch=self.N_BATCH, encode=False)
            t_dec = time.perf_counter() - t0
            assert res.rc == 0
            return t_enc, t_dec

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


def _timed_decode(ctx: api.Context, tokens: np.ndarray, pos0: int) -> tuple[api.Batch, float]:
    """Decode ``tokens`` at ``pos0``, every row's logits asked for (as a verify asks): the batch, and
    the seconds of the decode alone; a decode that fails raises."""
    batch = api.Batch.tokens(tokens, pos0=pos0, logits="all")
    t0 = time.perf_counter()
    rc = ctx.decode(batch)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"decode of {len(tokens)} tokens at position {pos0} returned {rc}")
    return batch, dt


def batch_cost(args: BatchCost) -> dict:
    """Seconds of the target's decode of k text tokens for each k in ``sizes``, every row's logits
    asked for (as a verify asks), after a prefix of ``prompt`` tokens. Each round decodes every size
    once, in an order that rotates, so every size sees the same machine weather; the context grows by
    what each decode appends, alike for every size."""
    from pyllama_dflash.harness.tiny.bench_pair import weight_bytes

    model = api.Model(args.target)
    ctx = api.Context(model, n_ctx=args.n_ctx, n_batch=args.prompt, n_ubatch=args.prompt)
    rng = np.random.default_rng(0)
    pos = 0

    def decode(n: int) -> float:
        nonlocal pos
        _, dt = _timed_decode(ctx, 8 + rng.integers(0, 100, n), pos)
        pos += n
        return dt

    try:
        decode(args.prompt)
        for k in args.sizes:  # a warm-up of every size: the first call of a shape allocates its graph
            decode(k)
        seconds: dict[str, list[float]] = {str(k): [] for k in args.sizes}
        for r in range(args.rounds):
            turn = r % len(args.sizes)
            for k in args.sizes[turn:] + args.sizes[:turn]:
                seconds[str(k)].append(decode(k))
    finally:
        ctx.close()
        model.close()
    return {"seconds": seconds, "weight_bytes": weight_bytes(args.target)}


def _round_contexts(args: RoundCosts, opened: ExitStack) -> tuple[api.Context, api.Context, api.Speculative]:
    """The drafting target (with rollback snapshots as served, unless told not), the plain target beside
    it (none, as llama-server's without a draft) and the speculative driver over the draft, each closed
    with ``opened``."""
    tm = opened.enter_context(api.Model(args.target))
    dm = opened.enter_context(api.Model(args.draft))
    n_max = dm.dflash_block_size - 1
    sized = {"n_ctx": args.n_ctx, "n_batch": args.prompt, "n_ubatch": args.prompt}
    target = opened.enter_context(api.Context(tm, **sized, n_rs_seq=n_max if args.rollback_snapshots else 0))
    plain = opened.enter_context(api.Context(tm, **sized))
    draft = opened.enter_context(api.Context.draft(dm, target, n_batch=args.prompt, n_ubatch=args.prompt))
    return target, plain, opened.enter_context(api.Speculative(target, draft, n_max=n_max))


def round_costs(args: RoundCosts) -> dict:
    """Seconds of each part of a speculative round (see job.RoundCosts) and of one plain decode, round
    by round on one sequence, on the variant this child loaded."""
    from pyllama_dflash.harness.tiny.bench_pair import weight_bytes

    parts: dict[str, list[float]] = {"decode": [], "draft": [], "verify": [], "process": []}
    drafted: list[int] = []

    def timed(part: str, fn: Callable[[], object]) -> object:
        t0 = time.perf_counter()
        out = fn()
        parts[part].append(time.perf_counter() - t0)
        return out

    def decode(ctx: api.Context, tokens: np.ndarray, pos0: int, part: str | None) -> api.Batch:
        batch, dt = _timed_decode(ctx, tokens, pos0)
        if part:
            parts[part].append(dt)
        return batch

    def feed(tokens: np.ndarray, pos0: int, part: str | None) -> None:
        batch = decode(target, tokens, pos0, part)
        ok = timed("process", lambda: spec.process_ok(batch)) if part == "verify" else spec.process_ok(batch)
        if not ok:
            raise RuntimeError(f"process() refused the batch at position {pos0}")

    with ExitStack() as opened:  # whatever opened is closed, a failure halfway included
        target, plain, spec = _round_contexts(args, opened)
        n_rs_seq = {"drafting": target.n_rs_seq, "plain": plain.n_rs_seq}
        prompt = 8 + np.random.default_rng(0).integers(0, 100, args.prompt)
        feed(prompt, 0, None)
        decode(plain, prompt, 0, None)
        spec.begin(0, prompt)
        pos = args.prompt
        # both contexts take every row, so the plain decode sees the drafting side's context length
        for r in range(args.rounds + 1):  # the first round warms up every graph and is dropped
            last = int(target.argmax())
            decode(plain, np.array([last]), pos, "decode")  # one token, no draft
            feed(np.array([last]), pos, None)
            pos += 1
            last = int(target.argmax())
            block = timed("draft", lambda last=last, pos=pos: spec.draft(0, last, pos))
            drafted.append(len(block))
            feed(np.array([last, *block]), pos, "verify")
            decode(plain, np.array([last, *block]), pos, None)
            spec.accept(0, len(block))
            pos += 1 + len(block)
            if r == 0:
                for times in (*parts.values(), drafted):
                    times.clear()
    return {
        "seconds": parts,
        "drafted": drafted,
        "n_rs_seq": n_rs_seq,
        "weight_bytes": {"target": weight_bytes(args.target), "draft": weight_bytes(args.draft)},
    }


def _median(fn: Callable[[], float], repeats: int) -> float:
    return float(np.median([fn() for _ in range(repeats)]))


TASKS = {
    SpecLoop.TASK: spec_loop,
    FillCurve.TASK: fill_curve,
    BindingsFill.TASK: bindings_fill,
    BatchCost.TASK: batch_cost,
    RoundCosts.TASK: round_costs,
}


def run_one(raw: dict) -> dict:
    job = BenchJob.from_json(raw)
    load(job.variant)
    return {"status": "OK", "result": TASKS[job.task.TASK](job.task)}


def main(argv: list[str]) -> int:
    return job_main(argv, run_one)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
