"""Building each mutant as a variant and trying the harness on it, cheapest check first.

A mutant becomes a series of its own in a scratch folder: one patch that takes the pristine
tree to the fix's files with the one line mutated (the fix's other files, such as 0005's
llama-server changes, as the fix has them), plus the series' EVERY patches (the C++ test). It
is built in the shared build folder, so only the mutated file recompiles. Then, stopping at the
first that notices:

1. the C++ test under ctest (row C1, a tenth of a second);
2. the scenario matrix of DFlash on the dense target, every run judged against the drift
   references, which are run once for all mutants (baseline with the reconverted twin, or drafting
   as the draft's definition has it for a ``definition`` fix), a drift proven a tie (the reference
   laid out as 0004 lays the draft out drafts the same) passing;
3. the same matrix for every other drafter of the family and target (tiny.drafters: the image
   scenarios on the MoE target), with their own references;
4. the EAGLE3 drafter's scenarios (repro --siblings'), each run against the same scenario on the
   unmutated fix, run once for all mutants: the same status, and where that is PASS the same drafts
   round for round. The library has no reference of EAGLE3's drafts (the definition reference is the
   DFlash family's), so the fix itself is the oracle here; through llama-server a fresh server is one
   (stage 6);
5. the fix's rules that no scenario reaches through mtmd (tests/test_patch_rules.py: a jump
   inside one batch, positions that go back; tests/test_definition_rules.py for a fix judged
   against the draft's definition; both for a fix that serves drafts as trained), run on the mutant as
   the series' fix;
6. EAGLE3's llama-server checks on the mutant's own llama-server (SIBLING_KILLERS), for what survived the
   rest: a slot restore, context checkpoints and a cached prefix reach libcommon's EAGLE3 state through
   llama-server only;
7. for a fix that feeds the MTP heads an image (0009), their oracle (oracles.mtp_heads: a chain of heads
   and an assistant after an image, on tiny Step 3.5 and Gemma 4 models); for a mutant of a model's graph
   (MODEL_FILES), right after C1;
8. optionally, a fixed-seed fuzz.

A mutant of the lines the fix adds to llama-server (``tools/server/server-context.cpp``, patches 0005 and
0007, and ``tools/server/server-task.cpp``, 0007's prompt-cache entries) is tried with the llama-server
checks of slot files and of image conversations instead (SERVER_KILLERS, on the mutant's own server; then
SIBLING_KILLERS, the MTP and EAGLE3 drafters', on their models; then, for a fix that serves drafts as
trained, SERVER_KILLERS again with DFlash drafts marked as trained with image rows, which alone reach its
branches for a DFlash draft with positions of its own): the C++ test and the matrix never run that code.

A mutant is *killed* when a row's status is not what the fix's expectations allow
(scenarios.catalog.expectations: a variant the table does not name is held to the fix's bar),
*stillborn* when it does not compile (not counted), *equivalent* when it survives and
equivalent.json says why no harness could tell it apart, and *survived* otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...env import PATCHES_ENV
from ...errors import BuildError, ReferenceDied
from ...harness.engine import ctest_row
from ...harness.engine.matrix import Job, case_name, prove_ties, run_cases, run_matrix
from ...harness.oracles import mtp_heads
from ...harness.oracles.drift import judge
from ...harness.oracles.references import REFERENCE, definition_config, reference_config
from ...harness.scenarios.catalog import SCENARIOS, SIBLING_SCENARIOS, expectations, meets
from ...harness.slotloop.config import server_config
from ...harness.slotloop.models import ModelSet, sibling_models, tiny_models
from ...harness.slotloop.record import DID_NOT_RUN, PASS
from ...harness.tiny import DRAFTERS, TARGET_KINDS
from ...paths import REPO_DIR
from ...product.llamabuild import BuildOptions, build, variant
from ...product.llamabuild.patchset import BASELINE, Series, diff_files, tree_reader
from ...product.llamabuild.variants import Variant
from ...words import Role, Status
from .operators import Mutant

VARIANT = "mutant"  # every mutant builds as this variant of its own series, one after another
EQUIVALENT_FILE = Path(__file__).with_name("equivalent.json")
# the rules no scenario reaches, per role of the fix (in a checkout; an installed package has no tests): a
# fix that serves drafts as trained keeps both, the twin's for unmarked DFlash drafts and the definition's
# for marked ones, EAGLE3 and MTP
_TWIN_RULES = REPO_DIR / "tests" / "test_patch_rules.py"
_DEFINITION_RULES = REPO_DIR / "tests" / "test_definition_rules.py"
RULES_TESTS = {
    Role.TWIN: (_TWIN_RULES,),
    Role.DEFINITION: (_DEFINITION_RULES,),
    Role.AS_TRAINED: (_TWIN_RULES, _DEFINITION_RULES),
}

PYTEST_FAILURES = ("FAILED", "ERROR")  # pytest's own words for a test that failed or errored, as it prints them
KILLED, SURVIVED, STILLBORN, EQUIVALENT = "killed", "survived", "stillborn", "equivalent"
# llama-server's files the series changes: its slots (0005, 0007) and its prompt cache's entries (0007)
SERVER_FILES = ("tools/server/server-context.cpp", "tools/server/server-task.cpp")
# the batch's state rows (0009): common_batch in libcommon, the batch and the graph's input in libllama
BATCH_STATE_FILES = ("common/common.cpp", "src/llama-batch.cpp", "src/llama-graph.cpp")
# model graphs 0009 changes (step35's MTP head reads an image's rows), judged by oracles.mtp_heads alone
MODEL_FILES = ("src/models/step35.cpp",)
# the files whose added lines are mutated: libcommon's drafters (patches 0001, 0003, 0004, 0007, 0008, 0009),
# llama-server's, and 0009's batch state rows; by default those of them the fix changes
MUTATED_FILES = ("common/speculative.cpp", *SERVER_FILES, *BATCH_STATE_FILES, *MODEL_FILES)
# the server checks that hold 0005's and 0007's promises: what kills a mutant of their lines
SERVER_KILLERS = (
    "slot_restore",
    "restore_drafts",
    "restore_no_draft_part",
    "restore_corrupt_draft_part",
    "restore_swapped_parts",
    "restore_swapped_parts_same_length",  # the binding compares the tokens, not only their count
    "restore_damaged_draft_part",
    "restore_draft_runs_past",
    "save_draft_part_unwritable",
    "save_target_part_unwritable",
    "save_draft_part_short_write",  # a failed write that created its file: the half-written part removed
    "save_target_part_short_write",
    "save_small_draft_part_short_write",  # a part the stream buffers whole: only the close can fail
    "restore_clears_without_draft_part",
    "save_without_draft_removes_stale_part",
    "restore_version_1_draft_part",  # the older format (no drafter state) still restores
    # 0007 trims by the row count where an image made it differ from the target's position: the checks
    # whose conversations hold an image (a prefix reused, the prompt cache, parallel slots)
    "exact_image",
    "two_turn",
    "alternating",
    "concurrent",
    # 0007's trims and restores judged by what the draft drafts: every round after an image, a second turn,
    # a cut-back cached prefix and rejected drafts against a fresh server's first round (the definition);
    # a slot restored with an image in it; a speculative checkpoint restored after an image
    "drafts_vs_definition",
    "restore_image_drafts",
    "spec_checkpoint_image",
    # an idle slot saved to the prompt cache with its draft when another slot starts, and loaded back
    "idle_slot_cache_drafts",
)
# the sibling drafters' checks, on their own models (slotloop.models.sibling_models): 0007's lines for a
# draft without positions of its own (the else-branches of slot_draft_load and server_draft_pos) are
# reached by MTP's only, and its count of the text rows (server_draft_pos, for EAGLE3) by EAGLE3's only
SIBLING_KILLERS = (
    ("mtp", "mtp_image_turns"),
    ("mtp", "mtp_drafts_vs_fresh"),
    ("mtp", "restore_draft_runs_past"),  # 0007's refusal of a draft part past its target, for MTP's draft
    ("eagle3", "eagle3_image_turns"),
    ("eagle3", "eagle3_drafts_vs_fresh"),  # its trims judged by what it drafts, as drafts_vs_definition judges
    ("eagle3", "eagle3_prompt_split"),  # its bridge decoded from a copy of the row's g
    ("eagle3", "eagle3_slot_restore_drafts"),  # its pending row forgotten by a slot restore
    ("eagle3", "eagle3_prompt_cache_drafts"),  # and by a prompt-cache load
    ("eagle3", "eagle3_restore_drafts"),  # its pending row carried by a slot file's draft part, text only
    ("eagle3", "eagle3_restore_image_drafts"),  # and after an image
    ("eagle3", "eagle3_prompt_cache_image_drafts"),  # and by a prompt-cache entry
)


@dataclass
class Outcome:
    id: str
    mutant: str  # Mutant.describe()
    status: str = SURVIVED
    killed_by: str | None = None  # C1, a scenario id, or "fuzz"
    detail: str | None = None
    build_s: float = 0.0
    judge_s: float = 0.0
    rows: dict = field(default_factory=dict)  # row -> status, for every row run

    def to_json(self) -> dict:
        return asdict(self)


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, dict]:
    """Mutant id -> {"mutant": what it changes, "reason": why no harness can tell it apart}."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    bad = [k for k, v in data.items() if not isinstance(v, dict) or not v.get("reason")]
    if bad:
        raise ValueError(f"{path}: every equivalent mutant needs a reason; missing for {', '.join(bad)}")
    return data


def write_series(
    mutant: Mutant,
    fixed: dict[str, str],
    series: Series,
    variant: str,
    pristine: Path,
    dest: Path,
    role: str = Role.TWIN,
) -> Path:
    """A series folder whose one variant is the fix with this mutant, judged as the fix ``variant`` is
    (``role``), with the tests the series applies on that fix; returns the folder."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    # a file the fix adds has no pristine version: the patch creates it
    diff = diff_files(tree_reader(pristine), {**fixed, mutant.path: mutant.text})
    header = f"Subject: [PATCH] mutant {mutant.id}\n\n{mutant.describe()}\n\n---\n"
    (dest / "0001-mutant.patch").write_text(header + diff, encoding="utf-8")
    lines = [f"0001-mutant.patch {VARIANT} {role}"]
    for patch in series.every_on(variant):
        shutil.copy2(series.directory / patch.name, dest / patch.name)
        lines.append(f"{patch.name} *")
    (dest / "series").write_text("\n".join(lines) + "\n")
    return dest


def references(models: ModelSet, config: dict, parallel: int, work: Path, role: str = Role.TWIN) -> dict[str, dict]:
    """The drift references, once for every mutant: each scenario on baseline with the twin, or, for a
    fix judged against the draft's definition, drafting as the definition has it."""
    if role == Role.DEFINITION:
        jobs = [Job(sid, BASELINE, models, definition_config(config), definition=True) for sid in SCENARIOS]
    else:
        jobs = [Job(sid, BASELINE, models, reference_config(config), twin=True) for sid in SCENARIOS]
    results = run_matrix(jobs, parallel, work / "references")
    return _ran({sid: results[(sid, jobs[0].column)] for sid in SCENARIOS}, "the drift references on baseline")


def unmutated_eagle3_runs(variant: str, models: ModelSet, config: dict, parallel: int, work: Path) -> dict[str, dict]:
    """The EAGLE3 drafter's scenarios on the unmutated fix, once for every mutant (stage 4's oracle)."""
    eagle3 = sibling_models("eagle3", models.target.parent)
    cases = [(eagle3, list(SIBLING_SCENARIOS))]
    table = run_cases(cases, [variant], config, parallel=parallel, drift=False, work_dir=work / "eagle3-fix")
    rows = {sid: row[variant] for sid, row in table[case_name(eagle3)].items()}
    return _ran(rows, f"EAGLE3's scenarios on the unmutated {variant}")


def _ran(rows: dict[str, dict], what: str) -> dict[str, dict]:
    """An oracle's rows, refused where one did not run: judged against it, every mutant would count as killed."""
    broken = [(sid, r) for sid, r in rows.items() if r["status"] in DID_NOT_RUN]
    if broken:
        (sid, r), n = broken[0], len(broken)
        raise ReferenceDied(f"{what} did not run ({n} of {len(rows)}; {sid}: {r['status']}, {r.get('first_failure')})")
    return rows


def try_mutant(
    mutant: Mutant,
    series_dir: Path,
    refs: Callable[[], dict[str, dict]],
    models: ModelSet,
    config: dict,
    *,
    parallel: int,
    work: Path,
    unmutated_eagle3: Callable[[], dict[str, dict]],
    fuzz_examples: int = 0,
    mtp_heads: bool = False,
) -> Outcome:
    """Build the mutant and try the harness on it, cheapest stage first (the module's docstring),
    stopping at the first stage that kills it; ``mtp_heads``: the fix feeds the MTP heads an image, and
    their oracle runs last."""
    out = Outcome(mutant.id, mutant.describe())
    manifest = _build(out, mutant, series_dir)
    if manifest is None:
        return out
    t1, built_s = time.monotonic(), out.build_s
    trial = _Trial(out, variant(VARIANT, series_dir))
    try:
        if mutant.path in SERVER_FILES:
            as_trained = trial.mutant_variant.role == Role.AS_TRAINED
            _server_stage(out, manifest, models, series_dir, work / mutant.id, marked=as_trained)
            return out
        # the test takes a tenth of a second; a mutant that loops forever is killed here, in a minute
        if trial.killed(ctest_row.ROW, ctest_row.run_ctest(manifest, timeout=60)):
            return out
        if mutant.path in MODEL_FILES and _mtp_heads_kill(out):
            return out
        if _matrix_kills(trial, refs, models, config, parallel, work / mutant.id):
            return out
        if _family_kills(trial, models, config, parallel, work / mutant.id / "family"):
            return out
        if _eagle3_kills(trial, unmutated_eagle3, models, config, parallel, work / mutant.id / "eagle3"):
            return out
        if _rules_kill(trial, series_dir):
            return out
        if _eagle3_server_kills(out, series_dir, models, work / mutant.id / "eagle3-server"):
            return out
        if mtp_heads and mutant.path not in MODEL_FILES and _mtp_heads_kill(out):  # a graph's ran after C1
            return out
        if fuzz_examples:
            _fuzz_stage(out, models, fuzz_examples, work / "fuzz")
        return out
    finally:
        out.judge_s = time.monotonic() - t1 - (out.build_s - built_s)  # a later stage's build is build time


def _build(out: Outcome, mutant: Mutant, series_dir: Path):
    """The mutant's build (its manifest), or None when it does not compile: ``out`` then says so."""
    os.environ[PATCHES_ENV] = str(series_dir)  # the children look the mutant's build up in its series
    # only a mutant of llama-server's lines needs the server from the start
    return _build_series(out, series_dir, server=mutant.path in SERVER_FILES)


def _build_series(out: Outcome, series_dir: Path, server: bool):
    """The mutant's series built (with llama-server or not): its manifest, or None when it does not
    compile or link, and ``out`` then says so; the time goes to ``out.build_s``."""
    t0 = time.monotonic()
    try:
        (manifest,) = build([VARIANT], BuildOptions(patches_dir=series_dir, quiet=True, cpu="native", server=server))
    except BuildError as e:
        out.status, out.detail = STILLBORN, _first_error(str(e))
        return None
    finally:
        out.build_s += time.monotonic() - t0
    return manifest


@dataclass
class _Trial:
    """A mutant's rows judged as the fix's expectations have them: the first row they do not allow kills it."""

    out: Outcome
    mutant_variant: Variant

    def killed(self, row: str, result: dict, drafter: str = "dflash", target: str = "dense") -> bool:
        out = self.out
        label = row if (drafter, target) == ("dflash", "dense") else f"{row} {drafter}/{target}"
        out.rows[label] = result["status"]
        if meets(expectations(self.mutant_variant, drafter=drafter, target=target)[row], result):
            return False
        out.status, out.killed_by = KILLED, label
        out.detail = f"{result['status']}: {result.get('first_failure')}"
        return True


def _matrix_kills(
    trial: _Trial, refs: Callable[[], dict[str, dict]], models: ModelSet, config: dict, parallel: int, work: Path
) -> bool:
    """Stage 2: the scenario matrix of DFlash on the dense target, judged against the drift references."""
    jobs = [Job(sid, VARIANT, models, server_config(VARIANT, config)) for sid in SCENARIOS]
    results = run_matrix(jobs, parallel, work)
    ref = refs()  # the drift references: computed once, by the first mutant that gets this far
    table = {sid: {VARIANT: judge(results[(sid, VARIANT)], ref[sid]), REFERENCE: ref[sid]} for sid in SCENARIOS}
    # the layout replay is 0004's: it proves no tie of the definition
    if not trial.mutant_variant.judged_as(models.image_rows).own_positions:
        prove_ties([(models, table)], [VARIANT], config, parallel, work)
    return any(trial.killed(sid, table[sid][VARIANT]) for sid in SCENARIOS)


def _family_kills(trial: _Trial, models: ModelSet, config: dict, parallel: int, work: Path) -> bool:
    """Stage 3: every other drafter and target of the family."""
    family = family_cases(models)
    tables = run_cases(family, [VARIANT], config, parallel=parallel, work_dir=work)
    return any(
        trial.killed(sid, tables[case_name(case_models)][sid][VARIANT], case_models.drafter, case_models.target_kind)
        for case_models, scenarios in family
        for sid in scenarios
    )


def _eagle3_kills(
    trial: _Trial,
    unmutated_eagle3: Callable[[], dict[str, dict]],
    models: ModelSet,
    config: dict,
    parallel: int,
    work: Path,
) -> bool:
    """Stage 4: the EAGLE3 drafter's scenarios against the unmutated fix's (the module's docstring)."""
    eagle3 = sibling_models("eagle3", models.target.parent)
    table = run_cases(
        [(eagle3, list(SIBLING_SCENARIOS))], [VARIANT], config, parallel=parallel, drift=False, work_dir=work
    )
    unmutated = unmutated_eagle3()
    out = trial.out
    for sid in SIBLING_SCENARIOS:
        got = judge(
            table[case_name(eagle3)][sid][VARIANT], unmutated[sid]
        )  # DRIFT where the drafts differ from the unmutated fix's
        out.rows[f"{sid} eagle3"] = got["status"]
        if got["status"] != unmutated[sid]["status"]:
            out.status, out.killed_by = KILLED, f"{sid} eagle3"
            out.detail = f"{got['status']} where the fix is {unmutated[sid]['status']}: {got.get('first_failure')}"
            return True
    return False


def _eagle3_server_kills(out: Outcome, series_dir: Path, models: ModelSet, work: Path) -> bool:
    """Stage 6, for what survived the rest: EAGLE3's llama-server checks on the mutant's llama-server (a
    slot restore, context checkpoints and a cached prefix go through libcommon's set_state and bridge,
    which no library scenario reaches), built only now."""
    if getattr(models, "real", False):
        return False
    manifest = _build_series(out, series_dir, server=True)
    if manifest is None:  # a libcommon that built and ran, in a server that does not link: stillborn too
        return True
    eagle3 = tuple((s, name) for s, name in SIBLING_KILLERS if s == "eagle3")
    _server_stage(out, manifest, models, series_dir, work, siblings=eagle3, family=False)
    return out.status == KILLED


def _mtp_heads_kill(out: Outcome) -> bool:
    """The MTP heads' oracle (a chain and an assistant after an image): right after C1 for a mutant of a
    model's graph, last of all for libcommon's, whose MTP lines reach those heads too."""
    failure = mtp_heads.first_failure(mtp_heads.run(VARIANT))
    out.rows["mtp heads"] = PASS if failure is None else Status.FAIL
    if failure is not None:
        out.status, out.killed_by, out.detail = KILLED, "mtp heads", failure
    return failure is not None


def _rules_kill(trial: _Trial, series_dir: Path) -> bool:
    """Stage 5: the fix's rules that no scenario reaches, when the checkout has their tests."""
    rules_tests = [t for t in RULES_TESTS[trial.mutant_variant.role] if t.is_file()]
    if not rules_tests:
        return False
    rules = _rules(series_dir, rules_tests)
    out = trial.out
    out.rows["rules"] = PASS if rules is None else Status.FAIL
    if rules is None:
        return False
    out.status, out.killed_by, out.detail = KILLED, "rules", rules
    return True


def _fuzz_stage(out: Outcome, models: ModelSet, examples: int, work: Path) -> None:
    """Stage 7, optional: a fixed-seed fuzz of the mutant."""
    from pyllama_dflash.harness.engine.schedule_runner import search_variants

    r = search_variants([VARIANT], models, examples=examples, parallel=1, work_dir=work)[VARIANT]
    if "runs" not in r:  # the child itself failed: a crash the fuzzer's child did not survive
        out.rows["fuzz"] = r.get("status")
        out.status, out.killed_by, out.detail = KILLED, "fuzz", f"{r.get('status')}: {r.get('first_failure')}"
    elif r["failures"]:
        first = r["failures"][0]
        out.rows["fuzz"] = first["kind"]
        out.status, out.killed_by = KILLED, "fuzz"
        out.detail = f"{first['kind']} at run {r['first_failure_run'].get(first['kind'])}: {first['message']}"
    else:
        out.rows["fuzz"] = PASS


def _server_stage(
    out: Outcome,
    manifest,
    models: ModelSet,
    series_dir: Path,
    work: Path,
    *,
    siblings: tuple[tuple[str, str], ...] = SIBLING_KILLERS,
    family: bool = True,
    marked: bool = False,
) -> None:
    """0005's and 0007's mutants: the slot and image checks on the mutant's llama-server (``family``), then
    the sibling drafters' (``siblings``), then for a fix that serves drafts as trained (``marked``) the
    family's again with drafts marked as trained with image rows (``<check> marked``: the definition's branches for a
    DFlash draft with positions of its own), in order, stopping at the first that notices. A check that
    errs (a server that died, say) notices too."""
    from pyllama_dflash.harness.server import run_server_checks

    killers = [(name, name, models) for name in SERVER_KILLERS] if family else []
    if not getattr(models, "real", False):
        killers += [(name, name, sibling_models(s, models.target.parent)) for s, name in siblings]
        if family and marked:
            as_trained = tiny_models(models.target.parent, image_rows=True)
            killers += [(f"{name} marked", name, as_trained) for name in SERVER_KILLERS]
    for row, name, m in killers:
        folder = work if row == name else work / "marked"
        r = run_server_checks(manifest, m, checks=[name], work_dir=folder, patches_dir=series_dir)[name]
        out.rows[row] = Status.PASS if r["ok"] else Status.FAIL
        if not r["ok"]:
            out.status, out.killed_by = KILLED, row
            out.detail = f"{r.get('error') or r.get('status')} (expected {r.get('expected')})"
            return


def family_cases(models: ModelSet) -> list[tuple[ModelSet, list[str]]]:
    """Every drafter and target but DFlash on the dense target (stage 2), with the scenarios each runs."""
    out = models.target.parent
    image = [sid for sid, sc in SCENARIOS.items() if sc.image]
    return [
        (tiny_models(out, drafter=d, target=t), list(SCENARIOS) if t == "dense" else image)
        for t in TARGET_KINDS
        for d in DRAFTERS
        if (d, t) != ("dflash", "dense")
    ]


def _rules(series_dir: Path, tests: list[Path]) -> str | None:
    """Run the rules tests with the mutant as the fix; None when they pass, else the first failure.
    The one test about full's documented tie is not a rule of any fix and is left out."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *map(str, tests), "-k", "not tie"],
        cwd=REPO_DIR,
        env={**os.environ, PATCHES_ENV: str(series_dir)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode == 0:
        return None
    failed = [line for line in proc.stdout.splitlines() if line.startswith(PYTEST_FAILURES)]
    return failed[0] if failed else f"pytest exited {proc.returncode}: {proc.stdout[-300:]}"


def _first_error(message: str) -> str:
    for line in message.splitlines():
        if "error:" in line:
            return line.strip()[:200]
    return message.splitlines()[0][:200]
