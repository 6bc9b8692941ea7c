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
from pathlib import Path

import numpy as np

from .. import child
from ..engine.matrix import DEFINITION, REFERENCE
from ..llamabuild.patchset import BASELINE, load_series
from ..paths import default_patches_dir
from ..scenarios.models import ModelSet
from .job import AcceptanceJob, Column
from .script import PHASES

MODEL = "reference model"
AFTER_IMAGES = {"after image", "later", "after second image", "after restore"}
TEXT_ONLY = "text only"
SESSION = {"n_ctx": 1024, "n_batch": 64, "n_ubatch": 64, "n_max": 3}


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


def run_column(job: AcceptanceJob, work_dir: Path, timeout: float = 1800) -> dict:
    result = child.run_job(
        "pyllama_dflash.acceptance.worker", job.to_json(), work_dir, job.column.name.replace(" ", "_"), timeout=timeout
    )
    if result.get("status") != "OK":
        tail = "\n".join(result.get("log_tail", []))
        raise RuntimeError(f"acceptance column {job.column.name}: {result.get('first_failure')}\n{tail}")
    return result


def bootstrap_mean(per_conv: list[tuple[float, int]], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of (sum accepted / rounds) resampling conversations."""
    acc = np.array([a for a, _ in per_conv], dtype=float)
    n = np.array([k for _, k in per_conv], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_conv), size=(n_boot, len(per_conv)))
    tot = n[idx].sum(axis=1)
    means = np.where(tot > 0, acc[idx].sum(axis=1) / np.maximum(tot, 1), 0.0)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


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
                "column": col.__dict__,
                "phases": summarise(result["rounds"], seeds),
                "failed": result["failed"],
            }
            overall = table[col.name]["phases"].get("all after images", {})
            log(f"  {col.name}: mean accepted after images {overall.get('mean_accepted', 0):.3f}")
    return {"conversations": len(seeds), "seeds": [min(seeds), max(seeds)], "session": SESSION, "table": table}


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
    return "\n".join(lines)
