"""Paired acceptance: every column drafts at every position of the same target replies.

The smoke run (two conversations, 64-row images, the dense target's text-trained draft) checks what
makes the table paired: the target's replies are the same in every column, and before the first
image every semantics drafts alike, so the text phase is the same per conversation in every column.
After the image the semantics part: the definition's draft sees the image's rows and the twin's
does not. The figures themselves are the bench's (``pyllama-dflash bench --only paired``), in
docs/performance.md, generated from docs/figures/paired.json (checked in test_docs.py; the README's
table here).
"""

from __future__ import annotations

import pytest

from pyllama_dflash.harness.slotloop.record import Round
from pyllama_dflash.lab.acceptance import paired
from pyllama_dflash.lab.acceptance.script import FIRST_POSITIONS, paired_results, phase_of
from pyllama_dflash.lab.draftmodel.trained import trained_models

SEEDS = (2000, 2001)


@pytest.fixture(scope="module")
def smoke(variants):
    return paired.measure_paired(trained_models("dense", trained_on="text"), SEEDS, 64, log=lambda line: None)


def test_a_positions_phase_goes_by_its_index_in_the_reply():
    assert phase_of(None, 30, FIRST_POSITIONS) == "text"
    assert phase_of("after image", FIRST_POSITIONS - 1, FIRST_POSITIONS) == "after image"
    assert phase_of("after image", FIRST_POSITIONS, FIRST_POSITIONS) == "later"
    assert phase_of("after restore", FIRST_POSITIONS, FIRST_POSITIONS) == "later after restore"


def test_a_position_accepts_the_drafts_prefix_that_the_target_generated():
    reply = [5, 6, 7, 8, 9, 10]
    rounds = [Round(0, p, 3, 0, False, tokens) for p, tokens in enumerate([[6, 7, 1], [7, 8, 9], [1, 8, 9]])]
    got = paired_results(7, "after image", reply, rounds, n_max=3)
    # three positions have three tokens after them; the first accepts two, the second all three
    assert [(r.index, r.accepted, r.drafted) for r in got] == [(0, 2, 3), (1, 3, 3), (2, 0, 3)]


def test_a_column_that_saw_other_target_tokens_is_refused():
    cols = {
        "a": {"column": {"images": True}, "replies": {"1": [[1, 2]]}},
        "b": {"column": {"images": True}, "replies": {"1": [[1, 3]]}},
    }
    with pytest.raises(RuntimeError, match="'b' saw other target tokens than 'a' on conversation 1"):
        paired.check_paired(cols)


@pytest.mark.slow
def test_before_the_image_every_semantics_drafts_alike(smoke):
    text = {name: e["phases"]["text"]["per_conversation"] for name, e in smoke["table"].items()}
    assert len(set(map(str, text.values()))) == 1, text
    for pair, by_phase in smoke["differences"].items():
        assert by_phase["text"]["difference"] == 0.0, pair


@pytest.mark.slow
def test_after_the_image_the_definition_drafts_otherwise_than_the_twin(smoke):
    d = smoke["differences"][f"{paired.DEFINITION} - {paired.TWIN}"]
    assert any(d[p]["difference"] != 0.0 for p in ("after image", "later", "after second image")), d


@pytest.mark.slow
def test_every_column_measures_every_position_of_the_replies(smoke):
    counts = {name: {p: f["rounds"] for p, f in e["phases"].items()} for name, e in smoke["table"].items()}
    image_columns = [c for n, c in counts.items() if n != paired.TEXT_ONLY]
    assert all(c == image_columns[0] for c in image_columns), counts
    assert image_columns[0]["after image"] == FIRST_POSITIONS * len(SEEDS)


AS_TRAINED = "as trained"


@pytest.mark.slow
@pytest.mark.parametrize(("trained_on", "served_as"), [("text", paired.TWIN), ("images", paired.DEFINITION)])
def test_the_as_trained_variant_serves_each_committed_draft_as_it_was_trained(variants, trained_on, served_as):
    """0008 reads the image-rows key the image-trained draft carries and the text-trained one lacks:
    position by position it accepts what the column of the draft's own training semantics accepts."""
    from pyllama_dflash.lab.acceptance.job import Column

    cols = (Column(served_as, "slots" if served_as == paired.TWIN else "definition"), Column(AS_TRAINED, "as-trained"))
    models = trained_models("dense", trained_on=trained_on)
    assert models.image_rows is (trained_on == "images")
    r = paired.measure_paired(models, SEEDS, 64, cols, log=lambda line: None)
    for phase, cell in r["table"][AS_TRAINED]["phases"].items():
        assert cell["per_conversation"] == r["table"][served_as]["phases"][phase]["per_conversation"], phase
    assert r["table"][AS_TRAINED]["since_image"] == r["table"][served_as]["since_image"]
