"""What a variant is: the one place every table of expectations derives from.

A variant of the series is ``baseline`` (the unpatched tree), the seed's zero-fill (kept to show what
it does), a fix exact to the draft's reconverted twin, or a fix exact to the draft's definition: its
series line says which (``patches/series``' role column). Whether its llama-server saves and restores
the draft with a slot follows from its patches (they change ``tools/server/server-context.cpp``: 0003).
A name the series does not know (a llama-server given by path, a mutant of another series) is a fix
whose server restores the target alone, as b11434's does. The scenario matrix's expectations
(``scenarios.catalog``) and the server checks' (``server.checks``) both key on :attr:`Variant.role`
and :attr:`Variant.saves_draft`, through this one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..paths import default_patches_dir
from .patchset import BASELINE, DEFINITION_ROLE, FIX_ROLE, SEED_ROLE, load_series

# the file whose patches make a variant's llama-server save and restore the draft with a slot (0003)
SERVER_SOURCE = "tools/server/server-context.cpp"

BASELINE_ROLE = "baseline"
__all__ = ["BASELINE_ROLE", "DEFINITION_ROLE", "FIX_ROLE", "SEED_ROLE", "Variant", "default_fix", "variant"]


@dataclass(frozen=True)
class Variant:
    name: str
    patches: tuple[str, ...]  # the patch files it carries, in order (the series' every-variant ones too)
    saves_draft: bool  # its llama-server saves and restores the draft's state with a slot
    # ``baseline``, ``seed`` (the seed's zero-fill), ``fix`` (exact to the twin) or ``definition`` (exact
    # to the draft's definition): what is expected of it, from its series line
    role: str = FIX_ROLE

    @property
    def own_positions(self) -> bool:
        """Whether its draft keeps positions of its own (patch 0005): trimmed by the row count."""
        return self.role == DEFINITION_ROLE


def variant(name: str, patches_dir: Path | None = None) -> Variant:
    """The variant ``name`` of the series in ``patches_dir`` (default: the package's), or, for a name
    the series does not know, a fix whose llama-server restores the target alone."""
    series = load_series(patches_dir or default_patches_dir())
    if name not in series.variants:
        return Variant(name, (), False)
    role = BASELINE_ROLE if name == BASELINE else series.role(name)
    return Variant(name, tuple(p.name for p in series.prefix(name)), series.changes(name, SERVER_SOURCE), role)


def default_fix(names: list[str], patches_dir: Path | None = None) -> str:
    """The variant ``--fix`` means when it is not given, of those run: the last whose role is ``fix``,
    else the last. A ``fix`` variant serves a draft as the public DFlash drafts were trained (text
    only: image rows skipped, the target's positions), and paired acceptance measures that those
    drafts accept best so; a draft trained with image rows accepts best under ``definition``, which
    ``--fix definition`` names (docs/performance.md, "Which semantics for which draft")."""
    fixes = [n for n in names if variant(n, patches_dir).role == FIX_ROLE]
    return fixes[-1] if fixes else names[-1]


def saves_draft_with_slot(name: str, patches_dir: Path | None = None) -> bool:
    """Whether the variant's llama-server saves and restores the draft's state with a slot (0003)."""
    return variant(name, patches_dir).saves_draft
