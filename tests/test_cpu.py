"""Builds know the CPU they were made for: a native build records and is keyed by its features, one
made for features this CPU lacks is refused (never a SIGILL), and a portable build runs the matrix.

The portable variants are built here on first use (one more cold build of llama.cpp).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from series_variants import VARIANTS

from pyllama_dflash.errors import VariantNotBuilt
from pyllama_dflash.harness.engine.matrix import run_table
from pyllama_dflash.harness.scenarios.catalog import SCENARIOS, expectations, meets
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.lab.bench import __main__ as bench_main
from pyllama_dflash.product.llamabuild import BuildOptions, build, cpu, manifest, toolchain


def test_a_build_records_the_features_it_uses(variants):
    m = variants["baseline"]  # native, or what $PYLLAMA_DFLASH_CPU asked the suite for
    assert m.cpu_features == list(cpu.features(m.cpu_mode))
    if cpu.is_x86() and m.cpu_mode == "native":
        assert m.cpu_features == list(cpu.native_features()) and "sse3" in m.cpu_features  # every x86-64 CPU
    assert cpu.missing(m.cpu_features) == []  # made here, so nothing is missing here


def test_an_avx2_build_is_x86_64_v3_and_records_it():
    """--cpu avx2 is how an AVX2 machine without AVX-512 rounds, on any x86-64 CPU that has AVX2: native off,
    ggml's default instruction sets on, AVX-512 off; its features are part of its key and checked on load."""
    tc = dataclasses.replace(toolchain.select("cpu"), cpu="avx2", cpu_features=cpu.features("avx2"))
    args = toolchain.cmake_configure_args(tc, Path("/src"), None, None)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=OFF" not in args
    if cpu.is_x86():
        assert {"avx2", "fma", "f16c"} <= set(tc.cpu_features) and not any("avx512" in f for f in tc.cpu_features)
    native = toolchain.select("cpu", cpu_mode="native")
    assert json.dumps(tc.key(), sort_keys=True) != json.dumps(native.key(), sort_keys=True)


def test_an_avx2_build_on_a_cpu_without_avx2_is_refused_with_it_named(variants, monkeypatch):
    if not cpu.is_x86():
        pytest.skip("not an x86 CPU: an avx2 build records no features there")
    data = {**variants["baseline"].data, "cpu": {"mode": "avx2", "features": list(cpu.AVX2_FEATURES)}}
    m = manifest.Manifest(variants["baseline"].path, data)
    flags = cpu.host_flags() or set()
    monkeypatch.setattr(cpu, "host_flags", lambda: flags - {"avx2"})
    problems = m.problems()
    assert any("built with --cpu avx2 for a CPU with avx2, which this CPU lacks" in p for p in problems), problems


def test_the_features_are_part_of_the_build_key():
    tc = toolchain.select("cpu")
    other = dataclasses.replace(tc, cpu_features=(*tc.cpu_features, "amx-tile"))
    portable = dataclasses.replace(tc, cpu="portable", cpu_features=())
    assert len({json.dumps(t.key(), sort_keys=True) for t in (tc, other, portable)}) == 3


def test_a_build_for_features_this_cpu_lacks_is_refused_with_them_named(variants, monkeypatch):
    m = variants["baseline"]
    if not m.cpu_features:
        pytest.skip("not an x86 CPU: native builds record no features there")
    lacking = m.cpu_features[-1]
    flags = cpu.host_flags() or set()
    monkeypatch.setattr(cpu, "host_flags", lambda: flags - {cpu._X86[lacking][1]})
    problems = m.problems()
    assert any(f"a CPU with {lacking}, which this CPU lacks" in p and "SIGILL" in p for p in problems), problems
    monkeypatch.setattr(manifest, "all_manifests", lambda: [m])
    with pytest.raises(VariantNotBuilt) as info:
        manifest.find("baseline", cpu_mode=m.cpu_mode)
    text = str(info.value)
    assert lacking in text and f"python build.py --variants baseline --cpu {m.cpu_mode}" in text
    assert "--cpu portable" in text


def test_a_manifest_that_recorded_no_cpu_is_refused(variants):
    m = variants["baseline"]
    old = manifest.Manifest(m.path, {k: v for k, v in m.data.items() if k != "cpu"})
    assert any("recorded the CPU" in p for p in old.problems())


@pytest.fixture(scope="session")
def portable(variants) -> dict[str, manifest.Manifest]:
    return {m.variant: m for m in build(["all"], BuildOptions(cpu="portable", quiet=True))}


def test_the_portable_build_targets_the_x86_64_baseline(portable):
    m = portable["baseline"]
    assert m.cpu_mode == "portable" and m.cpu_features == []
    assert "-DGGML_NATIVE=OFF" in m.data["configure_args"] and "-DGGML_AVX2=OFF" in m.data["configure_args"]
    cache = (m.lib_dir.parents[1] / "work" / m.data["build_key"] / "build" / "CMakeCache.txt").read_text()
    assert "GGML_NATIVE:BOOL=OFF" in cache and "GGML_AVX:BOOL=OFF" in cache


def test_the_portable_build_loads_and_passes_the_matrix(portable, model_set, monkeypatch, tmp_path):
    monkeypatch.setenv("PYLLAMA_DFLASH_CPU", "portable")  # the children look the portable builds up
    table = run_table(list(SCENARIOS), list(VARIANTS), model_set, DEFAULT_CONFIG, parallel=2, work_dir=tmp_path)
    for sid, row in table.items():
        for v in VARIANTS:
            r = row[v]
            assert r["build"]["cpu"] == "portable" and r["build"]["lib_dir"] == str(portable[v].lib_dir), r
            assert meets(expectations(v)[sid], r), (sid, v, r["status"], r.get("first_failure"))


def test_a_bench_section_that_cannot_run_says_why_in_one_line(variants, monkeypatch, tmp_path, capsys):
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "valgrind" else real_which(name, *a, **k)
    )
    out = tmp_path / "bench.json"
    assert bench_main.main(["--only", "instructions", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["instructions"] == {"skipped": "valgrind not found (install it to count instructions)"}
    err = capsys.readouterr().err
    assert "bench: instructions cannot run here: valgrind not found" in err and "Traceback" not in err
