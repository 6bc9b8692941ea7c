"""Shared fixtures: the built variants (built on first use, never skipped for want of one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyllama_dflash.env import CPU_ENV, JOBS_ENV
from pyllama_dflash.harness import tiny
from pyllama_dflash.harness.slotloop.models import ModelSet, tiny_models
from pyllama_dflash.product import api
from pyllama_dflash.product.llamabuild import BuildOptions, Manifest, build


@pytest.fixture(scope="session")
def variants() -> dict[str, Manifest]:
    """Every variant of patches/series, built if needed (a no-op when already built).

    A failing build fails the tests that need it; nothing is skipped.
    """
    # native unless $PYLLAMA_DFLASH_CPU asks for another (PYLLAMA_DFLASH_CPU=avx2 on an AVX-512 machine runs
    # the suite as an AVX2 machine rounds); the tests of portable builds build their own
    jobs = int(os.environ.get(JOBS_ENV, "0")) or None
    cpu_mode = os.environ.get(CPU_ENV) or "native"
    built = build(["all"], BuildOptions(jobs=jobs, cpu=cpu_mode, server=True))  # the server tests need it
    return {m.variant: m for m in built}


@pytest.fixture(scope="session")
def pristine(variants) -> Path:
    """The pristine llama.cpp tree the variants were built from."""
    return Path(next(iter(variants.values())).data["source"]["path"])


# ---- the baseline build in this process, and objects over the tiny models -------------------------


@pytest.fixture(scope="session")
def lib_dir(variants) -> Path:
    """The baseline build's libraries, loaded here (one variant per process: same sonames);
    other variants run in child processes."""
    path = variants["baseline"].lib_dir
    api.init(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> tiny.TinyModels:
    """The tiny files: target, the legacy draft and the projector (pyllama_dflash.harness.tiny)."""
    return tiny.write_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def model_set(tmp_path_factory: pytest.TempPathFactory) -> ModelSet:
    """What the scenarios run on: the tiny files plus every draft (M-RoPE twin, sliding-window)."""
    return tiny_models(tmp_path_factory.mktemp("model-set"))


@pytest.fixture
def target_model(lib_dir: Path, models: tiny.TinyModels):
    with api.Model(models.target) as model:
        yield model


@pytest.fixture
def draft_model(lib_dir: Path, models: tiny.TinyModels):
    with api.Model(models.draft) as model:
        yield model


@pytest.fixture
def target(target_model: api.Model):
    with api.Context(target_model, n_ctx=256, n_batch=64, n_ubatch=64) as ctx:
        yield ctx


@pytest.fixture
def draft(draft_model: api.Model, target: api.Context):
    with api.Context.draft(draft_model, target) as ctx:
        yield ctx


@pytest.fixture
def spec(target: api.Context, draft: api.Context):
    with api.Speculative(target, draft, n_max=3) as driver:
        yield driver


@pytest.fixture
def projector(lib_dir: Path, models: tiny.TinyModels, target_model: api.Model):
    with api.Projector(models.mmproj, target_model) as proj:
        yield proj


@pytest.fixture(scope="session")
def gguf():
    """The gguf-py that writes the tiny models (the pinned tree's, with the DFlash keys)."""
    return tiny.gguf_module()
