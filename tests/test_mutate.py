"""Mutation testing of the harness (pyllama_dflash.lab.mutate): the mutants, and the opt-in full run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from series_variants import AS_TRAINED, DEFINED, FEEDS_MTP, REPO, TWIN_FIX

from pyllama_dflash.env import MUTATION_TEST_ENV, PATCHES_ENV
from pyllama_dflash.errors import ReferenceDied
from pyllama_dflash.harness.oracles.drift import judge
from pyllama_dflash.harness.scenarios.catalog import SIBLING_SCENARIOS
from pyllama_dflash.harness.slotloop import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.models import tiny_models
from pyllama_dflash.lab.mutate.__main__ import parser
from pyllama_dflash.lab.mutate.operators import line_mutations, mutants
from pyllama_dflash.lab.mutate.plan import MUTATED_ROLES
from pyllama_dflash.lab.mutate.report import markdown, merge, scored
from pyllama_dflash.lab.mutate.runner import (
    EQUIVALENT_FILE,
    KILLED,
    MUTATED_FILES,
    RULES_TESTS,
    SERVER_KILLERS,
    SIBLING_KILLERS,
    Outcome,
    _server_stage,
    load_equivalents,
    unmutated_eagle3_runs,
)
from pyllama_dflash.product.llamabuild.manifest import variants_root
from pyllama_dflash.product.llamabuild.patchset import (
    apply_series,
    load_series,
    tree_reader,
)
from pyllama_dflash.product.process.child import DID_NOT_RUN
from pyllama_dflash.product.process.shard import Shard, parse_shard
from pyllama_dflash.words import Role

PRISTINE = "int f(int a, int b) {\n    return a;\n}\n"
PATCHED = (
    "int f(int a, int b) {\n"
    "    // a comment is not code\n"
    "    if (a <= b + 1) {\n"
    '        LOG_ERR("%s: %d\\n",\n'
    "                __func__, a - b);\n"
    "        return false;\n"
    "    }\n"
    "    const int n = std::min<int>(a, b - a);\n"
    "    ok = ok && g(n);\n"
    "    return a;\n"
    "}\n"
)


def test_each_operator_makes_its_fault():
    made = dict.fromkeys(op for op, _ in line_mutations("    if (a <= b + 1) {"))
    assert list(made) == ["bound", "offset", "negate"]
    got = {new for _, new in line_mutations("    if (a <= b + 1) {")}
    assert {"    if (a < b + 1) {", "    if (a <= b) {", "    if (!(a <= b + 1)) {"} <= got
    assert ("drop", None) in list(line_mutations("    ok = ok && g(n);"))
    assert ("swap", "    ok = ok || g(n);") in list(line_mutations("    ok = ok && g(n);"))
    caps = {new for op, new in line_mutations("    const int n = std::min<int>(a, b - a);") if op == "cap"}
    assert caps == {"    const int n = a;", "    const int n = b - a;"}
    assert ("swap", "    const int n = std::max<int>(a, b - a);") in list(
        line_mutations("    const int n = std::min<int>(a, b - a);")
    )
    assert ("drop", "    if (false) {") in list(line_mutations("    if (!prepare(x, y)) {"))
    assert ("negate", "        return true;") in list(line_mutations("        return false;"))


def test_only_the_added_code_is_mutated_not_comments_or_log_calls():
    ms = mutants("f.cpp", PRISTINE, PATCHED)
    lines = {m.line for m in ms}
    assert lines == {3, 6, 8, 9}  # the if, the return in it, the min, the && line: not the log call (4, 5)
    assert len({m.id for m in ms}) == len(ms)
    assert {m.id for m in ms} == {m.id for m in mutants("f.cpp", PRISTINE, PATCHED)}  # stable


def test_equal_lines_in_equal_neighbourhoods_get_distinct_ids():
    """The ends of two functions alike (0007's two own-positions queries end so) mutate alike; each
    mutant keeps an id of its own."""
    body = "bool f(int a) {\n    if (a) {\n        return true;\n    }\n    return false;\n}\nint x;\n"
    patched = body + body.replace("f(", "g(")
    got = mutants("x.cpp", "", patched)
    ends = [m for m in got if m.original.strip() == "return false;" and m.operator == "negate"]
    assert len(ends) == 2 and ends[0].context.split("\0")[0] == ends[1].context.split("\0")[0]  # alike
    ids = [m.id for m in got]
    assert len(got) == 2 * len(mutants("x.cpp", "", body)) and len(set(ids)) == len(ids)


def test_an_equivalent_mutant_needs_its_reason(tmp_path):
    bad = tmp_path / "equivalent.json"
    bad.write_text(json.dumps({"bound-12345678": {"mutant": "x"}}))
    with pytest.raises(ValueError, match="needs a reason; missing for bound-12345678"):
        load_equivalents(bad)


def test_a_fix_that_serves_drafts_as_trained_meets_the_rules_of_both_semantics():
    """An as-trained fix (0008, 0009) is the twin's for unmarked DFlash drafts and the definition's for
    marked ones, EAGLE3 and MTP, so its mutants meet both files of rules. With the twin's alone, slice 1
    of the whole series' run left five survivors (docs/regression.md, "The whole series")."""
    assert set(RULES_TESTS) == set(MUTATED_ROLES)
    assert RULES_TESTS[Role.AS_TRAINED] == RULES_TESTS[Role.TWIN] + RULES_TESTS[Role.DEFINITION]
    assert all(rules.is_file() for files in RULES_TESTS.values() for rules in files)


def test_a_fix_that_serves_drafts_as_trained_meets_the_server_checks_with_marked_drafts_last(monkeypatch, tmp_path):
    """On an as-trained fix an unmarked DFlash draft keeps the target's positions, so the definition's branches for a
    draft with positions of its own are reached through llama-server only with a marked one: the family's
    checks run again with marked drafts, after every other (slice 5 of the whole series' run left
    offset-1c16dfdd, a refusal's row count, standing without them). The server checks are recorded here,
    not run: which checks run on which models, in which order, is what is tested."""
    import pyllama_dflash.harness.server as server

    calls: list[tuple[str, bool, str]] = []

    def record(manifest, models, *, checks, **_):
        (name,) = checks
        calls.append((name, models.image_rows, models.drafter))
        return {name: {"ok": not (models.image_rows and name == "restore_draft_runs_past")}}

    monkeypatch.setattr(server, "run_server_checks", record)
    models = tiny_models()
    family = [(n, False, "dflash") for n in SERVER_KILLERS]
    siblings = [(n, False, s) for s, n in SIBLING_KILLERS]
    out = Outcome("m", "f.cpp:1 m")
    _server_stage(out, None, models, tmp_path, tmp_path)
    assert calls == family + siblings and out.status != KILLED
    calls.clear()
    _server_stage(out, None, models, tmp_path, tmp_path, marked=True)
    upto = SERVER_KILLERS.index("restore_draft_runs_past") + 1
    assert calls == family + siblings + [(n, True, "dflash") for n in SERVER_KILLERS[:upto]]
    assert (out.status, out.killed_by) == (KILLED, "restore_draft_runs_past marked")


@pytest.mark.build
def test_the_equivalent_mutants_on_file_exist_in_the_fix(pristine):
    """Each equivalent names a mutant of a fix that mutate judges: the twin's (TWIN_FIX), the definition's, the
    one that serves each draft as trained (0008) or the one that feeds MTP the image (0009, whose libllama
    and common.cpp lines mutate takes too)."""
    series = load_series(REPO / "patches")
    ids: set[str] = set()
    for fix in (v for v in (TWIN_FIX, DEFINED, AS_TRAINED, FEEDS_MTP) if v):
        fixed = apply_series(tree_reader(pristine), series.prefix(fix))
        read = tree_reader(pristine)
        per_file = {rel: {m.id for m in mutants(rel, read(rel), fixed[rel])} for rel in MUTATED_FILES if rel in fixed}
        # 0007 (aside) replaces most of 0004's lines: the definition's libcommon has fewer (14); 0008 keeps
        # 0004's and adds the definition's beside them; both change two lines of the prompt cache's
        # (server-task.cpp)
        assert all(10 < len(per_file[rel]) < 300 for rel in MUTATED_FILES[:2]), (fix, per_file)
        assert all(of_file for of_file in per_file.values()), (fix, per_file)
        ids |= set().union(*per_file.values())
    equivalents = load_equivalents(EQUIVALENT_FILE)
    assert set(equivalents) <= ids, sorted(set(equivalents) - ids)


@pytest.mark.build
def test_one_mutant_is_killed_and_the_run_leaves_nothing_behind(variants, tmp_path):
    """The whole tool on one mutant C1 kills (the jump check's flag set false): its scratch series is
    built, tried and scored, and then neither its builds in the cache nor its scratch folder stay."""
    before = {p.name for p in variants_root().iterdir()}
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    report = tmp_path / "mutate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.lab.mutate", "--variant", TWIN_FIX, "--only", "negate-7b1a71bf"]
        + ["--json", str(report)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["counts"] == {"killed": 1} and data["killed_by"] == {"C1": 1}, data
    assert {p.name for p in variants_root().iterdir()} == before
    assert not list(tmp_path.glob("pyllama-dflash-mutate-*"))


@pytest.mark.build
def test_the_eagle3_stage_does_not_kill_the_fix_itself(variants, tmp_path):
    """Stage 4 judges EAGLE3's runs against the unmutated fix's: the fix run again must meet every one,
    status and drafts (every sibling scenario on the definition passes and drafts)."""
    first = unmutated_eagle3_runs(DEFINED, tiny_models(), DEFAULT_CONFIG, 2, tmp_path / "a")
    again = unmutated_eagle3_runs(DEFINED, tiny_models(), DEFAULT_CONFIG, 2, tmp_path / "b")
    assert {sid: first[sid]["status"] for sid in SIBLING_SCENARIOS} == dict.fromkeys(SIBLING_SCENARIOS, "PASS")
    assert all(first[sid]["rounds"] for sid in SIBLING_SCENARIOS)  # something to compare in each
    for sid in SIBLING_SCENARIOS:
        assert judge(again[sid], first[sid])["status"] == "PASS", (sid, again[sid].get("first_failure"))


def test_an_oracle_that_did_not_run_stops_the_run_instead_of_killing_every_mutant(tmp_path, monkeypatch):
    """A fix whose build is stale (its series changed since) does not load: its EAGLE3 rows are ERROR, and
    judged against them every mutant that runs would count as killed. The run stops instead, saying why."""
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    first = next(patches.glob("0001-*.patch"))
    first.write_text(first.read_text().replace("Subject: [PATCH] ", "Subject: [PATCH] changed: ", 1))
    monkeypatch.setenv(PATCHES_ENV, str(patches))
    with pytest.raises(ReferenceDied, match=r"EAGLE3's scenarios on the unmutated .* did not run .*VariantNotBuilt"):
        unmutated_eagle3_runs(FEEDS_MTP, tiny_models(), DEFAULT_CONFIG, 2, tmp_path / "work")


@pytest.mark.build
def test_the_trials_build_the_fix_before_its_oracle_runs_so_a_stale_cache_cannot_stop_them(tmp_path, monkeypatch):
    """The same stale cache as above (the series changed since the fix was built), met the way a run meets
    it: stage 4's oracle builds the fix from the series first, and its EAGLE3 rows run."""
    from pyllama_dflash.lab.mutate.trials import _unmutated_eagle3

    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    first = next(patches.glob("0001-*.patch"))
    first.write_text(first.read_text().replace("Subject: [PATCH] ", "Subject: [PATCH] rebuilt: ", 1))
    monkeypatch.setenv(PATCHES_ENV, str(patches))

    class Fix:
        variant = FEEDS_MTP

    rows = _unmutated_eagle3(Fix(), tiny_models(), 2, tmp_path / "work")
    assert rows and all(r["status"] not in DID_NOT_RUN for r in rows.values())


def test_a_shard_that_is_not_i_of_n_is_refused_naming_the_flag(capsys):
    for bad in ("0/3", "4/3", "1/0", "2-3", "two/3", ""):
        with pytest.raises(SystemExit):
            parser().parse_args(["--shard", bad])
        assert "argument --shard:" in capsys.readouterr().err, bad
    assert parser().parse_args(["--shard", "2/3"]).shard == Shard(2, 3)


@pytest.mark.build
def test_the_shards_partition_the_mutants_and_each_keeps_its_slice_whatever_else_changes(pristine):
    series = load_series(REPO / "patches")
    fixed = apply_series(tree_reader(pristine), series.prefix(TWIN_FIX))
    read = tree_reader(pristine)
    ids = [m.id for rel in MUTATED_FILES if rel in fixed for m in mutants(rel, read(rel), fixed[rel])]
    for n in (1, 2, 3, 5):
        slices = [set(Shard(i, n).by_key(ids, str)) for i in range(1, n + 1)]
        assert set().union(*slices) == set(ids) and sum(map(len, slices)) == len(ids), n  # all, each once
        assert all(slices) or len(ids) < n, n  # no empty slice on the real list
    # a mutant's slice follows from its id alone: with half the mutants gone and the rest reversed, none moves
    rest = ids[::2][::-1]
    assert set(Shard(2, 3).by_key(rest, str)) == set(Shard(2, 3).by_key(ids, str)) & set(rest)


def _mutate(*args: str, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pyllama_dflash.lab.mutate", "--variant", TWIN_FIX, *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.build
def test_the_merged_shards_score_as_the_whole_run(variants, tmp_path):
    """Two mutants of llama-server's lines, each killed by the first slot check and each in its own slice
    of two: the slices run apart and merged give the whole run's counts, killers and outcomes."""
    only = "negate-fd953078,bound-8b426d97"  # the magic's and version's check negated, the token binding's flipped
    assert [Shard(1, 2).holds(m) for m in only.split(",")] == [True, False]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    whole = _mutate("--only", only, "--json", str(tmp_path / "whole.json"), env=env)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    for i in (1, 2):
        part = _mutate("--only", only, "--shard", f"{i}/2", "--json", str(tmp_path / f"{i}.json"), env=env)
        assert part.returncode == 0 and "(slice " in part.stdout, part.stdout[-3000:] + part.stderr[-3000:]
    slices = [str(tmp_path / f"{i}.json") for i in (1, 2)]
    merged = _mutate("--merge", *slices, "--json", str(tmp_path / "merged.json"), env=env)
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("whole.json", "merged.json"))
    expected = (1.0, {"killed": 2}, {"slot_restore": 2})
    assert (b["score"], b["counts"], b["killed_by"]) == (a["score"], a["counts"], a["killed_by"]) == expected
    assert [(o["id"], o["status"], o["killed_by"]) for o in b["outcomes"]] == [
        (o["id"], o["status"], o["killed_by"]) for o in a["outcomes"]
    ]
    assert [s["shard"] for s in b["shards"]] == ["1/2", "2/2"] and "mutation score: 2/2" in merged.stdout
    assert b["date"] == a["date"] and b["llama_cpp"] == a["llama_cpp"]  # where and on what it was measured
    table = markdown(b)
    assert (
        "2 slices merged; score 2/2" in table and "| `tools/server/server-context.cpp` | 2 | 2 | 0 | 0 | 0 |" in table
    )
    alone = _mutate("--merge", slices[0], env=env)  # a slice is not the run
    assert alone.returncode == 2 and "slice 2/2 missing" in alone.stderr, alone.stderr
    other = json.loads(Path(slices[1]).read_text())  # slice 2 as if it ran on other patches
    other["selection"]["series_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    mixed = _mutate("--merge", slices[0], str(tmp_path / "other.json"), env=env)
    assert mixed.returncode == 2 and "ran on different patches" in mixed.stderr, mixed.stderr


def _report(outcomes: list[tuple[str, str]], shard: str | None, only: list[str] | None = None) -> dict:
    """A report of ``(id, status)`` outcomes as mutate --json writes it: a slice of the run of a and b, or an
    --only run."""
    selection = {"every": 1, "limit": None, "only": only, "mutants": only or ["a", "b"], "series_sha256": "5" * 64}
    rows = [
        {"id": i, "status": st, "killed_by": "check" if st == "killed" else None, "mutant": f"f.cpp:1 {i}"}
        for i, st in outcomes
    ]
    return scored(
        rows, files=["f.cpp"], variant=TWIN_FIX, selection=selection, shard=shard and parse_shard(shard), wall_s=10.0
    ) | {
        "date": "2026-12-05",
        "machine": {"cpus": 2, "machine": "x86_64", "python": "3.11.7", "simd": "AVX2", "load": [0.1, 0.1, 0.1]},
        "llama_cpp": {"release": "b11434", "commit": "0123456789", "backend": "cpu"},
    }


def test_a_rerun_of_a_survivor_replaces_its_outcome_in_the_merge():
    """A survivor tried again with --only after a check was added: its outcome is the rerun's, said so."""
    slices = [_report([("a", "killed")], "1/2"), _report([("b", "survived")], "2/2")]
    rerun = _report([("b", "killed")], None, only=["b"])
    merged = merge([*slices, rerun])
    assert merged["counts"] == {"killed": 2} and merged["score"] == 1.0 and merged["wall_s"] == 30.0
    assert merged["reruns"] == [{"mutants": ["b"], "wall_s": 10.0, "date": "2026-12-05"}]
    assert "`b` tried again with `--only`" in markdown(merged)
    assert merge(slices)["counts"] == {"killed": 1, "survived": 1}
    with pytest.raises(ValueError, match="rerun mutant c is not one the slices tried"):
        merge([*slices, _report([("c", "killed")], None, only=["c"])])
    with pytest.raises(ValueError, match="different patches"):
        other = _report([("b", "killed")], None, only=["b"])
        merge([*slices, other | {"selection": other["selection"] | {"series_sha256": "0" * 64}}])


def test_a_run_of_some_mutants_merges_with_a_rerun_of_its_survivor():
    """An --only run (the mutants of the lines a change touched) and a rerun of its survivor after a check
    was added: the first given is the run, the rerun replaces its outcome."""
    run = _report([("a", "killed"), ("b", "survived")], None, only=["a", "b"])
    merged = merge([run, _report([("b", "killed")], None, only=["b"])])
    assert merged["counts"] == {"killed": 2} and merged["reruns"][0]["mutants"] == ["b"]
    with pytest.raises(ValueError, match="rerun mutant c is not one the slices tried"):
        merge([run, _report([("c", "killed")], None, only=["c"])])


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.skipif(
    not os.environ.get(MUTATION_TEST_ENV), reason=f"opt-in: set {MUTATION_TEST_ENV}=1 (about two hours on 2 cores)"
)
def test_the_harness_kills_every_non_equivalent_mutant(variants, tmp_path):
    report = tmp_path / "mutate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.lab.mutate", "--variant", TWIN_FIX, "--json", str(report)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3 * 3600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    data = json.loads(Path(report).read_text())
    assert data["score"] == 1.0 and data["counts"].get("survived", 0) == 0
