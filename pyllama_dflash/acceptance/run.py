"""Every column of the acceptance table side by side, on the same conversations, with intervals.

The columns: each variant of the series with the trained legacy draft; baseline with its reconverted
twin; baseline drafting as the definition has it, through llama.cpp and through the reference model
(the definition's ceiling); and the last variant on the same conversations without their images (the
text-only ceiling). Each column runs in a child of its own. Figures per phase: rounds, mean accepted
tokens per round, the acceptance rate (accepted / drafted), and a 95% interval of the mean accepted
from a bootstrap over conversations (a conversation's rounds are not independent of each other).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import child
from ..engine.matrix import DEFINITION, REFERENCE, reference_of
from ..llamabuild.builder import BuildOptions, build
from ..llamabuild.patchset import BASELINE, load_series
from ..paths import default_patches_dir
from ..scenarios.config import SessionConfig
from ..scenarios.models import ModelSet
from ..server import ServerOptions, serve
from .chat import TURN_PHASES, ChatFailed, TurnResult, fresh_slot_dir, run_chat
from .job import AcceptanceJob, Column
from .script import PHASES

MODEL = "reference model"
AFTER_IMAGES = {"after image", "later", "after second image", "after restore"}
TEXT_ONLY = "text only"
SESSION = SessionConfig(n_ctx=1024, n_batch=64, n_ubatch=64, n_max=3)


def columns(variants: Sequence[str] | None = None) -> list[Column]:
    variants = list(variants or load_series(default_patches_dir()).variants)
    cols = [Column(v, v) for v in variants]
    cols.insert(1, Column(REFERENCE, BASELINE, twin=True))
    cols += [
        Column(DEFINITION, BASELINE, mode="definition"),
        Column(MODEL, BASELINE, mode="model"),
        Column(TEXT_ONLY, variants[-1], images=False),
    ]
    return cols


def pairs(cols: Sequence[Column]) -> list[tuple[str, str]]:
    """The comparisons the table is for: the variant judged against the definition (the matrix's
    reference_of) against the twin on baseline (what b11434 does with a reconverted draft), and the two
    ceilings against that variant."""
    defined = [c.name for c in cols if c.mode == "variant" and c.images and reference_of(c.variant) == DEFINITION]
    if not defined:
        return []
    return [(defined[0], REFERENCE), (TEXT_ONLY, defined[0]), (MODEL, defined[0])]


def run_column(job: AcceptanceJob, work_dir: Path, timeout: float = 1800) -> dict:
    result = child.run_job(
        "pyllama_dflash.acceptance.worker", job.to_json(), work_dir, job.column.name.replace(" ", "_"), timeout=timeout
    )
    if result.get("status") != "OK":
        tail = "\n".join(result.get("log_tail", []))
        raise RuntimeError(f"acceptance column {job.column.name}: {result.get('first_failure')}\n{tail}")
    return result


def _resampled_means(per_conv: list[tuple[int, int]], idx: np.ndarray) -> np.ndarray:
    """Pooled mean accepted (sum accepted / rounds) of each resample of conversations."""
    acc = np.array([a for a, _ in per_conv], dtype=float)[idx].sum(axis=1)
    n = np.array([k for _, k in per_conv], dtype=float)[idx].sum(axis=1)
    return np.where(n > 0, acc / np.maximum(n, 1), 0.0)


def _resample(n_conv: int, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_conv, size=(n_boot, n_conv))


def bootstrap_mean(per_conv: list[tuple[int, int]]) -> tuple[float, float]:
    """95% percentile interval of the pooled mean accepted, resampling conversations."""
    lo, hi = np.quantile(_resampled_means(per_conv, _resample(len(per_conv))), [0.025, 0.975])
    return float(lo), float(hi)


def paired_difference(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> dict:
    """Mean accepted of a minus b on the same conversations, with a 95% interval from resampling the
    conversations once for both (each conversation is its own pair)."""
    idx = _resample(len(a))
    d = _resampled_means(a, idx) - _resampled_means(b, idx)
    point = _resampled_means(a, np.arange(len(a))[None])[0] - _resampled_means(b, np.arange(len(b))[None])[0]
    lo, hi = np.quantile(d, [0.025, 0.975])
    return {"difference": float(point), "ci95": [float(lo), float(hi)], "told_apart": bool(lo > 0 or hi < 0)}


def summarise(rounds: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    out = {}
    for phase in (*PHASES, "all after images"):
        want = AFTER_IMAGES if phase == "all after images" else {phase}
        rs = [r for r in rounds if r["phase"] in want]
        if not rs:
            continue
        per_conv = [
            (sum(r["accepted"] for r in rs if r["seed"] == s), sum(1 for r in rs if r["seed"] == s)) for s in seeds
        ]
        drafted = sum(r["drafted"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        lo, hi = bootstrap_mean(per_conv)
        out[phase] = {
            "per_conversation": per_conv,
            "rounds": len(rs),
            "mean_accepted": accepted / len(rs),
            "ci95": [lo, hi],
            "rate": accepted / drafted if drafted else 0.0,
            "drafted": drafted,
        }
    return out


def measure(models: ModelSet, seeds: Sequence[int], cols: Sequence[Column] | None = None, log=print) -> dict:
    cols = list(cols or columns())
    table = {}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-acceptance-") as tmp:
        for col in cols:
            job = AcceptanceJob(col, models, tuple(seeds), SESSION)
            result = run_column(job, Path(tmp))
            table[col.name] = {
                "column": asdict(col),
                "phases": summarise(result["rounds"], seeds),
                "failed": result["failed"],
            }
            overall = table[col.name]["phases"].get("all after images", {})
            log(f"  {col.name}: mean accepted after images {overall.get('mean_accepted', 0):.3f}")
    differences = {}
    for a, b in pairs(cols):
        if a in table and b in table:
            pa, pb = table[a]["phases"], table[b]["phases"]
            differences[f"{a} - {b}"] = {
                phase: paired_difference(pa[phase]["per_conversation"], pb[phase]["per_conversation"])
                for phase in pa
                if phase in pb
            }
    return {
        "conversations": len(seeds),
        "seeds": [min(seeds), max(seeds)],
        "session": SESSION.to_json(),
        "table": table,
        "differences": differences,
    }


# -- through llama-server ------------------------------------------------------------------------------


def server_columns(cols: Sequence[Column]) -> list[Column]:
    """The columns a llama-server can run: a variant's libcommon, legacy draft or twin, images or not
    (the definition's references run in the library only)."""
    return [c for c in cols if c.mode == "variant"]


def _server_options(slot_dir: Path, draft: bool) -> ServerOptions:
    return ServerOptions(
        draft=draft,
        n_parallel=1,
        n_ctx=SESSION.n_ctx,
        n_batch=SESSION.n_batch,
        n_ubatch=SESSION.n_ubatch,
        n_draft_max=SESSION.n_max,
        cache_ram_mib=0,  # the restored slot, not the prompt cache, must hold the conversation
        slot_save_path=slot_dir,
    )


def serve_column(col: Column, models: ModelSet, seeds: Sequence[int], work: Path) -> dict:
    """One column through llama-server: each conversation on a server with the draft, then on one without
    (the same variant, started beside it), so that the tokens/s ratio is measured side by side."""
    drafted_models = models.with_draft(models.draft_mrope) if col.twin else models
    turns: list[TurnResult] = []
    plain: list[TurnResult] = []
    failed = []
    slots = fresh_slot_dir(work, col.name)
    plain_slots = fresh_slot_dir(work, col.name + "_no_draft")
    with (
        serve(col.variant, drafted_models, _server_options(slots, True), log_path=slots / "server.log") as srv,
        serve(
            col.variant, drafted_models, _server_options(plain_slots, False), log_path=plain_slots / "server.log"
        ) as ref,
    ):
        for seed in seeds:
            mine: list[TurnResult] = []
            try:
                run_chat(srv, seed, mine, images=col.images)
            except ChatFailed as e:  # what an operator's client gets back: the server goes on
                failed.append({"seed": seed, "reason": str(e)[:800]})
                turns += mine
                continue
            theirs: list[TurnResult] = []
            run_chat(ref, seed, theirs, images=col.images)
            turns += mine
            plain += theirs
    return {"turns": [asdict(t) for t in turns], "plain": [asdict(t) for t in plain], "failed": failed}


def summarise_turns(turns: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    """Per phase: the acceptance rate (accepted / drafted) with a 95% interval over conversations."""
    out = {}
    for phase in (*TURN_PHASES, "all after images"):
        want = AFTER_IMAGES if phase == "all after images" else {phase}
        ts = [t for t in turns if t["phase"] in want]
        if not ts:
            continue
        per_conv = [
            (sum(t["accepted"] for t in ts if t["seed"] == s), sum(t["drafted"] for t in ts if t["seed"] == s))
            for s in seeds
        ]
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


def throughput_ratio(turns: list[dict], plain: list[dict], seeds: Sequence[int]) -> dict | None:
    """Tokens per second with the draft over without, pooled over the conversations both servers ran,
    with a 95% interval from resampling those conversations."""

    def per_seed(ts: list[dict]) -> dict[int, tuple[float, float]]:
        out: dict[int, tuple[float, float]] = {}
        for t in ts:
            n, ms = out.get(t["seed"], (0.0, 0.0))
            out[t["seed"]] = (n + t["predicted_n"], ms + t["predicted_ms"])
        return out

    a, b = per_seed(turns), per_seed(plain)
    both = [s for s in seeds if s in a and s in b and a[s][1] > 0 and b[s][1] > 0]
    if not both:
        return None
    an, ams, bn, bms = (np.array([src[s][k] for s in both]) for src in (a, b) for k in (0, 1))
    idx = _resample(len(both))
    ratios = (an[idx].sum(1) / ams[idx].sum(1)) / (bn[idx].sum(1) / bms[idx].sum(1))
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    return {
        "conversations": len(both),
        "with_draft_tok_s": float(an.sum() / ams.sum() * 1000),
        "without_draft_tok_s": float(bn.sum() / bms.sum() * 1000),
        "ratio": float((an.sum() / ams.sum()) / (bn.sum() / bms.sum())),
        "ci95": [float(lo), float(hi)],
    }


def measure_server(models: ModelSet, seeds: Sequence[int], cols: Sequence[Column] | None = None, log=print) -> dict:
    cols = server_columns(cols or columns())
    build(sorted({c.variant for c in cols}), BuildOptions(server=True, quiet=True))
    table = {}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-acceptance-server-") as tmp:
        for col in cols:
            result = serve_column(col, models, seeds, Path(tmp))
            table[col.name] = {
                "column": asdict(col),
                "phases": summarise_turns(result["turns"], seeds),
                "throughput": throughput_ratio(result["turns"], result["plain"], seeds),
                "failed": result["failed"],
                "turns": {"drafted": result["turns"], "plain": result["plain"]},
            }
            rate = table[col.name]["phases"].get("all after images", {}).get("rate", 0.0)
            log(f"  {col.name} (llama-server): acceptance rate after images {rate:.3f}")
    return {"conversations": len(seeds), "seeds": [min(seeds), max(seeds)], "table": table}


def server_markdown(result: dict) -> str:
    phases = (*TURN_PHASES, "all after images")
    lines = [
        "| column | " + " | ".join(phases) + " | tok/s with draft / without |",
        "|" + "---|" * (len(phases) + 2),
    ]
    for name, entry in result["table"].items():
        cells = []
        for p in phases:
            f = entry["phases"].get(p)
            cells.append("" if f is None else f"{f['rate']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]")
        t = entry["throughput"]
        cells.append("" if t is None else f"{t['ratio']:.2f} [{t['ci95'][0]:.2f}, {t['ci95'][1]:.2f}]")
        failed = f" ({len(entry['failed'])} failed)" if entry["failed"] else ""
        lines.append(f"| {name}{failed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    phases = [p for p in (*PHASES, "all after images")]
    head = "| column | " + " | ".join(phases) + " |"
    lines = [head, "|" + "---|" * (len(phases) + 1)]
    for name, entry in result["table"].items():
        cells = []
        for p in phases:
            f = entry["phases"].get(p)
            cells.append("" if f is None else f"{f['mean_accepted']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]")
        failed = f" ({len(entry['failed'])} failed)" if entry["failed"] else ""
        lines.append(f"| {name}{failed} | " + " | ".join(cells) + " |")
    for pair, by_phase in result.get("differences", {}).items():
        cells = []
        for p in phases:
            f = by_phase.get(p)
            mark = "" if f is None or f["told_apart"] else " (not told apart)"
            cells.append(
                "" if f is None else f"{f['difference']:+.2f} [{f['ci95'][0]:+.2f}, {f['ci95'][1]:+.2f}]{mark}"
            )
        lines.append(f"| *{pair}* | " + " | ".join(cells) + " |")
    return "\n".join(lines)
