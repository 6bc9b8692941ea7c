"""The series' C++ regression tests (patches 0002 and 0006, changed by 0011 where 0008 is), built with every
variant and run by ctest, and 0009's test (patch 0012), built where 0009 is."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from series_variants import AS_TRAINED, DEFINED, FEEDS_MTP, REPO, TWIN_FIX, VARIANTS

from pyllama_dflash.harness.engine import ctest_row
from pyllama_dflash.harness.scenarios.catalog import expectations, meets
from pyllama_dflash.harness.slotloop.record import CRASH, DRIFT, ERROR, FAIL, PASS, TIE
from pyllama_dflash.product.llamabuild import BuildOptions, ctest
from pyllama_dflash.product.llamabuild.builder import stage
from pyllama_dflash.product.llamabuild.patchset import BASELINE, EVERY, load_series

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def row(variants) -> dict[str, dict]:
    return ctest_row.run_row(list(variants.values()))


def test_every_variant_baseline_included_carries_the_tests():
    series = load_series(REPO / "patches")
    # the C++ tests among the patches for every variant (0010 is a test of llama-server's kind)
    test_patches = [p for p in series.every if p.on is None and any(path.startswith("tests/") for path in p.touched)]
    every_tests = list(ctest.TESTS[:2])
    assert [ctest.source(t) in p.touched for p, t in zip(test_patches, every_tests, strict=True)] == [True, True]
    assert all(p.variant == EVERY for p in test_patches)
    feeds_mtp = VARIANTS[VARIANTS.index(FEEDS_MTP) :]
    for variant in VARIANTS:
        mtp_test = ["test-speculative-mtp-image"] if variant in feeds_mtp else []
        assert ctest.built_with(series, variant) == every_tests + mtp_test
        on_top = series.every_on(variant)
        assert series.prefix(variant)[-len(on_top) :] == on_top  # on top of the variant's own patches
        assert {p.name for p in test_patches} <= {p.name for p in on_top}


def test_the_test_of_serving_drafts_as_trained_is_applied_where_the_fix_is():
    """0011 runs 0006's cases with drafts marked as trained with image rows on every tree it reaches, and a
    tree without 0008 fails them by design: it is applied on as-trained and the variants that carry it, so
    the twin-judged variants' C1 keeps judging them as before."""
    series = load_series(REPO / "patches")
    marked = next(p for p in series.every if p.on is not None)
    assert (marked.name[:4], marked.on) == ("0011", AS_TRAINED)
    carrying = VARIANTS[VARIANTS.index(AS_TRAINED) :]
    assert [v for v in series.variants if marked in series.prefix(v)] == [v for v in carrying if v != DEFINED]


def eagle3_checks(r: dict) -> list[dict]:
    return [c for c in r["checks"] if c["test"] == "test-speculative-eagle3-passes"]


def test_the_eagle3_passes_test_fails_on_b11434_and_passes_on_every_variant_that_carries_0001(row):
    """Patch 0002's test: a prompt split into passes at every place drafts, to the bit, what the prompt in one
    pass drafts. b11434 decodes the bridged row with the next row's g, so every split fails there; 0001, which
    every variant after baseline carries, decodes it from a copy."""
    base = eagle3_checks(row[BASELINE])
    splits = [c for c in base if "in one pass" in c["check"]]
    assert len(splits) == 12 and not any(c["ok"] for c in splits)
    assert all(c["ok"] for c in base if c["check"].endswith(ctest_row.CALLS_CHECK))  # nothing fails, it drifts
    for variant in VARIANTS[1:]:
        checks = eagle3_checks(row[variant])
        assert len(checks) == 25 and all(c["ok"] for c in checks), (variant, [c for c in checks if not c["ok"]])


def test_the_mtp_image_test_passes_where_0009_is(row):
    """Patch 0012's test of 0009: a state row beside an embedding is read as the hidden state, to the bit; a batch, and
    common_batch as well, takes one state per entry it has, of the model's width; and MTP's memory after an image
    is, byte for byte, that of the head fed the same rows by hand."""
    checks = [c for c in row[FEEDS_MTP]["checks"] if c["test"] == "test-speculative-mtp-image"]
    assert {c["case"] for c in checks} == {"state-row", "state-api", "mtp-after-image"} and len(checks) == 17, checks
    assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert not any(c["test"] == "test-speculative-mtp-image" for c in row[DEFINED]["checks"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_meets_its_expectation_under_ctest(row, variant):
    r = row[variant]
    assert meets(expectations(variant)[ctest_row.ROW], r), (
        variant,
        r["status"],
        r["first_failure"],
        r["log_tail"],
    )
    assert r["test_s"] is not None and r["checks"]


def test_baseline_fails_on_the_legacy_drafts_calls_and_the_seeds_fill_drifts(row):
    base, seed = row[BASELINE], row["zero-fill"]
    assert base["status"] == FAIL and "legacy draft: every call succeeds" in base["first_failure"]
    assert "common_speculative_process" in base["first_failure"]
    # the zero-fill's rows: every call succeeds, but the drafts move once the image's positions are emptied
    assert seed["status"] == DRIFT
    assert all(c["ok"] for c in seed["checks"] if c["check"].endswith(ctest_row.CALLS_CHECK))
    assert "without anything at the image's positions" in seed["first_failure"]


def test_the_fix_drafts_on_text_only_what_baseline_drafts(row):
    assert row[TWIN_FIX]["status"] in (PASS, TIE)
    text_only = row[TWIN_FIX]["drafts"][ctest_row.TEXT_ONLY]
    assert text_only == row[BASELINE]["drafts"][ctest_row.TEXT_ONLY]
    assert sum(len(r) for r in text_only["legacy"]) > 20  # it drafted, round after round


def test_a_tie_under_the_fix_is_proven_by_the_tests_own_layout_replay(row):
    """Where the fix's legacy draft drafts otherwise than its twin (DFlash2 with images, measured), the test
    replays the twin with the fix's cell layout, and that replay drafts exactly what the legacy draft drafts."""
    ties = [c for c in row[TWIN_FIX]["checks"] if ctest_row.TIE_CHECK in c["check"]]
    assert all(c["ok"] for c in ties)
    if row[TWIN_FIX]["status"] == TIE:
        assert ties and ties[0]["case"] in row[TWIN_FIX]["first_failure"]


def test_the_definition_drafts_what_its_reference_drafts_in_every_case(row):
    """0007 defines COMMON_SPECULATIVE_OWN_POSITIONS in speculative.h, and the test built with it judges the
    definition against the definition reference (every row at 0..N-1, the block at N) in every case of every
    drafter, exactly, where the other variants keep the twin's image-positions check."""
    if DEFINED is None:
        pytest.skip("the series has no definition variant")
    checks = [c for c in row[DEFINED]["checks"] if c["test"] == "test-speculative-dflash-image"]
    cases = {c["case"] for c in checks}
    by_reference = [c for c in checks if "drafts what the definition reference drafts" in c["check"]]
    assert len(cases) == 6 and {c["case"] for c in by_reference} == cases and len(by_reference) == 2 * len(cases)
    assert all(c["ok"] for c in row[DEFINED]["checks"]) and row[DEFINED]["status"] == PASS
    assert sum(1 for c in checks if "keeps positions of its own" in c["check"]) == len(cases)
    assert not any("image's positions" in c["check"] for c in checks)
    for variant in (BASELINE, TWIN_FIX):
        assert not any("definition reference" in c["check"] for c in row[variant]["checks"])
        assert any("image's positions" in c["check"] for c in row[variant]["checks"])


@pytest.mark.parametrize("drafter", ["dflash2", "dspark"])
def test_the_other_drafters_fail_on_baseline_and_pass_under_the_fix(row, drafter):
    """DFlash2 and DSpark share DFlash's process() and its fill: the legacy draft of each fails after an
    image on baseline, and under the fix drafts what its reconverted twin drafts, text-only as on baseline."""
    checks = lambda variant, case: [c for c in row[variant]["checks"] if c["case"] == f"{drafter}-{case}"]
    assert checks(BASELINE, "text-only") and all(c["ok"] for c in checks(BASELINE, "text-only"))
    failed = [c["check"] for c in checks(BASELINE, "images") if not c["ok"]]
    assert "legacy draft: every call succeeds" in failed
    assert checks(TWIN_FIX, "images") and all(c["ok"] for c in checks(TWIN_FIX, "images"))
    fix, base = row[TWIN_FIX]["drafts"][f"{drafter}-text-only"], row[BASELINE]["drafts"][f"{drafter}-text-only"]
    assert fix == base and sum(len(r) for r in fix["legacy"]) > 10


def test_the_staged_tree_runs_the_tests_with_upstreams_ctest(variants):
    """By hand: after building a variant, its build folder is an upstream-style ctest tree."""
    if shutil.which("ctest") is None:
        pytest.fail("ctest not found on PATH (it comes with cmake, which the build needs)")
    outcomes = {}
    for variant in (BASELINE, TWIN_FIX):
        staged = stage(variant, BuildOptions(cpu="native", quiet=True))
        assert all(
            (staged.tree / ctest.source(t)).is_file() for t in ctest.built_with(load_series(REPO / "patches"), variant)
        )
        selected = f"^({'|'.join(ctest.TESTS)})$"
        cmd = ["ctest", "--test-dir", str(staged.ctest_dir), "-L", "main", "-R", selected, "--output-on-failure"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert "out of 2" in out.stdout, out.stdout[-2000:]
        outcomes[variant] = out.returncode
    assert outcomes[BASELINE] != 0 and outcomes[TWIN_FIX] == 0


def test_a_text_only_difference_from_baseline_is_drift():
    drafts = {"legacy": [["5", "6"], ["7"]], "reconverted": [["5", "6"], ["7"]]}
    moved = {"legacy": [["5", "6"], ["8"]], "reconverted": [["5", "6"], ["7"]]}
    row = {
        BASELINE: {"status": FAIL, "first_failure": "x", "drafts": {ctest_row.TEXT_ONLY: drafts}},
        "same": {"status": PASS, "first_failure": None, "drafts": {ctest_row.TEXT_ONLY: drafts}},
        "moved": {"status": PASS, "first_failure": None, "drafts": {ctest_row.TEXT_ONLY: moved}},
    }
    ctest_row.judge_text_only(row)
    assert row["same"]["status"] == PASS
    assert row["moved"]["status"] == DRIFT and "legacy draft drafts otherwise" in row["moved"]["first_failure"]


def test_ctests_words_for_a_signal_make_a_crash_and_silence_an_error():
    crashed = ctest_row._judge("text-only:\n  OK   x\n1/1 Test #1: t ....***Exception: SegFault  0.05 sec\n", 8)
    assert crashed["status"] == CRASH and crashed["signal"] == "SegFault"
    assert ctest_row._judge("nothing printed\n", 0)["status"] == ERROR
    hung = ctest_row._judge("1/1 Test #1: t ...***Timeout  60.01 sec\n", 8)
    assert hung["status"] == ERROR and "did not finish" in hung["first_failure"]
    assert ctest_row._judge("images:\n  OK   a\n", 1)["status"] == ERROR  # checks passed, ctest did not
