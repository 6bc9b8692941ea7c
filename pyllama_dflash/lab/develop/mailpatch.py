"""The series' patch files as text: the mail header, the message, the diffstat, the diff, the trailer.

A patch of ``patches/`` reads::

    From: pyllama-dflash <pyllama-dflash@users.noreply.invalid>
    Subject: [PATCH 1/2] speculative : fill the DFlash draft's position hole left by an image

    the body, one paragraph or more

    ---
     common/speculative.cpp | 42 ++++++++++++++++++++++++++++++++++++++++++
     1 file changed, 42 insertions(+)

    --- a/common/speculative.cpp
    +++ b/common/speculative.cpp
    @@ -986,6 +986,7 @@
    ...
    --
    pyllama-dflash

:func:`parse` splits a patch into those parts, keeping every byte, so that :meth:`MailPatch.render`
gives the file back unchanged and write-back can replace only the parts a commit changed. The
diff is one :class:`Section` per file, ``--- a/path`` / ``+++ b/path`` (``--- /dev/null`` for a
new file) and hunks without ``diff --git`` or ``index`` lines, as patchset.py reads them.
:func:`diffstat` writes a diffstat as ``git format-patch`` does (72 columns).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...errors import PatchError
from ...product.llamabuild.hunk import read_hunk

SEPARATOR = "---\n"
_HEADER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: ")
_PREFIX_RE = re.compile(r"^\[PATCH[^\]]*\] ?")
_ADDRESS_RE = re.compile(r"^(.*?)\s*<([^<>]*)>\s*$")
# git's extended header lines, which may come before a file's --- / +++ lines
_EXTENDED = (
    "diff ",
    "index ",
    "new file mode ",
    "deleted file mode ",
    "old mode ",
    "new mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
)


def lines_of(text: str) -> list[str]:
    """The lines of text, each with its "\\n" (the last one without, when the text does not end
    with one). Only "\\n" ends a line, unlike str.splitlines()."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


@dataclass(frozen=True)
class Section:
    """One file's part of the diff: its ---/+++ lines (and any git extended header) and hunks."""

    path: str
    text: str
    added: int
    deleted: int


@dataclass(frozen=True)
class MailPatch:
    headers: tuple[str, ...]  # raw header fields, each with its continuation lines and line ends
    lead: str  # the blank line(s) between the header and the body
    body: str  # the message body: its lines with their ends, no blank line first or last; "" if none
    gap: str  # the blank line(s) between the body and the "---" line
    separator: bool  # whether a "---" line ends the message (git format-patch's)
    stat: str  # what lies between the "---" line and the diff: the diffstat and its blank line
    sections: tuple[Section, ...]
    trailer: str  # what follows the last hunk: "-- \npyllama-dflash\n" or nothing

    def header(self, name: str) -> str | None:
        """A header field's value, its continuation lines unfolded; None when absent."""
        for raw in self.headers:
            if raw.lower().startswith(name.lower() + ":"):
                return " ".join(line.strip() for line in raw[len(name) + 1 :].split("\n") if line.strip())
        return None

    @property
    def prefix(self) -> str:
        """The "[PATCH n/m] " that starts the subject (kept as each file has it), or ""."""
        subject = self.header("Subject") or ""
        m = _PREFIX_RE.match(subject)
        return m.group(0) if m else ""

    @property
    def summary(self) -> str | None:
        """The subject without its [PATCH] prefix: the commit message's first line."""
        subject = self.header("Subject")
        return None if subject is None else subject[len(self.prefix) :]

    @property
    def author(self) -> tuple[str, str] | None:
        """(name, email) of the From: header, None when absent or not ``Name <email>``."""
        value = self.header("From")
        m = _ADDRESS_RE.match(value) if value else None
        return (m.group(1), m.group(2)) if m else None

    def message(self) -> str | None:
        """The commit message this patch becomes: the summary, a blank line, the body; None
        when the patch has no Subject: header."""
        if self.summary is None:
            return None
        return self.summary + "\n" + ("\n" + self.body if self.body else "")

    @property
    def diff(self) -> str:
        return "".join(s.text for s in self.sections)

    def render(self) -> str:
        return (
            "".join(self.headers)
            + self.lead
            + self.body
            + self.gap
            + (SEPARATOR if self.separator else "")
            + self.stat
            + self.diff
            + self.trailer
        )

    def with_message(self, message: str, author: tuple[str, str]) -> MailPatch:
        """This patch with the summary, body and author of a commit; the fields that did not
        change keep their bytes (a folded subject, a From: written otherwise)."""
        if self.summary is None:
            return self  # nowhere to write a message: the text before the diff stays as it is
        first, _, rest = message.partition("\n")
        summary = first.strip()
        body = rest.strip("\n")
        body = body + "\n" if body else ""
        headers = []
        for raw in self.headers:
            low = raw.lower()
            if low.startswith("subject:") and summary != self.summary:
                raw = f"Subject: {self.prefix}{summary}\n"
            elif low.startswith("from:") and self.author is not None and author != self.author:
                raw = f"From: {author[0]} <{author[1]}>\n"
            headers.append(raw)
        lead = self.lead if (self.lead or not body) else "\n"
        return replace(self, headers=tuple(headers), lead=lead, body=body)

    def with_sections(self, sections: list[Section]) -> MailPatch:
        """This patch with another diff; the diffstat is written anew only where the files or
        their counts of added and removed lines changed (and only if the patch has one)."""
        counts = [(s.path, s.added, s.deleted) for s in sections]
        stat = self.stat
        if self.stat.strip() and counts != [(s.path, s.added, s.deleted) for s in self.sections]:
            stat = diffstat(sections)
        return replace(self, sections=tuple(sections), stat=stat)


def parse(text: str, name: str) -> MailPatch:
    """Split a patch file into its parts; render() of the result gives text back, byte for byte."""
    lines = lines_of(text)
    start = next(
        (i for i in range(len(lines) - 1) if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")), None
    )
    if start is None:
        raise PatchError(f"{name}: no unified diff found")
    while start > 0 and lines[start - 1].startswith(_EXTENDED):
        start -= 1
    sections, end = split_sections(lines, start, name)
    before = lines[:start]
    seps = [i for i, line in enumerate(before) if line == SEPARATOR]
    if seps:
        message, stat = before[: seps[-1]], "".join(before[seps[-1] + 1 :])
    else:
        message, stat = before, ""
    headers: list[str] = []
    i = 0
    if message and message[0].startswith("From ") and not message[0].startswith("From:"):
        headers.append(message[0])  # an mbox "From <commit> <date>" line, as git format-patch writes
        i = 1
    while i < len(message) and _HEADER_RE.match(message[i]):
        field = message[i]
        i += 1
        while i < len(message) and message[i][:1] in (" ", "\t") and message[i].strip():
            field += message[i]
            i += 1
        headers.append(field)
    if not any(h.lower().startswith("subject:") for h in headers):
        # no mail header: the text before the diff is kept whole
        return MailPatch((), "", "".join(message), "", bool(seps), stat, tuple(sections), "".join(lines[end:]))
    region = "".join(message[i:])
    content = region.strip("\n")
    if not content:
        lead, body, gap = region, "", ""
    else:
        lead = region[: len(region) - len(region.lstrip("\n"))]
        body = content + "\n"
        gap = region[len(lead) + len(body) :]
    return MailPatch(tuple(headers), lead, body, gap, bool(seps), stat, tuple(sections), "".join(lines[end:]))


def split_sections(lines: list[str], i: int, name: str) -> tuple[list[Section], int]:
    """The file sections of a diff from line i on, and the index of the first line after them."""
    sections: list[Section] = []
    bare = [line[:-1] if line.endswith("\n") else line for line in lines]  # as read_hunk reads them
    while True:
        j = i
        while j < len(lines) and lines[j].startswith(_EXTENDED):
            j += 1
        if not (j + 1 < len(lines) and lines[j].startswith("--- ") and lines[j + 1].startswith("+++ ")):
            return sections, i
        old = lines[j][4:].rstrip("\n").split("\t")[0]
        new = lines[j + 1][4:].rstrip("\n").split("\t")[0]
        if new == "/dev/null":
            raise PatchError(f"{name}: deleting {old} is not supported by the series' patches")
        path = new[2:] if new.startswith("b/") else new
        begin, i = i, j + 2
        added = deleted = 0
        if not (i < len(lines) and lines[i].startswith("@@")):
            raise PatchError(f"{name}: {path}: no hunks")
        while i < len(lines) and lines[i].startswith("@@"):
            hunk = read_hunk(bare, i, f"{name}: {path}")
            added += sum(tag == "+" for tag, _ in hunk.lines)
            deleted += sum(tag == "-" for tag, _ in hunk.lines)
            i = hunk.end
        sections.append(Section(path, "".join(lines[begin:i]), added, deleted))


# ---- the diffstat, as git format-patch writes it ------------------------------------------------


def _scale(it: int, width: int, max_change: int) -> int:
    return 0 if not it else 1 + (it * (width - 1)) // max_change


def diffstat(sections: list[Section] | tuple[Section, ...], width: int = 72) -> str:
    """git's ``--stat=72`` (what git format-patch writes) for these sections, with its blank line."""
    if not sections:
        return " 0 files changed\n\n"
    max_len = max(len(s.path) for s in sections)
    max_change = max(s.added + s.deleted for s in sections)
    number_width = len(str(max_change))
    width = max(width, 16 + 6 + number_width)
    graph_width, name_width = max_change, max_len
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(width * 3 // 8 - number_width - 6, 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width
    out = []
    for s in sections:
        name, prefix, room = s.path, "", name_width
        if name_width < len(name):
            prefix, room = "...", max(name_width - 3, 0)
            name = name[len(name) - room :] if room else ""
            slash = name.find("/")
            if slash >= 0:
                name = name[slash:]
        add, delete = s.added, s.deleted
        if graph_width <= max_change:
            total = _scale(add + delete, graph_width, max_change)
            if total < 2 and add and delete:
                total = 2
            if add < delete:
                add = _scale(add, graph_width, max_change)
                delete = total - add
            else:
                delete = _scale(delete, graph_width, max_change)
                add = total - delete
        changes = s.added + s.deleted
        out.append(
            f" {prefix}{name}{' ' * max(room - len(name), 0)} | {changes:>{number_width}}"
            f"{' ' if changes else ''}{'+' * add}{'-' * delete}\n"
        )
    files, insertions, deletions = len(sections), sum(s.added for s in sections), sum(s.deleted for s in sections)
    summary = f" {files} file{'s' if files != 1 else ''} changed"
    if insertions or not deletions:
        summary += f", {insertions} insertion{'s' if insertions != 1 else ''}(+)"
    if deletions or not insertions:
        summary += f", {deletions} deletion{'s' if deletions != 1 else ''}(-)"
    return "".join(out) + summary + "\n\n"
