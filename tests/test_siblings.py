"""The sibling drafters after an image, measured: draft-mtp (the target's own MTP head) and draft-eagle3.

Both skip the embedding batches of an image in process(), as DFlash does. What that does differs. The
series up to 0005 changes neither; 0007 (the definition variant) gives EAGLE3 positions of its own over
the text rows, which makes it pass where it failed. These tests hold the measurements, so that a change
to either shows.
"""

from __future__ import annotations

import pytest
from series_variants import DEFINED, FEEDS_MTP, VARIANTS

from pyllama_dflash.harness import tiny
from pyllama_dflash.harness.engine.matrix import case_name, run_cases
from pyllama_dflash.harness.repro.report import drafting_around_images
from pyllama_dflash.harness.scenarios.catalog import HOLE_SCENARIOS
from pyllama_dflash.harness.server import SIBLINGS_CHECKS, run_server_checks
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.models import SIBLINGS, sibling_models
from pyllama_dflash.product.llamabuild import variant as variant_of

SCENARIOS = ["S8", "S1", "S2", "S3", "S5", "S10", "S11"]
# the hole scenarios whose image follows text the draft holds: S2's image comes first (EAGLE3's memory
# is empty then), and S10's image reaches the target alone, through a target-only restore
HOLES = [sid for sid in SCENARIOS if sid in HOLE_SCENARIOS and sid not in ("S2", "S10")]


@pytest.fixture(scope="session")
def siblings(variants, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("siblings")
    cases = [(sibling_models(s, out / "models"), SCENARIOS) for s in SIBLINGS]
    tables = run_cases(cases, list(VARIANTS), DEFAULT_CONFIG, parallel=2, drift=False, work_dir=out)
    return {m.drafter: tables[case_name(m)] for m, _ in cases}


def test_the_tiny_mtp_target_is_the_dense_target_plus_a_head():
    g = tiny.gguf_module()
    m = sibling_models("mtp")
    fields = {k: f.contents() for k, f in g.GGUFReader(m.target).fields.items()}
    assert fields["qwen35.block_count"] == 3 and fields["qwen35.nextn_predict_layers"] == 1
    names = {t.name for t in g.GGUFReader(m.target).tensors}
    assert {"blk.2.nextn.eh_proj.weight", "blk.2.nextn.enorm.weight", "blk.2.nextn.hnorm.weight"} <= names
    dense = {t.name: t.data.tobytes() for t in g.GGUFReader(tiny.write_models(m.target.parent).target).tensors}
    mtp = {t.name: t.data.tobytes() for t in g.GGUFReader(m.target).tensors}
    assert {n: mtp[n] for n in dense} == dense  # the trunk byte for byte


@pytest.mark.parametrize("variant", VARIANTS)
def test_mtp_drafts_on_after_an_image_with_every_call_succeeding(siblings, variant):
    """MTP's context is the target's own (IMROPE): the text after an image may jump, nothing fails, the
    output is exact, and the rounds after the image draft as many tokens as before it."""
    for sid in SCENARIOS:
        r = siblings["mtp"][sid][variant]
        assert r["status"] == "PASS" and r["exact"] is True, (sid, r.get("first_failure"))
        after = drafting_around_images(r)["after_image"]
        assert after["empty_rounds"] == 0
        if sid != "S8" and after["rounds"]:
            assert (
                after["drafted_per_round"]
                == drafting_around_images(siblings["mtp"]["S8"][variant])["before_image"]["drafted_per_round"]
            )


# the variants where EAGLE3 keeps positions of its own over the text rows: 0007 and what carries it
# (0008 reads no key for EAGLE3, so it is judged there as the definition is)
OWN_POSITIONS = [v for v in VARIANTS if variant_of(v).judged_as(False, dflash_family=False).own_positions]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in OWN_POSITIONS])
def test_eagle3_fails_after_an_image_at_the_targets_positions(siblings, variant):
    """Up to 0005 EAGLE3's draft holds its rows at the target's positions and is never M-RoPE: the text
    after an image that text preceded is refused (Y = X + 1); an image first (S2) and text only (S8) pass."""
    table = siblings["eagle3"]
    for sid in HOLES:
        r = table[sid][variant]
        assert r["status"] == "FAIL" and "Y = X + 1" in r["first_failure"], (sid, r.get("first_failure"))
    assert table["S2"][variant]["status"] == table["S8"][variant]["status"] == "PASS"


@pytest.mark.skipif(DEFINED is None, reason="the series has no definition variant")
@pytest.mark.parametrize("variant", OWN_POSITIONS)
def test_eagle3_drafts_after_an_image_at_positions_of_its_own(siblings, variant):
    """0007 gives EAGLE3 positions of its own over the text rows (an image's rows are not in its
    context): every scenario passes with the target's own output, every call succeeding, and the rounds
    after the image draft as many tokens as the rounds of text only."""
    table = siblings["eagle3"]
    per_round = drafting_around_images(table["S8"][variant])["before_image"]["drafted_per_round"]
    for sid in SCENARIOS:
        r = table[sid][variant]
        assert r["status"] == "PASS" and r["exact"] is True, (sid, r.get("first_failure"))
        after = drafting_around_images(r)["after_image"]
        if sid in HOLES:
            assert after["rounds"] and after["empty_rounds"] == 0, (sid, after)
            assert after["drafted_per_round"] == per_round, (sid, after)


@pytest.mark.server
@pytest.mark.parametrize("sibling", SIBLINGS)
def test_the_siblings_through_llama_server(variants, sibling, tmp_path):
    m = sibling_models(sibling, tmp_path / "models")
    for v in ("baseline", VARIANTS[-1]):
        name = f"{sibling}_image_turns"
        r = run_server_checks(variants[v], m, checks=[name], work_dir=tmp_path)[name]
        assert r["ok"], (sibling, v, r)
        if sibling == "mtp":
            assert r["exact"] == {"image": True, "restored": True}
            assert r["draft"]["image"]["draft_n"] > 0 and r["draft"]["second_turn_after_the_image"]["draft_n"] > 0
        elif v in OWN_POSITIONS:  # 0007: positions of its own over the text rows
            assert r["exact"] == {"image": True, "restored": True}
            assert r["draft"]["image"]["draft_n"] > 0 and r["draft"]["second_turn_after_the_image"]["draft_n"] > 0
        else:
            assert r["status"][0] == 200 and r["status"][1] == 500  # text answers, the image fails
            assert r["draft"]["text_before_any_image"]["draft_n"] > 0
    assert set(SIBLINGS_CHECKS[sibling]) >= {name}


@pytest.mark.server
def test_mtp_drafts_each_round_as_a_fresh_server_does_but_after_a_context_checkpoint(variants, tmp_path):
    """mtp_drafts_vs_fresh: a request and its second turn draft, round for round, what a fresh server drafts
    for the same history (the reference of drafts_vs_definition). A request that goes back to a context
    checkpoint does not, on every variant, baseline included (measured; a b11434 behaviour, not the series')."""
    m = sibling_models("mtp", tmp_path / "models")
    for v in ("baseline", VARIANTS[-1]):
        r = run_server_checks(variants[v], m, checks=["mtp_drafts_vs_fresh"], work_dir=tmp_path)["mtp_drafts_vs_fresh"]
        assert r["ok"] and r["definition"]["same"] is True and len(r["definition"]["rounds"]) >= 6, (v, r)
        assert r["after_a_context_checkpoint"]["same"] is False and r["cache_n"][2], (v, r)


@pytest.mark.server
def test_mtp_drafts_after_an_image_as_a_fresh_server_does_and_from_the_image_with_0009(variants, tmp_path):
    """mtp_drafts_vs_fresh_after_an_image: an image request and its second turn draft, round for round, what a
    fresh server drafts for the same history, on b11434 (which skips the image in both) and with 0009 (which
    feeds it in both). The rounds draft otherwise with 0009: the image reaches the head. A third request that
    goes back to a context checkpoint drafts otherwise on both, as on text (mtp_drafts_vs_fresh)."""
    name, m = "mtp_drafts_vs_fresh_after_an_image", sibling_models("mtp", tmp_path / "models")
    drafted = {}
    for v in ("baseline", FEEDS_MTP):
        r = run_server_checks(variants[v], m, checks=[name], work_dir=tmp_path)[name]
        assert r["ok"] and r["definition"]["same"] is True and len(r["definition"]["rounds"]) >= 6, (v, r)
        assert r["after_a_context_checkpoint"]["same"] is False and r["cache_n"][1] and r["cache_n"][2], (v, r)
        drafted[v] = [x["drafted"] for x in r["definition"]["rounds"]]
    assert drafted["baseline"] != drafted[FEEDS_MTP]


@pytest.mark.server
def test_eagle3_drafts_each_round_as_a_fresh_server_does_after_an_image(variants, tmp_path):
    """eagle3_drafts_vs_fresh on 0007: an image request, its second turn and a cut-back request draft, round
    for round, what a fresh server drafts for the same history; baseline answers 500 at the image."""
    m = sibling_models("eagle3", tmp_path / "models")
    r = run_server_checks(variants[DEFINED], m, checks=["eagle3_drafts_vs_fresh"], work_dir=tmp_path)
    r = r["eagle3_drafts_vs_fresh"]
    assert r["ok"] and r["definition"]["same"] is True and len(r["definition"]["rounds"]) >= 12, r
    assert r["cache_n"][1] and r["cache_n"][2], r  # the second turn and the cut-back reuse the cached prefix
    b = run_server_checks(variants["baseline"], m, checks=["eagle3_drafts_vs_fresh"], work_dir=tmp_path)
    assert b["eagle3_drafts_vs_fresh"]["status"][0] == 500


@pytest.mark.server
def test_b11434s_eagle3_drafts_a_prompt_otherwise_when_it_goes_in_two_passes(variants, tmp_path):
    """The same text prompt in one pass and in two (a context checkpoint between): b11434's EAGLE3 drafts its
    first round otherwise (its bridged row decoded with the next row's g); with 0001 (the first variant carries
    it, and every later one) it drafts it alike."""
    m = sibling_models("eagle3", tmp_path / "models")
    for v, same in (("baseline", False), ("zero-fill", True), (DEFINED, True)):
        r = run_server_checks(variants[v], m, checks=["eagle3_prompt_split"], work_dir=tmp_path)["eagle3_prompt_split"]
        assert r["ok"] and r["two_passes"], (v, r)
        assert (r["first_round"]["one_pass"] == r["first_round"]["two_passes"]) is same, (v, r)


@pytest.mark.server
def test_an_mtp_draft_part_past_its_target_part_is_refused_as_running_past(variants, tmp_path):
    """MTP keeps the target's positions on 0007 too: a forged draft part longer than its target part is
    refused by slot_draft_load's other branch ("runs past"), not by the row count DFlash's and EAGLE3's get."""
    m = sibling_models("mtp", tmp_path / "models")
    for v in ("slots", DEFINED):
        r = run_server_checks(variants[v], m, checks=["restore_draft_runs_past"], work_dir=tmp_path)
        r = r["restore_draft_runs_past"]
        assert r["ok"] and r["restore_status"] == 400 and "runs past its target part" in r["restore_error"], (v, r)


def test_the_tiny_eagle3_draft_reads_three_target_rows():
    g = tiny.gguf_module()
    m = sibling_models("eagle3")
    fields = {k: f.contents() for k, f in g.GGUFReader(m.draft).fields.items()}
    assert fields["general.architecture"] == "eagle3" and fields["eagle3.block_count"] == 1
    assert list(fields["eagle3.target_layers"]) == [0, 1, 2]  # 2: the target's final hidden state
    assert fields["eagle3.target_hidden_size"] == 64
    assert "eagle3.rope.dimension_sections" not in fields  # b11434's eagle3 never reads it


@pytest.mark.server
@pytest.mark.parametrize("name", ["eagle3_slot_restore_drafts", "eagle3_prompt_cache_drafts"])
def test_eagle3_drafts_as_a_fresh_server_does_after_another_conversation_was_loaded(variants, name, tmp_path):
    """A conversation with an image brought back into its slot (a slot file, the prompt cache) over another one
    whose pending row is live at its last row: 0007 forgets that row's g, and every round of the continuation
    drafts what a fresh server drafts for the same history; baseline answers 500 at the image."""
    m = sibling_models("eagle3", tmp_path / "models")
    r = run_server_checks(variants[DEFINED], m, checks=[name], work_dir=tmp_path)[name]
    assert r["ok"] and r["loaded"] and r["cache_n_after_load"] == r["rows_of_a"], r
    assert r["definition"]["same"] is True and len(r["definition"]["rounds"]) >= 6, r
    b = run_server_checks(variants["baseline"], m, checks=[name], work_dir=tmp_path)[name]
    assert b["ok"] and b["status"][0] == 500, b
    assert name in SIBLINGS_CHECKS["eagle3"]


@pytest.mark.server
@pytest.mark.parametrize("name", ["eagle3_restore_image_drafts", "eagle3_prompt_cache_image_drafts"])
def test_eagle3_drafts_as_a_fresh_server_does_after_its_own_conversation_was_loaded(variants, name, tmp_path):
    """A conversation with an image brought back into its slot (a slot file, the prompt cache) and continued
    with new text, so that its last row must be written again from its own g: the slot file's draft part
    (format version 2) and the prompt-cache entry carry EAGLE3's pending row, and every round of the
    continuation drafts what a fresh server drafts for the same history."""
    m = sibling_models("eagle3", tmp_path / "models")
    r = run_server_checks(variants[DEFINED], m, checks=[name], work_dir=tmp_path)[name]
    assert r["ok"] and r["definition"]["same"] is True and len(r["definition"]["rounds"]) >= 6, r
    assert name in SIBLINGS_CHECKS["eagle3"]


@pytest.mark.server
def test_eagle3_drafts_as_its_conversation_never_interrupted_after_a_slot_restore_from_0005_on(variants, tmp_path):
    """A text conversation saved, another run, the first restored and continued: from 0005 on the draft part
    carries EAGLE3's pending row (format version 2) and the continuation drafts as never interrupted; a
    server that restores the target alone (baseline, full) leaves the other conversation's rows and row."""
    m = sibling_models("eagle3", tmp_path / "models")
    for v, same in (("baseline", False), ("full", False), ("slots", True), (DEFINED, True)):
        r = run_server_checks(variants[v], m, checks=["eagle3_restore_drafts"], work_dir=tmp_path)[
            "eagle3_restore_drafts"
        ]
        assert r["ok"] and r["same_drafts"] is same and len(r["drafted"]) >= 5, (v, r)


def test_b11434_reads_an_eagle3_drafts_rope_sections_as_plain_rope(variants, tmp_path):
    """An EAGLE3 draft whose GGUF says M-RoPE (rope.dimension_sections, as the converter writes for a draft
    config with mrope_section) drafts every round exactly as the plain one, before and after an image, on
    b11434 and on 0007: llama-model.cpp gives eagle3 LLAMA_ROPE_TYPE_NORM whatever the file says, so its
    batches carry one position a row and the encoder's single ``&pos`` is all there is to read."""
    from pyllama_dflash.harness.oracles.drift import drafts
    from pyllama_dflash.harness.tiny.eagle3 import write_eagle3

    plain = sibling_models("eagle3", tmp_path / "models")
    keyed_file = tmp_path / "models" / "tiny-eagle3-with-rope-sections.gguf"
    write_eagle3(keyed_file, mrope=True)
    keyed_fields = tiny.gguf_module().GGUFReader(keyed_file).fields
    assert "eagle3.rope.dimension_sections" in keyed_fields
    keyed = plain.with_draft(keyed_file)
    columns = ["baseline", DEFINED] if DEFINED else ["baseline"]
    runs = ["S8", "S1", "S4", "S11"]
    a, b = (
        run_cases([(m, runs)], columns, DEFAULT_CONFIG, parallel=2, drift=False, work_dir=tmp_path / name)[case_name(m)]
        for m, name in ((plain, "plain"), (keyed, "keyed"))
    )
    for sid in runs:
        for v in columns:
            assert b[sid][v]["status"] == a[sid][v]["status"], (sid, v, b[sid][v].get("first_failure"))
            assert drafts(b[sid][v].get("rounds", [])) == drafts(a[sid][v].get("rounds", [])), (sid, v)
    assert any(drafts(a[sid][DEFINED].get("rounds", [])) for sid in runs if DEFINED)  # something was drafted
