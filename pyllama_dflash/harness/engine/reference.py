"""The drift oracle's reference for schedules: baseline with the reconverted twin, in a process of its own.

The variants share sonames, so the fuzzer's process (one variant loaded) cannot also run
baseline. :class:`ReferenceProcess` keeps one child with baseline loaded for a whole search and
asks it, schedule by schedule, what the twin drafts: one JSON line each way over its stdin and
stdout. ``python -m pyllama_dflash.harness.engine.reference MODELS_JSON CONFIG_JSON [BACKEND] [twin|definition]`` is
that child (``definition``: the draft drafting as its definition has it, the reference of a variant with
positions of its own); its native logs go to stderr, which the parent keeps in a file and quotes if it dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from ...errors import ReferenceDied
from ...product.llamabuild.patchset import BASELINE
from ...words import Judged, Status
from ..oracles.references import twin_of
from ..slotloop.config import DEFAULT_CONFIG, SessionConfig
from ..slotloop.models import ModelSet, for_schedule
from .schedule import Schedule


class ReferenceProcess:
    """``drafts(schedule)`` -> {"status", "rounds"}: what the twin drafts on baseline, following the
    history a target-only restore leaves (SessionConfig.history_restores); with ``layout`` its cells laid
    out as the fix lays a legacy draft's (SessionConfig.twin_fill_layout), for the tie check."""

    def __init__(
        self,
        models: ModelSet,
        config: SessionConfig = DEFAULT_CONFIG,
        backend: str | None = None,
        definition: bool = False,
    ) -> None:
        if not definition:
            twin_of(models)  # refused here, not in the child
        self.models = models
        self.what = f"{BASELINE} + {Judged.DEFINITION if definition else Judged.TWIN}"
        self._log = tempfile.NamedTemporaryFile(prefix="pyllama-dflash-reference-", suffix=".log", delete=False)
        cmd = [
            sys.executable,
            "-m",
            "pyllama_dflash.harness.engine.reference",
            json.dumps(self.models.to_json()),
            json.dumps(config.to_json()),
            backend or "",
            Judged.DEFINITION if definition else Judged.TWIN,
        ]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )

    def drafts(self, schedule: Schedule, layout: bool = False) -> dict:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps({"schedule": schedule.to_json(), "layout": layout}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            return json.loads(line)
        except (OSError, ValueError) as e:
            raise ReferenceDied(
                f"the reference process ({self.what}) stopped answering "
                f"(exit {self._proc.poll()}): {e}; last log lines:\n{self._tail()}"
            ) from None

    def _tail(self, n: int = 12) -> str:
        self._log.flush()
        return "\n".join(Path(self._log.name).read_text(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> ReferenceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str]) -> int:
    from pyllama_dflash import load
    from pyllama_dflash.product import api

    from .execute import execute

    os.environ.setdefault(api.THREADS_ENV, "1")
    models, config = ModelSet.from_json(json.loads(argv[0])), SessionConfig.from_json(json.loads(argv[1]))
    load(BASELINE, backend=(argv[2] if len(argv) > 2 else "") or None)
    definition = len(argv) > 3 and argv[3] == Judged.DEFINITION
    # the protocol gets a descriptor of its own; anything else written to fd 1 (native code
    # included) goes to stderr, so it cannot break a reply
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        ask = json.loads(line)
        schedule = Schedule.from_json(ask["schedule"])
        # the twin of the drafter and target the schedule runs on (see execute), or the draft itself
        # drafting as its definition has it (no layout to replay: no fill there)
        drafter = for_schedule(models, schedule.drafter, schedule.target)
        if definition:
            ref_models, cfg = drafter, replace(config, definition_reference=True)
        else:
            layout = {"twin_fill_layout": True} if ask.get("layout") else {}
            ref_models, cfg = twin_of(drafter), replace(config, history_restores=True, **layout)
        try:
            outcome = execute(replace(schedule, drafter=None, target=None), ref_models, cfg, check=False)
            answer = {"status": outcome.status, "rounds": [asdict(r) for r in outcome.record.rounds]}
        except Exception as e:  # a harness error on one schedule: an answer that judges nothing, not a death
            answer = {"status": Status.ERROR, "rounds": [], "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
