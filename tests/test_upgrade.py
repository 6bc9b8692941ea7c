"""The legacy-draft upgrade: adds only dflash.rope.dimension_sections (and, with
--trained-with-image-rows, dflash.trained_with_image_rows), streams the tensor data unchanged, never
touches its input, and refuses bad inputs with the file named."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_dflash.harness.slotloop.models import ModelSet
from pyllama_dflash.harness.tiny._write import FINGERPRINT_KEY
from pyllama_dflash.product.upgrade import SECTIONS_KEY, DraftUpgradeError, inspect, upgrade
from pyllama_dflash.product.upgrade import gguf_stream as gs
from pyllama_dflash.product.upgrade.__main__ import main
from pyllama_dflash.product.upgrade.draft import IMAGE_ROWS_KEY

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ms(model_set: ModelSet) -> ModelSet:
    return model_set


@pytest.fixture
def legacy(ms: ModelSet, tmp_path: Path) -> Path:
    """A private copy of the legacy draft, so a test may point outputs beside it."""
    p = tmp_path / "legacy-dflash.gguf"
    shutil.copy2(ms.draft, p)
    return p


def _state(p: Path) -> tuple[str, int]:
    return hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns


def _data_section(g: gs.GGUFFile) -> bytes:
    with open(g.path, "rb") as f:
        f.seek(g.data_offset)
        return f.read()


def _kv_map(g: gs.GGUFFile) -> dict[str, tuple[Any, ...]]:
    return {kv.key: (kv.type, kv.value, kv.item_type) for kv in g.kvs}


def _finish(w: Any) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.product.upgrade", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


# ---- the upgrade itself -------------------------------------------------------------------------


def test_upgrade_adds_only_the_sections(ms: ModelSet, legacy: Path, tmp_path: Path) -> None:
    before = _state(legacy)
    out = tmp_path / "out.gguf"
    res = upgrade(legacy, out)
    assert res.written and res.out == out and out.is_file()

    src, dst, twin = gs.read_gguf(legacy), gs.read_gguf(out), gs.read_gguf(ms.twin)
    head_dim = src.get("dflash.attention.key_length")
    assert SECTIONS_KEY not in src
    assert dst.get(SECTIONS_KEY) == [head_dim // 2, 0, 0, 0] == twin.get(SECTIONS_KEY)
    assert res.sections == (head_dim // 2, 0, 0, 0)
    added = dst.kv(SECTIONS_KEY)
    assert added is not None and (added.type, added.item_type) == (gs.ValueType.ARRAY, gs.ValueType.INT32)
    assert added.raw == twin.kv(SECTIONS_KEY).raw  # same encoding as the converter's

    # every other key, value and type unchanged (and in the same order); only one key added
    assert [kv.key for kv in dst.kvs] == [kv.key for kv in src.kvs] + [SECTIONS_KEY]
    assert {k: v for k, v in _kv_map(dst).items() if k != SECTIONS_KEY} == _kv_map(src)
    assert [kv.raw for kv in dst.kvs[:-1]] == [kv.raw for kv in src.kvs]

    # same tensor infos, and the data section byte for byte
    assert dst.tensors == src.tensors
    assert dst.alignment == src.alignment and dst.data_offset % dst.alignment == 0
    assert _data_section(dst) == _data_section(src)

    assert _state(legacy) == before


def test_upgraded_legacy_is_the_reconverted_twin(ms: ModelSet, legacy: Path, tmp_path: Path) -> None:
    """Apart from the tiny generator's own fingerprint, the upgrade gives what the generator writes
    for an M-RoPE target."""
    out = upgrade(legacy, tmp_path / "out.gguf").out
    dst, twin = gs.read_gguf(out), gs.read_gguf(ms.twin)
    strip = lambda g: {k: v for k, v in _kv_map(g).items() if k != FINGERPRINT_KEY}
    assert strip(dst) == strip(twin)
    assert dst.tensors == twin.tensors
    assert _data_section(dst) == _data_section(twin)


def test_upgrade_default_output_name(legacy: Path) -> None:
    res = upgrade(legacy)
    assert res.out == legacy.with_name("legacy-dflash-twin.gguf") and res.out.is_file()


def test_upgrade_has_sections_is_noop(ms: ModelSet, tmp_path: Path) -> None:
    before = _state(ms.twin)
    out = tmp_path / "never.gguf"
    res = upgrade(ms.twin, out)
    assert not res.written and res.out is None
    assert res.sections == (16, 0, 0, 0)
    assert "already has rope.dimension_sections [16, 0, 0, 0]: nothing to do" in res.reason
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert _state(ms.twin) == before


def test_upgrade_non_mrope_target_is_noop(ms: ModelSet, legacy: Path, tmp_path: Path) -> None:
    # a GGUF without {arch}.rope.dimension_sections: the draft itself has none either
    res = upgrade(legacy, tmp_path / "never.gguf", target=legacy)
    assert not res.written and "does not use M-RoPE" in res.reason
    assert not (tmp_path / "never.gguf").exists()


def test_inspect(ms: ModelSet) -> None:
    info = inspect(ms.draft, ms.target)
    assert info.is_dflash and not info.has_sections and info.target_mrope is True and info.affected
    assert info.sections_to_write == (16, 0, 0, 0)
    info = inspect(ms.draft)
    assert info.target_mrope is None and not info.affected
    info = inspect(ms.twin, ms.target)
    assert info.has_sections and info.sections == (16, 0, 0, 0) and info.sections_to_write is None
    assert not info.affected
    info = inspect(ms.target)
    assert not info.is_dflash and info.architecture == "qwen35" and not info.affected


def test_in_place_replaces_atomically(legacy: Path, tmp_path: Path) -> None:
    expected = upgrade(legacy, tmp_path / "copy.gguf").out.read_bytes()
    os.chmod(legacy, 0o640)
    inode = legacy.stat().st_ino
    res = upgrade(legacy, in_place=True)
    assert res.written and res.out == legacy.resolve()
    assert legacy.read_bytes() == expected  # the same file as the upgraded copy
    st = legacy.stat()
    assert st.st_ino != inode  # a new file renamed over the old one, not rewritten in its place
    assert st.st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf", "legacy-dflash.gguf"]  # no temp left
    # again: now a no-op
    assert not upgrade(legacy, in_place=True).written


def test_in_place_cli(legacy: Path, tmp_path: Path) -> None:
    expected = upgrade(legacy, tmp_path / "copy.gguf").out.read_bytes()
    r = _cli(legacy, "--in-place")
    assert r.returncode == 0, r.stderr
    assert "added dflash.rope.dimension_sections = [16, 0, 0, 0]" in r.stdout
    assert legacy.read_bytes() == expected


# ---- CLI ------------------------------------------------------------------------------------------


def test_check_exit_codes(ms: ModelSet) -> None:
    r = _cli(ms.draft, "--check", "--target", ms.target)
    assert r.returncode == 1, r.stderr
    assert "affected" in r.stdout and len(r.stdout.strip().splitlines()) == 1
    r = _cli(ms.twin, "--check", "--target", ms.target)
    assert r.returncode == 0, r.stderr
    assert "not affected" in r.stdout


def test_check_without_target(ms: ModelSet, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(ms.draft), "--check"]) == 1
    assert "no sections; affected if its target uses M-RoPE" in capsys.readouterr().out
    assert main([str(ms.twin), "--check"]) == 0
    # a target without M-RoPE: not affected
    assert main([str(ms.draft), "--check", "--target", str(ms.draft)]) == 0
    assert "does not use M-RoPE" in capsys.readouterr().out


def test_cli_upgrade_and_noop(ms: ModelSet, legacy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    assert main([str(legacy), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert gs.read_gguf(out).get(SECTIONS_KEY) == [16, 0, 0, 0]
    assert main([str(ms.twin), "-o", str(tmp_path / "no.gguf")]) == 0
    assert "already has rope.dimension_sections [16, 0, 0, 0]: nothing to do" in capsys.readouterr().out
    assert not (tmp_path / "no.gguf").exists()


def test_cli_errors_exit_2_without_traceback(ms: ModelSet, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    for args in ([junk], [junk, "--check"], [ms.target, "--check"], [ms.draft, "--check", "--target", junk]):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("python -m pyllama_dflash.product.upgrade: error: ") and "Traceback" not in r.stderr
        assert str(args[-1] if "--target" in args else args[0]) in r.stderr


# ---- bad inputs -----------------------------------------------------------------------------------


def _truncated(src: Path, dst: Path, cut: int) -> Path:
    dst.write_bytes(src.read_bytes()[:cut])
    return dst


@pytest.mark.parametrize(
    "case", ["not-gguf", "empty", "target", "cut-kv", "cut-tensor-info", "cut-data", "cut-data-end"]
)
def test_bad_input_refused(case: str, ms: ModelSet, tmp_path: Path) -> None:
    g = gs.read_gguf(ms.draft)
    if case == "not-gguf":
        bad, words = tmp_path / "bad.gguf", ["not a GGUF file"]
        bad.write_bytes(b"PK\x03\x04" + bytes(100))
    elif case == "empty":
        bad, words = tmp_path / "bad.gguf", ["not a GGUF file"]
        bad.write_bytes(b"")
    elif case == "target":
        bad, words = tmp_path / "target.gguf", ["not a DFlash draft", "'qwen35'"]
        shutil.copy2(ms.target, bad)
    elif case == "cut-kv":
        bad, words = _truncated(ms.draft, tmp_path / "bad.gguf", 200), ["truncated in key/value #"]
    elif case == "cut-tensor-info":  # the last tensor info is longer than the padding before the data
        bad = _truncated(ms.draft, tmp_path / "bad.gguf", g.data_offset - g.alignment - 1)
        words = [f"truncated in tensor info #{len(g.tensors) - 1}"]
    elif case == "cut-data":
        bad = _truncated(ms.draft, tmp_path / "bad.gguf", g.data_offset + (g.file_size - g.data_offset) // 2)
        words = ["truncated in the data section", "tensor #"]
    else:
        bad = _truncated(ms.draft, tmp_path / "bad.gguf", g.file_size - 1)
        words = ["truncated in the data section", repr(g.tensors[-1].name)]
    before = _state(bad)
    out = tmp_path / "out.gguf"
    with pytest.raises(DraftUpgradeError) as ei:
        upgrade(bad, out)
    msg = str(ei.value)
    assert str(bad) in msg and ei.value.path == bad
    for w in words:
        assert w in msg
    assert isinstance(ei.value, ValueError)
    assert _state(bad) == before
    assert sorted(tmp_path.iterdir()) == [bad]  # no output, no temp file


@pytest.mark.parametrize("how", ["same", "relative", "symlink", "hardlink"])
def test_out_equal_to_input_refused(how: str, legacy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _state(legacy)
    out = legacy
    if how == "relative":
        monkeypatch.chdir(legacy.parent)
        out = Path("..") / legacy.parent.name / legacy.name
    elif how == "symlink":
        out = legacy.with_name("link.gguf")
        out.symlink_to(legacy)
    elif how == "hardlink":
        out = legacy.with_name("hard.gguf")
        os.link(legacy, out)
    with pytest.raises(DraftUpgradeError, match="is the input file") as ei:
        upgrade(legacy, out)
    assert str(legacy) in str(ei.value)
    assert _state(legacy) == before


def test_missing_head_size_keys(tmp_path: Path, gguf: Any) -> None:
    p = tmp_path / "headless.gguf"
    w = gguf.GGUFWriter(p, "dflash")
    w.add_uint32("dflash.block_count", 1)
    w.add_tensor("x.weight", np.zeros(4, dtype=np.float32))
    _finish(w)
    with pytest.raises(DraftUpgradeError, match="cannot tell the head size") as ei:
        upgrade(p, tmp_path / "out.gguf")
    assert str(p) in str(ei.value)


def test_error_is_a_pyllama_error() -> None:
    from pyllama_dflash.product.owning import PyllamaError

    assert issubclass(DraftUpgradeError, PyllamaError) and issubclass(DraftUpgradeError, ValueError)


# ---- streaming ------------------------------------------------------------------------------------


class _ReadSpy:
    """Wraps a file and records the size asked of every read() (-1/None: unbounded)."""

    def __init__(self, f: Any, sizes: list[int]) -> None:
        self._f, self._sizes = f, sizes

    def read(self, n: int | None = -1) -> bytes:
        self._sizes.append(-1 if n is None or n < 0 else n)
        return self._f.read(n)

    def __enter__(self) -> _ReadSpy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.mark.parametrize("chunk", [4096, gs.CHUNK_SIZE])
def test_streams_in_bounded_reads(chunk: int, legacy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real_open = open

    def spy_open(path: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        f = real_open(path, mode, *a, **kw)
        is_input = isinstance(path, (str, os.PathLike)) and Path(path) == legacy
        return _ReadSpy(f, sizes) if is_input else f

    monkeypatch.setattr(gs, "open", spy_open, raising=False)
    monkeypatch.setattr("builtins.open", spy_open)  # anything else reading the input is seen too
    out = upgrade(legacy, tmp_path / "out.gguf", chunk_size=chunk).out
    monkeypatch.undo()

    assert sizes and min(sizes) >= 0, "an unbounded read() of the input"
    assert max(sizes) <= chunk
    g = gs.read_gguf(legacy)
    data = g.file_size - g.data_offset
    if chunk < data:  # the data section was really copied piecewise
        assert sum(1 for s in sizes if s == chunk) >= data // chunk
    assert gs.read_gguf(out).get(SECTIONS_KEY) == [16, 0, 0, 0]


# ---- the output is a valid GGUF for llama.cpp's own reader ---------------------------------------


def test_gguf_py_reads_the_upgraded_draft(legacy: Path, tmp_path: Path, gguf: Any) -> None:
    out = upgrade(legacy, tmp_path / "out.gguf").out
    r, src = gguf.GGUFReader(out), gguf.GGUFReader(legacy)
    field = r.fields[SECTIONS_KEY]
    assert field.contents() == [16, 0, 0, 0]
    assert field.types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
    assert set(r.fields) == set(src.fields) | {SECTIONS_KEY}
    for k, f in src.fields.items():
        if not k.startswith("GGUF."):
            assert r.fields[k].contents() == f.contents(), k
    assert [t.name for t in r.tensors] == [t.name for t in src.tensors]
    for a, b in zip(r.tensors, src.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data), a.name


# ---- --trained-with-image-rows: the key of a draft trained with the target's image rows ------------


def test_image_rows_written_with_the_sections(legacy: Path, tmp_path: Path) -> None:
    before = _state(legacy)
    out = tmp_path / "out.gguf"
    res = upgrade(legacy, out, image_rows=True)
    assert res.written and res.out == out and res.image_rows and res.sections == (16, 0, 0, 0)
    assert res.reason == f"wrote {out}: added {SECTIONS_KEY} = [16, 0, 0, 0] and {IMAGE_ROWS_KEY} = true"

    src, dst = gs.read_gguf(legacy), gs.read_gguf(out)
    assert IMAGE_ROWS_KEY not in src
    assert dst.get(IMAGE_ROWS_KEY) is True and dst.get(SECTIONS_KEY) == [16, 0, 0, 0]
    assert dst.kv(IMAGE_ROWS_KEY).type is gs.ValueType.BOOL
    assert [kv.key for kv in dst.kvs] == [kv.key for kv in src.kvs] + [SECTIONS_KEY, IMAGE_ROWS_KEY]
    assert [kv.raw for kv in dst.kvs[:-2]] == [kv.raw for kv in src.kvs]
    assert dst.tensors == src.tensors and _data_section(dst) == _data_section(src)
    assert _state(legacy) == before


def test_image_rows_alone_when_the_sections_are_there(ms: ModelSet, tmp_path: Path) -> None:
    draft = tmp_path / "mrope.gguf"
    shutil.copy2(ms.twin, draft)
    before = _state(draft)
    res = upgrade(draft, image_rows=True)  # not "nothing to do": the key is missing
    out = draft.with_name("mrope-twin.gguf")
    assert res.written and res.out == out and res.sections == (16, 0, 0, 0) and res.image_rows
    assert res.reason == f"wrote {out}: added {IMAGE_ROWS_KEY} = true"

    src, dst = gs.read_gguf(draft), gs.read_gguf(out)
    assert dst.get(IMAGE_ROWS_KEY) is True
    assert [kv.key for kv in dst.kvs] == [kv.key for kv in src.kvs] + [IMAGE_ROWS_KEY]
    assert [kv.raw for kv in dst.kvs[:-1]] == [kv.raw for kv in src.kvs]
    assert _data_section(dst) == _data_section(src)
    assert _state(draft) == before


def test_image_rows_noop_when_both_are_there(ms: ModelSet, tmp_path: Path) -> None:
    both = upgrade(ms.twin, tmp_path / "both.gguf", image_rows=True).out
    before = _state(both)
    res = upgrade(both, tmp_path / "never.gguf", image_rows=True)
    assert not res.written and res.out is None and res.image_rows
    assert res.reason == (
        f"{both}: already has rope.dimension_sections [16, 0, 0, 0] and {IMAGE_ROWS_KEY} = true: nothing to do"
    )
    # without the option: today's no-op, today's line
    res = upgrade(both, tmp_path / "never.gguf")
    assert not res.written and res.reason == f"{both}: already has rope.dimension_sections [16, 0, 0, 0]: nothing to do"
    assert not (tmp_path / "never.gguf").exists() and _state(both) == before


def test_image_rows_alone_for_a_target_without_mrope(legacy: Path, tmp_path: Path) -> None:
    # the draft needs no sections for such a target, but the key still goes in
    out = tmp_path / "out.gguf"
    res = upgrade(legacy, out, target=legacy, image_rows=True)
    assert res.written and res.sections is None and res.reason == f"wrote {out}: added {IMAGE_ROWS_KEY} = true"
    dst = gs.read_gguf(out)
    assert dst.get(IMAGE_ROWS_KEY) is True and SECTIONS_KEY not in dst
    res = upgrade(out, tmp_path / "never.gguf", target=legacy, image_rows=True)
    assert not res.written and "does not use M-RoPE" in res.reason and IMAGE_ROWS_KEY in res.reason
    # a later upgrade without the option keeps the key, and adds the sections
    again = upgrade(out, tmp_path / "again.gguf")
    assert again.written and not again.reason.endswith("true")
    assert gs.read_gguf(again.out).get(IMAGE_ROWS_KEY) is True
    assert not (tmp_path / "never.gguf").exists()


def test_image_rows_in_place(legacy: Path, tmp_path: Path) -> None:
    expected = upgrade(legacy, tmp_path / "copy.gguf", image_rows=True).out.read_bytes()
    res = upgrade(legacy, in_place=True, image_rows=True)
    assert res.written and res.reason.startswith(f"replaced {legacy.resolve()}: added")
    assert legacy.read_bytes() == expected
    assert not upgrade(legacy, in_place=True, image_rows=True).written


def test_image_rows_key_encoded_as_the_generator_writes_it(legacy: Path, tmp_path: Path, gguf: Any) -> None:
    from pyllama_dflash.harness.tiny.draft import IMAGE_ROWS_KEY as TINY_KEY
    from pyllama_dflash.harness.tiny.draft import write_draft

    assert TINY_KEY is IMAGE_ROWS_KEY  # one name, defined in product.upgrade.draft
    gen = tmp_path / "gen.gguf"
    write_draft(gen, mrope=True, image_rows=True, gguf=gguf)
    out = upgrade(legacy, tmp_path / "out.gguf", image_rows=True).out
    assert gs.read_gguf(out).kv(IMAGE_ROWS_KEY).raw == gs.read_gguf(gen).kv(IMAGE_ROWS_KEY).raw
    field = gguf.GGUFReader(out).fields[IMAGE_ROWS_KEY]
    assert field.types == [gguf.GGUFValueType.BOOL] and field.contents() is True


def test_image_rows_inspect_and_check(
    ms: ModelSet, legacy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not inspect(legacy).image_rows
    out = tmp_path / "cli.gguf"
    assert main([str(legacy), "-o", str(out), "--trained-with-image-rows"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == f"wrote {out}: added {SECTIONS_KEY} = [16, 0, 0, 0] and {IMAGE_ROWS_KEY} = true"
    assert gs.read_gguf(out).get(IMAGE_ROWS_KEY) is True
    assert inspect(out).image_rows

    # --check: the same verdicts and exit codes; the key is noted, never judged
    assert main([str(out), "--check", "--target", str(ms.target)]) == 0
    assert capsys.readouterr().out.strip().endswith("; marked as trained with image rows")
    assert main([str(legacy), "--check", "--target", str(ms.target), "--trained-with-image-rows"]) == 1
    line = capsys.readouterr().out.strip()
    assert "affected" in line and f"--trained-with-image-rows adds {IMAGE_ROWS_KEY} = true" in line
    assert main([str(legacy), "--check"]) == 1
    assert "image rows" not in capsys.readouterr().out
