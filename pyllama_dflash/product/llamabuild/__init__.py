"""The build system: pinned source -> staged, patched tree -> CMake build -> manifests."""

from ...errors import (
    BuildError,
    PatchError,
    SourceError,
    ToolchainError,
    VariantNotBuilt,
)
from .builder import BuildOptions, build, find_built, plan
from .manifest import Manifest, find
from .variants import Variant, default_must_pass, saves_draft_with_slot, variant

__all__ = [
    "BuildError",
    "BuildOptions",
    "Manifest",
    "PatchError",
    "SourceError",
    "ToolchainError",
    "VariantNotBuilt",
    "build",
    "find",
    "find_built",
    "plan",
    "saves_draft_with_slot",
    "default_must_pass",
    "variant",
    "Variant",
]
