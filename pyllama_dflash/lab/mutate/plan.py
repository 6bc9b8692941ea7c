"""What a mutation run tries: the fix and how it is judged, its files, and the mutants selected.

:func:`plan` reads the flags (``--variant``, ``--files``, ``--every``, ``--only``, ``--shard``, ``--limit``)
against the series and the pristine source (baseline's build), and raises UsageError for a run that
cannot be made. :func:`stale` names the equivalent mutants on file that no fix of the series has.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...figures import provenance
from ...paths import default_patches_dir
from ...product.llamabuild import BuildOptions, build
from ...product.llamabuild.patchset import (
    EVERY,
    Series,
    apply_series,
    load_series,
    tree_reader,
)
from ...words import Role
from .operators import Mutant, mutants
from .runner import MUTATED_FILES

# the roles of the fixes mutate judges (the zero-fill is shown, not fixed)
MUTATED_ROLES = (Role.TWIN, Role.DEFINITION, Role.AS_TRAINED)


@dataclass
class Plan:
    series: Series
    variant: str  # the fix whose lines are mutated
    # Role.TWIN (judged against the twin), Role.DEFINITION (against the draft's definition) or Role.AS_TRAINED
    # (per draft; the mutants run on drafts without the image-rows key, judged against the twin, and the C++
    # test's runs with the key against the definition reference)
    role: str
    pristine: Path  # baseline's source tree
    read: Callable[[str], str]  # a file of the pristine tree
    own: dict[str, str]  # the files the fix's own patches touch, as the fix has them
    files: list[str]  # the files whose added lines are mutated
    all_mutants: list[Mutant]  # every mutant of those files, before any selection
    selected: list[Mutant]  # what this run tries: sampled, picked, sliced and limited
    selection: dict  # what was asked, for the report (and a merge of slices)
    provenance: dict  # when, where and on which llama.cpp the run judged (figures.provenance)


def plan(args: argparse.Namespace) -> Plan:
    series = load_series(default_patches_dir())
    fix = args.variant or series.variants[-1]
    # each mutant is judged as its fix is: against the twin, or against the draft's definition (0007)
    role = series.role(fix) if fix in series.variants[1:] else Role.TWIN
    if role not in MUTATED_ROLES:
        raise UsageError(f"--variant {fix!r} is judged as {role!r}: not a fix to mutate")
    (base,) = build(["baseline"], BuildOptions(cpu="native", quiet=True))
    pristine = Path(base.data["source"]["path"])
    read = tree_reader(pristine)
    # the fix's own files, without the test patches: a mutant's series applies those again on top, so a file
    # both touch must come without them
    own_patches = [p for p in series.prefix(fix) if p.variant != EVERY]
    fixed = apply_series(read, own_patches)
    own = {rel: fixed[rel] for p in own_patches for rel in p.touched}
    given = [f.strip() for f in args.files.split(",") if f.strip()] if args.files else None
    files = given if given is not None else [f for f in MUTATED_FILES if f in own]
    missing = [f for f in files if f not in own]
    if missing:
        raise UsageError(f"variant {fix!r} does not change {', '.join(missing)}")
    all_mutants = [m for f in files for m in mutants(f, read(f), own[f])]
    every = all_mutants[:: max(1, args.every)]
    wanted = {x.strip() for x in args.only.split(",")} if args.only else None
    if wanted is not None:
        every = [m for m in every if m.id in wanted]
    selection = {
        "every": args.every,
        "only": sorted(wanted) if wanted is not None else None,
        "limit": args.limit,
        "mutants": [m.id for m in every],  # before the slicing: what the slices together must try
        # the patches the mutants are judged in (their C++ tests included): slices of one run share them
        "series_sha256": series_digest(series, fix),
    }
    if args.shard:
        every = args.shard.by_key(every, lambda m: m.id)
    if args.limit:
        every = every[: args.limit]
    return Plan(series, fix, role, pristine, read, own, files, all_mutants, every, selection, provenance(base))


def series_digest(series: Series, fix: str) -> str:
    """sha256 of every patch the fix's variant applies (names and bytes, in order), its test patches and
    headers included: a run cut into slices over sessions is one run only if every slice ran on the same
    patches. Coarse on purpose: which patches a stage reads is not known here, so any change counts."""
    h = hashlib.sha256()
    for patch in series.prefix(fix):
        h.update(patch.name.encode() + b"\0" + (series.directory / patch.name).read_bytes() + b"\0")
    return h.hexdigest()


def stale(p: Plan, equivalents: dict[str, dict]) -> list[str]:
    """The equivalent mutants on file that are mutants of no fix of the series (equivalent.json serves
    every fix of the series: a mutant of another fix is not stale)."""
    fixes = [v for v in p.series.variants[1:] if p.series.role(v) in MUTATED_ROLES]
    known = {
        m.id
        for v in fixes
        for rel, text in apply_series(p.read, p.series.prefix(v)).items()
        if rel in p.files
        for m in mutants(rel, p.read(rel), text)
    }
    return sorted(set(equivalents) - known - {m.id for m in p.all_mutants})
