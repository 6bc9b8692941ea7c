"""The project's fixed vocabularies, one enum each: what a series line says a variant is judged as
(``Role``), what one run is held to (``Judged``), how a run ended (``Status``) and what a pull request
shows (``PullVerdict``).

Each is a ``str`` enum, so a value compares equal to its word and is written as it in JSON, in tables
and in ``patches/series``; ``tests/test_names.py`` keeps the words from being spelled as literals
elsewhere in the package.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A word of a fixed set: printed, formatted and written as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Role(Word):
    """A series line's role column: what the variant its patch makes is judged as."""

    SHOWN = "shown"  # the zero-fill (0003): shown beside the fixes, not judged exact
    TWIN = "twin"  # exact to the draft's reconverted twin on b11434 (0004's semantics)
    DEFINITION = "definition"  # exact to the draft's definition: every row at its own positions (0007's)
    AS_TRAINED = "as-trained"  # either, per draft, by its GGUF key (0008's): see judged()

    def judged(self, trained_with_image_rows: bool, *, dflash_family: bool = True) -> Judged:
        """What a run of this role is held to. An ``as-trained`` variant serves a DFlash-family draft
        marked as trained with image rows as the definition does, any other DFlash-family draft as the
        twin; the other drafters (EAGLE3, MTP) read no key and get the definition's semantics (0007)."""
        if self is Role.AS_TRAINED:
            return Judged.DEFINITION if trained_with_image_rows or not dflash_family else Judged.TWIN
        return Judged(self.value)


class Judged(Word):
    """What one run is held to: a role resolved for its draft, or the unpatched tree's failures."""

    BASELINE = "baseline"  # b11434 as released: its failures are what is expected
    SHOWN = "shown"
    TWIN = "twin"
    DEFINITION = "definition"

    @property
    def own_positions(self) -> bool:
        """Whether the draft keeps positions of its own (0007): trimmed by the row count."""
        return self is Judged.DEFINITION


class Status(Word):
    """How one run ended, best first."""

    PASS = "PASS"
    SKIP = "SKIP"  # not run: the models have no file the scenario needs
    # the drafts differ from the reference's only as a tie broken by the KV cells' order (proven by replaying
    # the reference with the fix's cell layout: oracles/drift.py)
    TIE = "TIE"
    DRIFT = "DRIFT"  # every call succeeded and the output is exact, but the draft drafted otherwise
    DEGRADED = "DEGRADED"  # a round drafted nothing where it should
    FAIL = "FAIL"
    CRASH = "CRASH"  # the child died or ran past its timeout
    ERROR = "ERROR"  # a Python error inside the child


class PullVerdict(Word):
    """What ``pyllama-dflash pulls`` says of a pull request of ``patches/pulls``."""

    PROVEN = "proven"  # its test fails on b11434 with the prerequisites and passes with the fixes
    NOT_PROVEN = "not proven"  # its test passes without the fixes, or fails with them
    NO_TEST = "no test yet"  # listed and built, not judged: no test of upstream's kind fails without it
