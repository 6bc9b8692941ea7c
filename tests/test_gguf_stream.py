"""The GGUF stream module (pyllama_dflash.product.upgrade.gguf_stream) on its own: its reader agrees with gguf-py
on every tiny model, reads every value type back, and refuses what it cannot read with the file
named, through the upgrade too."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_dflash.harness.slotloop.models import ModelSet
from pyllama_dflash.product.upgrade import SECTIONS_KEY, DraftUpgradeError, upgrade
from pyllama_dflash.product.upgrade import gguf_stream as gs


@pytest.fixture(scope="module")
def ms(model_set: ModelSet) -> ModelSet:
    return model_set


def _data_section(g: gs.GGUFFile) -> bytes:
    with open(g.path, "rb") as f:
        f.seek(g.data_offset)
        return f.read()


def _finish(w: Any) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_reader_agrees_with_gguf_py(ms: ModelSet, gguf: Any) -> None:
    for p in (ms.target, ms.draft, ms.twin, ms.mmproj):
        ours, theirs = gs.read_gguf(p), gguf.GGUFReader(p)
        assert ours.data_offset == theirs.data_offset
        fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert {kv.key: kv.value for kv in ours.kvs} == fields
        assert [(t.name, t.shape, t.offset) for t in ours.tensors] == [
            (t.name, tuple(int(x) for x in t.shape), t.data_offset - theirs.data_offset) for t in theirs.tensors
        ]
        assert [t.nbytes() for t in ours.tensors] == [int(t.n_bytes) for t in theirs.tensors]


@pytest.fixture
def synthetic(tmp_path: Path, gguf: Any) -> Path:
    """Every value type, a nested array, odd strings, quantized and half tensors, 64-byte alignment."""
    p = tmp_path / "synthetic.gguf"
    w = gguf.GGUFWriter(p, "dflash")
    w.add_custom_alignment(64)  # sets the key and pads the data to it
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nworld")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_array("t.strs", ["a", "", "ünï"])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.nested", [[1, 2, 3], [4], [5, 6]])
    w.add_uint32("dflash.embedding_length", 64)
    w.add_uint32("dflash.attention.head_count", 4)  # no key_length: head_dim = 64 // 4 = 16
    q8_rows = np.arange(2 * 68, dtype=np.uint8).reshape(2, 68)  # 2 rows of 2 Q8_0 blocks (34 bytes each)
    w.add_tensor("q8.weight", q8_rows, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("f16.weight", np.arange(6, dtype=np.float16).reshape(2, 3))
    w.add_tensor("f32.weight", np.arange(5, dtype=np.float32))
    _finish(w)
    return p


def test_synthetic_roundtrip(synthetic: Path, tmp_path: Path, gguf: Any) -> None:
    g = gs.read_gguf(synthetic)
    assert g.alignment == 64
    assert g.get("t.u64") == 2**63 + 5 and g.get("t.f64") == 1e-300 and g.get("t.bool") is True
    assert g.get("t.str") == "héllo\nworld" and g.get("t.strs") == ["a", "", "ünï"]
    assert g.get("t.nested") == [[1, 2, 3], [4], [5, 6]] and g.kv("t.nested").item_type is gs.ValueType.ARRAY
    assert [(t.type_name, t.shape, t.nbytes()) for t in g.tensors] == [
        ("Q8_0", (64, 2), 2 * 34 * 2),
        ("F16", (3, 2), 12),
        ("F32", (5,), 20),
    ]

    out = upgrade(synthetic, tmp_path / "out.gguf").out
    assert gs.read_gguf(out).get(SECTIONS_KEY) == [8, 0, 0, 0]
    o = gs.read_gguf(out)
    assert o.data_offset % 64 == 0 and _data_section(o) == _data_section(g)
    assert [kv.raw for kv in o.kvs[:-1]] == [kv.raw for kv in g.kvs]
    r = gguf.GGUFReader(out)
    assert r.fields[SECTIONS_KEY].contents() == [8, 0, 0, 0]
    src = gguf.GGUFReader(synthetic)
    for a, b in zip(r.tensors, src.tensors, strict=True):
        assert np.array_equal(a.data, b.data)


def _patched(src: Path, dst: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def test_reader_refuses_versions_and_endianness(synthetic: Path, tmp_path: Path, gguf: Any) -> None:
    for version, words in ((1, "version 1"), (4, "unknown GGUF version 4"), (0, "unknown GGUF version 0")):
        bad = _patched(synthetic, tmp_path / f"v{version}.gguf", 4, "<I", version)
        with pytest.raises(gs.GGUFError, match=words) as ei:
            gs.read_gguf(bad)
        assert ei.value.path == bad
    big = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(big, "dflash", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("dflash.embedding_length", 64)
    _finish(w)
    with pytest.raises(gs.GGUFError, match="big-endian"):
        gs.read_gguf(big)
    with pytest.raises(DraftUpgradeError, match="big-endian") as ei:
        upgrade(big, tmp_path / "out.gguf")
    assert str(big) in str(ei.value)


def test_reader_refuses_unknown_ggml_type(synthetic: Path, tmp_path: Path) -> None:
    g = gs.read_gguf(synthetic)
    # the last tensor info ends with its type (u32) and offset (u64)
    infos_start = synthetic.read_bytes().index(g.tensors[0].raw)
    type_at = infos_start + sum(len(t.raw) for t in g.tensors) - 12
    bad = _patched(synthetic, tmp_path / "type.gguf", type_at, "<I", 99)
    with pytest.raises(gs.GGUFError, match="unknown ggml type 99"):
        gs.read_gguf(bad)
    with pytest.raises(DraftUpgradeError, match="unknown ggml type 99"):
        upgrade(bad, tmp_path / "out.gguf")
