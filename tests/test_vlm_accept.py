"""``vlm accept``: paired acceptance on the committed trained pair through each variant's libraries.

What the acceptance tables rest on, at toy size: every column is judged on the same target tokens (the
command refuses otherwise), a reply ends at the target's own end of turn, and ``as-trained`` serves each
draft as its key says: the text-trained draft (unmarked) drafts exactly what it drafts under the twin's
semantics (``slots``), the image-trained draft (marked) exactly what it drafts under ``definition``, at
every phase. No figure is asserted: the committed record holds those, and a test is no benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyllama_dflash.lab.acceptance.paired import DEFINITION, TWIN
from pyllama_dflash.lab.acceptance.script import PHASES
from pyllama_dflash.lab.vlm.__main__ import main as vlm_main
from pyllama_dflash.lab.vlm.library_paired import AS_TRAINED, COLUMNS, TrainedPair, measure, trained_plan
from pyllama_dflash.lab.vlm.report import markdown
from pyllama_dflash.lab.vlm.scenes import SIDE_FOR_ROWS
from pyllama_dflash.lab.vlm.vocab import IM_END

COMMITTED = Path(__file__).parent / "data" / "vlm"


def _same_everywhere(differences: dict) -> bool:
    return all(d["difference"] == 0 and d["ci95"] == [0, 0] for d in differences.values())


@pytest.mark.slow
def test_the_plan_is_the_bench_shape_with_a_restore_and_replies_that_end_at_the_end_of_turn():
    plan = trained_plan(0, 256)
    assert [after for after, _ in plan.turns] == [None, "after image", "later", "after second image", "after restore"]
    assert [len(t.images) for _, t in plan.turns] == [0, 1, 0, 1, 0]
    assert {im.shape[0] for _, t in plan.turns for im in t.images} == {SIDE_FOR_ROWS[256]}
    assert plan.stop == IM_END and not plan.interlude.images
    assert trained_plan(0, 256).turns[0][1].text == plan.turns[0][1].text  # seeded: the same conversation


@pytest.mark.slow
@pytest.mark.build
def test_accept_runs_every_semantics_on_the_same_tokens_and_as_trained_is_the_twin_for_the_text_draft(
    variants, tmp_path
):
    out = tmp_path / "vlm-accept.json"
    args = ["accept", "--drafts", "text", "--rows", "64", "--conversations", "1", "--json", str(out)]
    assert vlm_main(args) == 0
    record = json.loads(out.read_text())
    run = record["runs"]["trained/text/64"]
    assert set(run["table"]) == {c.name for c in COLUMNS}
    assert set(run["table"][TWIN]["phases"]) >= set(PHASES)
    assert _same_everywhere(run["differences"][f"{AS_TRAINED} - {TWIN}"])
    assert "| text-trained | 64 | as-trained |" in markdown(record)


@pytest.mark.slow
@pytest.mark.build
def test_as_trained_serves_the_image_trained_draft_as_the_definition(variants):
    pair = TrainedPair(
        COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf", COMMITTED / "vlm-dflash-images.gguf"
    )
    cols = [c for c in COLUMNS if c.name in (DEFINITION, AS_TRAINED, TWIN)]
    run = measure(pair, [0], 64, 7, cols, log=lambda _: None)
    assert _same_everywhere(run["differences"][f"{AS_TRAINED} - {DEFINITION}"])
    assert not _same_everywhere(run["differences"][f"{AS_TRAINED} - {TWIN}"])  # else the test could not fail
