"""Every table of measured figures in the docs is written by the command that measured it, from a
committed record (docs/figures/), and lives on one page. Reads text only; no native code.

A table edited by hand, a record rerun without its page, a figure copied onto a second page, or a new
table of figures with no record behind it fails here. The tables that hold no measurement (names,
options, what a file owns) are listed below, each with what it holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyllama_dflash import records

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RECORDS = sorted((REPO / "docs" / "figures").glob("*.json"))

# the tables that hold no measured figure, by their header row: what each holds instead
DESCRIPTIVE = {
    "| word | meaning | in the code |": "the glossary",
    "| path | what it owns |": "the layout of the tree",
    "| pair | why it stays |": "the pairs duplicates reports, and why each stays",
    "| option | what it does |": "build options",
    "| patch | what it fixes | prerequisites |": "the patches and their prerequisites",
    "| survivor | what it does | killed by |": "mutants that survived a run and the check written for each",
    "| id | title | what it runs |": "the scenario catalogue",
    "| status | letter | meaning |": "the statuses of a run",
    "| kind | file | arch | what differs |": "the tiny targets",
    "| drafter | file | `--spec-type` | what it adds |": "the tiny drafters",
}


def _tables(page: Path) -> list[tuple[int, str]]:
    """The page's Markdown tables outside code blocks, each with its first line's number."""
    found, in_code, current, start = [], False, [], 0
    for n, line in enumerate([*page.read_text().splitlines(), ""], 1):
        in_code = in_code != line.startswith("```")
        if not in_code and line.startswith("|"):
            start = start or n
            current.append(line)
        elif current:
            found.append((start, "\n".join(current)))
            current, start = [], 0
    return found


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_each_record_is_on_exactly_one_page_as_its_command_writes_it(record):
    rendered = records.render(record).strip()
    homes = [p.relative_to(REPO) for p in PAGES if rendered in p.read_text()]
    assert len(homes) == 1, f"{record.name}: its command's --markdown is on {homes or 'no page'}; it must be on one"


def test_every_table_of_figures_is_a_committed_records_markdown():
    rendered = [records.render(r) for r in RECORDS]
    stray = [
        f"{page.relative_to(REPO)}:{line}"
        for page in PAGES
        for line, table in _tables(page)
        if table.splitlines()[0] not in DESCRIPTIVE and not any(table in text for text in rendered)
    ]
    assert stray == [], f"tables of figures no committed record writes (docs/figures/, records.py): {stray}"


def test_every_descriptive_table_is_still_in_the_docs():
    """A header listed above that no page has any more is a stale exception."""
    headers = {table.splitlines()[0] for page in PAGES for _, table in _tables(page)}
    assert sorted(set(DESCRIPTIVE) - headers) == []


def test_a_record_no_command_writes_is_refused_by_name(tmp_path):
    stray = tmp_path / "guesswork-1.json"
    stray.write_text("{}")
    with pytest.raises(ValueError, match="guesswork-1.json: no command writes records named guesswork"):
        records.render(stray)


@pytest.mark.parametrize("record", sorted((REPO / "docs" / "figures").glob("fuzz*.json")), ids=lambda p: p.name)
def test_fuzz_writes_the_committed_runs_table_from_its_json_alone(record, tmp_path, capsys):
    """``fuzz --merge RECORD --markdown FILE`` runs nothing and writes the page's table again, its exit status
    the record's verdict (a record whose must-pass variant did not run says NOT OK, and is kept as it is)."""
    from pyllama_dflash.harness.fuzz.__main__ import main as fuzz_main

    out = tmp_path / "fuzz.md"
    broken = json.loads(record.read_text())["broken"]
    assert fuzz_main(["--merge", str(record), "--markdown", str(out)]) == (1 if broken else 0)
    assert out.read_text() == records.render(record)


def test_the_heading_says_the_load_the_record_began_under_and_a_busy_machine_is_named(monkeypatch):
    from pyllama_dflash import figures

    record = {
        "date": "2026-12-04",
        "machine": {"cpus": 2, "machine": "x86_64", "python": "3.11.7", "simd": "AVX2", "load": [1.5, 1.0, 0.5]},
        "llama_cpp": {"release": "b11434", "commit": "0123456789", "backend": "cpu"},
    }
    assert "load average 1.50 at the start" in figures.heading(record)
    monkeypatch.setattr(figures.os, "getloadavg", lambda: (3.7, 2.0, 1.0))
    monkeypatch.setattr(figures.os, "cpu_count", lambda: 2)
    assert "load average 3.70" in figures.busy_warning()
    monkeypatch.setattr(figures.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert figures.busy_warning() is None


def test_the_matrix_tables_in_the_docs_name_the_series_variants():
    """The scenario tables (repro's, scenarios.md's record and the README's excerpt) name today's variants:
    a variant renamed or added in patches/series without the record run again fails here."""
    import json

    from pyllama_dflash.product.llamabuild.patchset import load_series

    variants = load_series(REPO / "patches").variants
    record = json.loads((REPO / "docs" / "figures" / "repro.json").read_text())
    assert record["variants"] == variants
    references = [c for c in record["columns"] if c not in variants]
    assert references and all(c.startswith("baseline+") for c in references)
    stale = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("scenario ") and " baseline " in line:
                named = line.split()[1:]
                if named != [*variants, *references]:
                    stale.append(f"{page.relative_to(REPO)}:{n}: {named}")
            elif line.startswith("each cell: baseline /"):
                named = line.removeprefix("each cell: ").split(";")[0].split(" / ")
                if named != [*variants, *references]:
                    stale.append(f"{page.relative_to(REPO)}:{n}: {named}")
    assert stale == [], "tables naming other variants than patches/series:\n" + "\n".join(stale)
