"""repro's verdict: the reasons a run is NOT OK (none: OK), from its tables and server checks."""

from __future__ import annotations

from ...product.llamabuild.patchset import BASELINE
from ..engine.matrix import Table, case_name
from ..scenarios.catalog import expectations, meets
from ..slotloop.models import ModelSet
from ..slotloop.record import DID_NOT_RUN, DRIFT, FAIL, PASS, SKIP, TIE
from .tables import Matrix


def matrix_problems(matrix: Matrix, must_pass: str, expect_baseline_fail: bool, check_expected: bool) -> list[str]:
    """Every table's reasons, each prefixed with its case where there are several."""
    reasons = []
    for case_models, _ in matrix.cases:
        case = case_name(case_models)
        table = matrix.tables[case]
        prefix = f"{case}: " if len(matrix.cases) > 1 else ""
        case_reasons = must_pass_problems(table, must_pass, expect_baseline_fail and case == matrix.first)
        if check_expected:
            case_reasons += unexpected(table, matrix.variants, case_models)
        case_reasons += reference_problems(table, matrix.references)
        reasons += [prefix + r for r in case_reasons]
    return reasons


def server_problems(server: dict[str, dict[str, dict]], family: dict[str, dict[str, dict[str, dict]]]) -> list[str]:
    """The server checks that did not go as expected: the plan's models', then each other case's."""
    reasons = _server_problems(server)
    for case, results in family.items():
        reasons += [f"{case}: {r}" for r in _server_problems(results)]
    return reasons


def _server_problems(server: dict[str, dict[str, dict]]) -> list[str]:
    return [
        f"server check {check} on {v}: {r.get('error') or r['status']} (expected {r.get('expected')})"
        for v, checks in server.items()
        for check, r in checks.items()
        if not r["ok"]
    ]


def reference_problems(table: Table, references: list[str]) -> list[str]:
    """A reference that crashed or erred cannot judge anything: say so rather than pass silently."""
    return [
        f"reference run ({c}) on {sid} is {row[c]['status']}: {row[c].get('first_failure')}"
        for sid, row in table.items()
        for c in references
        if row[c]["status"] in DID_NOT_RUN
    ]


def unexpected(table: Table, variants: list[str], models: ModelSet) -> list[str]:
    """Every cell whose status is not among what its variant is expected to do there."""
    out = []
    for v in variants:
        bar = expectations(v, drafter=models.drafter, target=models.target_kind, image_rows=models.image_rows)
        for sid, row in table.items():
            allowed = bar.get(sid)
            if allowed is not None and not meets(allowed, row[v]):
                out.append(
                    f"{v} {row[v]['status']} on {sid}, expected {'/'.join(allowed)}: {row[v].get('first_failure')}"
                )
    return out


def must_pass_problems(table: Table, must_pass: str, expect_baseline_fail: bool) -> list[str]:
    """The must-pass variant passes every scenario. A TIE passes (a tie broken by the cells' order, proven by the
    layout replay); the one documented exception besides is a drift confined to rounds where draft()
    met a draft behind the target (the fill then exists for the noise block's decode only, or, for
    the definition, the restored rows' features exist nowhere). The C++ test (C1) judges a fix with
    the target's positions against the twin, and the definition against the definition reference."""
    reasons = []
    for sid, row in table.items():
        status = row[must_pass]["status"]
        behind_only = status == DRIFT and (row[must_pass].get("drift") or {}).get("behind_only")
        if status not in (PASS, SKIP, TIE) and not behind_only:
            reasons.append(f"{must_pass} {status} on {sid}: {row[must_pass].get('first_failure')}")
    if expect_baseline_fail:
        base = table.get("S1", {}).get(BASELINE)
        if base is None:
            reasons.append("--expect-baseline-fail needs S1 and the baseline variant in the run")
        elif base["status"] != FAIL:
            reasons.append(f"baseline is {base['status']} on S1: the harness no longer reproduces the bug")
    return reasons
