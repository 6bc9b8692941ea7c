"""Choosing the backend (CPU or CUDA) and the CMake arguments a variant is built with."""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..env import BACKEND_ENV
from ..errors import ToolchainError
from . import cpu

BACKENDS = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Toolchain:
    backend: str  # cpu | cuda
    cmake_args: tuple[str, ...]  # from CMAKE_ARGS, passed through verbatim
    cuda_arch: str | None
    generator: str  # Ninja | Unix Makefiles
    cpu: str = "native"  # native | portable (see cpu.py)
    cpu_features: tuple[str, ...] = ()  # what a native build may use: part of its key

    def key(self) -> dict:
        return {
            "backend": self.backend,
            "cmake_args": list(self.cmake_args),
            "cuda_arch": self.cuda_arch,
            "cpu": self.cpu,
            "cpu_features": list(self.cpu_features),
        }


def user_cmake_args() -> tuple[str, ...]:
    return tuple(shlex.split(os.environ.get("CMAKE_ARGS", "")))


def _cuda_requested_by(cmake_args: tuple[str, ...]) -> bool:
    return any(
        a.upper().replace(" ", "") in ("-DGGML_CUDA=ON", "-DGGML_CUDA=1", "-DGGML_CUDA=TRUE") for a in cmake_args
    )


def select(backend: str | None = None, cuda_arch: str | None = None, cpu_mode: str | None = None) -> Toolchain:
    """Resolve ``auto`` and check that the chosen backend can really be built here."""
    backend = (backend or os.environ.get(BACKEND_ENV) or "auto").lower()
    if backend not in BACKENDS:
        raise ToolchainError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    args = user_cmake_args()
    if backend == "auto":
        backend = (
            "cuda" if _cuda_requested_by(args) or (cuda_toolkit_problems() == [] and nvidia_gpu_present()) else "cpu"
        )
    if backend == "cuda":
        problems = cuda_toolkit_problems()
        if problems:
            raise ToolchainError("--backend cuda: this machine cannot build ggml-cuda: " + "; ".join(problems))
    if shutil.which("cmake") is None:
        raise ToolchainError("cmake not found on PATH (install cmake >= 3.18)")
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    chosen = cpu.mode(cpu_mode)
    features = cpu.native_features() if chosen == "native" else ()
    return Toolchain(backend, args, cuda_arch if backend == "cuda" else None, generator, chosen, features)


def nvidia_gpu_present() -> bool:
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def cuda_toolkit_problems() -> list[str]:
    """What is missing for a CUDA build of ggml: nvcc and cuBLAS (ggml-cuda links it)."""
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)
    if nvcc is None:
        return ["nvcc not found (install the CUDA toolkit or put its bin/ on PATH)"]
    root = Path(nvcc).resolve().parent.parent
    patterns = ["lib64/libcublas.so*", "lib/libcublas.so*", "targets/*/lib/libcublas.so*", "lib/x64/cublas.lib"]
    if not any(glob.glob(str(root / p)) for p in patterns):
        return [f"cuBLAS not found in the CUDA toolkit at {root} (nvcc is there, libcublas is not)"]
    return []


def cmake_configure_args(tc: Toolchain, llama_dir: Path, build_number: int | None, commit: str | None) -> list[str]:
    args = [
        "-G",
        tc.generator,
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DLLAMA_CPP_DIR={llama_dir}",
        "-DBUILD_SHARED_LIBS=ON",
        # binaries and libraries land together in bin/ with an $ORIGIN rpath, so a
        # variant's outputs can be copied out of the shared build folder and still load
        "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
        "-DLLAMA_BUILD_COMMON=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        # configured so the series' own C++ test (ctest.py) can be built; upstream's are never built
        "-DLLAMA_BUILD_TESTS=ON",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DGGML_CCACHE=OFF",
    ]
    if build_number is not None:
        args.append(f"-DLLAMA_BUILD_NUMBER={build_number}")
    if commit:
        args.append(f"-DLLAMA_BUILD_COMMIT={commit[:8]}")
    if tc.cpu == "portable":
        args += cpu.PORTABLE_ARGS
    if tc.backend == "cuda":
        args.append("-DGGML_CUDA=ON")
        if tc.cuda_arch:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={tc.cuda_arch}")
    return args + list(tc.cmake_args)
