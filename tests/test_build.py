"""The build machinery on the real pinned tree: staging, verification, no-op rebuilds."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_dflash.files import file_lock, sha256_file
from pyllama_dflash.llamabuild import manifest as manifest_mod
from pyllama_dflash.llamabuild import pinned, toolchain
from pyllama_dflash.llamabuild.patchset import apply_series, load_series, tree_reader
from pyllama_dflash.llamabuild.stage import Stage
from pyllama_dflash.paths import cache_root

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"


def build_py(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=3600,
    )


def test_staging_leaves_the_pristine_tree_byte_identical(pristine, tmp_path):
    series = load_series(REPO / "patches")
    target = pristine / "common" / "speculative.cpp"
    links_before = os.stat(target).st_nlink
    stage = Stage(tmp_path / "stage", pristine)
    stage.ensure(lambda _m: None)
    assert os.stat(target).st_nlink == links_before + 1  # the stage shares the inode ...
    contents = apply_series(tree_reader(pristine), series.patches)
    assert sorted(stage.sync(contents, series.touched)) == sorted(series.touched)  # every file the series changes
    staged = stage.root / "common" / "speculative.cpp"
    assert os.stat(target).st_nlink == links_before  # ... until the patched copy replaces it
    assert staged.read_text() == contents["common/speculative.cpp"] != target.read_text()
    for rel, digest in pinned.FILES.items():
        assert sha256_file(pristine / rel) == digest
    # back to baseline: the staged file holds the pristine bytes again, as a copy
    assert sorted(stage.sync({}, series.touched)) == sorted(series.touched)
    assert not (stage.root / "tests" / "test-speculative-dflash-image.cpp").exists()  # a file the series adds goes
    assert staged.read_bytes() == target.read_bytes()
    assert stage.sync({}, series.touched) == []  # nothing left to rewrite


def test_a_patch_that_does_not_apply_is_named_with_its_hunk():
    proc = build_py("--check", "--patches", str(DATA / "broken-patches"))
    assert proc.returncode == 2, proc.stderr
    assert "0001-wrong-context.patch: common/speculative.cpp: hunk #1 (@@ -27,6 +27,7 @@) does not apply" in proc.stderr


def test_the_project_series_applies():
    proc = build_py("--check")
    assert proc.returncode == 0, proc.stderr
    assert "0001-speculative-dflash-zero-fill-image-hole.patch: applies" in proc.stdout


def test_a_fingerprint_mismatch_is_refused(pristine, tmp_path):
    tree = tmp_path / "llama.cpp"
    Stage(tree, pristine).ensure(lambda _m: None)
    batch = tree / "src" / "llama-batch.cpp"
    text = batch.read_text()
    batch.unlink()  # break the hard link before editing
    batch.write_text(text + "\n// not b11434\n")
    proc = build_py("--check", "--llama-dir", str(tree))
    assert proc.returncode == 2
    assert f"is not llama.cpp {pinned.RELEASE}" in proc.stderr and "src/llama-batch.cpp" in proc.stderr
    assert "--allow-unpinned" in proc.stderr
    assert build_py("--check", "--llama-dir", str(tree), "--allow-unpinned").returncode == 0


def test_a_tree_that_is_not_llama_cpp_is_refused(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    proc = build_py("--check", "--llama-dir", str(tmp_path))
    assert proc.returncode == 2
    assert f"--llama-dir {tmp_path}: not a llama.cpp source tree" in proc.stderr and "include/llama.h" in proc.stderr


def test_an_unknown_variant_is_refused():
    proc = build_py("--variant", "no-such-variant")
    assert proc.returncode == 2
    assert "unknown variant 'no-such-variant'" in proc.stderr and "baseline" in proc.stderr


def test_a_second_build_is_a_no_op(variants):
    before = {name: m.path.stat().st_mtime_ns for name, m in variants.items()}
    proc = build_py("--variant", "all")
    assert proc.returncode == 0, proc.stderr
    for name in variants:
        assert f"{name}: up to date" in proc.stderr
    assert "compile" not in proc.stderr
    assert {name: m.path.stat().st_mtime_ns for name, m in variants.items()} == before


def test_list_shows_every_variant_built(variants):
    proc = build_py("--list")
    assert proc.returncode == 0
    for name, m in variants.items():
        assert f"{name:12s} built     {m.lib_dir}" in proc.stdout


def test_manifests_record_provenance_and_patches(variants):
    base, fixed = variants["baseline"], variants["zero-fill"]
    for m in (base, fixed):
        assert m.data["source"]["fingerprint"] == pinned.FILES
        assert m.data["source"]["pinned"] is True
        assert m.binary("llama-server").is_file() and os.access(m.binary("llama-server"), os.X_OK)
        assert m.bindings.is_file()
    # baseline carries the series' C++ test (patch 0004, for every variant) and no fix
    test_patch = "0004-tests-dflash-drafting-across-images.patch"
    assert [p["name"] for p in base.data["patches"]] == [test_patch]
    assert [p["name"] for p in fixed.data["patches"]] == [
        "0001-speculative-dflash-zero-fill-image-hole.patch",
        test_patch,
    ]
    assert base.data["ctest"] == {
        "test": "test-speculative-dflash-image",
        "binary": "test-speculative-dflash-image",
        "labels": "main",
    }
    assert base.lib_dir != fixed.lib_dir
    # the variants really differ where the patch does: libllama-common, not libllama
    assert sha256_file(base.library("llama-common")) != sha256_file(fixed.library("llama-common"))


@pytest.mark.parametrize("variant", ["baseline", "zero-fill", "full"])
def test_each_variant_loads_from_python_and_reports_system_info(variants, variant):
    code = (
        f"import pyllama_dflash as p; m = p.load({variant!r}); from pyllama_dflash import api; "
        "print(m.lib_dir); print(api.system_info())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lib_dir, info = proc.stdout.split("\n", 1)
    assert lib_dir == str(variants[variant].lib_dir)
    assert "CPU :" in info


def test_a_second_variant_in_one_process_is_refused(variants):
    code = "import pyllama_dflash as p; p.load('baseline'); p.load('full')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "already loaded in this process" in proc.stderr and "one variant per process" in proc.stderr


def test_a_test_series_builds_incrementally_beside_the_project_variants(variants):
    for old in manifest_mod.variants_root().glob("test-comment-*"):
        shutil.rmtree(old)  # a previous run's: this test wants to see the incremental build
    work = cache_root() / "work" / variants["baseline"].data["build_key"]
    with file_lock(work / "lock"):  # put the shared stage back to baseline content first
        Stage(work / "llama.cpp", Path(variants["baseline"].data["source"]["path"])).sync(
            {}, ["common/speculative.cpp"]
        )
    proc = build_py("--patches", str(DATA / "test-patches"), "--variant", "test-comment", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    built = {line.split()[0]: Path(line.split()[-1]) for line in proc.stdout.splitlines() if line.strip()}
    test_dir = built["test-comment"]
    manifest = json.loads((test_dir / "manifest.json").read_text())
    assert [p["name"] for p in manifest["patches"]] == ["0001-test-comment.patch"]
    assert manifest["build_key"] == variants["baseline"].data["build_key"]  # same build folder
    # an incremental build: only common/speculative.cpp was rewritten, not a second full build
    assert manifest["files_rewritten"] == ["common/speculative.cpp"]
    steps = [int(m) for m in re.findall(r"compile \[\d+/(\d+)\]", proc.stderr)]
    assert steps and max(steps) < 20, steps  # a cold build has over 200 steps
    assert sha256_file(test_dir / "libllama.so") == sha256_file(variants["baseline"].library("llama"))
    # the project's variants are untouched by it
    again = build_py("--variant", "all")
    assert again.returncode == 0 and "compile" not in again.stderr


@pytest.mark.skipif(not toolchain.cuda_toolkit_problems(), reason="this machine has a complete CUDA toolkit")
def test_a_forced_cuda_build_without_a_toolkit_stops_before_configuring():
    proc = build_py("--backend", "cuda", "--variant", "baseline")
    assert proc.returncode == 2
    assert "--backend cuda: this machine cannot build ggml-cuda" in proc.stderr
    assert toolchain.cuda_toolkit_problems()[0] in proc.stderr
    assert "configure" not in proc.stderr and "fetch:" not in proc.stderr


def _fake_cublas_wheel(root: Path, layout: str, major: str) -> Path:
    """An installed nvidia-cublas wheel's files, empty: detection reads names, never contents."""
    base = root / "nvidia" / layout
    (base / "include").mkdir(parents=True)
    (base / "lib").mkdir()
    for f in ("include/cublas_v2.h", f"lib/libcublas.so.{major}", f"lib/libcublasLt.so.{major}"):
        (base / f).touch()
    return base


@pytest.mark.skipif(toolchain._cuda_root() is None, reason="no nvcc here: the wheel is matched to nvcc's version")
def test_cublas_from_a_wheel_is_found_for_the_toolkits_major_version(tmp_path, monkeypatch):
    major = toolchain._nvcc_major(toolchain._cuda_root())
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    base = _fake_cublas_wheel(tmp_path, f"cu{major}", major)
    wheel = toolchain.cublas_wheel()
    assert wheel is not None
    assert Path(wheel.lib_dir) == base / "lib"
    args = wheel.cmake_args()
    assert f"-DCUDA_cublas_LIBRARY={wheel.cublas}" in args and wheel.cublas.endswith(f"libcublas.so.{major}")
    assert any(a.startswith("-DCMAKE_CUDA_FLAGS=-isystem ") for a in args)


@pytest.mark.skipif(toolchain._cuda_root() is None, reason="no nvcc here: the message about cuBLAS needs one")
def test_a_missing_cublas_names_both_remedies(monkeypatch):
    # a toolkit without cuBLAS and no wheel to take it from, whatever this machine has
    monkeypatch.setattr(toolchain, "_toolkit_cublas", lambda root: False)
    monkeypatch.setattr(toolchain, "cublas_wheel", lambda: None)
    (problem,) = toolchain.cuda_toolkit_problems()
    assert "has nvcc (CUDA " in problem and "no libcublas" in problem
    assert "install the toolkit's cuBLAS" in problem and "pip install 'pyllama-dflash[cuda]'" in problem
