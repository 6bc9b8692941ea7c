"""The build system: pinned source -> staged, patched tree -> CMake build -> manifests."""

from ..errors import (
    BuildError,
    PatchError,
    SourceError,
    ToolchainError,
    VariantNotBuilt,
)
from .builder import BuildOptions, build, find_built, plan, saves_draft_with_slot
from .manifest import Manifest, find

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
]
