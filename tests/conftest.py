"""Shared fixtures: the built variants (built on first use, never skipped for want of one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyllama_dflash.build import BuildOptions, Manifest, build

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def variants() -> dict[str, Manifest]:
    """Every variant of patches/series, built if needed (a no-op when already built).

    A failing build fails the tests that need it; nothing is skipped.
    """
    built = build(["all"], BuildOptions(jobs=int(os.environ.get("PYLLAMA_DFLASH_JOBS", "0")) or None))
    return {m.variant: m for m in built}


@pytest.fixture(scope="session")
def pristine(variants) -> Path:
    """The pristine llama.cpp tree the variants were built from."""
    return Path(next(iter(variants.values())).data["source"]["path"])
