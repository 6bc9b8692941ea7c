"""Paired acceptance: every column judged on the same target tokens, position by position.

Each column runs the bench's conversation (script.py) through its variant's libraries with
``paired``: at every position of the target's replies the draft drafts from the target's own history,
and the accepted length there is the measure. The target's replies are the same in every column
(checked: a column whose replies differ on a conversation is an error, not a figure), so a paired
difference compares the same tokens.

The columns, per trained draft and image size:

- ``twin semantics``: ``slots`` with the legacy draft, which drafts what its reconverted twin drafts
  (image rows skipped, the target's positions: b11434's semantics) and restores the draft with a slot;
- ``definition``: every row, image rows included, at the draft's own positions; restores too;
- ``b11434 twin``: b11434 itself with the reconverted twin; its draft is not restored with a slot;
- ``zero-fill``: the zero-fill of the hole with zero rows; not restored either;
- ``text only``: the same conversation without its images (the ceiling; its tokens after the first
  turn are not the others', so it is compared by interval only).

After the restore, only columns alike in restoring the draft are compared with one another.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ...bootstrap import percentile_interval, resample
from ...harness.slotloop.config import SessionConfig
from ...harness.slotloop.models import ModelSet
from ...product.llamabuild import variant as variant_of
from ...product.llamabuild.patchset import BASELINE
from .job import AcceptanceJob, Column
from .measure import WORKER, run_column, session_for, summarise
from .script import IMAGE_ROWS_PX, PHASES
from .stats import bootstrap_mean, paired_difference, resampled_means

TWIN = "twin semantics"
DEFINITION = "definition"
B11434_TWIN = "b11434 twin"
ZERO_FILL = "zero-fill"
TEXT_ONLY = "text only"
TRAINED = {"images": "image-trained", "text": "text-trained"}  # a draft's label in tables and pictures
BEFORE_RESTORE = ("text", "after image", "later", "after second image")

COLUMNS = (
    Column(TWIN, "slots"),
    Column(DEFINITION, "definition"),
    Column(B11434_TWIN, BASELINE, twin=True),
    Column(ZERO_FILL, "zero-fill"),
    Column(TEXT_ONLY, "definition", images=False),
)
# (a, b, the phases where a - b compares the same tokens from drafts alike in restoring or not)
PAIRS = (
    (DEFINITION, TWIN, PHASES),
    (ZERO_FILL, TWIN, BEFORE_RESTORE),
    (B11434_TWIN, TWIN, BEFORE_RESTORE),
    (ZERO_FILL, B11434_TWIN, PHASES),
)


def restores_draft(col: Column) -> bool:
    return variant_of(col.variant).saves_draft


def check_paired(columns: dict[str, dict]) -> None:
    """Every image column's replies equal on every conversation (the text-only column's first one)."""
    ref_name, ref = next((n, c) for n, c in columns.items() if c["column"]["images"])
    for name, col in columns.items():
        for seed, replies in col["replies"].items():
            want = ref["replies"].get(seed)
            if want is None:
                continue
            mine, theirs = (replies[:1], want[:1]) if not col["column"]["images"] else (replies, want)
            if mine != theirs:
                raise RuntimeError(
                    f"paired acceptance: column {name!r} saw other target tokens than {ref_name!r} on "
                    f"conversation {seed}: the comparison would not be paired"
                )


def since_image(positions: list[dict], seeds: Sequence[int]) -> list[dict]:
    """Mean accepted at each index of the reply after the first image, with a 95% interval from
    resampling the conversations: the curve of accepted length against tokens since the image."""
    out = []
    reply = [p for p in positions if p["turn"] == "after image"]
    for i in sorted({p["index"] for p in reply}):
        per_conv = [(sum(p["accepted"] for p in reply if p["seed"] == s and p["index"] == i), 1) for s in seeds]
        lo, hi = bootstrap_mean(per_conv)
        out.append({"index": i, "mean_accepted": sum(a for a, _ in per_conv) / len(per_conv), "ci95": [lo, hi]})
    return out


def ratio_to_text(per_text: list, per_phase: list) -> dict:
    """A column's pooled mean accepted in a phase over its own in the text phase, with a 95% interval
    from resampling the conversations once for both."""
    idx, whole = resample(len(per_text)), np.arange(len(per_text))[None]
    point = resampled_means(per_phase, whole)[0] / max(resampled_means(per_text, whole)[0], 1e-12)
    r = resampled_means(per_phase, idx) / np.maximum(resampled_means(per_text, idx), 1e-12)
    return {"ratio": float(point), "ci95": list(percentile_interval(r))}


def paired_differences(table: dict[str, dict], pairs: Sequence[tuple[str, str, Sequence[str]]]) -> dict:
    """Each pair's column ``a`` minus column ``b``, per phase of the pair's that both columns have."""
    differences = {}
    for a, b, phases in pairs:
        if a in table and b in table:
            pa, pb = table[a]["phases"], table[b]["phases"]
            differences[f"{a} - {b}"] = {
                p: paired_difference(pa[p]["per_conversation"], pb[p]["per_conversation"])
                for p in phases
                if p in pa and p in pb
            }
    return differences


def measure_paired(
    models: ModelSet,
    seeds: Sequence[int],
    image_rows: int,
    cols: Sequence[Column] = COLUMNS,
    log=print,
    *,
    image_px: int | None = None,
    session: SessionConfig | None = None,
    pairs: Sequence[tuple[str, str, Sequence[str]]] = PAIRS,
    worker: str = WORKER,
    jobs: int = 1,
    threads: int | None = None,
) -> dict:
    """Every column on the same conversations with images of ``image_rows`` rows (``image_px`` wide: by
    default the tiny projector's size for that many), each column a child running ``worker``, ``jobs``
    children at once (acceptance is counted, not timed, so they may share the cores), each context on
    ``threads`` threads (default: the cores shared among the children)."""
    px = image_px or IMAGE_ROWS_PX[image_rows]
    session = session or session_for(px)
    table: dict[str, dict] = {}
    threads = threads or (max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None)
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-paired-") as tmp, ThreadPoolExecutor(jobs) as pool:
        running = [
            pool.submit(
                run_column,
                AcceptanceJob(col, models, tuple(seeds), session, paired=True, image_px=px),
                Path(tmp),
                module=worker,
                threads=threads,
            )
            for col in cols
        ]
        for col, future in zip(cols, running, strict=True):
            table[col.name] = _column_entry(col, future.result(), seeds)
            log(f"  {image_rows} rows, {col.name}: " + _brief(table[col.name]["phases"]))
    check_paired(table)
    differences = paired_differences(table, pairs)
    ratios = {
        name: {
            p: ratio_to_text(e["phases"]["text"]["per_conversation"], e["phases"][p]["per_conversation"])
            for p in PHASES[1:]
            if p in e["phases"] and e["column"]["images"]
        }
        for name, e in table.items()
    }
    for e in table.values():
        del e["replies"]
    return {
        "image_rows": image_rows,
        "image_px": px,
        "conversations": len(seeds),
        "seeds": [min(seeds), max(seeds)],
        "session": session.to_json(),
        "table": table,
        "differences": differences,
        "ratio_to_text": ratios,
    }


def _column_entry(col: Column, result: dict, seeds: Sequence[int]) -> dict:
    if result["failed"]:
        raise RuntimeError(f"paired acceptance: column {col.name} failed: {result['failed'][0]}")
    return {
        "column": asdict(col),
        "restores_draft": restores_draft(col),
        "phases": summarise(result["rounds"], seeds),
        "since_image": since_image(result["rounds"], seeds),
        "replies": result["replies"],
    }


def _brief(phases: dict) -> str:
    return ", ".join(f"{p} {f['mean_accepted']:.2f}" for p, f in phases.items() if p in PHASES)


def _cell(f: dict | None) -> str:
    if f is None:
        return ""
    if "difference" in f:
        mark = "" if f["told_apart"] else " ~"
        return f"{f['difference']:+.2f} [{f['ci95'][0]:+.2f}, {f['ci95'][1]:+.2f}]{mark}"
    if "ratio" in f:
        return f"{f['ratio']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]"
    return f"{f['mean_accepted']:.2f} [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]"


def markdown(runs: dict[str, dict]) -> str:
    """The paired tables of ``runs`` (``"target/trained_on/rows"`` -> measure_paired's result): mean
    accepted per position, each column's after-image phases over its own text phase, and the paired
    differences (``~``: the interval holds 0, not told apart)."""
    out = []
    head = "| draft | image rows | column | " + " | ".join(PHASES) + " |"
    rule = "|---|---|---|" + "---|" * len(PHASES)
    for title, key, rows_of in (
        ("Mean accepted per position (of n_max) [95% interval]", "table", lambda r: r["table"]),
        ("Over the column's own text phase [95% interval]", "ratio_to_text", lambda r: r["ratio_to_text"]),
        ("Paired differences [95% interval]", "differences", lambda r: r["differences"]),
    ):
        for target in sorted({k.split("/")[0] for k in runs}):
            out += ["", f"{title}, the {target} target:", "", head, rule]
            for k, r in runs.items():
                t, trained_on, rows = k.split("/")
                if t != target:
                    continue
                for name, entry in rows_of(r).items():
                    phases = entry["phases"] if key == "table" else entry
                    if not phases:
                        continue
                    cells = [_cell(phases.get(p)) for p in PHASES]
                    out.append(f"| {TRAINED[trained_on]} | {rows} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(out).lstrip("\n")
