"""The mutants of a plan tried one after another (runner.try_mutant), and what the run leaves behind.

The drift references are run once, when the first mutant's matrix needs them. At the end the shared
build folder is back on the fix, compiled; the builds of the run's scratch series are removed, and the
scratch folder too unless a mutant survived (its logs are what someone reads next).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ...env import PATCHES_ENV
from ...harness.slotloop import DEFAULT_CONFIG
from ...harness.slotloop.models import ModelSet
from ...product.llamabuild import BuildOptions, build
from ...product.llamabuild.builder import stage
from ...product.llamabuild.manifest import all_manifests
from ...words import Role
from .plan import Plan
from .runner import (
    EQUIVALENT,
    KILLED,
    MODEL_FILES,
    SURVIVED,
    Outcome,
    references,
    try_mutant,
    unmutated_eagle3_runs,
    write_series,
)


def try_all(p: Plan, models: ModelSet, equivalents: dict[str, dict], *, jobs: int, fuzz_examples: int) -> list[Outcome]:
    """Every selected mutant tried, a line printed for each; a survivor on file as equivalent is one."""
    work = Path(tempfile.mkdtemp(prefix="pyllama-dflash-mutate-"))
    refs = functools.cache(lambda: _references(p, models, jobs, work))
    unmutated_eagle3 = functools.cache(lambda: _on_the_series(lambda: _unmutated_eagle3(p, models, jobs, work)))
    outcomes: list[Outcome] = []
    try:
        for k, m in enumerate(p.selected, 1):
            series_dir = write_series(m, p.own, p.series, p.variant, p.pristine, work / "series", p.role)
            o = try_mutant(
                m,
                series_dir,
                refs,
                models,
                DEFAULT_CONFIG,
                parallel=jobs,
                work=work,
                unmutated_eagle3=unmutated_eagle3,
                fuzz_examples=fuzz_examples,
                mtp_heads=any(f in p.own for f in MODEL_FILES),
            )
            if o.status == SURVIVED and m.id in equivalents:
                o.status, o.detail = EQUIVALENT, equivalents[m.id]["reason"]
            outcomes.append(o)
            by = f" by {o.killed_by}" if o.killed_by else ""
            print(f"[{k}/{len(p.selected)}] {o.status:10s}{by:8s} {m.id:16s} {m.describe()}", flush=True)
            if o.status != KILLED and o.detail:
                print(f"      {o.detail}", flush=True)
    finally:
        _clean_up(p, work, outcomes)
    return outcomes


def _references(p: Plan, models: ModelSet, jobs: int, work: Path) -> dict[str, dict]:
    """Run once, when a mutant's matrix first needs them (C1 and the server stage do not), on the
    series' own baseline."""
    print(
        f"mutate: references on baseline ({'the definition' if p.role == Role.DEFINITION else 'the twin'}) ...",
        flush=True,
    )
    return _on_the_series(lambda: references(models, DEFAULT_CONFIG, jobs, work, p.role))


def _unmutated_eagle3(p: Plan, models: ModelSet, jobs: int, work: Path) -> dict[str, dict]:
    """Stage 4's oracle, on the fix built first from the series' own patches: a cache built from other
    patches does not load, and every mutant judged against its ERROR rows would count as killed
    (runner._ran refuses such rows; this keeps them from arising)."""
    build([p.variant], BuildOptions(cpu="native", quiet=True))
    return unmutated_eagle3_runs(p.variant, models, DEFAULT_CONFIG, jobs, work)


def _on_the_series(run):
    """``run()`` on the series' own variants (the references, the unmutated fix's EAGLE3 runs): not the
    mutant's series, whatever the environment says by then."""
    mutant_series = os.environ.pop(PATCHES_ENV, None)
    try:
        return run()
    finally:
        if mutant_series is not None:
            os.environ[PATCHES_ENV] = mutant_series


def _clean_up(p: Plan, work: Path, outcomes: list[Outcome]) -> None:
    os.environ.pop(PATCHES_ENV, None)
    if p.selected:  # the shared build folder back on the fix, compiled
        stage(p.variant, BuildOptions(cpu="native", quiet=True))
    # the builds of the run's scratch series go with the run: the mutants' folder, and the
    # baseline the mutant variant's series builds beside it (19 MB each, left in the cache before)
    for m in all_manifests():
        if Path(m.data.get("patches_dir", "")) == work / "series":
            shutil.rmtree(m.lib_dir, ignore_errors=True)
    # the scratch folder too (up to 25 MB of series, jobs and logs), unless a mutant survived:
    # its logs are what someone reads next
    if any(o.status == SURVIVED for o in outcomes):
        print(f"mutate: the logs of the run are kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
