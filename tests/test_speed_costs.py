"""The speed model's measurements (bench sections ``batch``, ``round`` and ``speed``) on real builds: each
part of a speculative round is timed in a child of its own, the bench pair is the same file on every
machine, and it serves through llama-server. Timings are checked for what they are (one per round,
positive), never for a value."""

from __future__ import annotations

import hashlib

import pytest

from pyllama_dflash.harness.slotloop.models import tiny_models
from pyllama_dflash.harness.tiny import write_models
from pyllama_dflash.harness.tiny.bench_pair import BENCH_PAIR, BENCH_PAIR_TARGET_SHA256, weight_bytes
from pyllama_dflash.lab.bench.job import BatchCost, RoundCosts, measure


def test_a_rounds_parts_are_each_timed_once_per_round(variants):
    models = tiny_models()
    res = measure("baseline", RoundCosts(str(models.target), str(models.draft), rounds=3, prompt=16, n_ctx=256))
    assert sorted(res["seconds"]) == ["decode", "draft", "process", "verify"]
    assert all(len(t) == 3 and min(t) > 0 for t in res["seconds"].values())
    # the tiny DFlash draft's block is 4: every round drafts 3, and all of them are verified and kept
    assert res["drafted"] == [3, 3, 3]
    # as llama-server serves a hybrid target with a 3-token draft, and its plain decode without one
    assert res["n_rs_seq"] == {"drafting": 3, "plain": 0}
    assert res["weight_bytes"]["target"] == weight_bytes(models.target)


def test_a_round_without_rollback_snapshots_keeps_none_on_either_side(variants):
    models = tiny_models()
    task = RoundCosts(str(models.target), str(models.draft), rounds=2, prompt=16, n_ctx=256, rollback_snapshots=False)
    res = measure("baseline", task)
    assert res["n_rs_seq"] == {"drafting": 0, "plain": 0}
    assert res["drafted"] == [3, 3]


def test_every_batch_size_is_timed_in_every_round(variants):
    models = tiny_models()
    res = measure("baseline", BatchCost(str(models.target), sizes=(1, 4), rounds=2, prompt=16, n_ctx=256))
    assert {k: len(v) for k, v in res["seconds"].items()} == {"1": 2, "4": 2}


@pytest.mark.slow
def test_the_bench_pair_target_is_the_same_bytes_on_every_machine(tmp_path):
    """830 MB, written in seconds from its seed; compared with the sha256 recorded beside its config."""
    pair = write_models(tmp_path, config=BENCH_PAIR)
    digest = hashlib.sha256()
    with open(pair.target, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    assert digest.hexdigest() == BENCH_PAIR_TARGET_SHA256
    assert weight_bytes(pair.target) >= 8 * 32 * 2**20  # at least 8x a 32 MiB last-level cache


@pytest.mark.slow
def test_the_bench_writes_the_speed_models_sections_and_their_table(variants, tmp_path):
    """A smoke of ``bench --only batch,round`` (two rounds each): the record has both pairs' costs, and
    its table gives the break-even acceptance of each pair."""
    import json

    from pyllama_dflash.lab.bench.__main__ import main as bench_main
    from pyllama_dflash.lab.bench.report import markdown

    record = tmp_path / "bench.json"
    assert bench_main(["--only", "batch,round", "--rounds", "2", "--json", str(record)]) == 0
    r = json.loads(record.read_text())
    assert sorted(r["round"]["pairs"]) == ["bench pair", "bench pair, no rollback snapshots", "tiny"]
    assert sorted(r["batch"]["ratio"]) == ["2", "4", "8"]
    table = markdown(r)
    assert "tiny: tokens accepted per round where drafting breaks even" in table
    assert "bench pair: tokens accepted per round where drafting breaks even" in table
    assert "bench pair, no rollback snapshots: a round (draft, verify, process)" in table


@pytest.mark.slow
def test_the_speed_section_serves_the_bench_pair_with_and_without_the_draft_in_every_phase(variants):
    """A smoke of ``bench --only speed`` on one remedy and one conversation: the bench pair's 830 MB target
    through the ``definition`` variant's llama-server, beside one without the draft, answers every turn,
    and each phase gets its tokens/s and time-to-first-token ratios."""
    from pyllama_dflash.harness.slotloop.models import bench_pair_models
    from pyllama_dflash.lab.acceptance.chat import TURN_PHASES
    from pyllama_dflash.lab.acceptance.measure import columns
    from pyllama_dflash.lab.acceptance.served import measure_server
    from pyllama_dflash.lab.bench.__main__ import held_out_seeds

    cols = [c for c in columns() if c.variant == "definition" and c.mode == "variant"]
    result = measure_server(bench_pair_models(), held_out_seeds(1), cols, log=lambda _line: None)
    (entry,) = result["table"].values()
    assert entry["failed"] == []
    for phase in TURN_PHASES:
        assert entry["speed"][phase]["tok_s"] is not None, phase
        assert entry["speed"][phase]["ttft"]["ratio"] > 0, phase


def test_a_bench_pair_draft_is_found_in_the_record_by_its_sha256(tmp_path):
    import json

    from pyllama_dflash.lab.draftmodel.trained import bench_pair_draft_record

    draft, other = (hashlib.sha256(b).hexdigest() for b in (b"the trained weights", b"trained on another CPU"))
    record = tmp_path / "bench-pair.json"
    record.write_text(json.dumps({"files": {"dflash-bench-pair.gguf": {"sha256": draft, "command": "train"}}}))
    found = bench_pair_draft_record(draft, record)
    assert found["file"] == "dflash-bench-pair.gguf" and found["command"] == "train"
    assert bench_pair_draft_record(other, record) is None
    assert bench_pair_draft_record(draft, tmp_path / "absent.json") is None


def test_the_speed_model_is_set_beside_the_measured_ratio_per_column_and_phase():
    """(1 + a) / c with a = the served acceptance rate x n_max: rate 0.5 of 3 and c = 1.25 give 2.00."""
    from pyllama_dflash.lab.bench.report import model_against_measure

    ratio = {"ratio": 1.8, "ci95": [1.6, 2.0]}
    pair = {"drafted": 3, "round_over_decode": {"median": 1.25, "ci95": [1.0, 1.5]}}
    served = {
        "table": {
            "definition": {
                "phases": {"text": {"rate": 0.5, "ci95": [0.4, 0.6]}, "after image": {"rate": 0.1, "ci95": [0, 1]}},
                "speed": {"text": {"tok_s": ratio, "ttft": ratio}, "after image": {"tok_s": None, "ttft": None}},
            }
        }
    }
    rows = model_against_measure(served, pair).splitlines()
    assert rows[2:] == ["| definition | text | 1.50 [1.20, 1.80] | 2.00 [1.47, 2.80] | 1.80 [1.60, 2.00] |"]


@pytest.mark.slow
def test_the_speed_section_runs_the_bench_pair_through_the_library_with_and_without_the_draft(variants):
    """The library half of ``bench --only speed`` on one remedy and one conversation: the ``definition``
    variant's slot loop with the bench pair's draft and with none gives every phase its ratios, and the
    same replies both ways (drafting changes the speed, never the tokens)."""
    from pyllama_dflash.harness.slotloop.models import bench_pair_models
    from pyllama_dflash.lab.acceptance.chat import TURN_PHASES
    from pyllama_dflash.lab.acceptance.measure import columns
    from pyllama_dflash.lab.acceptance.timed import measure_library_speed
    from pyllama_dflash.lab.bench.__main__ import held_out_seeds

    cols = [c for c in columns() if c.variant == "definition" and c.mode == "variant"]
    result = measure_library_speed(bench_pair_models(), held_out_seeds(1), cols, log=lambda _line: None)
    (entry,) = result["table"].values()
    assert entry["failed"] == []
    drafted, plain = entry["turns"]["drafted"], entry["turns"]["plain"]
    assert [t["phase"] for t in drafted] == [t["phase"] for t in plain] == list(TURN_PHASES)
    assert [t["generated"] for t in drafted] == [t["generated"] for t in plain]
    assert all(t["drafted"] > 0 for t in drafted) and all(t["drafted"] == 0 for t in plain)
    for phase in TURN_PHASES:
        assert entry["speed"][phase]["tok_s"]["ratio"] > 0, phase
        assert entry["speed"][phase]["ttft"]["ratio"] > 0, phase
