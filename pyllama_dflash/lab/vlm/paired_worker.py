"""``python -m pyllama_dflash.lab.vlm.paired_worker JOB OUT``: one column of the trained pair's paired
acceptance (library_paired.py) over its conversations, in a child of its own (one variant's libraries
per process)."""

from __future__ import annotations

import sys

from ...product.process.child import job_main
from ..acceptance.job import AcceptanceJob
from ..acceptance.worker import column_setup, run_conversations
from .library_paired import trained_plan
from .scenes import SIDE_FOR_ROWS

ROWS_FOR_SIDE = {side: rows for rows, side in SIDE_FOR_ROWS.items()}


def run_one(raw: dict) -> dict:
    job = AcceptanceJob.from_json(raw)
    if not job.paired or job.image_px not in ROWS_FOR_SIDE:
        raise ValueError(
            f"column {job.column.name}: the trained pair's acceptance is paired, with images of "
            f"{', '.join(f'{s} px' for s in ROWS_FOR_SIDE)} (got {job.image_px})"
        )
    rows = ROWS_FOR_SIDE[job.image_px]
    cfg, models, drafter = column_setup(job)
    return run_conversations(job, models, cfg, drafter, plan_of=lambda seed: trained_plan(seed, rows))


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:], run_one))
