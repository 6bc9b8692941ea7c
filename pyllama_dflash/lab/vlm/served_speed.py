"""Tokens/s with a draft over without, through llama-server, on the trained target (or its padded form).

Held-out conversations as an operator's client sends them (the ``openai`` SDK, the whole history each
turn, greedy, each reply ended by the target's own ``<|im_end|>`` or the token limit): prose only, or the
bench's shape (text, an image, text, a second image). One server without the draft and one per draft
length run side by side, a turn at a time, so every ratio compares turns timed within seconds of each
other on the same tokens (greedy output is the target's with or without a draft).

Per draft length and phase, from llama-server's ``timings``: tokens/s with over without and the prompt's
time (time to first token) with over without, each with a 95% interval over conversations; the accepted
tokens a round ``a`` (``draft_n_accepted`` over rounds, a round drafting ``n_max``); and the cost of a
round ``c`` in single-token decodes that the ratio implies, ``c = (1 + a) / ratio``, beside the
acceptance a 1.5x ratio would need at that cost, ``1.5 c - 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...bootstrap import percentile_interval, resample
from ...harness.server import ServerOptions, serve
from ...harness.server.bodies import image_part
from ...harness.tiny.image import png_bytes
from ..acceptance.chat import ask
from ..acceptance.served import prefill_ratio, throughput_ratio
from ..acceptance.stats import paired_difference
from .corpus import Turn
from .drafts import TrainedOn, draw_turns
from .prose import held_out_paragraphs

REPLY_TOKENS = 200  # a reply's limit: the target's prose replies end by themselves at about this length


@dataclass(frozen=True)
class PairFiles:
    """The files a llama-server runs: the target (the core or its padded form), projector, draft."""

    target: Path
    mmproj: Path
    draft: Path


def conversation(kind: TrainedOn, seed: int, rows: int | None) -> list[tuple[str, Turn]]:
    """A held-out conversation's turns, each with its phase: four prose turns (``text``), or the bench's
    shape, ``text``, ``after image``, ``later``, ``after second image`` (images of ``rows`` rows)."""
    held = held_out_paragraphs()
    turns = draw_turns(kind, np.random.default_rng([13, 60, seed]), held, 4, rows=rows)
    if kind is TrainedOn.TEXT:
        return [("text", t) for t in turns]
    return list(zip(("text", "after image", "later", "after second image"), turns, strict=True))


def _message(turn: Turn) -> dict:
    if turn.image is None:
        return {"role": "user", "content": turn.user}
    return {
        "role": "user",
        "content": [image_part(png_bytes(turn.image.pixels())), {"type": "text", "text": turn.user}],
    }


def run_side_by_side(servers: dict[str, object], seeds: Sequence[int], kind: TrainedOn, rows: int | None, log) -> dict:
    """Every conversation on every server, turn by turn: ``{server name: [turn dicts]}``."""
    out: dict[str, list[dict]] = {name: [] for name in servers}
    t0 = time.perf_counter()
    for i, seed in enumerate(seeds):
        history: dict[str, list[dict]] = {name: [] for name in servers}
        for phase, turn in conversation(kind, seed, rows):
            for name, srv in servers.items():
                history[name].append(_message(turn))
                r = ask(srv, history[name], REPLY_TOKENS, ignore_eos=False)
                history[name].append({"role": "assistant", "content": r.content})
                tm = r.timings
                out[name].append(
                    {
                        "seed": seed,
                        "phase": phase,
                        "reply": r.content,
                        **{k: tm.get(k, 0) for k in ("predicted_n", "predicted_ms", "prompt_ms", "draft_n")},
                        "draft_n_accepted": tm.get("draft_n_accepted", 0),
                    }
                )
        log(f"conversation {i + 1} of {len(seeds)} ({time.perf_counter() - t0:.0f} s)")
    return out


def _acceptance(turns: list[dict], n_max: int) -> float | None:
    drafted = sum(t["draft_n"] for t in turns)
    return sum(t["draft_n_accepted"] for t in turns) / (drafted / n_max) if drafted else None


def summarise(runs: dict[str, list[dict]], seeds: Sequence[int], n_maxes: Sequence[int]) -> dict:
    """Per draft length and phase: the ratios with intervals, ``a``, the implied ``c`` and the acceptance
    1.5x would need; each after-image phase's ratio over the text ratio; and whether every reply with the
    draft was the reply without it."""
    plain = runs["no draft"]
    phases = list(dict.fromkeys(t["phase"] for t in plain))
    table = {}
    for n_max in n_maxes:
        turns = runs[f"n_max {n_max}"]
        cells = {}
        for phase in [*phases, "all"]:
            sel = () if phase == "all" else (phase,)
            tok_s = throughput_ratio(turns, plain, seeds, sel)
            a = _acceptance([t for t in turns if not sel or t["phase"] in sel], n_max)
            c = (1 + a) / tok_s["ratio"] if tok_s and a is not None else None
            cells[phase] = {
                "tok_s": tok_s,
                "ttft": prefill_ratio(turns, plain, seeds, sel),
                "accepted_per_round": a,
                "implied_round_cost": c,
                "accepted_needed_for_1_5x": None if c is None else 1.5 * c - 1,
            }
        same = all(t["reply"] == p["reply"] for t, p in zip(turns, plain, strict=True))
        table[str(n_max)] = {
            "phases": cells,
            "ratio_of_text": ratio_of_text(turns, plain, seeds),
            "replies_equal_without_draft": same,
        }
    return table


@dataclass(frozen=True)
class Served:
    """One way of serving a draft: the build (variant) its server runs and the draft file."""

    variant: str
    draft: Path

    def server(self, n_max: int) -> str:
        return f"{self.variant} {self.draft.name} n_max {n_max}"


def measure_side_by_side(
    served: Sequence[Served],
    target: Path,
    mmproj: Path,
    kind: TrainedOn,
    seeds: Sequence[int],
    n_maxes: Sequence[int] = (3, 7),
    rows: int | None = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """One server without a draft, and one per way of serving and draft length, all asked each turn in
    turn; a record per way of serving, each holding the one plain server's turns as its own ``no draft``.
    Several ways share the plain server, so a comparison of two of them is made on the very same plain
    turns, and the plain side is run once instead of once per way."""
    base = ServerOptions(n_ctx=4096, threads=2, cache_ram_mib=0)
    plain = PairFiles(target, mmproj, served[0].draft)  # a server without a draft loads none of it
    options = {"no draft": (served[0].variant, plain, base.with_(draft=False))}
    for way in served:
        files = PairFiles(target, mmproj, way.draft)
        options.update({way.server(n): (way.variant, files, base.with_(n_draft_max=n)) for n in n_maxes})
    with ExitStack() as stack:
        servers = {name: stack.enter_context(serve(v, f, opts)) for name, (v, f, opts) in options.items()}
        runs = run_side_by_side(servers, seeds, kind, rows, log)
    out = []
    for way in served:
        mine = {"no draft": runs["no draft"], **{f"n_max {n}": runs[way.server(n)] for n in n_maxes}}
        out.append(
            {
                "variant": way.variant,
                "conversation_kind": kind.value,
                "rows": rows,
                "table": summarise(mine, seeds, n_maxes),
                "turns": mine,
            }
        )
        if len(served) > 1:
            out[-1]["served_beside"] = [f"{w.variant} {w.draft.name}" for w in served if w != way]
    return out


def measure(
    variant: str,
    files: PairFiles,
    kind: TrainedOn,
    seeds: Sequence[int],
    n_maxes: Sequence[int] = (3, 7),
    rows: int | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """One way of serving, beside a server without the draft."""
    (record,) = measure_side_by_side(
        [Served(variant, files.draft)], files.target, files.mmproj, kind, seeds, n_maxes, rows, log
    )
    return record


def paired_acceptance(a: dict, b: dict, n_max: int) -> dict:
    """Accepted tokens a round of record ``a`` minus record ``b`` (two ``measure`` records of one draft and
    the same conversations, e.g. two variants), per phase, paired over conversations with a 95% interval;
    and how many turns' replies were the same, so that the pair is judged on the same target tokens."""
    ta, tb = a["turns"][f"n_max {n_max}"], b["turns"][f"n_max {n_max}"]
    seeds = sorted({t["seed"] for t in ta})

    def per_conv(turns: list[dict], phase: str) -> list[tuple[float, float]]:
        sel = [[t for t in turns if t["seed"] == s and t["phase"] == phase] for s in seeds]
        return [(sum(t["draft_n_accepted"] for t in ts), sum(t["draft_n"] for t in ts) / n_max) for ts in sel]

    phases = list(dict.fromkeys(t["phase"] for t in ta))
    return {
        "phases": {p: paired_difference(per_conv(ta, p), per_conv(tb, p)) for p in phases},
        "same_replies": sum(x["reply"] == y["reply"] for x, y in zip(ta, tb, strict=True)),
        "turns": len(ta),
    }


def ratio_of_text(turns: list[dict], plain: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    """Per phase after an image: its tokens/s ratio (with the draft over without) over the text turns' ratio
    of the same conversations, with a 95% interval from resampling the conversations for both at once."""

    def sums(ts: list[dict], phase: str) -> np.ndarray:  # [conversation, (tokens, ms)]
        keys = ("predicted_n", "predicted_ms")
        return np.array(
            [[sum(t[k] for t in ts if t["seed"] == s and t["phase"] == phase) for k in keys] for s in seeds], float
        )

    def ratio(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> np.ndarray:
        a, b = a[idx].sum(axis=-2), b[idx].sum(axis=-2)
        return (a[..., 0] / a[..., 1]) / (b[..., 0] / b[..., 1])

    idx, whole = resample(len(seeds)), np.arange(len(seeds))
    text = sums(turns, "text"), sums(plain, "text")
    out = {}
    for phase in dict.fromkeys(t["phase"] for t in plain if t["phase"] != "text"):
        this = sums(turns, phase), sums(plain, phase)
        lo, hi = percentile_interval(ratio(*this, idx) / ratio(*text, idx))
        out[phase] = {"ratio": float(ratio(*this, whole) / ratio(*text, whole)), "ci95": [lo, hi]}
    return out
