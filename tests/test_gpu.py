"""The matrix again with every layer offloaded: runs where a CUDA build and a device exist.

Skipped (marker ``gpu``) unless a variant was built with ``--backend cuda`` and an NVIDIA device
is present; the CPU CI runs everything else.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import VARIANTS
from pyllama_dflash.engine.matrix import run_matrix
from pyllama_dflash.llamabuild import VariantNotBuilt, find
from pyllama_dflash.llamabuild.toolchain import nvidia_gpu_present
from pyllama_dflash.scenarios.catalog import SCENARIOS, expectations, meets
from pyllama_dflash.scenarios.scenario_job import ScenarioJob
from pyllama_dflash.slotloop.config import DEFAULT_CONFIG


def _cuda_builds() -> bool:
    try:
        return all(find(v, backend="cuda") for v in VARIANTS)
    except VariantNotBuilt:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (nvidia_gpu_present() and _cuda_builds()),
        reason="needs CUDA builds of every variant (build.py --backend cuda) and an NVIDIA device",
    ),
]


@pytest.fixture(scope="module")
def gpu_matrix(model_set, tmp_path_factory):
    jobs = [
        ScenarioJob(s, v, model_set, replace(DEFAULT_CONFIG, n_gpu_layers=99), backend="cuda")
        for s in SCENARIOS
        for v in VARIANTS
    ]
    return run_matrix(jobs, parallel=2, work_dir=tmp_path_factory.mktemp("gpu-matrix"))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gpu_matrix_cell(gpu_matrix, scenario, variant):
    result = gpu_matrix[(scenario, variant)]
    assert meets(expectations(variant)[scenario], result), (scenario, variant, result.get("first_failure"))
