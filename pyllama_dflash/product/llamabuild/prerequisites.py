"""Each patch with only the patches its header names: the series as upstream may take it, one at a time.

A patch's header names what it needs in one line before its diffstat, ``Prerequisites: none`` or
``Prerequisites: 0005, 0006`` (the numbers of earlier patches of the series). :func:`check` applies
every patch to the pristine tree with only those, in the series' order; :func:`alone_series` writes a
series folder whose one variant is that, for the builder to compile (``pyllama-dflash build --alone``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ...errors import PatchError
from ...words import Role
from .patchset import Patch, Series, apply_series

_LINE = re.compile(r"^Prerequisites: *(.*)$", re.M)
_NUMBER = re.compile(r"\b(\d{4})\b")
ALONE = "alone"  # the variant of a series folder written by alone_series


def named(series: Series, patch: Patch) -> tuple[Patch, ...]:
    """The earlier patches the header of ``patch`` names, in the series' order."""
    path = series.directory / patch.name
    header = path.read_text(encoding="utf-8").split("\n---\n", 1)[0]
    found = _LINE.findall(header)
    if len(found) != 1:
        raise PatchError(
            f"{path}: the header names no prerequisites (one line 'Prerequisites: none' or "
            f"'Prerequisites: 0005, 0006' before the diffstat)"
            if not found
            else f"{path}: the header has {len(found)} 'Prerequisites:' lines, not one"
        )
    text = found[0].strip()
    numbers = _NUMBER.findall(text)
    if not numbers and not text.lower().startswith("none"):
        raise PatchError(f"{path}: 'Prerequisites: {text}' names no patch number and does not say none")
    earlier = {p.name[:4]: p for p in series.patches[: series.patches.index(patch)]}
    unknown = [n for n in numbers if n not in earlier]
    if unknown:
        raise PatchError(f"{path}: prerequisites {', '.join(unknown)} are not earlier patches of {series.directory}")
    return tuple(p for p in series.patches if p.name[:4] in set(numbers))


def alone(series: Series, patch: Patch) -> tuple[Patch, ...]:
    """The patch after its named prerequisites: what upstream would apply to take it."""
    return (*named(series, patch), patch)


def check(series: Series, read: Callable[[str], str | None]) -> list[str]:
    """Every patch applied to the pristine tree (``read``) with only its named prerequisites; one
    problem per patch that does not apply or names none."""
    problems = []
    for patch in series.patches:
        try:
            apply_series(read, alone(series, patch))
        except PatchError as e:
            problems.append(f"{patch.name} with only its named prerequisites: {e}")
    return problems


def alone_series(series: Series, chain: tuple[Patch, ...], dest: Path) -> Path:
    """A series folder in dest whose one variant (:data:`ALONE`) is ``chain`` (:func:`alone`: a patch after
    its named prerequisites), and nothing else: no test patch of the series rides along unless named."""
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for p in chain:
        (dest / p.name).write_bytes((series.directory / p.name).read_bytes())
        lines.append(f"{p.name} {ALONE} {Role.TWIN}" if p is chain[-1] else f"{p.name} -")
    (dest / "series").write_text("\n".join(lines) + "\n")
    return dest
