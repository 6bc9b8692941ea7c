"""One variant in this process: ``python -m pyllama_dflash.engine.schedule_child JOB OUT``.

JOB (JSON) says the mode: ``search`` runs the hypothesis loop (needs the test extra), ``replay``
runs one schedule; with ``drift`` every completed run is also checked against the drift
oracle's reference (reference.py). The variants share sonames, so each gets a process of its own; the result
goes to OUT as JSON.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from ..child import job_main
from ..llamabuild import variant
from ..scenarios.models import ModelSet
from .reference import ReferenceProcess


def run_job(job: dict) -> dict:
    from .. import api, load

    t0 = time.monotonic()
    # one thread per context: the tiny models gain nothing from more, and ggml's spinning thread
    # pools in two children on two cores starve each other (measured: 50x slower than 1 thread)
    os.environ[api.THREADS_ENV] = str(job.get("threads", 1))
    load(job["variant"], backend=job.get("backend"))
    models = ModelSet.from_json(job["models"])
    # a variant judged against the draft's definition (0005) is fuzzed against the definition reference
    definition = variant(job["variant"]).own_positions
    config = job.get("config") or {}
    if job["mode"] not in ("search", "replay"):
        raise ValueError(f"unknown mode {job['mode']!r}")
    with contextlib.ExitStack() as stack:
        reference = None
        if job.get("drift"):  # the drift oracle: baseline with the reconverted twin, in a child of its own
            reference = stack.enter_context(
                ReferenceProcess(models, config, job.get("backend"), definition=definition)
            ).drafts
        if job["mode"] == "search":
            from .search import search

            result = search(
                models,
                examples=job["examples"],
                seed_=job.get("seed", 0),
                max_steps=job.get("max_steps", 8),
                exact=job.get("exact", False),
                config=config,
                ignore=frozenset(job.get("ignore", ())),
                reference=reference,
                weighted=job.get("weighted", True),
                drafters=tuple(job.get("drafters", ())),
                targets=tuple(job.get("targets", ())),
            ).to_json()
        else:
            from .execute import execute
            from .schedule import Schedule

            result = execute(
                Schedule.from_json(job["schedule"]), models, config, exact=job.get("exact", True), reference=reference
            ).to_json()
    result["variant"] = job["variant"]
    result["total_s"] = round(time.monotonic() - t0, 3)
    return result


def main(argv: list[str]) -> int:
    return job_main(argv, run_job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
