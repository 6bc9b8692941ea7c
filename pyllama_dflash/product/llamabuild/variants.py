"""What a variant is: the one place every table of expectations derives from.

A variant of the series is ``baseline`` (the unpatched tree), the zero-fill (kept to show what
it does), a fix exact to the draft's reconverted twin, a fix exact to the draft's definition, or a fix
that serves each draft as it was trained (either of the two, per draft: :meth:`Variant.judged_as`):
its series line says which (``patches/series``' role column, a :class:`~pyllama_dflash.words.Role`).
Whether its llama-server saves and restores the draft with a slot follows from its patches (they
change ``tools/server/server-context.cpp``: 0005).
A name the series does not know (a llama-server given by path, a mutant of another series) is a fix
whose server restores the target alone, as b11434's does. The scenario matrix's expectations
(``scenarios.catalog``) and the server checks' (``server.checks``) both key on what a run is judged as
(:meth:`Variant.judged_as`, a :class:`~pyllama_dflash.words.Judged`) and :attr:`Variant.saves_draft`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...paths import default_patches_dir
from ...words import Judged, Role
from .patchset import BASELINE, load_series

# the file whose patches make a variant's llama-server save and restore the draft with a slot (0005)
SERVER_SOURCE = "tools/server/server-context.cpp"

__all__ = ["Variant", "default_must_pass", "variant"]


@dataclass(frozen=True)
class Variant:
    name: str
    patches: tuple[str, ...]  # the patch files it carries, in order (the series' every-variant ones too)
    saves_draft: bool  # its llama-server saves and restores the draft's state with a slot
    role: Role | None = Role.TWIN  # its series line's; None for baseline, the unpatched tree

    def judged_as(self, trained_with_image_rows: bool, *, dflash_family: bool = True) -> Judged:
        """What a run of the variant is held to with a draft that carries (or lacks) the key of a draft
        trained with image rows (:meth:`Role.judged`); baseline is held to b11434's own failures."""
        if self.role is None:
            return Judged.BASELINE
        return self.role.judged(trained_with_image_rows, dflash_family=dflash_family)


def variant(name: str, patches_dir: Path | None = None) -> Variant:
    """The variant ``name`` of the series in ``patches_dir`` (default: the package's), or, for a name
    the series does not know, a fix whose llama-server restores the target alone."""
    series = load_series(patches_dir or default_patches_dir())
    if name not in series.variants:
        return Variant(name, (), False)
    role = None if name == BASELINE else series.role(name)
    return Variant(name, tuple(p.name for p in series.prefix(name)), series.changes(name, SERVER_SOURCE), role)


def default_must_pass(names: list[str], patches_dir: Path | None = None) -> str:
    """The variant ``--must-pass`` means when it is not given, of those run: the last whose role is
    ``as-trained``, else the last ``twin``, else the last. Paired acceptance measures that a draft
    accepts best served as it was trained (docs/performance.md, "Which semantics for which draft"):
    an ``as-trained`` variant does that per draft, a ``twin`` variant for drafts trained on text."""
    for role in (Role.AS_TRAINED, Role.TWIN):
        chosen = [n for n in names if variant(n, patches_dir).role == role]
        if chosen:
            return chosen[-1]
    return names[-1]


def saves_draft_with_slot(name: str, patches_dir: Path | None = None) -> bool:
    """Whether the variant's llama-server saves and restores the draft's state with a slot (0005)."""
    return variant(name, patches_dir).saves_draft
