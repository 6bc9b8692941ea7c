"""Mutants of the C++ lines a variant's patches add: one small, plausible fault each.

Only code lines the patches add are mutated (comments, blank lines, braces and log lines are
not: a mutated log message changes nothing the harness can observe, by design). Each operator
yields the whole file with one line changed or removed; mutants whose text is identical to
another's are kept once.

The operators:
- ``bound``: a comparison one off (``<`` and ``<=``, ``>`` and ``>=``), or ``== `` / ``!=`` swapped;
- ``offset``: a ``+ 1`` or ``- 1`` dropped;
- ``drop``: a statement (a line ending in ``;``) removed, or a checked call (``if (!f(...))``) with
  its check dropped (the call's result taken as success without calling it);
- ``negate``: an ``if`` condition negated, a ``return true`` / ``return false`` flipped, a ``true`` /
  ``false`` argument flipped;
- ``swap``: ``&&`` and ``||`` swapped, ``std::min`` and ``std::max`` swapped, the operands of a
  subtraction swapped;
- ``cap``: a cap or chunk size replaced (``std::min(a, b)`` by one operand, the draft's n_ubatch
  by its n_batch).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

_LOG = re.compile(r"\b(LOG_(ERR|WRN|INF|DBG)|SPC_(ERR|WRN|INF|DBG))\b")
_RELOPS = {" < ": " <= ", " <= ": " < ", " > ": " >= ", " >= ": " > ", " == ": " != ", " != ": " == "}
_IF = re.compile(r"^(\s*)(if|while) \((.*)\) \{$")
_SUB = re.compile(r"(?<![\w.\]>)])([A-Za-z_][\w.]*(?:\[[\w]+\])?) - ([A-Za-z_][\w.]*(?:\[[\w]+\])?)(?![\w(\[])")
_MIN = re.compile(r"std::(min|max)(<\w+>)?\(")
# a declaration (a type, then a name): removing it only makes a mutant that does not compile
_DECLARATION = re.compile(r"^(const\s+)?[A-Za-z_][\w:]*(<[^>]*>)?[\s*&]+[A-Za-z_]\w*\s*(=|;|\(|\{|\[)")


@dataclass(frozen=True)
class Mutant:
    path: str  # the file, relative to the tree
    line: int  # 1-based, in the variant's file
    operator: str
    original: str  # the line as the variant has it
    mutated: str | None  # None: the line is removed
    text: str  # the whole mutated file

    context: str = ""  # the lines around it: two equal lines mutated alike get distinct ids

    @property
    def id(self) -> str:
        """Stable while the line and its neighbours are: a digest of them and the change, not its number."""
        key = f"{self.context}\0{self.original.strip()}\0{self.mutated}"
        return f"{self.operator}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"

    def describe(self) -> str:
        after = "(removed)" if self.mutated is None else self.mutated.strip()
        return f"{self.path}:{self.line} {self.operator}: {self.original.strip()}  ->  {after}"


def added_lines(pristine: str, patched: str) -> list[int]:
    """0-based indexes of the patched file's lines that the patches added or changed."""
    a, b = pristine.splitlines(), patched.splitlines()
    out: list[int] = []
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag in ("insert", "replace"):
            out.extend(range(j1, j2))
    return out


def mutable(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith(("//", "/*", "*")) and s not in ("{", "}", "};") and not _LOG.search(line)


def line_mutations(line: str) -> Iterator[tuple[str, str | None]]:
    """(operator, mutated line or None for removed) for one line of C++."""
    for old, new in _RELOPS.items():
        for m in re.finditer(re.escape(old), line):
            yield ("bound", line[: m.start()] + new + line[m.end() :])
    for m in re.finditer(r" ([+-]) 1\b", line):
        yield ("offset", line[: m.start()] + line[m.end() :])
    stripped = line.strip()
    if stripped.endswith(";") and not stripped.startswith("return") and not _DECLARATION.match(stripped):
        yield ("drop", None)
    for m in re.finditer(r"!([A-Za-z_]\w*)\(", line):
        if _IF.match(line) and (args := _call_end(line, m.end())) is not None:
            yield ("drop", line[: m.start()] + "false" + line[args:])
    if m := _IF.match(line):
        indent, kw, cond = m.groups()
        negated = cond[1:] if cond.startswith("!") and "&&" not in cond and "||" not in cond else f"!({cond})"
        yield ("negate", f"{indent}{kw} ({negated}) {{")
    for a, b in (("return true;", "return false;"), ("return false;", "return true;")):
        if stripped == a:
            yield ("negate", line.replace(a, b))
    for m in re.finditer(r"\b(true|false)\b", line):
        if not stripped.startswith("return"):
            flipped = "false" if m.group(1) == "true" else "true"
            yield ("negate", line[: m.start()] + flipped + line[m.end() :])
    for a, b in ((" && ", " || "), (" || ", " && ")):
        for m in re.finditer(re.escape(a), line):
            yield ("swap", line[: m.start()] + b + line[m.end() :])
    for m in _MIN.finditer(line):
        other = "max" if m.group(1) == "min" else "min"
        yield ("swap", line[: m.start()] + f"std::{other}{m.group(2) or ''}(" + line[m.end() :])
        args = _call_args(line, m.end())
        if args is not None:
            (a, b), end = args
            for keep in (a, b):
                yield ("cap", line[: m.start()] + keep.strip() + line[end:])
    for m in _SUB.finditer(line):
        yield ("swap", line[: m.start()] + f"{m.group(2)} - {m.group(1)}" + line[m.end() :])
    if "llama_n_ubatch(" in line:
        yield ("cap", line.replace("llama_n_ubatch(", "llama_n_batch("))


def _call_end(line: str, start: int) -> int | None:
    """The index after the ')' closing the call whose '(' ends at start."""
    depth = 0
    for i in range(start, len(line)):
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            if depth == 0:
                return i + 1
            depth -= 1
    return None


def _call_args(line: str, start: int) -> tuple[tuple[str, str], int] | None:
    """The two arguments of the call whose '(' ends at start, and the index after its ')'."""
    depth, args, cur = 0, [], ""
    for i in range(start, len(line)):
        c = line[i]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                args.append(cur)
                return ((args[0], args[1]), i + 1) if len(args) == 2 else None
            depth -= 1
        elif c == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        cur += c
    return None


def mutants(path: str, pristine: str, patched: str) -> list[Mutant]:
    """Every mutant of the lines the patches add to one file, each text once."""
    lines = patched.split("\n")
    seen: set[str] = set()
    ids: set[str] = set()
    out: list[Mutant] = []
    in_log = False  # inside a log call that spans lines: its arguments are log text too
    for idx in added_lines(pristine, patched):
        line = lines[idx]
        starts_log = bool(_LOG.search(line))
        skip = in_log or starts_log or not mutable(line)
        in_log = (in_log or starts_log) and not line.rstrip().endswith(";")
        if skip:
            continue
        context = "\n".join(x.strip() for x in lines[max(0, idx - 2) : idx + 3])
        for operator, new in line_mutations(line):
            if new == line:
                continue
            changed = lines[:idx] + ([] if new is None else [new]) + lines[idx + 1 :]
            text = "\n".join(changed)
            if text in seen:
                continue
            seen.add(text)
            m = Mutant(path, idx + 1, operator, line, new, text, context)
            # two equal lines in equal neighbourhoods (the ends of two functions alike) mutate alike: the
            # later one's id counts which it is, so that --only, a merge and equivalent.json name one
            while m.id in ids:
                m = dataclasses.replace(m, context=m.context + "\0again")
            ids.add(m.id)
            out.append(m)
    return out
