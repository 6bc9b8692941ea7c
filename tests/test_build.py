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

from pyllama_dflash.env import CPU_ENV
from pyllama_dflash.errors import VariantNotBuilt
from pyllama_dflash.files import file_lock, sha256_file
from pyllama_dflash.paths import cache_root
from pyllama_dflash.product.llamabuild import BuildOptions, pinned, toolchain
from pyllama_dflash.product.llamabuild import manifest as manifest_mod
from pyllama_dflash.product.llamabuild.builder import holding_stage
from pyllama_dflash.product.llamabuild.builder import stage as stage_variant
from pyllama_dflash.product.llamabuild.patchset import apply_series, load_series, tree_reader
from pyllama_dflash.product.llamabuild.stage import Stage

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


_TAKE_LOCK = """
import fcntl, sys
with open(sys.argv[1], "a+") as f:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[2] == "now" else 0))
    except BlockingIOError:
        sys.exit(3)
"""


def _another_process_takes(lock: Path, now: bool) -> bool:
    """Whether another process takes the shared build folder's lock: at once (``now``), or at all, waiting for
    whatever other build of this cache holds it meanwhile."""
    proc = subprocess.run([sys.executable, "-c", _TAKE_LOCK, str(lock), "now" if now else "wait"], timeout=1800)
    return proc.returncode == 0


def test_a_stage_held_keeps_other_builds_out_until_its_block_ends(variants):
    """What runs on a staged folder (a pull request's side: ctest, llama-server) finds the variant there only if
    no other build stages the folder anew meanwhile: holding_stage keeps the folder's lock until its block ends,
    stage() lets it go when it returns."""
    opts = BuildOptions(cpu=os.environ.get(CPU_ENV) or "native", quiet=True)
    lock = cache_root() / "work" / variants["baseline"].data["build_key"] / "lock"
    with holding_stage("baseline", opts) as staged:
        assert (staged.tree / "common" / "speculative.cpp").is_file()
        assert not _another_process_takes(lock, now=True)
    assert _another_process_takes(lock, now=False)
    stage_variant("baseline", opts)
    assert _another_process_takes(lock, now=False)


def test_staging_leaves_the_pristine_tree_byte_identical(pristine, tmp_path):
    series = load_series(REPO / "patches")
    target = pristine / "common" / "speculative.cpp"
    stage = Stage(tmp_path / "stage", pristine)
    stage.ensure(lambda _m: None)
    staged = stage.root / "common" / "speculative.cpp"
    # the same inode, not a link count: other builds on this machine may link the shared tree meanwhile
    assert os.path.samefile(staged, target)  # the stage shares the inode ...
    contents = apply_series(tree_reader(pristine), series.prefix(series.variants[-1]))
    assert sorted(stage.sync(contents, series.touched)) == sorted(series.touched)  # every file the series changes
    assert not os.path.samefile(staged, target)  # ... until the patched copy replaces it
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
    assert "0003-speculative-dflash-zero-fill-image-hole.patch: applies" in proc.stdout
    assert "every patch applies with only the prerequisites its header names" in proc.stdout
    # what an additive series would bring to 0: the lines later fix patches take out of earlier ones; and
    # apart, what a variant aside takes out of the fixes it stands on (0007 of 0004's path)
    assert re.search(r"lines a fix patch removes that an earlier fix patch added: \d+", proc.stdout)
    assert re.search(r"lines a variant aside removes of the patches it stands on .*: [1-9]\d*", proc.stdout)


@pytest.mark.slow
def test_every_patch_builds_with_only_the_prerequisites_its_header_names(variants):
    """What upstream may take one patch at a time: each patch compiled on b11434 with only the patches its
    header names, llama-server where one of them touches it, and the C++ test a test patch brings."""
    series = load_series(REPO / "patches")
    proc = build_py("--alone", "--cpu", os.environ.get(CPU_ENV) or "native")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [ln.split(" ", 1)[0] for ln in lines] == [p.name for p in series.patches], lines
    assert all(": builds (libraries" in ln for ln in lines), lines
    by_number = {ln[:4]: ln for ln in lines}
    assert "(prerequisites: none)" in by_number["0001"] and "llama-server" not in by_number["0001"]
    assert "test-speculative-eagle3-passes" in by_number["0002"]
    assert "(prerequisites: none)" in by_number["0005"] and "llama-server" in by_number["0005"]
    assert "(prerequisites: none)" in by_number["0004"]
    assert "(prerequisites: 0001, 0004, 0005)" in by_number["0007"]
    # the tests of 0008 and 0009: 0011 changes 0006's test, 0012 compiles on b11434 without 0009
    assert "(prerequisites: 0006)" in by_number["0011"] and "test-speculative-dflash-image" in by_number["0011"]
    assert "(prerequisites: none)" in by_number["0012"] and "test-speculative-mtp-image" in by_number["0012"]
    # 0005's test is of llama-server's kind: a Python file, nothing to compile
    assert "(prerequisites: none)" in by_number["0013"]
    assert "(prerequisites: 0010)" in by_number["0014"]


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
    proc = build_py("--variants", "baseline,no-such-variant")
    assert proc.returncode == 2
    assert "unknown variant 'no-such-variant'" in proc.stderr and "baseline" in proc.stderr


def test_the_old_repeated_variant_flag_still_builds_and_names_the_new_one():
    """--variant NAME, repeatable, was build's flag before --variants LIST, which the other tools take."""
    proc = build_py("--variant", "baseline", "--variant", "no-such-variant")
    assert proc.returncode == 2
    assert "--variant is now --variants" in proc.stderr and "unknown variant 'no-such-variant'" in proc.stderr


def test_a_second_build_is_a_no_op(variants):
    before = {name: m.path.stat().st_mtime_ns for name, m in variants.items()}
    proc = build_py("--variants", "all")
    assert proc.returncode == 0, proc.stderr
    for name in variants:
        assert f"{name}: up to date" in proc.stderr
    assert "compile" not in proc.stderr
    assert {name: m.path.stat().st_mtime_ns for name, m in variants.items()} == before


def test_list_shows_every_variant_built(variants):
    proc = build_py("--list")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    for name, m in variants.items():
        assert any(ln.startswith(f"{name:12s} built ") and ln.endswith(f"  {m.lib_dir}") for ln in lines), lines


def test_manifests_record_provenance_and_patches(variants):
    base, fixed = variants["baseline"], variants["zero-fill"]
    for m in (base, fixed):
        assert m.data["source"]["fingerprint"] == pinned.FILES
        assert m.data["source"]["pinned"] is True
        assert m.binary("llama-server").is_file() and os.access(m.binary("llama-server"), os.X_OK)
        assert m.bindings.is_file()
    # baseline carries the series' tests (patches 0002 and 0006, C++, and 0010, llama-server's kind, for every
    # variant) and no fix; the first variant carries 0001 too (a fix every later variant carries), then its own
    tests = [
        "0002-tests-eagle3-drafting-after-a-prompt-split-into-passes.patch",
        "0006-tests-dflash-drafting-across-images.patch",
        "0010-tests-server-dflash-drafting-across-an-image.patch",
    ]
    assert [p["name"] for p in base.data["patches"]] == tests
    assert [p["name"] for p in fixed.data["patches"]] == [
        "0001-speculative-eagle3-decode-the-bridged-row-from-a-copy.patch",
        "0003-speculative-dflash-zero-fill-image-hole.patch",
        *tests,
    ]
    assert base.data["ctest"] == [
        {"test": test, "binary": test, "labels": "main"}
        for test in ("test-speculative-eagle3-passes", "test-speculative-dflash-image")
    ]
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
    # the shared folder back to baseline, compiled, first: the last variant built there may have changed
    # libllama's headers (0009), whose undoing recompiles most of the tree, which is not the build measured
    stage_variant("baseline", BuildOptions(cpu=os.environ.get(CPU_ENV) or "native", quiet=True))
    work = cache_root() / "work" / variants["baseline"].data["build_key"]
    with file_lock(work / "lock"):  # then every file back to pristine content: the test series' base
        Stage(work / "llama.cpp", Path(variants["baseline"].data["source"]["path"])).sync(
            {}, ["common/speculative.cpp"]
        )
    proc = build_py("--patches", str(DATA / "test-patches"), "--variants", "test-comment", "--jobs", "2")
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
    again = build_py("--variants", "all")
    assert again.returncode == 0 and "compile" not in again.stderr
    shutil.rmtree(test_dir)  # 19 MB in the shared cache that nothing else reads


@pytest.mark.skipif(not toolchain.cuda_toolkit_problems(), reason="this machine has a complete CUDA toolkit")
def test_a_forced_cuda_build_without_a_toolkit_stops_before_configuring():
    proc = build_py("--backend", "cuda", "--variants", "baseline")
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


def test_an_edit_through_a_staged_link_is_named_and_undone_and_the_stage_recompiles_it(pristine, tmp_path, monkeypatch):
    """The sdist tree is guarded: its files are read-only and recorded. An append to a staged file that
    is a hard link into it (what an editor does to a file with several links, after making it writable)
    changes the pristine file; the next resolve names it and extracts the tree again, and the stage
    relinks, with that path a fresh copy (so ninja recompiles it)."""
    from pyllama_dflash.env import CACHE_ENV
    from pyllama_dflash.product.llamabuild import source

    archive = cache_root() / "downloads" / pinned.SDIST_FILENAME
    assert archive.is_file(), f"{archive}: the builds fetched the pinned sdist there"
    cache = tmp_path / "cache"
    (cache / "downloads").mkdir(parents=True)
    os.link(archive, cache / "downloads" / archive.name)
    monkeypatch.setenv(CACHE_ENV, str(cache))  # never the real cache
    said: list[str] = []
    src = source._from_sdist(said.append)  # the sdist route itself (resolve() would try git first)
    assert src.record is not None and src.record.generation == 1
    rel = "src/llama-batch.cpp"
    original = (src.path / rel).read_bytes()
    assert (src.path / rel).stat().st_mode & 0o222 == 0  # read-only

    stage = Stage(tmp_path / "stage", src.path, src.record)
    stage.ensure(said.append)
    staged = stage.root / rel
    assert staged.stat().st_ino == (src.path / rel).stat().st_ino  # a link: the same file
    os.chmod(staged, 0o644)
    with open(staged, "a") as f:
        f.write("// an edit through the stage\n")
    assert (src.path / rel).read_bytes() != original  # the pristine tree changed with it

    said.clear()
    again = source._from_sdist(said.append)
    assert any(rel in line and "was modified" in line for line in said), said
    assert (again.path / rel).read_bytes() == original
    assert again.record.generation == 2 and again.record.repaired_since(1) == [rel]
    assert again.record.changed(again.path) == []

    Stage(tmp_path / "stage", again.path, again.record).ensure(said.append)
    assert staged.read_bytes() == original
    assert staged.stat().st_ino != (again.path / rel).stat().st_ino  # a copy, not a link
    assert staged.stat().st_mtime_ns > (again.path / rel).stat().st_mtime_ns  # newer than its objects
    other = "src/llama-context.cpp"
    assert (stage.root / other).stat().st_ino == (again.path / other).stat().st_ino  # the rest linked again


def test_a_variant_of_another_series_is_published_beside_the_projects_own(variants, tmp_path):
    """--patches DIR with the project's variant names: its build gets its own folder (the series' tag), the
    project's build stays as it was and is still the one found, and build --list names both series. A
    build holds llama-server only when asked for it."""
    from pyllama_dflash.product.llamabuild import BuildOptions, build, find_built
    from pyllama_dflash.product.llamabuild.builder import series_tag

    other = tmp_path / "patches"
    shutil.copytree(REPO / "patches", other)
    ours = variants["full"]
    before = ours.path.read_bytes()
    mode = ours.cpu_mode  # native, or what $PYLLAMA_DFLASH_CPU asked the suite for
    (theirs,) = build(["full"], BuildOptions(patches_dir=other, cpu=mode, quiet=True))
    try:
        tag = series_tag(load_series(other))
        assert tag and theirs.lib_dir.name == f"{ours.lib_dir.name}-{tag}"
        assert ours.path.read_bytes() == before  # not replaced, not rebuilt
        assert find_built(["full"], cpu_mode=mode)[0].lib_dir == ours.lib_dir
        assert find_built(["full"], cpu_mode=mode, patches_dir=other)[0].lib_dir == theirs.lib_dir
        listed = build_py("--list").stdout
        project, _, elsewhere = listed.partition("builds of other series:")
        # the project's line names the series folder it was built from (perhaps another clone's)
        assert f"series {ours.data['patches_dir']}  {ours.lib_dir}" in project
        assert elsewhere and f"series {other}  {theirs.lib_dir}" in elsewhere

        # built without llama-server unless asked: asking later builds it into the same folder
        assert not theirs.has_binary("llama-server") and not (theirs.lib_dir / "llama-server").exists()
        with pytest.raises(VariantNotBuilt, match="built without llama-server; build it with: .* --server"):
            theirs.binary("llama-server")
        # looked up with the server, the build of the same patches that has one serves (the project's)
        assert find_built(["full"], cpu_mode=mode, patches_dir=other, server=True)[0].lib_dir == ours.lib_dir
        (again,) = build(["full"], BuildOptions(patches_dir=other, cpu=mode, quiet=True, server=True))
        assert again.lib_dir == theirs.lib_dir and again.binary("llama-server").is_file()
        assert find_built(["full"], cpu_mode=mode, patches_dir=other, server=True)[0].lib_dir == theirs.lib_dir
    finally:
        shutil.rmtree(theirs.lib_dir)


def test_build_list_needs_no_toolkit(tmp_path):
    """--list reads the manifests: no source is resolved and no compiler or CUDA toolkit is looked for."""
    env = {"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "none"), "CUDA_PATH": str(tmp_path / "none")}
    proc = build_py("--list", "--backend", "cuda", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"series: {REPO / 'patches'}"), proc.stdout
    assert all(line.endswith(("not built for cuda",)) or "cuda" in line for line in proc.stdout.splitlines()[1:])
