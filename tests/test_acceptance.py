"""The acceptance table on the trained draft: every column runs, and the columns that must draft alike do.

The definition variant drafts through libcommon exactly what baseline drafts when fed every row as the
definition has it, so their accepted counts are equal round for round; the reference model drafts the
same within the F16 cache's rounding (a tie in the argmax may go either way). Through llama-server,
the same conversations as a chat client sends them: baseline answers 500 at the image with the legacy
draft, every other column answers every turn with the replies of a server without the draft, and the
trained draft is accepted after images. The figures themselves are the bench's
(``pyllama-dflash bench --only acceptance``), not asserted here.
"""

from __future__ import annotations

import inspect

import pytest
from series_variants import DEFINED

from pyllama_dflash.harness.oracles.references import DEFINITION, REFERENCE
from pyllama_dflash.lab.acceptance.measure import MODEL, TEXT_ONLY, columns, measure
from pyllama_dflash.lab.acceptance.script import WithoutDraftFailed, side_by_side
from pyllama_dflash.lab.acceptance.served import measure_server, speed_by_phase
from pyllama_dflash.lab.draftmodel.trained import trained_models

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


# -- the same conversations through each variant's llama-server ----------------------------------------


@pytest.fixture(scope="module")
def served(variants):
    return measure_server(trained_models("dense"), SEEDS, log=lambda line: None)


@pytest.mark.slow
def test_baseline_llama_server_answers_500_at_the_image_with_a_legacy_draft(served):
    failed = served["table"]["baseline"]["failed"]
    assert [f["seed"] for f in failed] == list(SEEDS)
    assert all("500" in f["reason"] and "failed to process speculative batch" in f["reason"] for f in failed)


@pytest.mark.slow
def test_every_other_server_column_answers_every_turn_and_drafts_what_the_target_accepts(served):
    for name, entry in served["table"].items():
        if name == "baseline":
            continue
        assert entry["failed"] == [], name
        assert entry["phases"]["all after images"]["turns"] == 3 * len(SEEDS), name
        # random drafts are never accepted; the trained one is, through llama-server too
        assert entry["phases"]["all after images"]["accepted"] > 0, name


@pytest.mark.slow
def test_the_server_answers_with_the_draft_what_it_answers_without(served):
    """The tokens/s ratio compares like with like: the same replies, turn for turn, after images and a
    slot restore too (speculative decoding changes the speed, never the text)."""
    for name, entry in served["table"].items():
        drafted = [(t["seed"], t["phase"], t["reply"]) for t in entry["turns"]["drafted"]]
        plain = [(t["seed"], t["phase"], t["reply"]) for t in entry["turns"]["plain"]]
        done = {f["seed"] for f in entry["failed"]}
        assert [d for d in drafted if d[0] not in done] == plain, name
        assert entry["throughput"] is None if len(done) == len(SEEDS) else entry["throughput"]["ratio"] > 0, name


@pytest.mark.slow
def test_the_first_turn_has_no_image_and_drafts_alike_on_every_server_column(served):
    text = {name: entry["phases"]["text"] for name, entry in served["table"].items()}
    assert len({(t["drafted"], t["accepted"]) for t in text.values()}) == 1, text


@pytest.mark.slow
def test_every_answering_server_column_times_every_phase_with_and_without_the_draft(served):
    for name, entry in served["table"].items():
        if entry["failed"]:
            continue
        for phase, ratios in entry["speed"].items():
            assert ratios["tok_s"] is not None and ratios["ttft"] is not None, (name, phase)
            assert ratios["tok_s"]["ci95"][0] <= ratios["tok_s"]["ratio"] <= ratios["tok_s"]["ci95"][1], (name, phase)


def test_a_phases_speed_is_pooled_over_that_phases_turns_only():
    def turn(seed, phase, n, ms, prompt_ms):
        return {"seed": seed, "phase": phase, "predicted_n": n, "predicted_ms": ms, "prompt_ms": prompt_ms}

    seeds = (1, 2)
    drafted = [turn(s, "text", 10, 50.0, 5.0) for s in seeds] + [turn(s, "after image", 10, 200.0, 30.0) for s in seeds]
    plain = [turn(s, "text", 10, 100.0, 5.0) for s in seeds] + [turn(s, "after image", 10, 100.0, 20.0) for s in seeds]
    by_phase = speed_by_phase(drafted, plain, seeds)
    assert by_phase["text"]["tok_s"]["ratio"] == pytest.approx(2.0)
    assert by_phase["after image"]["tok_s"]["ratio"] == pytest.approx(0.5)
    assert by_phase["after image"]["ttft"]["ratio"] == pytest.approx(1.5)
    assert by_phase["after restore"]["tok_s"] is None


def _side(name: str, log: list[str], turns: int, fail_at: int | None = None):
    for k in range(turns):
        if k == fail_at:
            raise ValueError(f"{name} refused turn {k + 1}")
        log.append(f"{name}{k + 1}")
        yield f"{name}{k + 1}"


@pytest.mark.parametrize(
    ("conversation_index", "order"),
    [
        (0, ["D1", "P1", "P2", "D2", "D3", "P3", "P4", "D4"]),
        (1, ["P1", "D1", "D2", "P2", "P3", "D3", "D4", "P4"]),
    ],
)
def test_the_two_sides_of_a_timed_conversation_take_turns_first_in_turn(conversation_index, order):
    log: list[str] = []
    pairs = list(side_by_side(_side("D", log, 4), _side("P", log, 4), conversation_index))
    assert pairs == [("D1", "P1"), ("D2", "P2"), ("D3", "P3"), ("D4", "P4")]
    # each turn swaps which side goes first, and so does each conversation
    assert log == order


def test_the_drafting_sides_failure_is_its_own_and_one_without_the_draft_says_so():
    with pytest.raises(ValueError, match="D refused turn 2"):
        list(side_by_side(_side("D", [], 4, fail_at=1), _side("P", [], 4), conversation_index=0))
    with pytest.raises(WithoutDraftFailed, match="without the draft failed at turn 3: P refused turn 3"):
        list(side_by_side(_side("D", [], 4), _side("P", [], 4, fail_at=2), conversation_index=0))
    with pytest.raises(RuntimeError, match="one side ended at turn 4"):
        list(side_by_side(_side("D", [], 4), _side("P", [], 3), conversation_index=0))


def test_the_other_side_is_closed_when_one_side_fails():
    plain = _side("P", [], 4)  # held here, so that only side_by_side can close it
    with pytest.raises(ValueError):
        list(side_by_side(_side("D", [], 4, fail_at=1), plain, conversation_index=0))
    assert inspect.getgeneratorstate(plain) == inspect.GEN_CLOSED
