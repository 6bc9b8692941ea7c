"""What a variant is: the one place every table of expectations derives from.

A variant of the series is ``baseline`` (the unpatched tree), the zero-fill (kept to show what
it does), a fix exact to the draft's reconverted twin, a fix exact to the draft's definition, or a fix
that serves each draft as it was trained (either of the two, per draft: :meth:`Variant.judged_as`):
its series line says which (``patches/series``' role column). Whether its llama-server saves and restores
the draft with a slot follows from its patches (they change ``tools/server/server-context.cpp``: 0005).
A name the series does not know (a llama-server given by path, a mutant of another series) is a fix
whose server restores the target alone, as b11434's does. The scenario matrix's expectations
(``scenarios.catalog``) and the server checks' (``server.checks``) both key on :attr:`Variant.role`
and :attr:`Variant.saves_draft`, through this one rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..paths import default_patches_dir
from .patchset import AS_TRAINED_ROLE, BASELINE, DEFINITION_ROLE, SHOWN_ROLE, TWIN_ROLE, load_series

# the file whose patches make a variant's llama-server save and restore the draft with a slot (0005)
SERVER_SOURCE = "tools/server/server-context.cpp"

BASELINE_ROLE = "baseline"
__all__ = [
    "AS_TRAINED_ROLE",
    "BASELINE_ROLE",
    "DEFINITION_ROLE",
    "TWIN_ROLE",
    "SHOWN_ROLE",
    "Variant",
    "default_must_pass",
    "variant",
]


@dataclass(frozen=True)
class Variant:
    name: str
    patches: tuple[str, ...]  # the patch files it carries, in order (the series' every-variant ones too)
    saves_draft: bool  # its llama-server saves and restores the draft's state with a slot
    # ``baseline``, ``shown`` (the zero-fill), ``twin`` (exact to the twin), ``definition`` (exact
    # to the draft's definition) or ``as-trained`` (either, per draft): what is expected of it, from its
    # series line
    role: str = TWIN_ROLE

    def judged_as(self, image_rows: bool, *, dflash_family: bool = True) -> Variant:
        """The variant as it is judged with drafts that carry (``image_rows``) or lack the key of a draft
        trained with image rows. An ``as-trained`` variant (patch 0008) is a ``definition`` fix with a
        DFlash-family draft that has the key and a ``twin`` fix with one that has not; the other drafters
        (EAGLE3, MTP) read no key and get 0007's semantics, a ``definition`` fix's. Every other variant
        reads no key and is itself."""
        if self.role != AS_TRAINED_ROLE:
            return self
        return replace(self, role=DEFINITION_ROLE if image_rows or not dflash_family else TWIN_ROLE)

    @property
    def own_positions(self) -> bool:
        """Whether its draft keeps positions of its own (patch 0007): trimmed by the row count. An
        ``as-trained`` variant's depends on the draft: ask :meth:`judged_as` first."""
        if self.role == AS_TRAINED_ROLE:
            raise ValueError(f"variant {self.name!r} keeps positions of its own or not per draft: judged_as() first")
        return self.role == DEFINITION_ROLE


def variant(name: str, patches_dir: Path | None = None) -> Variant:
    """The variant ``name`` of the series in ``patches_dir`` (default: the package's), or, for a name
    the series does not know, a fix whose llama-server restores the target alone."""
    series = load_series(patches_dir or default_patches_dir())
    if name not in series.variants:
        return Variant(name, (), False)
    role = BASELINE_ROLE if name == BASELINE else series.role(name)
    return Variant(name, tuple(p.name for p in series.prefix(name)), series.changes(name, SERVER_SOURCE), role)


def default_must_pass(names: list[str], patches_dir: Path | None = None) -> str:
    """The variant ``--must-pass`` means when it is not given, of those run: the last whose role is
    ``as-trained``, else the last ``twin``, else the last. Paired acceptance measures that a draft
    accepts best served as it was trained (docs/performance.md, "Which semantics for which draft"):
    an ``as-trained`` variant does that per draft, a ``twin`` variant for drafts trained on text."""
    for role in (AS_TRAINED_ROLE, TWIN_ROLE):
        chosen = [n for n in names if variant(n, patches_dir).role == role]
        if chosen:
            return chosen[-1]
    return names[-1]


def saves_draft_with_slot(name: str, patches_dir: Path | None = None) -> bool:
    """Whether the variant's llama-server saves and restores the draft's state with a slot (0005)."""
    return variant(name, patches_dir).saves_draft
