"""What ``pyllama-dflash pulls`` prints: a line per request as it is judged, and the record's table (its
``--markdown``, the one in docs/upstream.md)."""

from __future__ import annotations

import re
from pathlib import Path

from ...figures import heading, table
from ...words import PullVerdict

_SUBJECT = re.compile(r"^Subject: (?:\[PATCH[^\]]*\] ?)?(.*)$", re.M)


def subject(patch: Path) -> str:
    """The patch's subject line, without its ``[PATCH n/m]``: the pull request's title."""
    found = _SUBJECT.search(patch.read_text(encoding="utf-8"))
    return found.group(1).strip() if found else patch.name


PARTS = ("ctest", "server")  # a side's cells: its C++ tests, its tests of llama-server's kind


def cells(side: dict) -> list[dict]:
    """A side's cells, one per kind of test it ran; the side itself where it did not build."""
    return [side[part] for part in PARTS if part in side] or [side]


def _cell(cell: dict) -> str:
    checks = cell.get("checks") or []
    failed = sum(not c["ok"] for c in checks)
    counted = f", {failed} of {len(checks)} checks fail" if failed else f", {len(checks)} checks pass" if checks else ""
    return f"{cell['status']}{counted}"


def _side(side: dict | None) -> str:
    if side is None:
        return "-"
    return "; ".join(f"{part} {_cell(side[part])}" for part in PARTS if part in side) or _cell(side)


def line(entry: dict) -> str:
    """One request as the command prints it."""
    fixes = ", ".join(f[:4] for f in entry["fixes"])
    if entry["verdict"] == PullVerdict.NO_TEST:
        return f"{entry['name']} ({fixes}): {entry['verdict']}"
    tests = ", ".join(t[:4] for t in entry["test_patches"])
    return (
        f"{entry['name']} ({fixes}, tests {tests}): {entry['verdict']}: without the fix "
        f"{_side(entry['without'])}; with it {_side(entry['with'])}"
    )


def markdown(record: dict) -> str:
    """The record's heading, one row per request in merge order, and each request's title."""
    header = ["request", "fixes", "prerequisites", "tests", "b11434, prerequisites, tests", "and the fixes", "verdict"]
    rows = [
        [
            f"`{e['name']}`",
            ", ".join(f[:4] for f in e["fixes"]),
            ", ".join(e["prerequisites"]) or "none",
            ", ".join(t[:4] for t in e["test_patches"]) + f" ({', '.join(f'`{t}`' for t in e['tests'])})"
            if e["test_patches"]
            else "none yet",
            _side(e.get("without")),
            _side(e.get("with")),
            str(e["verdict"]),
        ]
        for e in record["pulls"]
    ]
    titles = [f"{i}. `{e['name']}`: " + "; ".join(e["subjects"]) for i, e in enumerate(record["pulls"], 1)]
    out = [heading(record), "", f"`{record['command']}`:", "", table(header, rows), "", *titles]
    return "\n".join(out) + "\n"
