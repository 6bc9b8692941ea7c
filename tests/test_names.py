"""One word per concept: a name retired from the code and docs stays retired.

Each entry is an old name, what it is called now, and the only places it may still stand (an alias
that still takes it and says its new name, or the test of that alias). No native code.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# old name (a regular expression) -> (its new name, the files that may still spell it)
RETIRED: dict[str, tuple[str, tuple[str, ...]]] = {
    r"--fix\b": (
        "--must-pass (repro, fuzz) or --variant (mutate)",
        ("pyllama_dflash/flags.py", "pyllama_dflash/lab/mutate/__main__.py", "tests/test_cli.py"),
    ),
    r"\bdefault_fix\b|\bfix_of\b|\bfix_problems\b": ("default_must_pass, must_pass_of, must_pass_problems", ()),
    r"\bfix variant\b": ("must-pass variant", ()),
    r"\bdraft_mrope\b|\bdraft_swa_mrope\b|--draft-mrope|-mrope\.gguf": (
        "the twin: ModelSet.twin, ModelSet.swa_twin, tiny --twin, NAME-twin.gguf",
        (),
    ),
    r"mtp-image-rows|mtp-feed-image-rows": ("mtp-fed-images (image rows name the draft's GGUF key alone)", ()),
    r"--image-rows\b": ("--trained-with-image-rows (the key, fuzz) or --rows-per-image (a size, bench)", ()),
    r"^FIX = |\bconftest import .*\bFIX\b": ("TWIN_FIX (the last variant of role twin)", ()),
    r"\bfrom conftest import\b": ("from series_variants import (conftest is pytest's to load)", ()),
    r"\b_living_children\b|self\._children\b": ("owners and dependents (owning.NativeHandle)", ()),
    r"\bfix_eagle3_runs\b": ("unmutated_eagle3_runs", ()),
    r"\bNO_HOLE\b": ("Scenario.hole and HOLE_SCENARIOS", ()),
    r"\bSEED_ROLE\b|\bFIX_ROLE\b|\bthe seed's\b": ("SHOWN_ROLE, TWIN_ROLE, the zero-fill", ()),
    r"\b(?:seed|fix)=Expect\b|\brole `(?:seed|fix)`": ("the roles shown and twin", ()),
    r"\b_reference\(": ("fresh_server_round, or the client's without_draft", ()),
    r"\b_kind\(|\b_expectation_key\b": ("Check.expect(judged, saves_draft)", ()),
    r"\b(?:SHOWN|TWIN|DEFINITION|AS_TRAINED|BASELINE)_ROLE\b|\bROLES\b": ("words.Role and words.Judged", ()),
    r"\bjudged_variant\b": ("judged_on, which returns a words.Judged", ()),
    r"\bslots=Expect\b": ("saving_draft= (a fix whose llama-server saves the draft)", ()),
}

SCANNED = ("pyllama_dflash", "tests", "docs", "README.md", ".github", ".ci", "patches/series")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", *SCANNED], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.splitlines() if not line.endswith((".json", ".svg", ".gguf"))]


@pytest.mark.parametrize("old", list(RETIRED))
def test_a_retired_name_does_not_come_back(old):
    new, allowed = RETIRED[old]
    pattern = re.compile(old)
    hits = []
    for path in _tracked():
        rel = path.relative_to(REPO).as_posix()
        if rel == "tests/test_names.py" or any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        hits += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not hits, f"{old} is now {new}:\n" + "\n".join(hits)


# the words of words.py's enums, and where a literal of one names something else (file prefix -> words)
WORDS_MODULE = "pyllama_dflash/words.py"
OTHER_MEANINGS = {
    # a variant name: b11434 unpatched, the series' last as-trained variant
    "pyllama_dflash/": {"baseline"},
    "pyllama_dflash/lab/vlm/serving_cli.py": {"as-trained"},
    # the acceptance columns' and modes' names: the draft served as its definition, or as it was trained
    "pyllama_dflash/lab/acceptance/": {"definition", "as-trained"},
    # the trained pair's acceptance columns, each named as the variant it runs on
    "pyllama_dflash/lab/vlm/library_paired.py": {"definition", "as-trained"},
    # a module's name: server/checks/definition.py
    "pyllama_dflash/harness/server/checks/__init__.py": {"definition"},
    # the draft kind's own enum (slotloop.models.DraftKind) and the tiny generator's file name part
    "pyllama_dflash/harness/slotloop/models.py": {"twin"},
    "pyllama_dflash/harness/tiny/__init__.py": {"twin"},
    # pytest's own words, read from its output
    "pyllama_dflash/lab/mutate/runner.py": {"ERROR"},
}


def _enum_words() -> set[str]:
    from pyllama_dflash.words import Judged, Role, Status

    return {w.value for enum in (Role, Judged, Status) for w in enum}


def test_a_role_or_status_is_spelled_through_its_enum():
    """A role, what a run is held to, or a status written as a string literal outside words.py is a
    second copy of the vocabulary: it is an enum member everywhere else."""
    words = _enum_words()
    hits = []
    for path in sorted((REPO / "pyllama_dflash").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == WORDS_MODULE:
            continue
        allowed = set().union(*(w for prefix, w in OTHER_MEANINGS.items() if rel.startswith(prefix)))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and node.value in words and node.value not in allowed:
                hits.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not hits, "spell these through words.Role, words.Judged or words.Status:\n" + "\n".join(hits)
