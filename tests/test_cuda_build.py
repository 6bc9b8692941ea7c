"""The CUDA build, on a machine with nvcc and cuBLAS (the toolkit's or the nvidia-cublas wheel's),
with or without a GPU. Opt-in: a cold CUDA build takes the better part of an hour on 2 cores, so
it runs only with PYLLAMA_DFLASH_TEST_CUDA_BUILD=1 (the cuda-build workflow job sets it). Opted
in, a machine that cannot build CUDA fails these tests: it does not skip them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from series_variants import TWIN_FIX, VARIANTS

from pyllama_dflash.env import CUDA_ARCH_ENV, CUDA_BUILD_TEST_ENV
from pyllama_dflash.product.llamabuild import BuildOptions, build, toolchain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.build,
    pytest.mark.skipif(
        not os.environ.get(CUDA_BUILD_TEST_ENV),
        reason=f"opt-in: set {CUDA_BUILD_TEST_ENV}=1 to build every variant with CUDA (long on a small machine)",
    ),
]
ARCH = os.environ.get(CUDA_ARCH_ENV) or "90"


@pytest.fixture(scope="module")
def cuda_variants():
    problems = toolchain.cuda_toolkit_problems()
    assert not problems, problems  # opted in: a machine that cannot build CUDA is a failure
    return {m.variant: m for m in build(["all"], BuildOptions(backend="cuda", cuda_arch=ARCH, cpu="native"))}


def test_every_variant_compiles_and_links_ggml_cuda(cuda_variants):
    assert sorted(cuda_variants) == sorted(VARIANTS)
    for m in cuda_variants.values():
        assert m.backend == "cuda" and m.data["cuda_arch"] == ARCH
        assert "ggml-cuda" in m.data["libraries"], m.data["libraries"]
    # one shared build folder: the variants differ in libllama-common (and 0005's server), not in ggml
    libs = {v: (m.lib_dir / m.data["libraries"]["ggml-cuda"]).read_bytes() for v, m in cuda_variants.items()}
    assert len(set(libs.values())) == 1


def test_cublas_resolves_where_the_build_found_it(cuda_variants):
    m = cuda_variants[TWIN_FIX]
    out = subprocess.run(["ldd", str(m.library("ggml-cuda"))], capture_output=True, text=True, check=True).stdout
    cublas = next(line for line in out.splitlines() if "libcublas.so" in line)
    assert "not found" not in cublas, out
    wheel = toolchain.select("cuda", ARCH, "native").cublas
    if wheel is not None:
        assert wheel.lib_dir in cublas, cublas


def test_the_cuda_build_loads_here_with_the_devices_there_are(cuda_variants):
    """Without a GPU (or a driver) the CUDA variant still loads: ggml-cuda finds no device, the CPU runs."""
    code = (
        "import json, pyllama_dflash as p\n"
        f"p.load({TWIN_FIX!r}, backend='cuda')\n"
        "from pyllama_dflash import api\n"
        "print(json.dumps(api.devices()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    devices = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(d["type"] == "cpu" for d in devices), devices
    if not toolchain.nvidia_gpu_present():
        assert not any(d["type"] == "gpu" for d in devices), devices
