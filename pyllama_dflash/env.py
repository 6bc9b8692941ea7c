"""Every environment variable pyllama_dflash reads, in one place, with what it does.

Modules import the names from here; nothing else spells ``PYLLAMA_DFLASH_*``.
"""

from __future__ import annotations

import os

CACHE_ENV = "PYLLAMA_DFLASH_CACHE"  # the build cache (default: $XDG_CACHE_HOME/pyllama-dflash)
PATCHES_ENV = "PYLLAMA_DFLASH_PATCHES"  # another patch series folder (default: the checkout's patches/)
BACKEND_ENV = "PYLLAMA_DFLASH_BACKEND"  # auto | cpu | cuda: the backend builds and loads use
CPU_ENV = "PYLLAMA_DFLASH_CPU"  # native | avx2 | portable: the CPU a build targets, and the one a lookup prefers
LIB_DIR_ENV = "PYLLAMA_DFLASH_LIB_DIR"  # a variant's library folder, for a process that did not load() one
THREADS_ENV = "PYLLAMA_DFLASH_THREADS"  # threads per context (runners that start several children set it)
GGUF_PY_ENV = "PYLLAMA_DFLASH_GGUF_PY"  # a llama.cpp gguf-py folder for the tiny models (default: the pinned tree's)
FUZZ_EXAMPLES_ENV = "PYLLAMA_DFLASH_FUZZ_EXAMPLES"  # fuzzer examples per variant (default 50)
FUZZ_SEED_ENV = "PYLLAMA_DFLASH_FUZZ_SEED"  # fuzzer seed (default 0, so CI is deterministic)
JOBS_ENV = "PYLLAMA_DFLASH_JOBS"  # parallel compile jobs for the test suite's builds
SKIP_BUILD_ENV = "PYLLAMA_DFLASH_SKIP_BUILD"  # `pip install .` without building the variants
CUDA_BUILD_TEST_ENV = "PYLLAMA_DFLASH_TEST_CUDA_BUILD"  # 1: the test suite builds every variant with CUDA too
CUDA_ARCH_ENV = "PYLLAMA_DFLASH_CUDA_ARCH"  # CMAKE_CUDA_ARCHITECTURES for that test (default 90)
MUTATION_TEST_ENV = "PYLLAMA_DFLASH_TEST_MUTATION"  # 1: the test suite runs the whole mutation testing
FUZZ_BUDGET_TEST_ENV = "PYLLAMA_DFLASH_TEST_FUZZ_BUDGET"  # 1: the test suite fuzzes the fix at 5 seeds x 1000
SOAK_TEST_ENV = "PYLLAMA_DFLASH_TEST_SOAK"  # 1: the test suite runs the full soak (600 requests)


def get(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None
