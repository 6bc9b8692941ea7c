"""The pull requests of patches/pulls: their format, their sides, and each test failing on b11434 without
its fix and passing with it (``pyllama-dflash pulls``, real builds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_dflash.env import CPU_ENV
from pyllama_dflash.errors import PatchError
from pyllama_dflash.product.llamabuild.patchset import EVERY, load_series
from pyllama_dflash.product.llamabuild.pulls import load_pulls, with_fix, without
from pyllama_dflash.words import PullVerdict

REPO = Path(__file__).resolve().parent.parent
SERIES = load_series(REPO / "patches")


def _numbers(patches) -> list[str]:
    return [p.name[:4] for p in patches]


def test_every_fix_is_in_one_request_and_the_zero_fill_in_none():
    """A maintainer can take the series request by request: each patch that makes or carries a variant is
    the fix of exactly one request, save the zero-fill, shown beside the fixes and never proposed."""
    fixes = [p.name for pull in load_pulls(SERIES) for p in pull.fixes]
    assert sorted(fixes) == sorted(p.name for p in SERIES.own if not p.aside)
    assert all(test.variant == EVERY for pull in load_pulls(SERIES) for test in pull.tests)


def test_each_side_holds_the_prerequisites_and_the_test_and_then_the_fixes():
    pulls = {p.name: p for p in load_pulls(SERIES)}
    assert [_numbers(without(SERIES, pulls[n])) for n in ("eagle3-bridge", "dflash-after-image")] == [
        ["0002"],
        ["0006", "0010"],
    ]
    assert _numbers(with_fix(SERIES, pulls["dflash-after-image"])) == ["0004", "0006", "0010"]
    # the fixes go in the order a build applies them, the tests last: 0011 changes 0006's test, its prerequisite
    # and 0014 changes 0010's llama-server test
    assert _numbers(without(SERIES, pulls["as-trained"])) == ["0001", "0004", "0005", "0006", "0010", "0011", "0014"]
    assert _numbers(with_fix(SERIES, pulls["as-trained"])) == [
        *("0001", "0004", "0005", "0008"),
        *("0006", "0010", "0011", "0014"),
    ]
    assert pulls["eagle3-bridge"].test_names == ["test-speculative-eagle3-passes"]
    assert pulls["eagle3-bridge"].server_tests == []
    assert pulls["dflash-after-image"].test_names == ["test-speculative-dflash-image"]
    assert pulls["dflash-after-image"].server_tests == ["unit/test_speculative_dflash_image.py"]
    assert pulls["as-trained"].test_names == ["test-speculative-dflash-image"]  # new cases in 0006's test
    assert pulls["as-trained"].server_tests == ["unit/test_speculative_dflash_image.py"]  # and in 0010's
    assert pulls["mtp-fed-images"].test_names == ["test-speculative-mtp-image"]
    assert _numbers(without(SERIES, pulls["draft-in-slot-file"])) == ["0013"]
    assert _numbers(with_fix(SERIES, pulls["draft-in-slot-file"])) == ["0005", "0013"]
    assert pulls["draft-in-slot-file"].test_names == []
    assert pulls["draft-in-slot-file"].server_tests == ["unit/test_speculative_slot_restore.py"]
    # every request has a test upstream can run
    assert [name for name, pull in pulls.items() if not pull.tests] == []
    assert "0007" not in _numbers(with_fix(SERIES, pulls["as-trained"]))  # the definition stands aside


def _series_with_pulls(tmp_path: Path, pulls: str) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    for p in SERIES.patches:
        (folder / p.name).write_bytes((SERIES.directory / p.name).read_bytes())
    (folder / "series").write_bytes((SERIES.directory / "series").read_bytes())
    (folder / "pulls").write_text(pulls)
    return folder


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("eagle3-bridge 0001", "expected '<name> <fix patches> <test patches>'"),
        ("Eagle3 0001 0002", "expected '<name> <fix patches> <test patches>'"),
        ("eagle3-bridge 0001,0042 0002", "0042 is not a patch of"),
        ("zero-fill 0003 0006", "a fix is a patch that makes or carries a variant, and not one aside"),
        ("tests 0002 0006", "a fix is a patch that makes or carries a variant, and not one aside"),
        ("eagle3-bridge 0001 0004", "the test 0004-.* is not a '\\*' patch that brings or changes a test"),
        ("eagle3-bridge 0001 0002,0005", "the test 0005-.* is not a '\\*' patch that brings or changes a test"),
    ],
)
def test_a_bad_request_is_refused_naming_its_line(tmp_path, line, why):
    folder = _series_with_pulls(tmp_path, f"# a comment\n{line}\n")
    with pytest.raises(PatchError, match=f"pulls:2: {why}"):
        load_pulls(load_series(folder))


def test_a_series_without_a_pulls_file_is_named(tmp_path):
    folder = _series_with_pulls(tmp_path, "")
    (folder / "pulls").unlink()
    with pytest.raises(PatchError, match=r"pulls: no pulls file"):
        load_pulls(load_series(folder))


@pytest.mark.slow
@pytest.mark.build
def test_each_request_with_a_test_fails_on_b11434_and_passes_with_its_fix(variants, tmp_path):
    """The whole command on the project's requests: each test fails on b11434 with its fix's prerequisites
    and passes with the fix, built for real in the shared build folder; the requests without a test are
    listed as such."""
    record = tmp_path / "pulls.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.lab.pulls", "--json", str(record)],
        cwd=REPO,
        env={**os.environ, CPU_ENV: os.environ.get(CPU_ENV) or "native"},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    entries = {e["name"]: e for e in json.loads(record.read_text())["pulls"]}
    verdicts = {name: e["verdict"] for name, e in entries.items()}
    tested = {p.name for p in load_pulls(SERIES) if p.tests}
    assert {n for n, v in verdicts.items() if v == PullVerdict.PROVEN} == tested
    assert {n for n, v in verdicts.items() if v == PullVerdict.NO_TEST} == set(verdicts) - tested
    assert len(proc.stdout.splitlines()) == len(verdicts)
    # the server test is upstream's harness over each side's llama-server: b11434 answers the image with HTTP 500
    dflash = entries["dflash-after-image"]
    assert [c["ok"] for c in dflash["without"]["server"]["checks"]] == [True, False]
    assert "500" in dflash["without"]["server"]["first_failure"]
    # a slot restored on b11434 drafts from the other conversation's rows its draft still holds
    slots = entries["draft-in-slot-file"]
    assert [c["ok"] for c in slots["without"]["server"]["checks"]] == [False]
    assert [c["ok"] for c in slots["with"]["server"]["checks"]] == [True]
    # EAGLE3 after an image (0014's cases in 0010's file): the same 500 until each draft is served as trained
    trained = entries["as-trained"]
    assert "test_eagle3_draft_answers_as_without_it" in trained["without"]["server"]["first_failure"]
    assert "500" in trained["without"]["server"]["first_failure"]
    assert all(c["ok"] for c in trained["with"]["server"]["checks"])
