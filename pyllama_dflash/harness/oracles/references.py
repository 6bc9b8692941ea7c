"""The references a run's drafts are judged against, and which of them judges a variant.

Each is the same scenario (or schedule) on ``baseline``: with the draft's reconverted twin
(:data:`REFERENCE`, what a ``fix`` variant must draft), drafting as the draft's definition has it
(:data:`DEFINITION`, what a ``definition`` variant must draft), or with the twin's cells laid out as
the fix lays a legacy draft's (:data:`LAYOUT`, the tie check's replay). Here: their names as columns
of the matrix, their session configs, the twin's models, and which one judges a variant on a set of
models (:func:`reference_of`, from :func:`judged_on`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ...product.llamabuild.patchset import BASELINE
from ...product.llamabuild.variants import Variant
from ...product.llamabuild.variants import variant as variant_of
from ...words import Judged
from .. import tiny
from ..slotloop.config import SessionConfig, server_config
from ..slotloop.models import SIBLINGS, ModelSet

REFERENCE = f"{BASELINE}+twin"  # the drift oracle's column: baseline with the draft's reconverted twin
# the definition variant's column: baseline drafting from every row of the history at 0..N-1
DEFINITION = f"{BASELINE}+definition"
# the tie check's run: the reference replayed with the fix's cell layout (not a column of the table)
LAYOUT = f"{REFERENCE} (fix's layout)"


def reference_config(config: SessionConfig) -> SessionConfig:
    """The drift reference's session config: baseline's slot loop, following the history a target-only
    restore leaves (SessionConfig.history_restores)."""
    return replace(server_config(BASELINE, config), history_restores=True)


def definition_config(config: SessionConfig) -> SessionConfig:
    """The definition reference's session config: baseline's slot loop, drafting from the history the
    target holds (SessionConfig.definition_reference)."""
    return replace(server_config(BASELINE, config), definition_reference=True)


def layout_config(config: SessionConfig) -> SessionConfig:
    """The tie check's session config: the drift reference with the twin's cells laid out as the fix lays
    a legacy draft's (SessionConfig.twin_fill_layout)."""
    return replace(reference_config(config), twin_fill_layout=True)


def twin_of(models: ModelSet) -> ModelSet:
    """The models with the draft's reconverted twin in its place (the drift oracle's reference)."""
    twin = models.draft_for("plain", twin=True)
    if twin is None:
        raise ValueError(f"no reconverted twin of the draft {models.draft} to take the reference from")
    return models.with_draft(twin)


def judged_on(v: Variant, models: object) -> Judged:
    """What a run of the variant on these models is held to (Variant.judged_as): an ``as-trained`` variant's
    per draft, by the image-rows key of a DFlash-family draft. ``models`` is a :class:`ModelSet` or a
    :class:`tiny.TinyModels`; a set that says neither (real files given to llama-server) is taken as
    an unmarked DFlash draft."""
    image_rows = bool(getattr(models, "image_rows", False))
    return v.judged_as(image_rows, dflash_family=getattr(models, "drafter", tiny.DFLASH.name) not in SIBLINGS)


def reference_of(variant: str, models: ModelSet) -> str:
    """The column a variant's drafts are judged against on these models: the definition's for a
    ``definition`` variant (an ``as-trained`` one with drafts trained with image rows), the twin's for
    every other."""
    return DEFINITION if judged_on(variant_of(variant), models).own_positions else REFERENCE


def reference_columns(variants: Iterable[str], cases: Iterable[ModelSet]) -> list[str]:
    """The reference columns that judge these variants on these cases' models, in the tables' order:
    every case's table has all of them."""
    variants = list(variants)
    return sorted({reference_of(v, m) for m in cases for v in variants}, key=(REFERENCE, DEFINITION).index)
