"""One variant in this process: ``python -m pyllama_dflash.harness.engine.run_schedule JOB OUT``.

JOB is a :class:`~.schedule_job.SearchJob` (the hypothesis loop; needs the test extra) or a
:class:`~.schedule_job.ReplayJob` (one schedule) as JSON; with ``drift`` every completed run is also
checked against the drift oracle's reference (reference.py). The variants share sonames, so each
gets a process of its own; the result goes to OUT as JSON.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from ...product.llamabuild import variant
from ...product.process.child import job_main
from ..oracles.references import judged_on
from . import schedule_job
from .reference import ReferenceProcess
from .schedule_job import SearchJob


def run_job(job_json: dict) -> dict:
    from pyllama_dflash import load
    from pyllama_dflash.product import api

    t0 = time.monotonic()
    job = schedule_job.from_json(job_json)
    # one thread per context: the tiny models gain nothing from more, and ggml's spinning thread
    # pools in two children on two cores starve each other (measured: 50x slower than 1 thread)
    os.environ[api.THREADS_ENV] = str(job.threads)
    load(job.variant, backend=job.backend)
    # a variant judged against the draft's definition (0007; 0008 with a draft trained with image rows) is
    # fuzzed against the definition reference
    definition = judged_on(variant(job.variant), job.models).own_positions
    with contextlib.ExitStack() as stack:
        reference = None
        if job.drift:  # the drift oracle: baseline with the reconverted twin, in a child of its own
            reference = stack.enter_context(
                ReferenceProcess(job.models, job.config, job.backend, definition=definition)
            ).drafts
        if isinstance(job, SearchJob):
            from .search import search

            result = search(job, reference=reference).to_json()
        else:
            from .execute import execute

            result = execute(job.schedule, job.models, job.config, exact=job.exact, reference=reference).to_json()
    result["variant"] = job.variant
    result["total_s"] = round(time.monotonic() - t0, 3)
    return result


def main(argv: list[str]) -> int:
    return job_main(argv, run_job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
