"""A patch's diff carried over an edit: which lines of a file before a patch are which lines after it.

An :data:`Alignment` maps each line of ``a`` to the index of the same line in ``b`` (equal text,
line end included), or None for a removed line; the mapped indexes increase. A patch's hunks
give one (:func:`from_hunks`); :func:`compose` chains them; :func:`unified` writes the hunks of
one, as diff -u, git diff and difflib write them (3 lines of context, ``@@ -s,n +s,n @@``, a
count of 1 left out, ``\\ No newline at end of file`` after a last line without one).

write-back uses them when a commit changed a file its patch already changed: the patch's own
alignment, composed with an alignment of the file before the edit and after it, keeps every hunk
the edit did not reach as it was, whatever tool first wrote the patch (the series' patches come
from diff -u, git diff and difflib, which place a change among equal lines each its own way).
"""

from __future__ import annotations

import difflib

from ...errors import PatchError
from ...product.llamabuild.hunk import HEADER_RE, NO_EOL, read_hunk

Alignment = list[int | None]

_NO_EOL = "\\ No newline at end of file\n"


def between(a: list[str], b: list[str]) -> Alignment:
    """An alignment of a with b (difflib's longest matching blocks)."""
    m: Alignment = [None] * len(a)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for i, j, n in matcher.get_matching_blocks():
        for k in range(n):
            m[i + k] = j + k
    return m


def compose(ab: Alignment, bc: Alignment) -> Alignment:
    return [None if j is None else bc[j] for j in ab]


def from_hunks(section: str, a: list[str], name: str) -> tuple[list[str], Alignment]:
    """The lines after a file section's hunks, applied to a, and the alignment of a with them.

    A hunk is looked for at its stated line first, then further and further away (as the build
    applies it); PatchError where one is not found.
    """
    hunks = _hunks(section, name)
    b: list[str] = []
    m: Alignment = [None] * len(a)
    i = 0
    for start, tagged in hunks:
        old = [text for tag, text in tagged if tag != "+"]
        at = _find(a, old, start, i)
        if at is None:
            raise PatchError(f"{name}: a hunk at line {start + 1} does not apply")
        for k in range(i, at):
            m[k] = len(b)
            b.append(a[k])
        i = at
        for tag, text in tagged:
            if tag == " ":
                m[i] = len(b)
                b.append(text)
                i += 1
            elif tag == "-":
                i += 1
            else:
                b.append(text)
    for k in range(i, len(a)):
        m[k] = len(b)
        b.append(a[k])
    return b, m


def _hunks(section: str, name: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """(0-based start in the old file, [(tag, line with its end)]) per hunk."""
    lines = section.split("\n")
    hunks = []
    k = 0
    while k < len(lines):
        if not HEADER_RE.match(lines[k]):
            k += 1
            continue
        hunk = read_hunk(lines, k, name)
        tagged: list[tuple[str, str]] = []
        for tag, text in hunk.lines:
            if tag != NO_EOL:
                tagged.append((tag, text + "\n"))
            elif tagged:  # the line before has no line end
                tagged[-1] = (tagged[-1][0], tagged[-1][1][:-1])
        hunks.append((hunk.old_start - 1 if hunk.n_old else hunk.old_start, tagged))
        k = hunk.end
    return hunks


def _find(a: list[str], needle: list[str], expected: int, lowest: int) -> int | None:
    n = len(needle)
    if n == 0:
        return min(max(expected, lowest), len(a))
    for offset in range(len(a) + 1):
        for at in (expected + offset, expected - offset) if offset else (expected,):
            if lowest <= at <= len(a) - n and a[at : at + n] == needle:
                return at
    return None


def refine(a: list[str], b: list[str], m: Alignment, a_touched: set[int], b_touched: set[int]) -> Alignment:
    """m, with lines matched anew between consecutive matched pairs where an edit touched a line
    (a_touched, b_touched): a line the edit made equal on both sides is not removed and added."""
    m = list(m)
    pairs = [(i, j) for i, j in enumerate(m) if j is not None]
    bounds = [(-1, -1), *pairs, (len(a), len(b))]
    for (i0, j0), (i1, j1) in zip(bounds, bounds[1:], strict=False):
        ai, bj = range(i0 + 1, i1), range(j0 + 1, j1)
        if not ai or not bj:
            continue
        if not (a_touched.intersection(ai) or b_touched.intersection(bj)):
            continue
        sub = between(a[i0 + 1 : i1], b[j0 + 1 : j1])
        for k, j in enumerate(sub):
            if j is not None:
                m[i0 + 1 + k] = j0 + 1 + j
    return m


def unified(a: list[str], b: list[str], m: Alignment, context: int = 3) -> str:
    """The hunks that turn a into b along m (the file's ---/+++ lines not included)."""
    ops: list[tuple[str, str]] = []
    a_pos: list[int] = []  # lines of a before each op
    b_pos: list[int] = []
    i = j = 0

    def emit(tag: str, text: str) -> None:
        a_pos.append(i)
        b_pos.append(j)
        ops.append((tag, text))

    for ai, bj in [(i_, j_) for i_, j_ in enumerate(m) if j_ is not None] + [(len(a), len(b))]:
        while i < ai:
            emit("-", a[i])
            i += 1
        while j < bj:
            emit("+", b[j])
            j += 1
        if ai < len(a):
            if a[ai] != b[bj]:
                raise ValueError(f"aligned lines differ: {a[ai]!r} / {b[bj]!r}")
            emit(" ", a[ai])
            i, j = ai + 1, bj + 1
    a_pos.append(i)
    b_pos.append(j)
    changes = [k for k, (tag, _) in enumerate(ops) if tag != " "]
    if not changes:
        return ""
    groups = []
    first = last = changes[0]
    for k in changes[1:]:
        if k - last - 1 > 2 * context:
            groups.append((first, last))
            first = k
        last = k
    groups.append((first, last))
    out = []
    for first, last in groups:
        lo, hi = max(first - context, 0), min(last + context, len(ops) - 1)
        old, new = _range(a_pos[lo], a_pos[hi + 1] - a_pos[lo]), _range(b_pos[lo], b_pos[hi + 1] - b_pos[lo])
        out.append(f"@@ -{old} +{new} @@\n")
        for tag, text in ops[lo : hi + 1]:
            out.append(tag + text if text.endswith("\n") else tag + text + "\n" + _NO_EOL)
    return "".join(out)


def _range(start: int, count: int) -> str:
    if count == 1:
        return str(start + 1)
    return f"{start if count == 0 else start + 1},{count}"
