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
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from ...env import THREADS_ENV
from ...harness.oracles.references import DEFINITION, REFERENCE, reference_of
from ...harness.slotloop.config import SessionConfig
from ...harness.slotloop.models import ModelSet
from ...paths import default_patches_dir
from ...product.llamabuild.patchset import BASELINE, load_series
from ...product.process import child
from .job import AcceptanceJob, Column
from .script import PHASES
from .stats import bootstrap_mean, paired_difference

MODEL = "reference model"
AFTER_IMAGES = {"after image", "later", "after second image", "after restore", "later after restore"}
TEXT_ONLY = "text only"
SESSION = SessionConfig(n_ctx=1024, n_batch=64, n_ubatch=64, n_max=3)
# n_ctx for two images of 1024 rows and the turns' text, with the draft holding every row (definition)
N_CTX_LARGE_IMAGES = 4096
WORKER = "pyllama_dflash.lab.acceptance.worker"  # the child that runs a column


def session_for(image_px: int | None) -> SessionConfig:
    """The session of a conversation whose images are ``image_px`` wide (None: the corpus's small ones)."""
    return SESSION if image_px is None else replace(SESSION, n_ctx=N_CTX_LARGE_IMAGES)


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


def pairs(cols: Sequence[Column], models: ModelSet) -> list[tuple[str, str]]:
    """The comparisons the table is for: the variant judged against the definition on these models (the
    oracles' reference_of) against the twin on baseline (what b11434 does with a reconverted draft), and
    the two ceilings against that variant."""
    defined = [
        c.name for c in cols if c.mode == "variant" and c.images and reference_of(c.variant, models) == DEFINITION
    ]
    if not defined:
        return []
    return [(defined[0], REFERENCE), (TEXT_ONLY, defined[0]), (MODEL, defined[0])]


def run_column(
    job: AcceptanceJob, work_dir: Path, timeout: float = 1800, module: str = WORKER, threads: int | None = None
) -> dict:
    """One column in a child running ``module`` (``python -m module JOB OUT``), its contexts on ``threads``
    threads where given (children that run at once share the cores)."""
    env = {THREADS_ENV: str(threads)} if threads else None
    name = job.column.name.replace(" ", "_")
    result = child.run_job(module, job.to_json(), work_dir, name, timeout=timeout, env=env)
    if result.get("status") != "OK":
        tail = "\n".join(result.get("log_tail", []))
        raise RuntimeError(f"acceptance column {job.column.name}: {result.get('first_failure')}\n{tail}")
    return result


def per_phase(items: list[dict], phases: Sequence[str], seeds: Sequence[int], weight) -> Iterator:
    """For each phase, and "all after images", that has items (rounds or turns, with ``phase``, ``seed``
    and ``accepted``): the phase, its items, and per conversation (accepted, sum of ``weight`` of its
    items), the pairs the bootstrap resamples."""
    for phase in (*phases, "all after images"):
        want = AFTER_IMAGES if phase == "all after images" else {phase}
        its = [i for i in items if i["phase"] in want]
        if its:
            per_conv = [
                (sum(i["accepted"] for i in its if i["seed"] == s), sum(weight(i) for i in its if i["seed"] == s))
                for s in seeds
            ]
            yield phase, its, per_conv


def summarise(rounds: list[dict], seeds: Sequence[int]) -> dict[str, dict]:
    out = {}
    for phase, rs, per_conv in per_phase(rounds, PHASES, seeds, weight=lambda r: 1):
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


def measure(
    models: ModelSet, seeds: Sequence[int], cols: Sequence[Column] | None = None, log=print, image_px: int | None = None
) -> dict:
    cols = list(cols or columns())
    session = session_for(image_px)
    table = {}
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-acceptance-") as tmp:
        for col in cols:
            job = AcceptanceJob(col, models, tuple(seeds), session, image_px=image_px)
            result = run_column(job, Path(tmp))
            table[col.name] = {
                "column": asdict(col),
                "phases": summarise(result["rounds"], seeds),
                "failed": result["failed"],
            }
            overall = table[col.name]["phases"].get("all after images", {})
            log(f"  {col.name}: mean accepted after images {overall.get('mean_accepted', 0):.3f}")
    differences = {}
    for a, b in pairs(cols, models):
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
        "session": session.to_json(),
        "image_px": image_px,
        "table": table,
        "differences": differences,
    }


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
