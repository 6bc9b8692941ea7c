"""Build manifests: the only way the package finds a built variant.

Each built variant lives in ``<cache>/variants/<variant>-<build key>/`` with its
libraries, ``llama-server``, the compiled bindings and ``manifest.json``, which is
written last (atomically), so a folder without one is an unfinished build.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..env import BACKEND_ENV
from ..errors import VariantNotBuilt
from ..paths import cache_root

MANIFEST = "manifest.json"
SCHEMA = 1


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

    def binary(self, name: str = "llama-server") -> Path:
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


def find(variant: str, *, backend: str | None = None, expected_inputs: dict | None = None) -> Manifest:
    """The newest valid build of ``variant`` (optionally for one backend)."""
    backend = backend or os.environ.get(BACKEND_ENV) or None
    if backend == "auto":
        backend = None
    candidates, rejected = [], []
    for m in all_manifests():
        if m.variant != variant or (backend and m.backend != backend):
            continue
        problems = m.problems(expected_inputs)
        (rejected.append(f"{m.lib_dir.name}: {'; '.join(problems)}") if problems else candidates.append(m))
    if not candidates:
        why = f" (stale or broken builds: {' | '.join(rejected)})" if rejected else ""
        on = f" for backend {backend}" if backend else ""
        raise VariantNotBuilt(
            f"variant {variant!r} is not built{on} in {variants_root()}{why}; run: python build.py --variant {variant}"
        )
    return max(candidates, key=lambda m: m.data.get("built_at", ""))
