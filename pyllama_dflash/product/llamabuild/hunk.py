"""The one reader of a unified diff's hunk: its header, and its lines checked against the header's counts.

Three readers need a hunk: the series (``patchset.parse_patch``, to apply it), a patch file kept byte
for byte (``develop.mailpatch``, to count what a file section adds and deletes) and the line mapping
between two versions of a patch (``develop.align``). Each reads the same grammar, so each goes through
:func:`read_hunk` and interprets the tagged lines its own way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import PatchError

HEADER_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_EOL = "\\"  # the tag of "\ No newline at end of file", which belongs to the line before it


@dataclass(frozen=True)
class RawHunk:
    header: str  # the @@ line, stripped
    old_start: int  # as the header writes it: 1-based, or the line before an empty old side
    n_old: int
    n_new: int
    lines: tuple[tuple[str, str], ...]  # (tag, body without its line end): " ", "-", "+" or NO_EOL
    end: int  # the index of the first line after the hunk


def read_hunk(lines: list[str], i: int, where: str) -> RawHunk:
    """The hunk whose header is ``lines[i]``. ``lines`` are without line ends, except that a final
    empty string (what ``split("\\n")`` leaves after the last newline) is not a line. ``where`` names
    the patch and file for the errors, which are PatchErrors."""
    m = HEADER_RE.match(lines[i])
    if not m:
        raise PatchError(f"{where}: malformed hunk header {lines[i].strip()!r}")
    header = lines[i].strip()
    n_old = int(m.group(2)) if m.group(2) is not None else 1
    n_new = int(m.group(4)) if m.group(4) is not None else 1
    tagged: list[tuple[str, str]] = []
    o = n = 0
    i += 1
    while o < n_old or n < n_new or (i < len(lines) and lines[i].startswith(NO_EOL)):
        if i >= len(lines) or (i == len(lines) - 1 and lines[i] == ""):
            raise PatchError(f"{where}: hunk {header} is truncated")
        line = lines[i]
        tag, body = (line[:1], line[1:]) if line else (" ", "")
        if tag not in (" ", "-", "+", NO_EOL):
            raise PatchError(f"{where}: unexpected line in hunk {header}: {line!r}")
        tagged.append((tag, body))
        o += tag in " -"
        n += tag in " +"
        i += 1
    if o != n_old or n != n_new:
        raise PatchError(f"{where}: hunk {header} line counts do not match its header")
    return RawHunk(header, int(m.group(1)), n_old, n_new, tuple(tagged), i)
