"""``vlm speed`` on the committed trained pair: one held-out prose conversation on a server with the draft
and one without, side by side. What it checks is what the speed table rests on: the replies with the draft
are the replies without it, every turn is timed on both, and the figures derived from them are consistent
(no timing is asserted: a test is no benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyllama_dflash.errors import UsageError
from pyllama_dflash.lab.vlm.__main__ import main as vlm_main
from pyllama_dflash.lab.vlm.drafts import TrainedOn
from pyllama_dflash.lab.vlm.scenes import SIDE_FOR_ROWS
from pyllama_dflash.lab.vlm.served_speed import PairFiles, Served, conversation, measure, measure_side_by_side

COMMITTED = Path(__file__).parent / "data" / "vlm"
FILES = PairFiles(COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf", COMMITTED / "vlm-dflash-text.gguf")


def test_a_conversation_of_the_bench_shape_has_its_images_where_its_phases_say():
    turns = conversation(TrainedOn.IMAGES, 0, rows=64)
    assert [phase for phase, _ in turns] == ["text", "after image", "later", "after second image"]
    assert [t.image is not None for _, t in turns] == [False, True, False, True]
    assert {t.image.side for _, t in turns if t.image} == {SIDE_FOR_ROWS[64]}


@pytest.mark.server
def test_the_draft_changes_no_reply_and_every_turn_is_timed_on_both_servers(variants):
    record = measure("as-trained", FILES, TrainedOn.TEXT, seeds=[0], n_maxes=(3,), log=lambda _: None)
    plain, drafted = record["turns"]["no draft"], record["turns"]["n_max 3"]
    assert [t["reply"] for t in drafted] == [t["reply"] for t in plain]
    assert all(t["predicted_n"] > 0 and t["predicted_ms"] > 0 for t in plain + drafted)
    assert all(t["draft_n"] == 0 for t in plain) and sum(t["draft_n"] for t in drafted) > 0
    cell = record["table"]["3"]["phases"]["all"]
    assert record["table"]["3"]["replies_equal_without_draft"]
    assert 0 <= cell["accepted_per_round"] <= 3
    # c = (1 + a) / ratio: the cost of a round the measured ratio implies
    assert cell["implied_round_cost"] == pytest.approx((1 + cell["accepted_per_round"]) / cell["tok_s"]["ratio"])


@pytest.mark.server
def test_ways_of_serving_side_by_side_share_one_plain_server_and_write_a_record_each(variants):
    ways = [Served("slots", FILES.draft), Served("definition", COMMITTED / "vlm-dflash-images.gguf")]
    made = measure_side_by_side(ways, FILES.target, FILES.mmproj, TrainedOn.TEXT, [0], (3,), log=lambda _: None)
    assert [r["variant"] for r in made] == ["slots", "definition"]
    assert made[0]["turns"]["no draft"] == made[1]["turns"]["no draft"]  # the very same plain turns
    assert made[0]["served_beside"] == ["definition vlm-dflash-images.gguf"]
    for r in made:
        assert [t["reply"] for t in r["turns"]["n_max 3"]] == [t["reply"] for t in r["turns"]["no draft"]]
        assert sum(t["draft_n"] for t in r["turns"]["n_max 3"]) > 0
    # two drafts on the same tokens draft differently: each record holds its own server's turns
    assert [t["draft_n_accepted"] for t in made[0]["turns"]["n_max 3"]] != [
        t["draft_n_accepted"] for t in made[1]["turns"]["n_max 3"]
    ]


def test_several_ways_of_serving_need_a_record_path_that_names_each(tmp_path):
    drafts = f"{FILES.draft},{COMMITTED / 'vlm-dflash-images.gguf'}"
    args = ["speed", "--target", str(FILES.target), "--draft", drafts, "--json", str(tmp_path / "speed.json")]
    with pytest.raises(UsageError, match=r"2 ways of serving write a record each; name them with \{variant\}"):
        vlm_main(args)


@pytest.mark.parametrize("draft", ["text", "image"])
def test_pair_writes_the_committed_paired_figures_from_the_committed_speed_records(draft, tmp_path):
    """docs/figures/vlm-paired-256-*.json is what `vlm pair` makes of the two speed records it names."""
    figures = Path(__file__).parent.parent / "docs" / "figures"
    committed = json.loads((figures / f"vlm-paired-256-{draft}-draft.json").read_text())
    first, second = (figures / f"vlm-speed-images-256-{draft}-draft-{v}.json" for v in ("definition", "slots"))
    assert vlm_main(["pair", str(first), str(second), "--json", str(tmp_path / "out.json")]) == 0
    made = json.loads((tmp_path / "out.json").read_text())
    assert made["phases"] == committed["phases"] and made["same_replies"] == committed["same_replies"]


def test_pair_refuses_records_of_two_drafts(tmp_path):
    figures = Path(__file__).parent.parent / "docs" / "figures"
    text, image = (figures / f"vlm-speed-images-256-{d}-draft-slots.json" for d in ("text", "image"))
    with pytest.raises(UsageError, match="different drafts"):
        vlm_main(["pair", str(text), str(image)])
