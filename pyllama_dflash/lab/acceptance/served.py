"""The acceptance table through llama-server: the variant columns' conversations as a chat client sends
them (``chat.chat_turns``), each beside a server of the same variant without the draft.

Figures per turn from the answers' ``timings``: the acceptance rate (``draft_n_accepted / draft_n``) with
a 95% interval over conversations, and tokens per second with the draft over without, pooled over the
conversations both servers completed, with its interval.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ...bootstrap import percentile_interval, resample
from ...harness.server import ServerOptions, serve
from ...harness.slotloop.models import ModelSet
from ...harness.tiny.long_context import long_context_target
from ...pace import eta
from ...paths import cache_root
from ...product.llamabuild.builder import BuildOptions, build
from .chat import TURN_PHASES, ChatFailed, TurnResult, chat_turns, fresh_slot_dir
from .job import Column
from .measure import SESSION, columns, per_phase, session_for
from .script import side_by_side
from .stats import bootstrap_mean


def server_columns(cols: Sequence[Column]) -> list[Column]:
    """The columns a llama-server can run: a variant's libcommon, legacy draft or twin, images or not
    (the definition's references run in the library only)."""
    return [c for c in cols if c.mode == "variant"]


def _server_options(slot_dir: Path, draft: bool, n_ctx: int = SESSION.n_ctx) -> ServerOptions:
    return ServerOptions(
        draft=draft,
        n_parallel=1,
        n_ctx=n_ctx,
        n_batch=SESSION.n_batch,
        n_ubatch=SESSION.n_ubatch,
        n_draft_max=SESSION.n_max,
        cache_ram_mib=0,  # the restored slot, not the prompt cache, must hold the conversation
        slot_save_path=slot_dir,
    )


def serve_column(col: Column, models: ModelSet, seeds: Sequence[int], work: Path, image_px: int | None = None) -> dict:
    """One column through llama-server: each conversation on a server with the draft and on one without
    (the same variant, started beside it), turn by turn (``script.side_by_side``), so that the tokens/s
    ratio is measured side by side. Where the draft's server fails a turn, the other has run the turns
    before it and perhaps that one, and none of that conversation's turns count for it."""
    n_ctx = session_for(image_px).n_ctx
    drafted_models = models.with_draft(models.twin) if col.twin else models
    turns: list[TurnResult] = []
    plain: list[TurnResult] = []
    failed = []
    slots = fresh_slot_dir(work, col.name)
    plain_slots = fresh_slot_dir(work, col.name + "_no_draft")
    with (
        serve(col.variant, drafted_models, _server_options(slots, True, n_ctx), log_path=slots / "server.log") as srv,
        serve(
            col.variant,
            drafted_models,
            _server_options(plain_slots, False, n_ctx),
            log_path=plain_slots / "server.log",
        ) as ref,
    ):
        for k, seed in enumerate(seeds):
            mine: list[TurnResult] = []
            theirs: list[TurnResult] = []
            sides = (chat_turns(srv, seed, col.images, image_px), chat_turns(ref, seed, col.images, image_px))
            try:
                for with_draft, without in side_by_side(*sides, k):
                    mine.append(with_draft)
                    theirs.append(without)
            except ChatFailed as e:  # what an operator's client gets back: the server goes on
                failed.append({"seed": seed, "reason": str(e)[:800]})
                turns += mine
                continue
            turns += mine
            plain += theirs
    return {"turns": [asdict(t) for t in turns], "plain": [asdict(t) for t in plain], "failed": failed}


def summarise_turns(turns: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    """Per phase: the acceptance rate (accepted / drafted) with a 95% interval over conversations."""
    out = {}
    for phase, ts, per_conv in per_phase(turns, TURN_PHASES, seeds, weight=lambda t: t["drafted"]):
        per_conv = [pc for pc in per_conv if pc[1]]
        drafted = sum(t["drafted"] for t in ts)
        accepted = sum(t["accepted"] for t in ts)
        lo, hi = bootstrap_mean(per_conv) if per_conv else (0.0, 0.0)
        out[phase] = {
            "turns": len(ts),
            "drafted": drafted,
            "accepted": accepted,
            "rate": accepted / drafted if drafted else 0.0,
            "ci95": [lo, hi],
        }
    return out


def _paired_sums(
    turns: list[dict], plain: list[dict], seeds: Sequence[int], keys: tuple[str, ...], phases: tuple[str, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Per conversation both servers ran (the last key's sum above 0 on both), the sums of ``keys`` over
    its turns (those of ``phases``, or all), with the draft and without: ``[n_conv, len(keys)]`` each."""

    def sums(ts: list[dict]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for t in ts:
            if not phases or t["phase"] in phases:
                out[t["seed"]] = out.get(t["seed"], 0.0) + np.array([float(t.get(k, 0.0)) for k in keys])
        return out

    a, b = sums(turns), sums(plain)
    both = [s for s in seeds if s in a and s in b and a[s][-1] > 0 and b[s][-1] > 0]
    shape = (len(both), len(keys))
    return np.array([a[s] for s in both]).reshape(shape), np.array([b[s] for s in both]).reshape(shape)


def throughput_ratio(
    turns: list[dict], plain: list[dict], seeds: Sequence[int], phases: tuple[str, ...] = ()
) -> dict | None:
    """Tokens per second with the draft over without, over the turns of ``phases`` (or all), pooled over
    the conversations both servers ran, with a 95% interval from resampling those conversations."""
    a, b = _paired_sums(turns, plain, seeds, ("predicted_n", "predicted_ms"), phases)
    if not len(a):
        return None
    (an, ams), (bn, bms) = a.T, b.T
    idx = resample(len(a))
    ratios = (an[idx].sum(1) / ams[idx].sum(1)) / (bn[idx].sum(1) / bms[idx].sum(1))
    lo, hi = percentile_interval(ratios)
    return {
        "conversations": len(a),
        "with_draft_tok_s": float(an.sum() / ams.sum() * 1000),
        "without_draft_tok_s": float(bn.sum() / bms.sum() * 1000),
        "ratio": float((an.sum() / ams.sum()) / (bn.sum() / bms.sum())),
        "ci95": [lo, hi],
    }


IMAGE_TURNS = ("after image", "after second image")


def prefill_ratio(
    turns: list[dict], plain: list[dict], seeds: Sequence[int], phases: tuple[str, ...] = IMAGE_TURNS
) -> dict | None:
    """Prompt processing (time to first token) with the draft over without, over the turns of ``phases``
    (the image turns unless told), pooled over the conversations both servers ran, with a 95% interval
    from resampling them."""
    a, b = _paired_sums(turns, plain, seeds, ("prompt_ms",), phases)
    if not len(a):
        return None
    am, bm = a[:, 0], b[:, 0]
    idx = resample(len(a))
    lo, hi = percentile_interval(am[idx].sum(1) / bm[idx].sum(1))
    return {"conversations": len(a), "ratio": float(am.sum() / bm.sum()), "ci95": [lo, hi]}


def speed_by_phase(turns: list[dict], plain: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    """Per phase of the conversation: tokens/s and time to first token, with the draft over without."""
    return {
        p: {"tok_s": throughput_ratio(turns, plain, seeds, (p,)), "ttft": prefill_ratio(turns, plain, seeds, (p,))}
        for p in TURN_PHASES
    }


def speed_entry(col: Column, result: dict, seeds: Sequence[int]) -> dict:
    """A column's speed figures from its runs with the draft (``turns``) and without (``plain``), as the
    served table and the library's (acceptance.timed) both keep them."""
    turns, plain = result["turns"], result["plain"]
    return {
        "column": asdict(col),
        "throughput": throughput_ratio(turns, plain, seeds),
        "speed": speed_by_phase(turns, plain, seeds),
        "failed": result["failed"],
        "turns": {"drafted": turns, "plain": plain},
    }


def measure_server(
    models: ModelSet,
    seeds: Sequence[int],
    cols: Sequence[Column] | None = None,
    log=print,
    image_px: int | None = None,
) -> dict:
    cols = server_columns(cols or columns())
    if image_px is not None:  # llama-server caps a slot at the training context the tiny target records
        n_ctx = session_for(image_px).n_ctx
        models = replace(models, target=long_context_target(models.target, n_ctx, cache_root() / "long-context"))
    build(sorted({c.variant for c in cols}), BuildOptions(server=True, quiet=True))
    table = {}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-acceptance-server-") as tmp:
        t0 = time.perf_counter()
        for i, col in enumerate(cols):
            result = serve_column(col, models, seeds, Path(tmp), image_px)
            table[col.name] = {
                **speed_entry(col, result, seeds),
                "phases": summarise_turns(result["turns"], seeds),
                "prefill": prefill_ratio(result["turns"], result["plain"], seeds),
            }
            rate = table[col.name]["phases"].get("all after images", {}).get("rate", 0.0)
            log(
                f"  {col.name} (llama-server): acceptance rate after images {rate:.3f} "
                f"(column {i + 1}/{len(cols)}, {eta(i + 1, len(cols), t0)})"
            )
    return {"conversations": len(seeds), "seeds": [min(seeds), max(seeds)], "image_px": image_px, "table": table}


def ratio_cell(r: dict | None) -> str:
    """A ratio with its 95% interval, or an empty cell where none was measured."""
    return "" if r is None else f"{r['ratio']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"


def server_markdown(result: dict) -> str:
    phases = (*TURN_PHASES, "all after images")
    lines = [
        "| column | " + " | ".join(phases) + " | tok/s with draft / without | image turns' prefill with / without |",
        "|" + "---|" * (len(phases) + 3),
    ]
    for name, entry in result["table"].items():
        cells = []
        for p in phases:
            f = entry["phases"].get(p)
            cells.append("" if f is None else f"{f['rate']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]")
        cells += [ratio_cell(entry["throughput"]), ratio_cell(entry.get("prefill"))]
        failed = f" ({len(entry['failed'])} failed)" if entry["failed"] else ""
        lines.append(f"| {name}{failed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms_a_token(turns: list[dict]) -> str:
    times = [t["predicted_ms"] / t["predicted_n"] for t in turns if t.get("predicted_n")]
    return f"{float(np.median(times)):.1f}" if times else "n/a"


def speed_markdown(result: dict) -> str:
    """Per column and phase: tokens/s with the draft over without, then time to first token likewise;
    and the median turn's milliseconds a generated token with the draft and without, which shows a
    column whose side without the draft ran at a level of its own."""
    lines = [
        "| column | " + " | ".join(f"{p}: tok/s, TTFT" for p in TURN_PHASES) + " | ms a token, with / without |",
        "|" + "---|" * (len(TURN_PHASES) + 2),
    ]
    for name, entry in result["table"].items():
        by_phase = entry.get("speed", {})
        cells = [
            f"{ratio_cell(by_phase[p]['tok_s'])}; {ratio_cell(by_phase[p]['ttft'])}" if p in by_phase else ""
            for p in TURN_PHASES
        ]
        turns = entry.get("turns", {})
        cells.append(f"{_ms_a_token(turns.get('drafted', []))} / {_ms_a_token(turns.get('plain', []))}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
