"""The binding layer itself: the compiled module per variant, its inputs, the native log routing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pyllama_dflash.product.process import logs


def test_second_library_dir_is_refused(lib_dir: Path, tmp_path: Path) -> None:
    from pyllama_dflash.product.bindings.ffi import BindingLoadError, load_module

    other = tmp_path / "other-variant"
    other.mkdir()
    with pytest.raises(BindingLoadError) as info:
        load_module(other)
    assert str(lib_dir.resolve()) in str(info.value) and str(other.resolve()) in str(info.value)
    # the same dir again is fine
    ffi, lib = load_module(lib_dir)
    from pyllama_dflash.product.bindings.header_adapters import SHIM_ABI

    assert int(lib.pyllama_dflash_shim_abi()) == SHIM_ABI


def test_log_pieces_are_joined_into_lines() -> None:
    ring = logs.LogRing(capacity=8)
    joiner = logs._LineJoiner("llama", ring)
    mark = ring.mark()
    joiner.feed(4, "first part")  # GGML_LOG_LEVEL_ERROR
    joiner.feed(5, ", continued")  # GGML_LOG_LEVEL_CONT
    joiner.feed(5, " and done\nsecond")
    joiner.feed(2, "third\n")  # a new message closes the open line
    got = [(ln.level, ln.text) for ln in ring.lines(since=mark)]
    assert got == [
        (logging.ERROR, "first part, continued and done"),
        (logging.ERROR, "second"),
        (logging.INFO, "third"),
    ]


def test_compile_inputs_hash_is_stable() -> None:
    from pyllama_dflash.product.bindings import ffibuild

    assert ffibuild.source_hash() == ffibuild.source_hash()
    assert len(ffibuild.source_hash()) == 64
    assert "pyllama_dflash_spec_process_embd_view" in ffibuild.cdef_text()
