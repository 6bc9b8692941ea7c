"""``python -m pyllama_dflash.lab.acceptance.worker JOB OUT``: one column over its conversations, in a child
process of its own (one variant's libraries per process)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict

import numpy as np

from ... import load
from ...harness.oracles.references import definition_config
from ...harness.slotloop import Session
from ...harness.slotloop.config import server_config
from ...harness.slotloop.loaded import Loaded
from ...harness.slotloop.record import Record, StopScenario
from ...product.llamabuild.patchset import BASELINE
from ...product.process.child import job_main
from .job import AcceptanceJob
from .script import Plan, RoundResult, WithoutDraftFailed, conversation, run_conversation, side_by_side


def reference_model_drafter(models):
    """The definition's drafts from the reference model (draftmodel.forward), given every row's features."""
    from pyllama_dflash.lab.draftmodel import forward
    from pyllama_dflash.lab.draftmodel.weights import load_draft

    weights = load_draft(models.draft, models.target).float64()

    def draft(features: np.ndarray, id_last: int, n_draft: int) -> list[int]:
        block = np.array([id_last] + [weights.hp.mask_id] * n_draft)
        return forward.drafted(weights, forward.block_logits(weights, features, block))

    return draft


def run_one(raw: dict) -> dict:
    job = AcceptanceJob.from_json(raw)
    cfg, models, drafter = column_setup(job)
    if job.timed:
        return _timed(job, models, cfg)
    return run_conversations(job, models, cfg, drafter)


def column_setup(job: AcceptanceJob) -> tuple:
    """The column's variant loaded; its session's configuration, its models and its reference drafter."""
    col = job.column
    load(col.variant)
    if col.mode == "variant":
        cfg = server_config(col.variant, job.session)
    else:
        if col.variant != BASELINE:
            raise ValueError(f"column {col.name}: the definition's references run on {BASELINE}")
        cfg = definition_config(job.session)
    models = job.models.with_draft(job.models.twin) if col.twin else job.models
    drafter = reference_model_drafter(models) if col.mode == "model" else None
    return cfg, models, drafter


def run_conversations(job: AcceptanceJob, models, cfg, drafter, plan_of: Callable[[int], Plan] | None = None) -> dict:
    """Each of the job's conversations in a session of its own (``plan_of``: a seed's conversation, by
    default the tiny corpus's): the rounds or paired positions, the replies, and the conversations the
    variant failed (what llama-server answers with HTTP 500)."""
    rounds: list[RoundResult] = []
    failed = []
    replies: dict[int, list[list[int]]] = {}
    with Loaded() as loaded:
        for seed in job.seeds:
            with Session(models, cfg, Record(), loaded=loaded, definition_drafter=drafter) as s:
                try:
                    run_conversation(
                        s,
                        seed,
                        rounds,
                        images=job.column.images,
                        paired=job.paired,
                        image_px=job.image_px,
                        replies=replies.setdefault(seed, []),
                        plan=plan_of(seed) if plan_of else None,
                    )
                except StopScenario as stop:
                    failed.append({"seed": seed, "reason": str(stop)[:800]})
    return {
        "status": "OK",
        "rounds": [asdict(r) for r in rounds],
        "failed": failed,
        "replies": {str(k): v for k, v in replies.items()},
    }


def _timed(job: AcceptanceJob, models, cfg) -> dict:
    """Each conversation with the draft and without it, two sessions side by side a turn at a time
    (``script.side_by_side``), so that a machine slowing down or warming up weighs on both sides alike. A
    conversation either side fails (the draft's side: what llama-server answers with 500) is in neither
    side's turns; ``failed`` says which side failed."""
    if job.column.mode != "variant" or job.paired:
        raise ValueError(f"column {job.column.name}: the timed run takes a variant's own drafting, unpaired")
    turns: list[dict] = []
    plain: list[dict] = []
    failed = []
    how = {"images": job.column.images, "image_px": job.image_px}
    with Loaded() as loaded:
        for k, seed in enumerate(job.seeds):
            sides: dict[bool, list[dict]] = {True: [], False: []}
            with (
                Session(models, cfg, Record(), speculative=True, loaded=loaded) as drafting,
                Session(models, cfg, Record(), speculative=False, loaded=loaded) as alone,
            ):
                runs = (
                    conversation(drafting, seed, [], timings=sides[True], **how),
                    conversation(alone, seed, [], timings=sides[False], **how),
                )
                try:
                    for _ in side_by_side(*runs, k):
                        pass
                except (StopScenario, WithoutDraftFailed) as stop:
                    draft = not isinstance(stop, WithoutDraftFailed)
                    failed.append({"seed": seed, "draft": draft, "reason": str(stop)[:800]})
                    continue
            turns += sides[True]
            plain += sides[False]
    return {"status": "OK", "turns": turns, "plain": plain, "failed": failed}


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:], run_one))
