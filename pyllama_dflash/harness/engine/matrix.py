"""The scenario matrix: every (scenario, column) of every case, run in child processes.

A *case* is one pair of drafter and target (a :class:`ModelSet`); a *column* is a variant, or one of
the references that judge it (``oracles.references``): ``baseline+twin``, the scenario on ``baseline`` with the draft's
reconverted twin (what a ``twin`` variant must draft), and ``baseline+definition``, the scenario on
``baseline`` drafting as the draft's definition has it (what a ``definition`` variant must draft).
Jobs that share a variant's libraries share a child (``child.run_batch``), several children at
once, so the matrix over drafters and targets stays in seconds; a child that crashes costs only the
job it crashed in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...env import THREADS_ENV
from ...product.llamabuild.patchset import BASELINE
from ...product.process import child
from ..oracles.drift import judge
from ..oracles.references import (
    DEFINITION,
    LAYOUT,
    REFERENCE,
    definition_config,
    layout_config,
    reference_columns,
    reference_config,
    reference_of,
)
from ..scenarios.scenario_job import ScenarioJob
from ..slotloop.config import SessionConfig, server_config
from ..slotloop.models import ModelSet, case_name
from ..slotloop.record import DRIFT, PASS

SCENARIO_MODULE = "pyllama_dflash.harness.scenarios.run_scenario"  # what a child runs: the jobs, one by one


# the name mutate (and older callers) import the matrix's job by: one scenario on one variant, in a child
Job = ScenarioJob


def run_jobs(jobs: list[ScenarioJob], parallel: int, work_dir: Path | None = None) -> list[dict]:
    """Every job in a child, jobs of one variant (and backend) batched into children of their own,
    ``parallel`` children at once; the results in the order of ``jobs``."""
    scratch = child.Scratch("pyllama-dflash-matrix-", work_dir)
    work = scratch.path
    parallel = max(1, parallel)
    share = max(1, (os.cpu_count() or 1) // parallel)
    batches = _batches(jobs, parallel)
    # children share the cores: each context gets its share of threads, not all of them
    threads = os.environ.get(THREADS_ENV, str(share))
    results: list[dict | None] = [None] * len(jobs)

    def run(index: int, batch: list[int]) -> None:
        first = jobs[batch[0]]
        name = f"{first.variant}-{index:03d}"
        out = child.run_batch(
            SCENARIO_MODULE,
            [jobs[i].to_json() for i in batch],
            work,
            name,
            timeout_per_job=max(jobs[i].timeout_s for i in batch),
            env={THREADS_ENV: threads},
        )
        for i, result in zip(batch, out, strict=True):
            results[i] = result

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for f in [pool.submit(run, k, b) for k, b in enumerate(batches)]:
            f.result()
    done = [r for r in results if r is not None]
    scratch.close(done)
    return done


def _batches(jobs: list[ScenarioJob], parallel: int) -> list[list[int]]:
    """Indexes of jobs grouped by the libraries they load (variant and backend), cut into pieces of
    about a quarter of each child's share, largest first, so the children finish together."""
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, j in enumerate(jobs):
        groups.setdefault((j.variant, j.backend), []).append(i)
    size = max(1, -(-len(jobs) // (parallel * 4)))
    pieces = [g[k : k + size] for g in groups.values() for k in range(0, len(g), size)]
    return sorted(pieces, key=len, reverse=True)


Table = dict[str, dict[str, dict]]  # table[scenario][column]


def run_cases(
    cases: Iterable[tuple[ModelSet, list[str]]],
    variants: list[str],
    config: SessionConfig,
    *,
    parallel: int,
    drift: bool = True,
    work_dir: Path | None = None,
    **job_options,
) -> dict[str, Table]:
    """The matrix of every case (models, with the scenarios to run on them), as
    ``tables[case][scenario][column]``, all of it in one pool of children.

    With drift, each scenario of a case also runs once on baseline with the case's reconverted
    twin (column :data:`REFERENCE`) and, where a variant is judged against the draft's definition,
    once drafting as the definition has it (column :data:`DEFINITION`); every variant's drafts are
    compared with its own (:func:`reference_of`, :func:`pyllama_dflash.harness.oracles.drift.judge`).
    ``job_options`` go to every :class:`ScenarioJob`.
    """
    cases = list(cases)
    references = reference_columns(variants, [m for m, _ in cases]) if drift else []
    jobs: list[ScenarioJob] = []
    for models, scenarios in cases:
        for sid in scenarios:
            jobs += [ScenarioJob(sid, v, models, server_config(v, config), **job_options) for v in variants]
            if REFERENCE in references:
                jobs.append(ScenarioJob(sid, BASELINE, models, reference_config(config), twin=True, **job_options))
            if DEFINITION in references:
                jobs.append(
                    ScenarioJob(sid, BASELINE, models, definition_config(config), definition=True, **job_options)
                )
    results = run_jobs(jobs, parallel, work_dir)
    by_key = {(j.case, *j.key): r for j, r in zip(jobs, results, strict=True)}
    tables: dict[str, Table] = {}
    for models, scenarios in cases:
        case = case_name(models)
        table = {sid: {v: by_key[(case, sid, v)] for v in variants} for sid in scenarios}
        for sid, row in table.items():
            for column in references:
                row[column] = by_key[(case, sid, column)]
            for v in variants:
                if drift:
                    judge(row[v], row[reference_of(v, models)])
        tables[case] = table
    # the variants judged against the twin differ by case only for an as-trained variant: one replay
    # pool per set of them
    by_judged: dict[tuple[str, ...], list[tuple[ModelSet, Table]]] = {}
    for models, _ in cases if drift else ():
        twin_judged = tuple(v for v in variants if reference_of(v, models) == REFERENCE)
        if twin_judged:
            by_judged.setdefault(twin_judged, []).append((models, tables[case_name(models)]))
    for twin_judged, judged_cases in by_judged.items():
        prove_ties(judged_cases, list(twin_judged), config, parallel, work_dir, **job_options)
    return tables


def prove_ties(
    cases: list[tuple[ModelSet, Table]],
    variants: list[str],
    config: SessionConfig,
    parallel: int,
    work_dir: Path | None = None,
    **job_options,
) -> None:
    """Where a run drifted, replay its reference with the fix's cell layout and judge again: a drift
    that replay drafts too is a tie broken by the cells' order (TIE). One replay per drifting row;
    the tables (their rows holding each variant's result and the REFERENCE) are judged in place."""
    tables = {case_name(models): table for models, table in cases}
    jobs = [
        ScenarioJob(sid, BASELINE, models, layout_config(config), twin=True, **job_options)
        for models, table in cases
        for sid, row in table.items()
        if any(row[v].get("status") == DRIFT and row[v].get("drift") for v in variants)
    ]
    if not jobs:
        return
    for job, layout in zip(jobs, run_jobs(jobs, parallel, work_dir), strict=True):
        row = tables[job.case][job.scenario]
        row[LAYOUT] = layout
        for v in variants:
            if row[v].get("status") == DRIFT and row[v].get("drift"):
                row[v]["status"] = PASS  # judged again from the start, now with the layout replay
                judge(row[v], row[REFERENCE], layout)


def run_table(
    scenarios: list[str],
    variants: list[str],
    models: ModelSet,
    config: SessionConfig,
    *,
    parallel: int,
    drift: bool = True,
    work_dir: Path | None = None,
    **job_options,
) -> Table:
    """The matrix of one case as ``table[scenario][column]`` (see :func:`run_cases`)."""
    tables = run_cases(
        [(models, scenarios)], variants, config, parallel=parallel, drift=drift, work_dir=work_dir, **job_options
    )
    return tables[case_name(models)]


def run_matrix(jobs: list[ScenarioJob], parallel: int, work_dir: Path | None = None) -> dict[tuple[str, str], dict]:
    """The jobs' results keyed by :attr:`ScenarioJob.key` (jobs of one case)."""
    return {j.key: r for j, r in zip(jobs, run_jobs(jobs, parallel, work_dir), strict=True)}
