"""The pull requests of ``patches/pulls``: the series as upstream would take it, one concern at a time.

A request is its fix patches and the tests that show them: each fails on b11434 with the fixes'
prerequisites (:func:`without`) and passes with the fixes (:func:`with_fix`). A test patch brings C++ tests
(ctest) or tests in the form of llama-server's (``tools/server/tests/unit``). The format is in the file's own
header: ``<name> <fix patches> <test patches>`` a line, patches by number, ``-`` for no test yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import PatchError
from . import ctest, prerequisites
from .patchset import EVERY, Patch, Series

PULLS_FILE = "pulls"
NO_TEST = "-"
SERVER_TESTS = "tools/server/tests/unit/"  # where llama-server's tests live, each a test_*.py
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Pull:
    name: str
    fixes: tuple[Patch, ...]
    tests: tuple[Patch, ...]  # series patches that bring or change tests (their lines say '*'); none: no test yet

    @property
    def test_names(self) -> list[str]:
        """The C++ tests the test patches bring."""
        return cpp_tests(self.tests)

    @property
    def server_tests(self) -> list[str]:
        """The tests of llama-server's kind the test patches bring, relative to ``tools/server/tests``."""
        return server_tests(self.tests)


def cpp_tests(patches: tuple[Patch, ...]) -> list[str]:
    """The series' C++ tests (ctest.TESTS) that ``patches`` bring, or change: a request's test may be new
    cases in a test an earlier request brought."""
    touched = _touched(patches)
    return [t for t in ctest.TESTS if ctest.source(t) in touched]


def server_tests(patches: tuple[Patch, ...]) -> list[str]:
    """The tests of llama-server's kind that ``patches`` bring, or change (a request's test may be new cases
    in a file an earlier request brought), relative to ``tools/server/tests``."""
    prefix = SERVER_TESTS.removesuffix("unit/")
    return sorted(t.removeprefix(prefix) for t in _touched(patches) if t.startswith(SERVER_TESTS) and t.endswith(".py"))


def _touched(patches: tuple[Patch, ...]) -> set[str]:
    """The files ``patches`` add or change."""
    return {path for p in patches for path in p.touched}


def load_pulls(series: Series) -> list[Pull]:
    """The requests of the series folder's ``pulls`` file, in merge order; an error names the line."""
    path = series.directory / PULLS_FILE
    if not path.is_file():
        raise PatchError(f"{path}: no pulls file (one '<name> <fix patches> <test patches>' per line)")
    by_number = {p.name[:4]: p for p in series.patches}
    pulls: list[Pull] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        parts = line.split()
        if len(parts) != 3 or not _NAME_RE.match(parts[0]):
            raise PatchError(f"{where}: expected '<name> <fix patches> <test patches>', got {raw!r}")
        name, fixes, tests = parts[0], parts[1].split(","), [] if parts[2] == NO_TEST else parts[2].split(",")
        unknown = [n for n in [*fixes, *tests] if n not in by_number]
        if unknown:
            raise PatchError(f"{where}: {', '.join(unknown)} is not a patch of {series.directory}/series")
        pull = Pull(name, tuple(by_number[n] for n in fixes), tuple(by_number[n] for n in tests))
        _check(pull, where)
        pulls.append(pull)
    return pulls


def _check(pull: Pull, where: str) -> None:
    if any(p.variant == EVERY or p.aside for p in pull.fixes):
        raise PatchError(f"{where}: a fix is a patch that makes or carries a variant, and not one aside")
    for test in pull.tests:
        if test.variant != EVERY or not (cpp_tests((test,)) or server_tests((test,))):
            raise PatchError(f"{where}: the test {test.name} is not a '{EVERY}' patch that brings or changes a test")


def without(series: Series, pull: Pull) -> tuple[Patch, ...]:
    """b11434's side: the fixes' named prerequisites and the tests, in the order a build applies them."""
    needed = {p.name for fix in pull.fixes for p in prerequisites.named(series, fix)} - _names(pull.fixes)
    for test in pull.tests:
        needed |= _names((test, *prerequisites.named(series, test)))
    return _as_built(series, needed)


def with_fix(series: Series, pull: Pull) -> tuple[Patch, ...]:
    """The request applied: :func:`without` and the fixes, in the order a build applies them."""
    return _as_built(series, _names(without(series, pull)) | _names(pull.fixes))


def _names(patches: tuple[Patch, ...]) -> set[str]:
    return {p.name for p in patches}


def _as_built(series: Series, needed: set[str]) -> tuple[Patch, ...]:
    """The patches in the order a build applies them: the series' own, then those for every variant."""
    return tuple(p for p in (*series.own, *series.every) if p.name in needed)
