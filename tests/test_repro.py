"""The scenario matrix on the tiny models, every variant: the table the fix is judged by.

Each (scenario, variant) runs in its own child process (see pyllama_dflash.harness.engine.matrix).
These tests never skip: a missing build is built by the ``variants`` fixture, and a build
failure fails them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from series_variants import DEFINED, SERVED_AS_TRAINED, TWIN_FIX, VARIANTS

from pyllama_dflash.harness.engine.matrix import run_matrix, run_table
from pyllama_dflash.harness.oracles.drift import compare
from pyllama_dflash.harness.oracles.references import DEFINITION, REFERENCE
from pyllama_dflash.harness.scenarios.catalog import SCENARIOS, expectations, meets
from pyllama_dflash.harness.scenarios.scenario_job import ScenarioJob
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG, server_config
from pyllama_dflash.harness.slotloop.models import IMAGE_ROWS_CASE
from pyllama_dflash.product.llamabuild import default_must_pass
from pyllama_dflash.product.llamabuild import variant as variant_of


@pytest.fixture(scope="session")
def matrix(variants, model_set, tmp_path_factory) -> dict[tuple[str, str], dict]:
    """Every cell, judged by the drift oracle; the reference runs under (scenario, REFERENCE)."""
    assert set(VARIANTS) <= set(variants), f"built variants: {sorted(variants)}"
    table = run_table(
        list(SCENARIOS),
        list(VARIANTS),
        model_set,
        DEFAULT_CONFIG,
        parallel=2,
        work_dir=tmp_path_factory.mktemp("matrix"),
    )
    return {(sid, v): r for sid, row in table.items() for v, r in row.items()}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matrix_cell(matrix, scenario, variant):
    result = matrix[(scenario, variant)]
    expected = expectations(variant)[scenario]
    assert meets(expected, result), (
        f"{scenario} on {variant}: {result['status']} (expected {'/'.join(expected)}): "
        f"{result.get('first_failure')}\nlog: {result.get('log')}\n" + "\n".join(result.get("log_tail", []))
    )


def test_baseline_fails_s1_at_the_draft_with_both_positions(matrix):
    r = matrix[("S1", "baseline")]
    failing = [c for c in r["calls"] if not c["ok"]]
    assert len(failing) == 1 and failing[-1] is r["calls"][-1]
    call = failing[0]
    assert call["who"] == "spec" and call["api"] == "common_speculative_process"
    text = "\n".join(call["log"])
    assert "Y = X + 1" in text and "X = " in text and "Y = " in text
    # every target call before it succeeded: the target is fine, only the draft refuses
    assert all(c["ok"] for c in r["calls"] if c["who"] == "target")


def test_the_fix_drafts_right_after_the_image(matrix):
    for variant in ("zero-fill", "full"):
        r = matrix[("S1", variant)]
        assert r["drafted_after_image"] and r["drafted_after_image"] > 0
        assert r["exact"] is True  # greedy output equals decoding without the draft


def test_full_drafts_in_the_first_round_of_s10_where_zero_fill_cannot(matrix):
    zf, full = matrix[("S10", "zero-fill")], matrix[("S10", "full")]
    assert zf["rounds"][0]["drafted"] == 0 and full["rounds"][0]["drafted"] > 0
    assert all(r["drafted"] > 0 for r in zf["rounds"][1:])


def test_outputs_are_exact_wherever_a_run_completes(matrix):
    for (sid, variant), r in matrix.items():
        if r["status"] in ("PASS", "DRIFT", "DEGRADED"):
            assert r["exact"] is True, f"{sid} {variant}"


# -- the drift oracle: drafted tokens, not only return codes and output ----------------------------


def test_every_round_records_its_drafted_tokens(matrix):
    for (sid, variant), r in matrix.items():
        for rnd in r.get("rounds", []):
            assert len(rnd["tokens"]) == rnd["drafted"], (sid, variant, rnd)


def test_the_references_run_and_draft(matrix):
    """Baseline with the reconverted twin completes every scenario and drafts in every round: the oracle
    has something to judge. S7 too: the reference follows the history a target-only restore leaves (the
    twin's rows past the restored position removed), where baseline itself refuses the next rows (X <= Y)."""
    for sid in SCENARIOS:
        ref = matrix[(sid, REFERENCE)]
        if sid == "S7":
            assert ref["status"] == "PASS", ref.get("first_failure")
            history = [c for c in ref["calls"] if c["step"].endswith("(history)")]
            assert history and history[0]["who"] == "draft" and history[0]["api"] == "llama_memory_seq_rm"
            assert matrix[(sid, "baseline+twin")]["status"] == "PASS"
            assert matrix[(sid, "full")]["drafts"] == ref["drafts"] != []  # the fix trims to the same history
            continue
        if sid == "S12":  # baseline's server restores the target alone: the twin drifts there too
            assert ref["status"] == "DRIFT", ref.get("first_failure")
            continue
        assert ref["status"] == "PASS", (sid, ref.get("first_failure"))
        assert ref["rounds"] and all(rnd["drafted"] > 0 for rnd in ref["rounds"]), sid


@pytest.mark.parametrize("variant", ["full", "slots"])
def test_the_fix_drafts_exactly_what_the_twin_drafts_on_baseline(matrix, variant):
    """The legacy draft under the fix: same tokens, same positions, every round, every scenario but
    S12, whose drafts are judged within the run (the reference, on baseline, drifts there itself)."""
    for sid in SCENARIOS:
        if sid == "S12":
            continue
        r = matrix[(sid, variant)]
        assert r["drift"] is None, (sid, r["drift"])
        assert r["drafts"] == r["reference"]["drafts"] and r["drafts"], sid


def test_the_fix_leaves_an_m_rope_draft_as_it_was(matrix):
    """S9 runs the M-RoPE draft itself: under the fix it drafts what it drafted on baseline."""
    assert matrix[("S9", "full")]["drafts"] == matrix[("S9", "baseline")]["drafts"]
    assert matrix[("S9", "zero-fill")]["drafts"] != matrix[("S9", "baseline")]["drafts"]  # the seed fills it


def test_zero_fill_drift_names_the_round_and_quotes_both_drafts(matrix):
    r = matrix[("S1", "zero-fill")]
    d = r["drift"]
    assert r["status"] == "DRIFT" and r["exact"] is True and d["run"] != d["reference"]
    assert 1 <= d["round"] <= d["total"] and d["differing"] >= 1
    assert r["drafts"][d["round"] - 1]["tokens"] == d["run"]
    assert r["reference"]["drafts"][d["round"] - 1]["tokens"] == d["reference"]
    assert f"round {d['round']}" in r["first_failure"] and str(d["run"]) in r["first_failure"]
    assert str(d["reference"]) in r["first_failure"]


def test_a_one_row_image_tail_is_injected_as_on_the_twin(matrix):
    """S11: the 1-row tail sub-batch is not pinned; baseline's twin injects it at P, and so does the fix
    (the draft's cell at P is the twin's), then fills and removes [P + 1, next) for the text."""
    full, ref = matrix[("S11", "full")], matrix[("S11", REFERENCE)]
    assert full["status"] == "PASS" and full["drift"] is None
    image = next(c for c in full["calls"] if c["api"] == "mtmd_helper_decode_image_chunk")
    tail = [c for c in full["calls"] if c["api"] == "common_speculative_process" and "sub-batch 3/3" in c["step"]]
    assert tail and tail[0]["n"] == 1 and tail[0]["pos"] == [image["pos"][0]] * 2
    assert full["drafts"] == ref["drafts"]


def test_a_restored_slot_drafts_as_its_conversation_only_where_the_server_restores_the_draft(matrix):
    """S12: save A, run B, restore A, continue A. Where the variant's llama-server restores the target
    alone (b11434, and every variant without 0005), A's continuation drafts otherwise than A never
    interrupted; with 0005 (slots) the draft's state comes back with the slot and the drafts are equal."""
    for variant in [v for v in VARIANTS if not variant_of(v).saves_draft]:
        r = matrix[("S12", variant)]
        assert r["status"] == "DRIFT" and r["exact"] is True, (variant, r.get("first_failure"))
        assert r["first_failure"].startswith("restored A against A uninterrupted: drafts differ")
    slots = matrix[("S12", "slots")]
    assert slots["status"] == "PASS" and slots["exact"] is True, slots.get("first_failure")
    restores = [c for c in slots["calls"] if c["step"] == "restore A"]
    assert [(c["who"], c["api"]) for c in restores] == [
        ("target", "llama_state_seq_set_data"),
        ("draft", "llama_state_seq_set_data"),
    ]


def test_the_fix_trims_a_draft_ahead_with_a_warning(matrix):
    """S7: the draft holds positions the restored target dropped; the fix removes them and says so."""
    calls = matrix[("S7", "full")]["calls"]
    warned = [line for c in calls for line in c["log"] if "WARNING" in line and "removing positions" in line]
    assert warned and "[6, 17]" in warned[0], [c["log"] for c in calls if c["log"]]


def test_repro_cli_json_and_exit_status(variants, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyllama_dflash.harness.repro",
            "--no-build",
            "--scenarios",
            "S1,S8",
            "--drafters",
            "dflash,dspark",
            "--expect-baseline-fail",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["variants"] == list(VARIANTS) and report["must_pass"] == default_must_pass(list(VARIANTS))
    assert report["ok"] is True
    assert report["reference"] == {"variant": "baseline", "draft": "reconverted twin"}
    # per case: as-trained is judged against the definition only where the drafts carry the image-rows key
    assert len(report["references"]) == 8  # dflash and dspark on two targets, unmarked and marked
    for case, refs in report["references"].items():
        keyed = case.endswith(IMAGE_ROWS_CASE)
        by_definition = {DEFINED} | (set(SERVED_AS_TRAINED) if keyed else set())
        assert refs == {v: DEFINITION if v in by_definition else REFERENCE for v in VARIANTS}, case
    # a case per drafter and target, every cell naming both, and again with the drafts marked
    assert sorted(c["image_rows"] for c in report["cases"]) == [False] * 4 + [True] * 4
    cases = {(c["drafter"], c["target"]): c for c in report["cases"] if not c["image_rows"]}
    assert set(cases) == {(d, t) for d in ("dflash", "dspark") for t in ("dense", "moe")}
    assert cases[("dspark", "moe")]["spec_type"] == "draft-dspark"
    assert "S8" not in cases[("dspark", "moe")]["results"]  # the MoE target runs the image scenarios
    for (drafter, target), case in cases.items():
        for row in case["results"].values():
            assert all((r["drafter"], r["target"]) == (drafter, target) for r in row.values())
    s1 = cases[("dflash", "dense")]["results"]["S1"]
    assert s1["full"]["drafts"] == s1["full"]["reference"]["drafts"] == s1[REFERENCE]["drafts"] != []
    assert s1["zero-fill"]["status"] == "DRIFT"
    assert report["llama_cpp"]["pinned"] is True
    assert s1["baseline"]["status"] == "FAIL"
    assert "Y = X + 1" in s1["baseline"]["first_failure"]
    assert isinstance(report["wall_s"], float)
    assert "S1   text, image, text" in proc.stdout
    assert "== every drafter on the moe target (qwen35moe) ==" in proc.stdout


def test_repro_exits_non_zero_when_the_fix_is_baseline(variants):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyllama_dflash.harness.repro",
            "--no-build",
            "--scenarios",
            "S1",
            "--drafters",
            "dflash",
            "--targets",
            "dense",
            "--must-pass",
            "baseline",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1
    assert "baseline FAIL on S1" in proc.stderr


def _xy(call: dict) -> tuple[int, int]:
    text = "\n".join(call["log"])
    return int(re.search(r"\bX = (\d+)", text).group(1)), int(re.search(r"\bY = (\d+)", text).group(1))


def test_the_hole_is_as_wide_as_the_image_grid(matrix):
    """Baseline's failing draft batch: X is the draft's last position, Y the text after the image."""
    for sid, tail_row in (("S3", False), ("S11", True)):
        calls = matrix[(sid, "baseline")]["calls"]
        image = next(c for c in calls if c["api"] == "mtmd_helper_decode_image_chunk")
        p_image, p_end = image["pos"]  # the image's first temporal position, the last it spans
        x, y = _xy(calls[-1])
        assert y == p_end + 1  # text resumes max(nx, ny) positions after P
        # a pinned sub-batch is skipped, but a one-row tail is injected at P (S11)
        assert x == (p_image if tail_row else p_image - 1), (sid, x, p_image)


def test_a_draft_with_smaller_batches_than_the_target_drafts_as_its_twin(variants, model_set, tmp_path):
    """The draft's n_batch 8 and n_ubatch 4 against the target's 16: every run the fix injects is cut at
    the draft's n_ubatch, the 6-position hole of S3 spans two of its ubatches."""
    config = replace(DEFAULT_CONFIG, draft_n_batch=8, draft_n_ubatch=4)
    table = run_table(["S1", "S3", "S5", "S11"], [TWIN_FIX], model_set, config, parallel=2, work_dir=tmp_path)
    for sid, row in table.items():
        r = row[TWIN_FIX]
        assert r["status"] == "PASS" and r["drift"] is None and r["drafts"] == r["reference"]["drafts"], (sid, r)


BEHIND = ("S10", "S16")  # a target-only restore leaves the draft behind: the restored rows' features exist nowhere


def test_the_definition_drafts_what_the_definition_reference_drafts(matrix):
    """0007 on the legacy draft: the same tokens at the same positions in every round of every scenario
    as a cleared draft context fed every row of the history at 0..N-1 through the API; where a
    target-only restore left the draft behind, only the rounds that began behind may differ."""
    for sid in SCENARIOS:
        r = matrix[(sid, DEFINED)]
        reference = matrix[(sid, DEFINITION)]
        assert reference["status"] == "PASS" and reference["drafts"], (sid, reference.get("first_failure"))
        if sid in BEHIND:
            assert r["drift"] is not None and r["drift"]["behind_only"], (sid, r["drift"])
            continue
        assert r["drift"] is None, (sid, r["drift"])
        assert r["drafts"] == reference["drafts"], sid


def test_the_twin_is_not_the_definition_after_an_image(matrix):
    """The two references draft alike without an image and otherwise after one: the twin skips the
    image's rows and ropes at the target's compressed positions, the definition does neither."""
    assert matrix[("S8", REFERENCE)]["drafts"] == matrix[("S8", DEFINITION)]["drafts"] != []
    after_an_image = ("S2", "S3", "S4", "S5", "S11", "S13", "S15")
    assert all(matrix[(sid, REFERENCE)]["drafts"] != matrix[(sid, DEFINITION)]["drafts"] for sid in after_an_image)


def test_under_the_definition_a_legacy_draft_and_its_twin_draft_alike(matrix, model_set, tmp_path):
    """Sections [n_rot/2, 0, 0, 0] at positions {p, p, p, 0} rope as a plain draft at p: under 0007 the
    twin question disappears, round by round."""
    scenarios = ["S1", "S3", "S4", "S5", "S13"]
    config = server_config(DEFINED, DEFAULT_CONFIG)
    jobs = [ScenarioJob(sid, DEFINED, model_set, config, twin=True) for sid in scenarios]
    twins = run_matrix(jobs, parallel=2, work_dir=tmp_path)
    for sid in scenarios:
        twin = twins[(sid, f"{DEFINED}+twin")]
        assert twin["status"] == "PASS", (sid, twin.get("first_failure"))
        assert twin["drafts"] == matrix[(sid, DEFINED)]["drafts"] != [], sid


def _round(seq, pos0, tokens, call, behind=False):
    return {"seq": seq, "pos0": pos0, "tokens": tokens, "behind": behind, "generate_call": call}


def test_the_oracle_pairs_rounds_within_one_generate_call():
    """A behind round that accepts otherwise ends its generate() call a round sooner than the reference's;
    the next call's rounds still meet their counterparts (seed 111's schedule, in miniature)."""
    run = [_round(1, 7, [5, 5], 1, behind=True), _round(1, 9, [6], 1, behind=True), _round(1, 1, [68], 2)]
    reference = [_round(1, 7, [4, 4], 1), _round(1, 8, [4, 4], 1), _round(1, 9, [1], 1), _round(1, 1, [68], 2)]
    found = compare(run, reference)
    assert found is not None and found.behind_only and found.differing == 3 and found.total == 4, found
    # past the behind rounds, a differing round is a drift that no behind round excuses
    found = compare(run[:2] + [_round(1, 1, [67], 2)], reference)
    assert found is not None and not found.behind_only and found.differing == 4, found


def test_within_a_call_the_oracle_pairs_rounds_at_the_same_position():
    """A draft behind for one round (a legacy draft, realigned by the next process()) that accepted
    otherwise moves the call's later rounds: where both sides drafted at one position the drafts must
    agree, and a round at a position only one side reached is excused by the behind round before it."""
    run = [_round(0, 4, [9, 9], 1, behind=True), _round(0, 7, [3, 3], 1), _round(0, 10, [2], 1)]
    reference = [_round(0, 4, [8, 8], 1), _round(0, 5, [3, 3], 1), _round(0, 7, [3, 3], 1), _round(0, 10, [2], 1)]
    found = compare(run, reference)
    assert found is not None and found.behind_only and found.differing == 2, found
    # the same positions with other drafts: a drift, behind round or not
    found = compare(run[:2] + [_round(0, 10, [1], 1)], reference)
    assert found is not None and not found.behind_only and found.differing == 3, found
    # without a behind round, a round only one side drafted is a drift
    assert not compare(run[1:], reference[1:][1:] + [_round(0, 12, [2], 1)]).behind_only


@pytest.mark.slow
def test_the_real_model_path_takes_an_image_of_a_thousand_rows_on_three_sequences(variants, models, tmp_path):
    """repro's real-model path (--target, --draft, --mmproj, --image) on the tiny files and an 896 px
    image, a 32x32 grid of 1024 rows on one position, the size users send. S13's three sequences hold
    it (they had 256 cells each, whatever the context, and every column ERRORed), and the image
    scenarios keep their verdicts: baseline fails at the hole, the fix and the definition pass. S14's
    image is one row there too (it was the given file at its own size, so baseline failed S14)."""
    from pyllama_dflash.harness.tiny import image

    png = tmp_path / "large.png"
    png.write_bytes(image.png_bytes(image.rgb(896, 896, seed=896)))
    report = tmp_path / "repro.json"
    cmd = [sys.executable, "-m", "pyllama_dflash.harness.repro", "--no-build", "--scenarios", "S1,S13,S14"]
    cmd += ["--json", str(report)]
    cmd += ["--target", str(models.target), "--draft", str(models.draft), "--mmproj", str(models.mmproj)]
    proc = subprocess.run([*cmd, "--image", str(png)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (case,) = json.loads(report.read_text())["cases"]
    for sid, on_baseline in (("S1", "FAIL"), ("S13", "FAIL"), ("S14", "PASS")):
        statuses = {v: case["results"][sid][v]["status"] for v in ("baseline", TWIN_FIX, DEFINED)}
        assert statuses == {"baseline": on_baseline, TWIN_FIX: "PASS", DEFINED: "PASS"}, (sid, statuses)
    assert "pos 38" in proc.stdout  # the text after a 32x32 grid resumes 32 positions on: the hole's width
