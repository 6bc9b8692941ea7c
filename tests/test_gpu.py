"""The matrix again with every layer offloaded: runs wherever an NVIDIA device is present.

Marker ``gpu``. Where a device is present the CUDA builds of every variant are made first (a missing
toolkit fails the test, it does not skip it); only a machine with no NVIDIA device skips, and the CPU CI
runs everything else.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from series_variants import VARIANTS

from pyllama_dflash.harness.engine.matrix import run_matrix
from pyllama_dflash.harness.scenarios.catalog import SCENARIOS, expectations, meets
from pyllama_dflash.harness.scenarios.scenario_job import ScenarioJob
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.product.llamabuild import BuildOptions, build
from pyllama_dflash.product.llamabuild.toolchain import nvidia_gpu_present

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvidia_gpu_present(), reason="no NVIDIA device on this machine"),
]


@pytest.fixture(scope="module")
def gpu_matrix(model_set, tmp_path_factory):
    build(list(VARIANTS), BuildOptions(backend="cuda", quiet=True))  # made once, kept in the build cache
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
