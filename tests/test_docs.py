"""The docs say what the code has: the scenarios (docs/scenarios.md), the commands
(docs/architecture.md) and the pytest markers (docs/regression.md). Reads text only; no native code.

Each test reads the page as a person would: the number in the prose and the names it lists, both
held to the code's own list (the scenario catalogue, ``cli.TOOLS``, pyproject's markers).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pyllama_dflash import cli
from pyllama_dflash.harness.scenarios.catalog import SCENARIOS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
NUMBERS += "seventeen eighteen nineteen twenty"
WORDS = {w: i for i, w in enumerate(NUMBERS.split())}


def _number(text: str) -> int:
    return int(text) if text.isdigit() else WORDS[text.lower()]


def _section(page: Path, heading: str) -> str:
    """The text under ``heading`` (a Markdown heading line), up to the next heading of its level or above."""
    text = page.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(rf"\n#{{1,{len(level)}}} ", text[start:])]
    return text[start : start + ends[0]] if ends else text[start:]


def test_scenarios_md_counts_and_lists_every_scenario():
    text = (DOCS / "scenarios.md").read_text()
    table = re.findall(r"^\| (S\d+) \|", _section(DOCS / "scenarios.md", "## The scenarios"), re.M)
    assert table == list(SCENARIOS), "the table of 'The scenarios' lists the catalogue's scenarios, in order"
    counts = [_number(m) for m in re.findall(rf"\b(\d+|{'|'.join(WORDS)}) scenarios\b", text, re.I)]
    assert counts, "docs/scenarios.md says how many scenarios there are"
    assert set(counts) == {len(SCENARIOS)}, f"docs/scenarios.md counts {counts}; the catalogue has {len(SCENARIOS)}"


def test_architecture_md_names_every_command():
    section = _section(DOCS / "architecture.md", "## The command")
    listing = re.search(r"a subcommand per tool:(.*?)\(", section, re.S)
    assert listing, "'The command' lists the subcommands ('a subcommand per tool: ...')"
    named = re.findall(r"`([a-z][a-z-]*)`", listing.group(1))
    assert sorted(named) == sorted(cli.TOOLS), f"docs/architecture.md names {named}; cli.TOOLS has {list(cli.TOOLS)}"


def _pyproject_markers() -> list[str]:
    """The markers pyproject.toml declares for pytest (``"name: what it marks"``, one a line)."""
    block = re.search(r"^markers = \[\n(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.M | re.S)
    assert block, "pyproject.toml declares pytest markers"
    return re.findall(r'^\s*"([a-z]+):', block.group(1), re.M)


def test_regression_md_counts_and_lists_every_marker():
    markers = _pyproject_markers()
    section = _section(DOCS / "regression.md", "## The test suite and CI")
    said = re.search(rf"\b(\d+|{'|'.join(WORDS)}) pytest markers\b", section, re.I)
    assert said, "'The test suite and CI' says how many pytest markers there are"
    bullets = re.search(r"(?:^- .*\n(?:  .*\n)*)+", section[said.end() :], re.M)
    assert bullets, "... and lists them, a bullet each"
    listed = re.findall(r"`([a-z]+)`", bullets.group(0))
    assert _number(said.group(1)) == len(markers), f"docs/regression.md says {said.group(1)}; pyproject has {markers}"
    assert sorted(listed) == sorted(markers), f"docs/regression.md lists {listed}; pyproject has {markers}"


def _layout_rows() -> list[tuple[list[Path], str]]:
    """docs/architecture.md's layout table: per row, the paths of its first cell (a bare name is beside
    the first path's) and the text of its second."""
    rows = []
    for line in _section(DOCS / "architecture.md", "## Layout").splitlines():
        if not line.startswith("| `"):
            continue
        first, what = line[2:].split(" | ", 1)
        names = re.findall(r"`([^`]+)`", first)
        paths = [REPO / names[0]]
        beside = paths[0] if paths[0].is_dir() else paths[0].parent
        paths += [REPO / n if (REPO / n).exists() else beside / n for n in names[1:]]
        rows.append((paths, what))
    return rows


def test_architecture_md_names_files_that_exist():
    """A module renamed or removed is renamed or removed in the layout too."""
    rows = _layout_rows()
    assert len(rows) > 20
    missing = [str(p.relative_to(REPO)) for paths, _ in rows for p in paths if not p.exists()]
    for paths, what in rows:
        folders = [p if p.is_dir() else p.parent for p in paths]
        for name in re.findall(r"`([A-Za-z_][\w/.-]*\.(?:py|json|h))`", what):
            if not ((REPO / name).exists() or any((f / name).exists() or any(f.rglob(name)) for f in folders)):
                missing.append(f"{name} (in the row of {paths[0].relative_to(REPO)})")
    assert missing == [], f"docs/architecture.md names what is not there: {missing}"


def test_architecture_md_has_a_row_for_every_package():
    named = {p for paths, _ in _layout_rows() for p in paths}
    packages = sorted(d for d in (REPO / "pyllama_dflash").iterdir() if (d / "__init__.py").is_file())
    assert [str(d.relative_to(REPO)) for d in packages if d not in named] == []


def test_api_md_and_the_api_docstring_show_the_same_example():
    import textwrap

    from pyllama_dflash.product import api

    block = re.search(r"```python\n(.*?)```", (DOCS / "api.md").read_text(), re.S)
    assert block, "docs/api.md shows the API in a python block"
    shown = textwrap.indent(block.group(1), "    ")
    assert shown in api.__doc__, "pyllama_dflash.product.api's docstring shows another example than docs/api.md"


def _tracked_package_files() -> list[Path]:
    """Every file git tracks under pyllama_dflash/: the modules, and the declarations, native sources and data
    beside them."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "pyllama_dflash"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files are tracked is unknown")
    return [REPO / rel for rel in out.split()]


def _layout_names() -> tuple[set[Path], set[Path]]:
    """The files and the folders docs/architecture.md's layout table names. A name in a row is looked up in
    the row's folder (its first path, or the folder of its first file), in each folder the row names, and
    from the top of the repository, so ``report.py`` in the row of ``repro/`` is repro/report.py alone."""
    files: set[Path] = set()
    folders: set[Path] = set()
    for line in _section(DOCS / "architecture.md", "## Layout").splitlines():
        if not line.startswith("| `"):
            continue
        tokens = [t.strip("/") for token in re.findall(r"`([^`]+)`", line) for t in re.split(r"[ ,]+", token) if t]
        first = REPO / tokens[0]
        bases = [first if first.is_dir() else first.parent]
        for _ in range(2):  # a folder named inside a folder the row names
            bases += [b / t for t in tokens for b in bases if (b / t).is_dir() and b / t not in bases]
        folders.update(REPO / t for t in tokens if (REPO / t).is_dir())
        folders.update(b for b in bases if b != REPO / "pyllama_dflash" or first.is_dir())
        files.update(p for t in tokens for p in [REPO / t, *(b / t for b in bases)] if p.is_file())
    return files, folders


def test_architecture_md_names_every_file_of_the_package():
    """Every file of the package is named in the layout table, in the row of its folder (by its path from
    there), so that a new file gets a few words saying what it owns: the modules, and the files beside them
    (``bindings/decl/*.h``, the native sources, ``equivalent.json``). A package's __init__.py is its folder's."""
    files, folders = _layout_names()
    missing = [
        str(path.relative_to(REPO))
        for path in _tracked_package_files()
        if path not in files and not (path.name == "__init__.py" and path.parent in folders)
    ]
    assert missing == [], f"docs/architecture.md's layout table does not name {missing}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation but '-' dropped, spaces as '-'."""
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        in_code = in_code != line.startswith("```")
        if not in_code and (m := re.match(r"^#{1,6} (.*)$", line)):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return found


def test_every_link_to_a_section_finds_its_heading():
    """A renamed heading (a patch renumbered, say) breaks the links to it silently on GitHub."""
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            linked = (page.parent / target).resolve() if target else page
            if linked.suffix == ".md" and linked.is_file() and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor}")
    assert broken == []
