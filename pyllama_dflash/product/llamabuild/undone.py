"""The lines a patch of the series removes that an earlier patch of it added: what a series whose patches
undo each other shows, line by line.

Every line of every file the series touches carries the patch that added it (none for the pristine
tree's), as the patches apply in order; a patch's removed line is counted against the patch that added it.
A hunk's removed and added lines are told apart from its context by aligning its old and new sides.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .patchset import Patch, Series, apply_series, diff_files, each_hunk, parse_patch, split_lines


@dataclass(frozen=True)
class Undone:
    patch: str  # the patch that removes the line
    added_by: str  # the earlier patch that added it
    path: str
    line: str


def undone_lines(read: Callable[[str], str | None], patches: tuple[Patch, ...]) -> list[Undone]:
    """Every line one of ``patches`` removes that an earlier one added, in the order they apply.
    ``read(path)``: a pristine file's text, or None where the tree has no such file."""
    files: dict[str, tuple[list[str], list[str | None]]] = {}
    found: list[Undone] = []
    for patch in patches:
        for fp in patch.files:
            if fp.path not in files:
                lines = split_lines(read(fp.path) or "")
                files[fp.path] = (lines, [None] * len(lines))
            lines, owners = files[fp.path]
            for at, hunk in each_hunk(lines, fp, patch.name):
                old_owners = owners[at : at + len(hunk.old_lines)]
                new_owners: list[str | None] = []
                ops = difflib.SequenceMatcher(None, hunk.old_lines, hunk.new_lines, autojunk=False).get_opcodes()
                for tag, i1, i2, j1, j2 in ops:
                    if tag == "equal":
                        new_owners += old_owners[i1:i2]
                        continue
                    found += [
                        Undone(patch.name, owner, fp.path, hunk.old_lines[i])
                        for i, owner in zip(range(i1, i2), old_owners[i1:i2], strict=True)
                        if owner is not None and owner != patch.name
                    ]
                    new_owners += [patch.name] * (j2 - j1)
                lines[at : at + len(hunk.old_lines)] = hunk.new_lines
                owners[at : at + len(hunk.old_lines)] = new_owners
    return found


def by_pair(found: list[Undone]) -> Counter[tuple[str, str]]:
    """How many lines each patch removes of each earlier patch's: ``{(patch, added_by): n}``."""
    return Counter((u.patch, u.added_by) for u in found)


def fixes_undone(read: Callable[[str], str | None], series: Series) -> list[Undone]:
    """:func:`undone_lines` along the series' chain: the fix patches as they merge, each on the ones before
    it. A variant aside is not among them (see :func:`asides_undone`)."""
    return undone_lines(read, series.chain)


def asides_undone(read: Callable[[str], str | None], series: Series) -> list[Undone]:
    """What each variant aside removes of the patches it stands on: shown beside the fixes, never merged
    under them, so a fix patch never has to put its lines back."""
    found: list[Undone] = []
    for aside in (p for p in series.own if p.aside):
        found += [u for u in undone_lines(read, series.own_prefix(aside.variant)) if u.patch == aside.name]
    return found


def removed_between(read: Callable[[str], str | None], series: Series, since: str, until: str) -> list[Undone]:
    """The lines of ``since``'s patches that ``until``'s tree no longer has: its tree against ``since``'s
    as one diff, counted as :func:`undone_lines` counts a patch. However the patches between the two are
    split, together they remove at least these; a series whose fixes add and never remove needs
    ``until``'s tree itself to keep them."""
    before, after = series.own_prefix(since), series.own_prefix(until)
    if after[: len(before)] != before:
        raise ValueError(f"variant {until!r} does not carry {since!r}'s patches")
    old, new = apply_series(read, before), apply_series(read, after)
    text = diff_files(lambda path: old.get(path, read(path)), new)
    name = f"{since}..{until}"
    direct = Patch(name, until, "", parse_patch(text, name))
    return [u for u in undone_lines(read, (*before, direct)) if u.patch == name]
