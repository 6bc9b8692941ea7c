"""Choosing the backend (CPU or CUDA) and the CMake arguments a variant is built with."""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...env import BACKEND_ENV
from ...errors import ToolchainError
from . import cpu

BACKENDS = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class CublasWheel:
    """cuBLAS from an installed ``nvidia-cublas`` wheel, for a toolkit that has nvcc but no cuBLAS.

    The wheel has only versioned libraries (``libcublas.so.13``), which find_library does not
    look for, so they are handed to FindCUDAToolkit as its cache variables, the headers to nvcc
    as a system include folder, and the folder to the linker as an rpath of the built libraries:
    nothing is written into the toolkit or the wheel.
    """

    include_dir: str
    lib_dir: str
    cublas: str
    cublas_lt: str

    def cmake_args(self) -> list[str]:
        return [
            f"-DCUDA_cublas_LIBRARY={self.cublas}",
            f"-DCUDA_cublasLt_LIBRARY={self.cublas_lt}",
            f"-DCMAKE_CUDA_FLAGS=-isystem {self.include_dir}",
        ]


@dataclass(frozen=True)
class Toolchain:
    backend: str  # cpu | cuda
    cmake_args: tuple[str, ...]  # from CMAKE_ARGS, passed through verbatim
    cuda_arch: str | None
    generator: str  # Ninja | Unix Makefiles
    cpu: str = "native"  # native | avx2 | portable (see cpu.py)
    cpu_features: tuple[str, ...] = ()  # what a native or avx2 build uses: part of its key
    cublas: CublasWheel | None = None  # CUDA: cuBLAS from a wheel, the toolkit having none
    cuda_lib_dir: str | None = None  # CUDA: the toolkit's runtime libraries, an rpath of the build
    cuda_driver_stub: bool = False  # CUDA: libcuda can be linked (else GGML_CUDA_NO_VMM)

    def key(self) -> dict:
        key = {
            "backend": self.backend,
            "cmake_args": list(self.cmake_args),
            "cuda_arch": self.cuda_arch,
            "cpu": self.cpu,
            "cpu_features": list(self.cpu_features),
        }
        if self.backend == "cuda":  # a CPU build's key stays what it was
            key["cublas"] = self.cublas.lib_dir if self.cublas else "toolkit"
            key["cuda_driver_stub"] = self.cuda_driver_stub
        return key


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
            # the GPU first: probing the toolkit runs nvcc, which a CPU build should not wait for
            "cuda" if _cuda_requested_by(args) or (nvidia_gpu_present() and cuda_toolkit_problems() == []) else "cpu"
        )
    if backend == "cuda":
        problems = cuda_toolkit_problems()
        if problems:
            raise ToolchainError("--backend cuda: this machine cannot build ggml-cuda: " + "; ".join(problems))
    if shutil.which("cmake") is None:
        raise ToolchainError("cmake not found on PATH (install cmake >= 3.18)")
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    chosen = cpu.mode(cpu_mode)
    features = cpu.features(chosen)
    if backend != "cuda":
        return Toolchain(backend, args, None, generator, chosen, features)
    root = _cuda_root()
    return Toolchain(
        backend,
        args,
        cuda_arch,
        generator,
        chosen,
        features,
        cublas=None if _toolkit_cublas(root) else cublas_wheel(),
        cuda_lib_dir=str(root / "lib64") if root and (root / "lib64").is_dir() else None,
        cuda_driver_stub=bool(root and glob.glob(str(root / "lib64" / "stubs" / "libcuda.so"))),
    )


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


def _cuda_root() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME or $CUDA_PATH, /usr/local/cuda, else where nvcc on PATH lives
    (an nvcc on PATH may be a wrapper script elsewhere, so the toolkit's own folders come first)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and os.access(Path(candidate) / "bin" / "nvcc", os.X_OK):
            return Path(candidate).resolve()
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def _toolkit_cublas(root: Path | None) -> bool:
    patterns = ["lib64/libcublas.so*", "lib/libcublas.so*", "targets/*/lib/libcublas.so*", "lib/x64/cublas.lib"]
    return bool(root) and any(glob.glob(str(root / p)) for p in patterns)


@functools.cache
def _nvcc_major(root: Path) -> str | None:
    """nvcc's major version (run once per toolkit and process: every probe of the toolkit needs it)."""
    try:
        out = subprocess.run([str(root / "bin" / "nvcc"), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.", out.stdout)
    return m.group(1) if m else None


def cublas_wheel() -> CublasWheel | None:
    """cuBLAS from an installed nvidia-cublas wheel that matches nvcc's major version: the CUDA 13
    layout (``nvidia/cu13/{include,lib}``) or the CUDA 12 one (``nvidia/cublas/{include,lib}``)."""
    root = _cuda_root()
    major = _nvcc_major(root) if root else None
    if major is None:
        return None
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec and spec.submodule_search_locations else ():
        for sub in (f"cu{major}", "cublas"):
            inc, lib = Path(base) / sub / "include", Path(base) / sub / "lib"
            cublas, cublas_lt = lib / f"libcublas.so.{major}", lib / f"libcublasLt.so.{major}"
            if (inc / "cublas_v2.h").is_file() and cublas.is_file() and cublas_lt.is_file():
                return CublasWheel(str(inc), str(lib), str(cublas), str(cublas_lt))
    return None


def cuda_toolkit_problems() -> list[str]:
    """What is missing for a CUDA build of ggml: nvcc, and cuBLAS (ggml-cuda links it) in the
    toolkit or from an installed nvidia-cublas wheel."""
    root = _cuda_root()
    if root is None:
        return ["nvcc not found (install the CUDA toolkit or put its bin/ on PATH)"]
    if not _toolkit_cublas(root) and cublas_wheel() is None:
        major = _nvcc_major(root) or "?"
        return [
            f"cuBLAS not found: the CUDA toolkit at {root} has nvcc (CUDA {major}) but no libcublas, and no "
            f"nvidia-cublas wheel for CUDA {major} is installed; install the toolkit's cuBLAS, or the wheel "
            "with: pip install 'pyllama-dflash[cuda]'"
        ]
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
    args += cpu.cmake_args(tc.cpu)
    if tc.backend == "cuda":
        args.append("-DGGML_CUDA=ON")
        root = _cuda_root()
        if root is not None:  # the toolkit's own nvcc: CMake derives the toolkit's folders from it
            args += [f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={root}"]
        if tc.cuda_arch:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={tc.cuda_arch}")
        if not tc.cuda_driver_stub:
            # without libcuda (no driver, no stub) ggml-cuda cannot link the driver API it needs for
            # virtual memory; its memory pool then takes the cudaMalloc path. It is also what lets
            # the built libraries load on a machine without a driver (CPU only)
            args.append("-DGGML_CUDA_NO_VMM=ON")
        if tc.cublas:
            args += tc.cublas.cmake_args()
        rpath = [d for d in (tc.cublas.lib_dir if tc.cublas else None, tc.cuda_lib_dir) if d]
        if rpath:
            args.append(f"-DCMAKE_BUILD_RPATH={';'.join(rpath)}")  # with $ORIGIN (CMAKE_BUILD_RPATH_USE_ORIGIN)
    return args + list(tc.cmake_args)
