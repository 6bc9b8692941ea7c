"""The drafters that share DFlash's code, on the dense and the MoE target: the matrix for each.

DFlash on the dense target is tests/test_repro.py's matrix; here every other drafter of the family
(tiny.drafters: a causal draft, DFlash2, DSpark anchor-first and bonus-anchor, DSpark with a reduced
vocabulary) runs every scenario on the dense target, and every drafter, DFlash included, runs the
image scenarios on the MoE target. Each run is judged against its own reconverted twin.
"""

from __future__ import annotations

import pytest
from series_variants import TWIN_FIX, VARIANTS

from pyllama_dflash.harness.engine.matrix import case_name, run_cases
from pyllama_dflash.harness.oracles.references import REFERENCE
from pyllama_dflash.harness.scenarios.catalog import HOLE_SCENARIOS, SCENARIOS, expectations, meets
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.models import DraftKind, tiny_models
from pyllama_dflash.harness.tiny import DRAFTERS

IMAGE_SCENARIOS = [sid for sid, sc in SCENARIOS.items() if sc.image]
CASES = [(d, "dense") for d in DRAFTERS if d != "dflash"] + [(d, "moe") for d in DRAFTERS]
# the scenarios in which a legacy draft meets a hole (S9's draft is M-RoPE: it accepts the jump)
HOLES = [sid for sid in HOLE_SCENARIOS if SCENARIOS[sid].draft != DraftKind.TWIN]


@pytest.fixture(scope="session")
def family(variants, tmp_path_factory) -> dict[tuple[str, str], dict]:
    """Every case's table, keyed by (drafter, target)."""
    out = tmp_path_factory.mktemp("family")
    cases = [
        (tiny_models(out, drafter=d, target=t), list(SCENARIOS) if t == "dense" else IMAGE_SCENARIOS) for d, t in CASES
    ]
    tables = run_cases(cases, list(VARIANTS), DEFAULT_CONFIG, parallel=2, work_dir=out / "runs")
    return {(m.drafter, m.target_kind): tables[case_name(m)] for m, _ in cases}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "/".join(c))
def test_every_cell_meets_its_expectation(family, case):
    drafter, target = case
    for variant in VARIANTS:
        bar = expectations(variant, drafter=drafter, target=target)
        for sid, row in family[case].items():
            r = row[variant]
            assert meets(bar[sid], r), (variant, sid, r["status"], r.get("first_failure"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "/".join(c))
def test_baseline_fails_on_every_hole_and_the_fix_drafts_what_the_twin_drafts(family, case):
    """The bug and its fix are the same for every drafter: the legacy draft's process() is refused after an
    image (Y = X + 1), and the fix drafts round for round what the reconverted twin drafts on baseline;
    the one exception left is the first round after a target-only restore (S10 and S16, the draft()-side
    case)."""
    table = family[case]
    for sid in HOLES:
        base = table[sid]["baseline"]
        assert base["status"] == "FAIL" and "Y = X + 1" in base["first_failure"], (sid, base["first_failure"])
        fix = table[sid][TWIN_FIX]
        if fix["status"] == "DRIFT":
            drift = fix["drift"]
            assert sid in ("S10", "S16") and drift["behind_only"] and drift["differing"] == 1, drift
            continue
        assert fix["status"] in ("PASS", "TIE"), (sid, fix.get("first_failure"))
        if fix["status"] == "PASS":
            assert fix["drafts"] == table[sid][REFERENCE]["drafts"] != [], sid


@pytest.mark.parametrize("case", CASES, ids=lambda c: "/".join(c))
def test_the_seeds_zero_fill_drifts_for_every_drafter(family, case):
    """zero-fill never fails where the hole was, and its zero rows move some drafted token of every drafter
    (which scenarios show it depends on the draft's weights: see scenarios.catalog)."""
    table = family[case]
    assert all(table[sid]["zero-fill"]["status"] not in ("FAIL", "CRASH") for sid in HOLES if sid != "S10")
    assert any(table[sid]["zero-fill"]["status"] == "DRIFT" for sid in HOLES), {
        sid: table[sid]["zero-fill"]["status"] for sid in HOLES
    }
