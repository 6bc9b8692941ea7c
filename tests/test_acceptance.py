"""The acceptance table on the trained draft: every column runs, and the columns that must draft alike do.

The definition variant drafts through libcommon exactly what baseline drafts when fed every row as the
definition has it, so their accepted counts are equal round for round; the reference model drafts the
same within the F16 cache's rounding (a tie in the argmax may go either way). The figures themselves
are the bench's (``pyllama-dflash bench --only acceptance``), not asserted here.
"""

from __future__ import annotations

import pytest

from conftest import DEFINED
from pyllama_dflash.acceptance.measure import MODEL, TEXT_ONLY, columns, measure
from pyllama_dflash.draftmodel.trained import trained_models
from pyllama_dflash.engine.matrix import DEFINITION, REFERENCE

SEEDS = (2000, 2001)


@pytest.fixture(scope="module")
def table(variants):
    return measure(trained_models("dense"), SEEDS, log=lambda line: None)


def _per_conv(table, column, phase):
    return table["table"][column]["phases"][phase]["per_conversation"]


@pytest.mark.slow
def test_every_column_measures_every_phase_or_says_why_not(table):
    for col in columns():
        entry = table["table"][col.name]
        assert entry["phases"]["text"]["rounds"] > 0, col.name
        if not entry["failed"]:
            assert set(entry["phases"]) >= {"after image", "later", "after second image", "after restore"}, col.name


@pytest.mark.slow
def test_baseline_with_a_legacy_draft_fails_every_conversation_at_its_image(table):
    failed = table["table"]["baseline"]["failed"]
    assert [f["seed"] for f in failed] == list(SEEDS)
    assert all("Y = X + 1" in f["reason"] for f in failed)


@pytest.mark.slow
@pytest.mark.skipif(DEFINED is None, reason="the series has no definition variant")
def test_the_definition_variant_accepts_what_the_definition_reference_accepts(table):
    for phase in table["table"][DEFINED]["phases"]:
        assert _per_conv(table, DEFINED, phase) == _per_conv(table, DEFINITION, phase), phase


@pytest.mark.slow
def test_the_trained_draft_drafts_something_the_target_accepts_after_images(table):
    for name in (REFERENCE, DEFINITION, MODEL, TEXT_ONLY):
        assert table["table"][name]["phases"]["all after images"]["mean_accepted"] > 0.2, name
