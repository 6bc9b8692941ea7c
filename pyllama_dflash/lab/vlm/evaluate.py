"""Judging the trained target on llama.cpp itself: its logits against the reference forward, and
what it writes about an image it has not seen.

Both run on a real build through the bindings (the caller loads a variant first). The logits of
every row come from one ``llama_process`` per chunk, text rows as tokens and image rows as the
embeddings mtmd made of the image, at the positions mtmd gives them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import forward
from .config import CoreConfig
from .corpus import CAPTION_QUESTION, Image, Rendered
from .vocab import IM_END, VOCAB


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    """Mean squared error over the reference's mean square."""
    want = np.asarray(want, np.float64)
    return float(np.mean((np.asarray(got, np.float64) - want) ** 2) / np.mean(want**2))


def llama_logits(target: Path, rendered: Rendered, rows_of: dict[tuple, np.ndarray]) -> np.ndarray:
    """Logits ``[n, n_vocab]`` of every row of ``rendered``, from llama.cpp, a chunk per call."""
    from pyllama_dflash.product import api

    n = rendered.n
    image_at = {first: im for first, im in rendered.image_rows}
    out = []
    with api.Model(target) as model:
        ctx = api.Context(model, n_ctx=max(256, n + 8), n_batch=n, n_ubatch=n)
        try:
            i = 0
            while i < n:
                if i in image_at:
                    rows = rows_of[image_at[i].key]
                    j = i + len(rows)
                    batch = api.Batch.embeddings(rows, rendered.pos[:, i:j], logits="all")
                else:
                    j = next((f for f in sorted(image_at) if f > i), n)
                    batch = api.Batch.tokens(rendered.tokens[i:j], rendered.pos[0, i:j], logits="all")
                rc = ctx.process_rc(batch)
                if rc != 0:
                    raise RuntimeError(f"{target}: llama_process returned {rc} at rows {i}..{j - 1}")
                out += [ctx.logits(k) for k in range(j - i)]
                i = j
        finally:
            ctx.close()
    return np.stack(out)


def reference_logits(cfg: CoreConfig, params: dict, rendered: Rendered, rows_of: dict[tuple, np.ndarray]) -> np.ndarray:
    x = params["token_embd.weight"][np.maximum(rendered.tokens, 0)].astype(np.float32)
    for first, im in rendered.image_rows:
        rows = rows_of[im.key]
        x[first : first + len(rows)] = rows
    return forward.logits(np, params, cfg, x, rendered.pos)


CAPTION = re.compile(r"I see an? (\w+) (\w+) at the (\w+)\.")


@dataclass(frozen=True)
class CaptionResult:
    image: Image
    reply: str

    def parsed(self) -> tuple[str, str, str] | None:
        m = CAPTION.search(self.reply)
        return (m.group(1), m.group(2), m.group(3)) if m else None

    def right(self, attribute: str) -> bool:
        got = self.parsed()
        if got is None:
            return False
        colour, shape, place = got
        return {"colour": colour, "shape": shape, "place": place}[attribute] == getattr(self.image.scene, attribute)


def greedy_captions(target: Path, mmproj: Path, images: Sequence[Image], max_tokens: int = 48) -> list[CaptionResult]:
    """The target's greedy reply to the caption question about each image, through mtmd's helper
    (as llama-server feeds it)."""
    from pyllama_dflash.product import api

    results = []
    prompt_tail = f"{CAPTION_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    with api.Model(target) as model, api.Projector(mmproj, model) as proj:
        ctx = api.Context(model, n_ctx=2048, n_batch=1024, n_ubatch=1024)
        try:
            for image in images:
                ctx.clear()
                n_past = 0
                text = f"<|im_start|>user\n{proj.marker}{prompt_tail}"
                with proj.tokenize(text, [image.pixels()]) as chunks:
                    for chunk in chunks:
                        if chunk.type == "image":
                            n_past = proj.decode_image(ctx, chunk, n_past).n_past
                        else:
                            toks = chunk.tokens
                            if ctx.process_rc(api.Batch.tokens(toks, pos0=n_past, logits="last")) != 0:
                                raise RuntimeError(f"{target}: prompt decode failed")
                            n_past += len(toks)
                results.append(CaptionResult(image, _greedy(ctx, n_past, max_tokens, target)))
        finally:
            ctx.close()
    return results


def _greedy(ctx, n_past: int, max_tokens: int, target: Path) -> str:
    """The reply a context holding a prompt up to ``n_past`` writes greedily, up to its <|im_end|>."""
    from pyllama_dflash.product import api

    reply: list[int] = []
    for pos in range(n_past, n_past + max_tokens):
        tok = ctx.argmax(-1)
        if tok == IM_END:
            break
        reply.append(tok)
        if ctx.process_rc(api.Batch.tokens([tok], pos0=pos, logits="last")) != 0:
            raise RuntimeError(f"{target}: decode failed")
    return VOCAB.decode(reply)


def caption_scores(results: Sequence[CaptionResult]) -> dict[str, float]:
    n = max(len(results), 1)
    return {a: sum(r.right(a) for r in results) / n for a in ("colour", "shape", "place")} | {
        "parsed": sum(r.parsed() is not None for r in results) / n
    }


def greedy_reply(target: Path, question: str, max_tokens: int = 240) -> str:
    """The target's greedy reply to a one-turn text chat."""
    from pyllama_dflash.product import api

    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    with api.Model(target) as model:
        ctx = api.Context(model, n_ctx=max_tokens + 256, n_batch=256, n_ubatch=256)
        try:
            toks = [int(t) for t in model.tokenize(prompt, parse_special=True)]
            if ctx.process_rc(api.Batch.tokens(toks, logits="last")) != 0:
                raise RuntimeError(f"{target}: prompt decode failed")
            return _greedy(ctx, len(toks), max_tokens, target)
        finally:
            ctx.close()
