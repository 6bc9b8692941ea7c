"""Run one scenario on one variant, in this process:
``python -m pyllama_dflash.harness.scenarios.run_scenario JOB OUT``.

JOB is a :class:`~.scenario_job.ScenarioJob` as JSON: the variant, the scenario, the models, the
session config and whether to run the scenario's draft or its reconverted twin; the result
is written to OUT as JSON. The parent runs each job in a fresh process, so a variant
that aborts or segfaults takes only its own child down (reported as CRASH), and each
variant's libraries (same sonames) load into a process of their own.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import asdict, fields, replace

import numpy as np

from ...product.process.child import job_main
from ...words import Status
from ..oracles.drift import drafts
from ..slotloop import replay_reference
from ..slotloop.config import SessionConfig
from ..slotloop.loaded import Loaded
from ..slotloop.models import (
    ModelSet,
    large_image,
    long_image,
    small_image,
    tiny_image,
    wide_image,
)
from ..slotloop.ops import Generate, Op
from ..slotloop.record import Record, StopScenario
from .catalog import SCENARIOS, Env
from .scenario_job import ScenarioJob


def images_for(models: ModelSet) -> dict[str, np.ndarray | bytes]:
    """The scenarios' images: synthetic arrays for the tiny models, the given files for real ones, but
    S14's 1x1 image: a file is decoded at its own size (image_min_tokens is a floor, not a size), so S14
    takes the synthetic 28 px image there too, which any projector resizes up to its minimum."""
    if models.image_files:
        files = [p.read_bytes() for p in models.image_files]
        given = {k: files[-1] if k == "small2" else files[0] for k in ("small", "small2", "large", "wide", "long")}
        return {**given, "tiny": tiny_image(0)}
    return {
        "small": small_image(0),
        "small2": small_image(1),
        "large": large_image(0),
        "wide": wide_image(0),
        "tiny": tiny_image(0),
        "long": long_image(0),
    }


# greedy references already replayed in this process: a batch of jobs replays each schedule once
_REPLAYED: dict[str, dict[int, list[int]]] = {}
# the models and projectors of this process's sessions, loaded once (see slotloop/loaded.py)
_LOADED = Loaded()


def _replay(models: ModelSet, cfg: SessionConfig, ops: list[Op]) -> dict[int, list[int]]:
    """replay_reference, once per (target, projector, config, operations) in this process: it runs
    on the target alone, so every drafter and variant of a batch shares it."""
    key = hashlib.sha256(
        "\x1f".join([str(models.target), str(models.mmproj), repr(cfg), _ops_digest(ops)]).encode()
    ).hexdigest()
    if key not in _REPLAYED:
        _REPLAYED[key] = replay_reference(models, cfg, ops, _LOADED)
    return {seq: list(tokens) for seq, tokens in _REPLAYED[key].items()}


def _ops_digest(ops: list[Op]) -> str:
    """The operations as text, an image by the hash of its pixels (or of its file's bytes)."""
    parts = []
    for op in ops:
        for x in (type(op).__name__, *(getattr(op, f.name) for f in fields(op))):
            items = x if isinstance(x, tuple) else (x,)
            parts.append(
                ",".join(
                    hashlib.sha256(a if isinstance(a, bytes) else a.tobytes()).hexdigest()
                    + repr(getattr(a, "shape", ""))
                    if isinstance(a, bytes | np.ndarray)
                    else repr(a)
                    for a in items
                )
            )
        parts.append("|")
    return "\x1f".join(parts)


def run_job(job_json: dict) -> dict:
    from pyllama_dflash import load

    t0 = time.monotonic()
    job = ScenarioJob.from_json(job_json)
    build = load(job.variant, backend=job.backend)
    t_init = time.monotonic() - t0
    scenario = SCENARIOS[job.scenario]
    draft = job.models.draft_for(scenario.draft, twin=job.twin)
    if draft is None:
        what = f"reconverted twin of the {scenario.draft} draft" if job.twin else f"{scenario.draft} draft"
        return {"status": Status.SKIP, "reason": f"no {what} for these models", "calls": []}
    models = job.models.with_draft(draft)
    cfg = replace(job.config, n_seq=scenario.n_seq)
    images = images_for(models)
    record = Record()
    env = Env(models, record, cfg, images, loaded=_LOADED)
    stopped = None
    try:
        scenario.run(env)
    except StopScenario as e:
        stopped = e.call
    finally:
        # each session with its own config: a scenario may size one otherwise (n_ctx, image_min_tokens)
        ops = [(s.cfg, s.ops) for s in env.sessions if any(isinstance(op, Generate) for op in s.ops)]
        for s in reversed(env.sessions):
            s.close()
    result = {
        "status": record.status(),
        "first_failure": stopped.summary() if stopped else record.drift,
        "calls": [c.to_json() for c in record.calls],
        "rounds": [asdict(r) for r in record.rounds],
        "drafts": drafts([asdict(r) for r in record.rounds]),
        "build": {"lib_dir": str(build.lib_dir), "cpu": build.cpu_mode},
        "drafted_after_image": record.drafted_after_image(),
        "generated": {str(k): v for k, v in record.generated.items()},
        "exact": None,
    }
    if stopped is None and ops and job.check_exact:
        reference: dict[int, list[int]] = {}
        for session_cfg, session_ops in ops:  # one after the other, as their generated tokens were
            for seq, tokens in _replay(models, session_cfg, session_ops).items():
                reference.setdefault(seq, []).extend(tokens)
        result["exact"] = reference == record.generated
        if not result["exact"]:
            result["status"] = Status.FAIL
            result["first_failure"] = (
                f"output differs from greedy decoding without the draft: {record.generated} != {reference}"
            )
    result["timings"] = {"init_s": round(t_init, 3), "total_s": round(time.monotonic() - t0, 3)}
    return result


def main(argv: list[str]) -> int:
    return job_main(argv, run_job)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
