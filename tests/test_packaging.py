"""What a non-editable install carries: the patch series, the native sources, every subpackage.

``pip install .`` builds the variants from what the wheel holds (setup.py); an installed
package must find its patch series without the checkout. The wheel is built from a copy of
the tracked files, with the variant build skipped (that part is what every other test covers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from pyllama_dflash.product.llamabuild.patchset import load_series

REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_the_series_the_native_sources_and_every_package(tmp_path):
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for rel in tracked:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYLLAMA_DFLASH_SKIP_BUILD": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("pyllama_dflash-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    series = load_series(REPO / "patches")
    assert {"pyllama_dflash/_patches/series", "pyllama_dflash/_patches/pulls"} <= names
    assert {f"pyllama_dflash/_patches/{p.name}" for p in series.patches} <= names
    for native in ("CMakeLists.txt", "shim.cpp", "pyllama_dflash_shim.h"):
        assert f"pyllama_dflash/product/native/{native}" in names
    decls = {p.name for p in (REPO / "pyllama_dflash" / "bindings" / "decl").glob("*.h")}
    assert {f"pyllama_dflash/product/bindings/decl/{d}" for d in decls} <= names
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "pyllama_dflash").rglob("__init__.py")}
    assert {f"{pkg}/__init__.py" for pkg in packages} <= names, sorted(packages)
