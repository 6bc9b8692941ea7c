"""The scenario matrix on the tiny models, every variant: the table the fix is judged by.

Each (scenario, variant) runs in its own child process (see pyllama_dflash.repro.runner).
These tests never skip: a missing build is built by the ``variants`` fixture, and a build
failure fails them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_dflash.repro.runner import Job, run_matrix
from pyllama_dflash.scenarios.catalog import EXPECTED, SCENARIOS
from pyllama_dflash.scenarios.models import tiny_models

VARIANTS = ("baseline", "zero-fill", "full")


@pytest.fixture(scope="session")
def matrix(variants, tmp_path_factory) -> dict[tuple[str, str], dict]:
    assert set(VARIANTS) <= set(variants), f"built variants: {sorted(variants)}"
    models = tiny_models(tmp_path_factory.mktemp("tiny-models"))
    jobs = [Job(sid, v, models, {"n_batch": 16, "n_ubatch": 16}) for sid in SCENARIOS for v in VARIANTS]
    return run_matrix(jobs, parallel=2, work_dir=tmp_path_factory.mktemp("matrix"))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matrix_cell(matrix, scenario, variant):
    result = matrix[(scenario, variant)]
    expected = EXPECTED[variant][scenario]
    assert result["status"] in expected, (
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
        if r["status"] in ("PASS", "DEGRADED"):
            assert r["exact"] is True, f"{sid} {variant}"


def test_repro_cli_json_and_exit_status(variants, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.repro", "--no-build", "--scenarios", "S1,S8",
         "--expect-baseline-fail", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["variants"] == list(VARIANTS) and report["fix"] == "full" and report["ok"] is True
    assert report["llama_cpp"]["pinned"] is True
    assert report["results"]["S1"]["baseline"]["status"] == "FAIL"
    assert "Y = X + 1" in report["results"]["S1"]["baseline"]["first_failure"]
    assert isinstance(report["wall_s"], float)
    assert "S1   text, image, text" in proc.stdout


def test_repro_exits_non_zero_when_the_fix_is_baseline(variants):
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.repro", "--no-build", "--scenarios", "S1", "--fix", "baseline"],
        capture_output=True, text=True, timeout=600,
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
