"""The CPU a build targets: the one place that reads CPU features, the compiler's and the host's.

A ``native`` build is compiled with llama.cpp's default ``GGML_NATIVE=ON`` (``-march=native``),
so it uses every instruction set the build machine has. Such a build dies with SIGILL on a CPU
that lacks one of them (a cached build restored on another runner, a wheel taken elsewhere,
valgrind, which cannot execute AVX-512). So a native build records the features
``-march=native`` enables here (the compiler's own predefined macros), they go into its build
key, and loading it where any is missing is refused, naming them.

An ``avx2`` build turns ``GGML_NATIVE`` off and keeps what ggml then enables by default (SSE4.2,
AVX, AVX2, BMI2, FMA, F16C; AVX-512 off): x86-64-v3, the CPU of an AVX2 machine without AVX-512.
Its float results round as such a machine's native build does, so on an AVX-512 machine it stands
in for one (a numeric bound tuned on AVX-512 is checked there). It records those features, and a
CPU that lacks one is refused as for a native build.

A ``portable`` build turns ``GGML_NATIVE`` off and every optional x86 instruction set with it
(SSE4.2, AVX, AVX2, BMI2, FMA, F16C; AVX-512 is off by default): the x86-64 baseline, which runs
on any x86-64 CPU. Upstream's release builds go further (every CPU variant of ggml built as a
dynamically loaded backend, the best chosen at run time); that costs a ggml-cpu compile per
variant, and this package loads one library set per variant, so it takes the baseline instead.

Only x86 is described: elsewhere a native build records no features and nothing is checked.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import shutil
import subprocess
from pathlib import Path

from ...env import CPU_ENV
from ...errors import ToolchainError

MODES = ("native", "avx2", "portable")

# the compiler's macro for each instruction set ggml can use, and its name in /proc/cpuinfo
_X86: dict[str, tuple[str, str]] = {
    "sse3": ("__SSE3__", "pni"),
    "ssse3": ("__SSSE3__", "ssse3"),
    "sse4.1": ("__SSE4_1__", "sse4_1"),
    "sse4.2": ("__SSE4_2__", "sse4_2"),
    "avx": ("__AVX__", "avx"),
    "avx2": ("__AVX2__", "avx2"),
    "fma": ("__FMA__", "fma"),
    "f16c": ("__F16C__", "f16c"),
    "bmi": ("__BMI__", "bmi1"),
    "bmi2": ("__BMI2__", "bmi2"),
    "avx512f": ("__AVX512F__", "avx512f"),
    "avx512bw": ("__AVX512BW__", "avx512bw"),
    "avx512cd": ("__AVX512CD__", "avx512cd"),
    "avx512dq": ("__AVX512DQ__", "avx512dq"),
    "avx512vl": ("__AVX512VL__", "avx512vl"),
    "avx512vbmi": ("__AVX512VBMI__", "avx512vbmi"),
    "avx512vbmi2": ("__AVX512VBMI2__", "avx512_vbmi2"),
    "avx512vnni": ("__AVX512VNNI__", "avx512_vnni"),
    "avx512bf16": ("__AVX512BF16__", "avx512_bf16"),
    "avx512ifma": ("__AVX512IFMA__", "avx512ifma"),
    "avx512bitalg": ("__AVX512BITALG__", "avx512_bitalg"),
    "avx512vpopcntdq": ("__AVX512VPOPCNTDQ__", "avx512_vpopcntdq"),
    "avxvnni": ("__AVXVNNI__", "avx_vnni"),
    "amx-tile": ("__AMX_TILE__", "amx_tile"),
    "amx-int8": ("__AMX_INT8__", "amx_int8"),
    "amx-bf16": ("__AMX_BF16__", "amx_bf16"),
}

# GGML_NATIVE off, the rest at ggml's defaults (ggml/CMakeLists.txt: INS_ENB), AVX-512 off as it is by
# default there, said outright so that no user CMAKE_ARGS default turns it on
AVX2_ARGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF")
# what such a build compiles for (ggml-cpu/CMakeLists.txt: -msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2)
AVX2_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "bmi2")

# GGML_NATIVE off turns these on by default (ggml/CMakeLists.txt: INS_ENB): a portable build
# turns them off again
PORTABLE_ARGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=OFF",
    "-DGGML_AVX=OFF",
    "-DGGML_AVX2=OFF",
    "-DGGML_BMI2=OFF",
    "-DGGML_FMA=OFF",
    "-DGGML_F16C=OFF",
)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def features(chosen: str) -> tuple[str, ...]:
    """The instruction sets a build in this mode uses, which a CPU that loads it must have."""
    if chosen == "native":
        return native_features()
    return AVX2_FEATURES if chosen == "avx2" and is_x86() else ()


def cmake_args(chosen: str) -> tuple[str, ...]:
    """What this mode adds to llama.cpp's CMake configuration (native: nothing, llama.cpp's default)."""
    return {"avx2": AVX2_ARGS, "portable": PORTABLE_ARGS}.get(chosen, ())


def mode(requested: str | None = None) -> str:
    """``--cpu``, else ``$PYLLAMA_DFLASH_CPU``, else native."""
    chosen = (requested or os.environ.get(CPU_ENV) or "native").lower()
    if chosen not in MODES:
        raise ToolchainError(f"--cpu {chosen!r}: expected one of {', '.join(MODES)} (or set {CPU_ENV})")
    return chosen


def _compiler() -> str:
    cc = shlex.split(os.environ.get("CC", ""))
    return cc[0] if cc else (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang") or "cc")


@functools.lru_cache(maxsize=4)
def native_features(compiler: str | None = None) -> tuple[str, ...]:
    """The instruction sets ``-march=native`` enables on this machine, as the compiler says
    (its predefined macros); empty off x86."""
    if not is_x86():
        return ()
    cc = compiler or _compiler()
    try:
        out = subprocess.run(
            [cc, "-march=native", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot ask the C compiler {cc} what -march=native enables: {e}") from None
    if out.returncode != 0:
        raise ToolchainError(f"{cc} -march=native -dM -E failed: {out.stderr.strip()[-300:]}")
    defined = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("#define ")}
    return tuple(name for name, (macro, _) in _X86.items() if macro in defined)


def host_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """This CPU's feature flags (/proc/cpuinfo), None where they cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def missing(features: list[str] | tuple[str, ...], flags: set[str] | None = None) -> list[str]:
    """The features a build was made for that this CPU lacks ([] where that cannot be told)."""
    flags = host_flags() if flags is None else flags
    if not flags or not is_x86():
        return []
    return [f for f in features if f in _X86 and _X86[f][1] not in flags]
