"""Build manifests: the only way the package finds a built variant.

Each built variant lives in ``<cache>/variants/<variant>-<build key>[-<series tag>]/`` with
its libraries, ``llama-server`` when it was asked for, the compiled bindings and
``manifest.json``, which is written last (atomically), so a folder without one is an
unfinished build. The series tag names a series other than the project's own
(builder.series_tag), so such builds never replace the project's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...env import BACKEND_ENV, CPU_ENV
from ...errors import VariantNotBuilt
from ...paths import cache_root
from . import cpu

MANIFEST = "manifest.json"
SCHEMA = 2  # 2: "ctest" lists the C++ tests built (1: one test, or null)


@dataclass(frozen=True)
class Manifest:
    path: Path
    data: dict

    @property
    def variant(self) -> str:
        return self.data["variant"]

    @property
    def lib_dir(self) -> Path:
        return self.path.parent

    @property
    def backend(self) -> str:
        return self.data["backend"]

    @property
    def cpu_mode(self) -> str | None:
        """native | avx2 | portable; None for a build made before the CPU was recorded."""
        return (self.data.get("cpu") or {}).get("mode")

    @property
    def cpu_features(self) -> list[str]:
        return list((self.data.get("cpu") or {}).get("features", []))

    def has_binary(self, name: str) -> bool:
        return name in self.data.get("binaries", {})

    def binary(self, name: str = "llama-server") -> Path:
        if not self.has_binary(name):
            raise VariantNotBuilt(
                f"{self.lib_dir}: variant {self.variant!r} was built without {name}; build it with: "
                f"python build.py --variants {self.variant} --server (incremental)"
            )
        return self.lib_dir / self.data["binaries"][name]

    def library(self, name: str) -> Path:
        return self.lib_dir / self.data["libraries"][name]

    @property
    def bindings(self) -> Path:
        return self.lib_dir / self.data["bindings"]

    def problems(self, expected_inputs: dict | None = None) -> list[str]:
        """Why this build cannot be used: missing files, or inputs that changed since."""
        out = []
        if self.data.get("schema") != SCHEMA:
            out.append(f"manifest schema {self.data.get('schema')} != {SCHEMA}")
            return out
        files = [*self.data["libraries"].values(), *self.data["binaries"].values(), self.data["bindings"]]
        for rel in files:
            if not (self.lib_dir / rel).is_file():
                out.append(f"{self.lib_dir / rel} is missing")
        if expected_inputs is not None:
            for key, value in expected_inputs.items():
                if self.data.get("inputs", {}).get(key) != value:
                    out.append(f"{key} changed since this build")
        if self.cpu_mode is None:
            out.append("built before builds recorded the CPU they target: it may use instructions this CPU lacks")
        lacking = cpu.missing(self.cpu_features)
        if lacking:
            how = "-march=native on" if self.cpu_mode == "native" else f"--cpu {self.cpu_mode} for"
            out.append(
                f"built with {how} a CPU with {', '.join(lacking)}, which this CPU lacks "
                "(loading it would die of SIGILL)"
            )
        return out


def read(path: Path) -> Manifest | None:
    try:
        return Manifest(path, json.loads(path.read_text()))
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError):
        return None


def variants_root() -> Path:
    return cache_root() / "variants"


def all_manifests() -> list[Manifest]:
    root = variants_root()
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        m = read(entry / MANIFEST)
        if m is not None:
            found.append(m)
    return found


def find(
    variant: str,
    *,
    backend: str | None = None,
    expected_inputs: dict | None = None,
    cpu_mode: str | None = None,
    binaries: tuple[str, ...] = (),
    series_tag: str | None = None,
) -> Manifest:
    """The newest valid build of ``variant`` (optionally for one backend, one CPU mode); a native
    build is preferred to an avx2 or portable one unless ``cpu_mode`` (or $PYLLAMA_DFLASH_CPU) asks, and with
    no backend asked for, a CUDA build only where an NVIDIA GPU is present."""
    backend = backend or os.environ.get(BACKEND_ENV) or None
    if backend == "auto":
        backend = None
    cpu_mode = cpu_mode or os.environ.get(CPU_ENV) or None
    candidates, rejected = [], []
    for m in all_manifests():
        if m.variant != variant or (backend and m.backend != backend) or (cpu_mode and m.cpu_mode != cpu_mode):
            continue
        problems = m.problems(expected_inputs) + [f"built without {b}" for b in binaries if not m.has_binary(b)]
        (rejected.append(f"{m.lib_dir.name}: {'; '.join(problems)}") if problems else candidates.append(m))
    if not candidates:
        why = f" (stale or broken builds: {' | '.join(rejected)})" if rejected else ""
        on = f" for backend {backend}" if backend else ""
        raise VariantNotBuilt(
            f"variant {variant!r} is not built{on}{f' for --cpu {cpu_mode}' if cpu_mode else ''} in "
            f"{variants_root()}{why}; run: python build.py --variants {variant}"
            f"{f' --cpu {cpu_mode}' if cpu_mode else ''}{' --server' if binaries else ''} "
            "(--cpu portable: a build that runs on any x86-64 CPU)"
        )
    if backend is None and len({m.backend for m in candidates}) > 1:
        # CPU and CUDA builds side by side, and no backend asked for: the one auto would build here
        from .toolchain import nvidia_gpu_present

        wanted = "cuda" if nvidia_gpu_present() else "cpu"
    else:
        wanted = None
    # a build of the series asked for before one of another series with the same patches
    same_series = lambda m: m.data.get("series_tag") == series_tag
    return max(
        candidates,
        key=lambda m: (m.backend == wanted, same_series(m), m.cpu_mode == "native", m.data.get("built_at", "")),
    )
