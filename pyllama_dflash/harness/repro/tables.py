"""The run of repro: the scenario tables of every case (with the C++ test's row), the llama-server
checks and the sibling drafters. It runs and returns what ran; the verdict and the report judge
and print it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ...product.llamabuild import find_built
from ...product.llamabuild.patchset import BASELINE
from ..engine import ctest_row
from ..engine.matrix import Table, case_name, run_cases
from ..oracles.references import reference_columns
from ..scenarios.catalog import SIBLING_SCENARIOS
from ..slotloop.models import ModelSet
from .plan import Plan
from .report import drafting_around_images


@dataclass
class Matrix:
    """The tables of every case: ``tables[case][scenario][column]``, a column per variant and then
    per drift reference."""

    cases: list[tuple[ModelSet, list[str]]]
    tables: dict[str, Table]
    variants: list[str]
    references: list[str]

    @property
    def columns(self) -> list[str]:
        return self.variants + self.references

    @property
    def first(self) -> str:
        return case_name(self.cases[0][0])

    def n_runs(self) -> tuple[int, int]:
        """The runs made, and how many of them were references (a ``-`` cell ran nothing)."""
        runs = refs = 0
        for table in self.tables.values():
            runs += sum(1 for row in table.values() for r in row.values() if r["status"] != "-")
            refs += sum(
                1 for row in table.values() for c in self.references if row.get(c, {}).get("status", "-") != "-"
            )
        return runs, refs


def backend(args: argparse.Namespace) -> str | None:
    return args.backend if args.backend != "auto" else None


def run_matrix(args: argparse.Namespace, plan: Plan, cases: list[tuple[ModelSet, list[str]]], scenarios: list[str]):
    """Every case's table, the C++ test's row in the first; every cell labelled with its drafter and target."""
    variants = plan.variants
    tables = run_cases(
        cases,
        variants,
        plan.config,
        parallel=args.jobs,
        drift=not args.no_drift,
        backend=backend(args),
        check_exact=not args.no_exact,
        timeout_s=args.timeout,
    )
    references = [] if args.no_drift else reference_columns(variants, [m for m, _ in cases])
    matrix = Matrix(cases, tables, variants, references)
    if ctest_row.ROW in scenarios and not args.no_ctest:
        # the C++ test builds its own models in memory, every drafter of it: one row, in the first table
        row = tables[matrix.first][ctest_row.ROW] = ctest_row.run_row(plan.manifests, timeout=args.timeout)
        for column in references:
            row[column] = {"status": "-", "first_failure": None}  # its own oracle
    for case_models, _ in cases:
        _label(tables[case_name(case_models)], case_models)
    return matrix


def _label(table: Table, models: ModelSet) -> None:
    """Every cell names the drafter and target it ran on (the JSON report's promise)."""
    for row in table.values():
        for result in row.values():
            result.setdefault("drafter", models.drafter)
            result.setdefault("target", models.target_kind)


def run_server(args: argparse.Namespace, plan: Plan, cases: list[tuple[ModelSet, list[str]]]) -> tuple[dict, dict]:
    """The llama-server checks on every variant with the plan's models and with the first drafts marked
    as trained with image rows, and the image and restore checks (FAMILY) for every other drafter and
    target of the tables: ``(server, family)``."""
    from pyllama_dflash.harness.server import FAMILY
    from pyllama_dflash.harness.server.run_checks import run_on_each

    base = find_built([BASELINE], backend=args.backend, server=True)[0]

    def twin_reference(m: ModelSet):
        twin = m.draft_for("plain", twin=True)
        return (base, m.with_draft(twin)) if twin else None

    server = run_on_each(plan.manifests, plan.models, reference=twin_reference(plan.models))
    # every check on the first case whose drafts carry the image-rows key as well (an as-trained
    # variant serves them as the definition does), the image and restore checks on the others
    first_keyed = next((m for m, _ in cases if m.image_rows), None)
    family = {
        case_name(m): run_on_each(
            plan.manifests, m, checks=None if m is first_keyed else FAMILY, reference=twin_reference(m)
        )
        for m, _ in cases[1:]
    }
    return server, family


@dataclass
class Siblings:
    """The sibling drafters' tables (measured, not judged), and with --server their own llama-server
    checks per sibling and variant."""

    models: list[ModelSet]
    tables: dict[str, Table]
    server: dict[str, dict] | None = None


def run_siblings(args: argparse.Namespace, plan: Plan) -> Siblings:
    """draft-mtp and draft-eagle3 on the image scenarios (and S8, text only): measured, not judged."""
    from pyllama_dflash.harness.slotloop.models import SIBLINGS, sibling_models

    cases = [(sibling_models(s), list(SIBLING_SCENARIOS)) for s in SIBLINGS]
    tables = run_cases(
        cases,
        plan.variants,
        plan.config,
        parallel=args.jobs,
        drift=False,  # neither has a reconverted twin
        backend=backend(args),
        timeout_s=args.timeout,
    )
    out = {}
    for m, _ in cases:
        table = tables[case_name(m)]
        for row in table.values():
            for r in row.values():
                r["around_images"] = drafting_around_images(r)
        out[m.drafter] = table
    return Siblings([m for m, _ in cases], out)


def run_siblings_server(plan: Plan, siblings: Siblings) -> dict[str, dict]:
    """The sibling drafters' own llama-server checks, per sibling and variant (measured)."""
    from pyllama_dflash.harness.server import SIBLINGS_CHECKS
    from pyllama_dflash.harness.server.run_checks import run_on_each

    return {m.drafter: run_on_each(plan.manifests, m, checks=SIBLINGS_CHECKS[m.drafter]) for m in siblings.models}
