"""The English the target learns to write: text that ships with Python itself, no download.

Two sources: the documentation topics of ``pydoc_data`` (the language reference's prose, about
465k characters) and the docstrings of the standard library's modules, read with ``ast`` from
their source files (nothing is imported). Each becomes paragraphs of plain prose: code blocks,
grammar rules and reST underlines are dropped, lines are joined, and the few non-ASCII
punctuation marks are spelt in ASCII, so that every character has a token of its own.

A paragraph goes to the held-out split by a hash of its text, so the split never depends on the
order the sources are read in, and the held-out paragraphs are never trained on.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

_ASCII = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2019": "'", "\u2018": "'", "\u2013": "-", "\u2014": "-"})
_MIN_CHARS, _MAX_CHARS = 80, 600


@dataclass(frozen=True)
class Paragraph:
    subject: str  # what a user would ask about: a topic's or a module's name
    text: str

    @property
    def held_out(self) -> bool:
        return hashlib.sha256(self.text.encode()).digest()[0] < 13  # about 5%


def _is_prose(block: str) -> bool:
    lines = block.splitlines()
    if any(line.startswith(("   ", "\t", ">>>")) for line in lines):  # code, grammar rules, examples
        return False
    if re.fullmatch(r"[\s*=\-~^]+", lines[-1]):  # a heading's underline
        return False
    letters = sum(ch.isalpha() or ch == " " for ch in block)
    return letters / max(len(block), 1) > 0.85


def paragraphs_of(subject: str, text: str) -> list[Paragraph]:
    out = []
    for block in re.split(r"\n\s*\n", text.translate(_ASCII)):
        block = block.strip("\n")
        if not block.strip() or not _is_prose(block):
            continue
        flat = " ".join(block.split())
        if not flat.isascii() or len(flat) < _MIN_CHARS:
            continue
        out.append(Paragraph(subject, _cut(flat)))
    return out


def _cut(text: str) -> str:
    """At most _MAX_CHARS, ended at a sentence where one ends in the second half."""
    if len(text) <= _MAX_CHARS:
        return text
    end = text.rfind(". ", _MAX_CHARS // 2, _MAX_CHARS)
    return text[: end + 1] if end > 0 else text[:_MAX_CHARS].rsplit(" ", 1)[0]


def topic_paragraphs() -> list[Paragraph]:
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        out += paragraphs_of(name.replace("-", " "), topics[name])
    return out


def docstring_paragraphs(limit_files: int | None = None) -> list[Paragraph]:
    """Docstrings of the standard library's own modules (tests, idlelib and site-packages left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not {"test", "tests", "idle_test", "site-packages", "idlelib", "lib2to3"} & set(p.relative_to(root).parts)
    )
    out = []
    for path in files[:limit_files]:
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                    out += paragraphs_of(name, doc)
    return out


def held_out_paragraphs() -> list[Paragraph]:
    """The held-out paragraphs, read once a process (reading the standard library takes seconds)."""
    return list(_held_out())


@functools.cache
def _held_out() -> tuple[Paragraph, ...]:
    return tuple(p for p in all_paragraphs() if p.held_out)


def all_paragraphs(limit_files: int | None = None) -> list[Paragraph]:
    seen: set[str] = set()
    out = []
    for p in topic_paragraphs() + docstring_paragraphs(limit_files):
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out
