"""Tiny GGUF generators and the synthetic PNG: pure Python, no llama.cpp build needed.

The GGUF tests need a llama.cpp gguf-py (with DFlash support): from
$PYLLAMA_DFLASH_GGUF_PY or pyllama_dflash.product.llamabuild.source.pristine_tree(); they
skip with the reason when none is available.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from pyllama_dflash.harness import tiny
from pyllama_dflash.harness.tiny import image
from pyllama_dflash.harness.tiny._write import FINGERPRINT_KEY

MB = 1 << 20


@pytest.fixture(scope="module")
def gguf():
    try:
        return tiny.gguf_module()
    except tiny.GgufUnavailable as exc:
        pytest.skip(f"no gguf-py with DFlash support: {exc}")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _fields(gguf, path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _tensors(gguf, path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    r = gguf.GGUFReader(path)
    # t.shape is ggml ne order
    return {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in r.tensors}


# --- determinism and size ---------------------------------------------------------


def test_same_bytes_twice(gguf, tmp_path):
    a = tiny.write_models(tmp_path / "a", seed=3)
    b = tiny.write_models(tmp_path / "b", seed=3)
    for x, y in [(a.target, b.target), (a.draft, b.draft), (a.mmproj, b.mmproj)]:
        assert x.read_bytes() == y.read_bytes()


def test_seed_changes_weights(gguf, tmp_path):
    a = tiny.write_models(tmp_path / "a", seed=0)
    b = tiny.write_models(tmp_path / "b", seed=1)
    assert _sha(a.target) != _sha(b.target)
    assert _sha(a.draft) != _sha(b.draft)


def test_server_args(models):
    a = models.server_args()
    assert a[a.index("-md") + 1] == str(models.draft)
    assert a[a.index("--spec-draft-n-max") + 1] == str(models.block_size - 1)
    assert "--no-warmup" in a and "-md" not in models.server_args(spec=False)


def test_sizes(models):
    for p in (models.target, models.draft, models.mmproj):
        assert 0 < p.stat().st_size < MB, p


# --- cache behaviour ------------------------------------------------------------------


def test_write_models_skips_up_to_date(gguf, tmp_path):
    first = tiny.write_models(tmp_path)
    assert set(first.written) == {"target", "draft", "mmproj"}
    stats = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (first.target, first.draft, first.mmproj)}
    second = tiny.write_models(tmp_path)
    assert second.written == ()
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stats} == stats
    # a different draft variant only writes its own file
    third = tiny.write_models(tmp_path, twin=True)
    assert third.written == ("draft",) and third.draft != first.draft
    assert not list(tmp_path.glob(".*.tmp"))


def test_write_models_repairs_changed_file(gguf, tmp_path):
    m = tiny.write_models(tmp_path)
    good = m.target.read_bytes()
    m.target.write_bytes(good[: len(good) // 2])  # truncated: fingerprint unreadable
    again = tiny.write_models(tmp_path)
    assert again.written == ("target",)
    assert m.target.read_bytes() == good


def test_config_change_rewrites(gguf, tmp_path):
    tiny.write_models(tmp_path)
    m = tiny.write_models(tmp_path, config=tiny.TinyConfig(block_size=8))
    assert "draft" in m.written and m.block_size == 8


# --- contents ---------------------------------------------------------------------------


def test_target_keys_and_tensors(gguf, models):
    cfg = models.config
    f = _fields(gguf, models.target)
    assert f["general.architecture"] == "qwen35"
    assert f["qwen35.embedding_length"] == cfg.n_embd
    assert f["qwen35.block_count"] == 2
    assert f["qwen35.full_attention_interval"] == 2
    assert list(f["qwen35.rope.dimension_sections"]) == list(cfg.rope_sections)
    assert f["qwen35.ssm.inner_size"] == cfg.ssm_state_size * cfg.ssm_time_step_rank
    assert f["tokenizer.ggml.model"] == "test"
    assert len(f["tokenizer.ggml.tokens"]) == cfg.n_vocab
    assert f["tokenizer.ggml.bos_token_id"] == cfg.bos_id
    assert f["tokenizer.ggml.eos_token_id"] == cfg.eos_id
    assert "<|im_start|>" in f["tokenizer.chat_template"]
    assert FINGERPRINT_KEY in f

    t = _tensors(gguf, models.target)
    E = cfg.n_embd
    assert t["token_embd.weight"] == ((E, cfg.n_vocab), "F32")
    assert t["output.weight"] == ((E, cfg.n_vocab), "F32")  # own head: a tied one just repeats the last token
    assert {"blk.0.attn_qkv.weight", "blk.0.ssm_a", "blk.0.ssm_conv1d.weight"} <= t.keys()  # recurrent
    assert t["blk.1.attn_q.weight"] == ((E, 2 * cfg.n_head * cfg.head_dim), "F32")  # attention + gate
    assert "blk.1.attn_qkv.weight" not in t

    r = gguf.GGUFReader(models.target)
    ssm_a = next(x for x in r.tensors if x.name == "blk.0.ssm_a")
    assert (np.asarray(ssm_a.data) < 0).all()
    head = np.asarray(next(x for x in r.tensors if x.name == "output.weight").data)
    assert not head[list(cfg.eog_ids)].any()  # EOG rows zero: greedy never picks them
    assert head[cfg.bos_id].any() and head[8:].all(axis=1).any()


def test_draft_keys_and_tensors(gguf, models):
    cfg = models.config
    f = _fields(gguf, models.draft)
    assert f["general.architecture"] == "dflash"
    assert f["dflash.embedding_length"] == cfg.n_embd
    assert list(f["dflash.target_layers"]) == list(cfg.target_layer_ids)
    assert all(0 <= i < cfg.n_layer for i in f["dflash.target_layers"])
    assert f["dflash.block_size"] == cfg.block_size
    assert f["dflash.attention.causal"] is False
    assert f["tokenizer.ggml.mask_token_id"] == cfg.mask_id
    assert "dflash.rope.dimension_sections" not in f  # NEOX draft: reproduces the bug
    assert "dflash.attention.sliding_window" not in f

    t = _tensors(gguf, models.draft)
    E = cfg.n_embd
    assert t["fc.weight"] == ((E * len(cfg.target_layer_ids), E), "F32")
    assert {"enc.output_norm.weight", "output_norm.weight", "blk.0.ffn_norm.weight"} <= t.keys()
    assert "token_embd.weight" not in t and "output.weight" not in t  # shared from the target


def test_draft_variants(gguf, tmp_path):
    mr = tiny.write_models(tmp_path, twin=True)
    f = _fields(gguf, mr.draft)
    assert list(f["dflash.rope.dimension_sections"]) == [mr.config.head_dim // 2, 0, 0, 0]
    sw = tiny.write_models(tmp_path, draft_swa=8)
    f = _fields(gguf, sw.draft)
    assert f["dflash.attention.sliding_window"] == 8
    assert list(f["dflash.attention.sliding_window_pattern"]) == [True] * sw.config.draft_n_layer
    with pytest.raises(ValueError):
        tiny.write_models(tmp_path / "bad", draft_swa=0)


@pytest.mark.parametrize("drafter", list(tiny.DRAFTERS))
@pytest.mark.parametrize("swa", [None, 4])
def test_the_reconverted_twin_has_the_same_tensors_byte_for_byte(gguf, tmp_path, swa, drafter):
    """The drift oracle's reference is only honest if the twin is the legacy draft plus the
    sections: every tensor equal in name, shape, type and bytes; the only key added is the sections.
    So for every drafter of the family."""
    form = tiny.drafter(drafter)
    legacy = gguf.GGUFReader(tiny.write_models(tmp_path, draft_swa=swa, form=form).draft)
    twin = gguf.GGUFReader(tiny.write_models(tmp_path, draft_swa=swa, twin=True, form=form).draft)
    assert [t.name for t in legacy.tensors] == [t.name for t in twin.tensors]
    for a, b in zip(legacy.tensors, twin.tensors, strict=True):
        assert (a.tensor_type, list(a.shape)) == (b.tensor_type, list(b.shape)), a.name
        assert a.data.tobytes() == b.data.tobytes(), a.name
    keys = lambda r: {k for k in r.fields if not k.startswith("GGUF.")}
    assert keys(twin) - keys(legacy) == {"dflash.rope.dimension_sections"}
    assert keys(legacy) - keys(twin) == set()


def test_drafter_forms_share_the_plain_drafts_tensors(gguf, tmp_path):
    """Each form adds its own tensors and keys to the plain draft's, whose tensors it keeps byte for
    byte: the drafters differ where the drafter does (src/models/dflash.cpp's optional tensors)."""
    plain = {t.name: t.data.tobytes() for t in gguf.GGUFReader(tiny.write_models(tmp_path).draft).tensors}
    added = {
        "dflash-causal": set(),
        "dflash2": {"selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight"}
        | {f"blk.0.{p}_conv_{k}" for p in ("attn", "ffn") for k in ("base", "proj.weight")},
        "dspark": {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"},
        "dspark-bonus": {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"},
        "dspark-vocab": {"markov_w1.weight", "markov_w2.weight", "d2t", "output.weight"},
    }
    for name, extra in added.items():
        path = tiny.write_models(tmp_path, form=tiny.drafter(name)).draft
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
        assert set(tensors) - set(plain) == extra, name
        assert all(tensors[n].data.tobytes() == b for n, b in plain.items()), name
        f = _fields(gguf, path)
        assert f["dflash.attention.causal"] is (name == "dflash-causal")
        if name == "dflash2":
            assert f["dflash.selector_top_k"] > 0 and f["dflash.conv_group_size"] > 0
        if name.startswith("dspark"):
            assert f["dflash.sample_from_anchor"] is (name != "dspark-bonus")
            assert f["dflash.has_confidence_head"] is ("conf_proj.weight" in tensors)
    d2t = next(t for t in gguf.GGUFReader(tmp_path / "tiny-dspark-vocab.gguf").tensors if t.name == "d2t")
    ids = np.asarray(d2t.data)
    assert d2t.tensor_type.name == "I64" and len(set(ids.tolist())) == len(ids) == 64  # absolute, distinct ids
    assert ids.min() == 0 and ids.max() < tiny.TinyConfig().n_vocab


def test_moe_target_shares_all_but_the_ffn(gguf, tmp_path):
    """The qwen35moe target: the dense target's tensors except the FFN's, which are routed experts and a
    gated shared expert (src/models/qwen35moe.cpp)."""
    dense = {t.name: t.data.tobytes() for t in gguf.GGUFReader(tiny.write_models(tmp_path).target).tensors}
    moe_path = tiny.write_models(tmp_path, target_kind="moe").target
    assert moe_path.name == "tiny-qwen35moe.gguf"
    moe = {t.name: t for t in gguf.GGUFReader(moe_path).tensors}
    ffn = {n for n in dense if ".ffn_" in n}
    assert {n: moe[n].data.tobytes() for n in set(dense) - ffn} == {n: dense[n] for n in set(dense) - ffn}
    assert not ffn & set(moe)
    assert tuple(int(x) for x in moe["blk.1.ffn_gate_exps.weight"].shape) == (64, 32, 4)
    f = _fields(gguf, moe_path)
    assert f["general.architecture"] == "qwen35moe"
    assert f["qwen35moe.expert_count"] == 4 and f["qwen35moe.expert_used_count"] == 2


def test_mmproj_keys_and_tensors(gguf, models):
    cfg = models.config
    f = _fields(gguf, models.mmproj)
    assert f["general.architecture"] == "clip"
    assert f["clip.projector_type"] == "qwen2vl_merger"
    assert f["clip.has_vision_encoder"] is True
    assert f["clip.vision.projection_dim"] == cfg.n_embd
    assert f["clip.vision.patch_size"] == 14
    t = _tensors(gguf, models.mmproj)
    assert t["v.patch_embd.weight"] == ((14, 14, 3, cfg.v_n_embd), "F16")
    assert t["v.patch_embd.weight.1"] == ((14, 14, 3, cfg.v_n_embd), "F16")
    assert t["mm.2.weight"] == ((4 * cfg.v_n_embd, cfg.n_embd), "F32")
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        assert f"v.blk.0.{name}.bias" in t


def test_config_validation():
    with pytest.raises(ValueError):
        tiny.TinyConfig(target_layer_ids=(0, 2)).validate()
    with pytest.raises(ValueError):
        tiny.TinyConfig(rope_sections=(8, 8, 8, 0)).validate()


# --- tokenizer model and image grid ---------------------------------------------------------


def test_test_vocab_tokenizer():
    # 5-byte chunks, so a few words make a handful of tokens
    ids = tiny.tokenize_test_vocab("Describe this image please")
    assert len(ids) == 6 and all(0 <= i < 128 for i in ids)
    assert tiny.tokenize_test_vocab("hello") == [sum(b * 31 ** (4 - i) for i, b in enumerate(b"hello")) % 128]


@pytest.mark.parametrize(
    "size,grid",
    [
        ((56, 56), (3, 3)),  # below 8 tokens: upscaled to 84x84
        ((84, 84), (3, 3)),
        ((112, 112), (4, 4)),
        ((168, 168), (6, 6)),  # 36 tokens > n_batch 32
        ((252, 84), (9, 3)),
    ],
)
def test_image_grid(size, grid):
    assert tiny.image_grid(*size) == grid


# --- PNG ---------------------------------------------------------------------------------------


def _parse_png(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == image.PNG_SIGNATURE
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.append((kind, body))
        pos += 12 + n
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    w, h, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0)
    return w, h, zlib.decompress(chunks[1][1])


def test_png_roundtrip():
    arr = image.rgb(30, 20, seed=5)
    assert arr.shape == (20, 30, 3) and arr.dtype == np.uint8
    w, h, raw = _parse_png(image.png_bytes(arr))
    assert (w, h) == (30, 20)
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any()  # filter byte 0 on every row
    assert np.array_equal(rows[:, 1:].reshape(h, w, 3), arr)


def test_png_deterministic_and_seeded():
    assert image.png_bytes(image.rgb(84, 84, 1)) == image.png_bytes(image.rgb(84, 84, 1))
    assert not np.array_equal(image.rgb(84, 84, 1), image.rgb(84, 84, 2))
    assert image.png_data_url(b"\x89PNG").startswith("data:image/png;base64,")


def test_png_rejects_bad_input():
    with pytest.raises(ValueError):
        image.png_bytes(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError):
        image.png_bytes(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError):
        image.rgb(0, 4)


def test_gguf_module_leaves_sys_modules_alone(gguf, monkeypatch):
    import sys
    import types

    from pyllama_dflash.harness.tiny import _gguf

    assert tiny.gguf_module() is gguf  # cached
    # pretend another (e.g. PyPI) gguf is already imported: it must survive our import
    fake = types.ModuleType("gguf")
    monkeypatch.setitem(sys.modules, "gguf", fake)
    monkeypatch.setattr(_gguf, "_cache", {})
    fresh = tiny.gguf_module(Path(gguf.__file__).parents[2])
    assert sys.modules["gguf"] is fake
    assert fresh is not fake and hasattr(fresh.GGUFWriter, "add_target_layers")


def test_gguf_module_clear_error(tmp_path, monkeypatch):
    with pytest.raises(tiny.GgufUnavailable):
        tiny.gguf_module(tmp_path)  # no gguf-py under it


def test_a_long_context_target_differs_in_its_context_length_alone(tmp_path):
    """llama-server caps a slot at the training context the target records: the copy that lifts it keeps
    every other entry and every tensor byte, so it computes what the target computes."""
    from pyllama_dflash.harness.slotloop.models import tiny_models
    from pyllama_dflash.harness.tiny.long_context import long_context_target
    from pyllama_dflash.product.upgrade.gguf_stream import read_gguf

    src = tiny_models().target
    out = long_context_target(src, 4096, tmp_path)
    assert long_context_target(src, 4096, tmp_path) == out  # made once
    a, b = read_gguf(src), read_gguf(out)
    key = f"{a.get('general.architecture')}.context_length"
    assert (a.get(key), b.get(key)) == (256, 4096)
    assert [(k.key, k.value) for k in a.kvs if k.key != key] == [(k.key, k.value) for k in b.kvs if k.key != key]
    assert [t.raw for t in a.tensors] == [t.raw for t in b.tensors]
    assert src.read_bytes()[a.data_offset :] == out.read_bytes()[b.data_offset :]
    # a target whose context is long enough already is used as it is (the bench pair's 830 MB: no copy)
    assert long_context_target(src, 256, tmp_path / "none") == src.resolve()
    assert not (tmp_path / "none").exists()
