"""The API (pyllama_dflash.product.api) against the real libraries and the tiny models (no mocks).

Library: the baseline build, found through its manifest (built on first use by the ``variants``
fixture). Tiny models: pyllama_dflash.harness.tiny, written with the pinned tree's gguf-py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_dflash.harness import tiny
from pyllama_dflash.harness.slotloop.models import DRAFT_KINDS
from pyllama_dflash.harness.tiny import gemma4, image
from pyllama_dflash.product import api
from pyllama_dflash.product.api import kv_cells

# fixtures (lib_dir, models, target_model, draft_model, target, draft, spec, projector): conftest.py


def _prompt(model: api.Model) -> np.ndarray:
    toks = model.tokenize("hello world, this is a prompt")
    assert toks.size > 1
    return toks


# ---- text on the target ---------------------------------------------------------------------------


def test_text_decode_on_target_returns_zero(target: api.Context, target_model: api.Model) -> None:
    toks = _prompt(target_model)
    batch = api.Batch.tokens(toks, pos0=0)
    assert target.decode(batch) == 0
    assert target.pos_max(0) == toks.size - 1
    assert 0 <= target.argmax() < target_model.n_vocab

    # the llama_batch_ext / llama_process route continues the same sequence
    more = api.Batch.tokens(toks[:3], pos0=toks.size)
    assert target.process_rc(more) == 0
    assert target.pos_max(0) == toks.size + 2


def test_oversized_batch_is_refused_before_native_code(target: api.Context) -> None:
    batch = api.Batch.tokens(np.zeros(target.n_batch + 1, dtype=np.int32) + 9)
    with pytest.raises(ValueError, match="n_batch"):
        target.decode(batch)


def test_embedding_batch_from_numpy_decodes(target: api.Context, target_model: api.Model) -> None:
    assert target_model.is_mrope
    n = 6
    rng = np.random.default_rng(0)
    embd = rng.standard_normal((n, target_model.n_embd_inp)).astype(np.float32)
    # an image-like grid pinned at temporal position 0: rows t, y, x, z
    pos = np.stack([np.zeros(n), np.repeat([0, 1], 3), np.tile([0, 1, 2], 2), np.zeros(n)]).astype(np.int32)
    batch = api.Batch.embeddings(embd, pos)
    np.testing.assert_array_equal(batch.embd, embd)  # numpy views onto the C arrays
    np.testing.assert_array_equal(batch.pos, pos)
    assert target.decode(batch) == 0
    assert target.pos_max(0) == 0

    # and through llama_process, continuing after the pinned rows
    assert target.process_rc(api.Batch.embeddings(embd, pos + np.array([[1], [1], [1], [0]], dtype=np.int32))) == 0
    assert target.pos_max(0) == 1


# ---- draft contexts ------------------------------------------------------------------------------


def test_draft_context_without_target_is_refused(draft_model: api.Model) -> None:
    with pytest.raises(api.ContextError, match="needs a target"):
        api.Context.draft(draft_model, None)
    with pytest.raises(api.ContextError, match="Context.draft"):
        api.Context(draft_model)


def test_draft_batch_skipping_ahead_returns_minus_one_and_logs_both_positions(
    target: api.Context, draft: api.Context, spec: api.Speculative, target_model: api.Model
) -> None:
    toks = _prompt(target_model)
    batch = api.Batch.tokens(toks, pos0=0)
    assert target.decode(batch) == 0
    assert spec.process_ok(batch) is True
    x = draft.pos_max(0)
    assert x == toks.size - 1
    y = x + 3  # what the target's next text looks like after an M-RoPE image

    for route in (draft.decode, draft.process_rc):
        rc = route(api.Batch.tokens([9, 10], pos0=y, logits="none"))
        assert rc == -1
        text = "\n".join(ln.text for ln in draft.last_log)
        assert f"X = {x}" in text and f"Y = {y}" in text and "Y = X + 1" in text, text
    assert draft.pos_max(0) == x  # nothing was stored


# ---- speculative driver ----------------------------------------------------------------------------


def test_speculative_process_text_batch_returns_true(
    target: api.Context, draft: api.Context, spec: api.Speculative, target_model: api.Model
) -> None:
    toks = _prompt(target_model)
    batch = api.Batch.tokens(toks, pos0=0)
    assert target.decode(batch) == 0
    assert spec.process_ok(batch) is True
    assert draft.pos_max(0) == toks.size - 1  # the target's features were injected at the same positions

    spec.begin(0, toks)
    drafted = spec.draft(0, target.argmax(), toks.size)
    assert 1 <= len(drafted) <= spec.n_max
    assert all(0 <= t < target_model.n_vocab for t in drafted)
    assert draft.pos_max(0) == toks.size - 1  # the noise block was trimmed, as llama-server does
    spec.accept(0, 1)

    # the next target batch (the accepted token) lines up with the draft again
    nxt = api.Batch.tokens([drafted[0]], pos0=toks.size)
    assert target.decode(nxt) == 0
    assert spec.process_ok(nxt) is True
    assert draft.pos_max(0) == toks.size


def test_speculative_must_exist_before_the_target_decodes(
    target: api.Context, draft: api.Context, target_model: api.Model
) -> None:
    assert target.decode(api.Batch.tokens(_prompt(target_model))) == 0
    with pytest.raises(api.ContextError, match="before the target decodes"):
        api.Speculative(target, draft)


def test_speculative_refuses_rows_the_target_never_decoded(spec: api.Speculative) -> None:
    with pytest.raises(api.NativeCallError, match="the batch the target just decoded"):
        spec.process_tokens_ok([9, 10], [0, 1])


def test_accept_without_a_draft_raises_instead_of_aborting(spec: api.Speculative) -> None:
    with pytest.raises(api.NativeCallError, match="no draft was made"):
        spec.accept(0, 2)


# ---- mtmd -----------------------------------------------------------------------------------------------


def test_image_chunk_decode_sees_four_position_rows_with_one_temporal_position(
    target: api.Context, spec: api.Speculative, projector: api.Projector, target_model: api.Model
) -> None:
    assert projector.uses_mrope
    chunks = projector.tokenize(f"look at this {projector.marker} now", [image.rgb(56, 56)])
    kinds = [c.type for c in chunks]
    assert kinds == ["text", "image", "text"], chunks
    text0, img = chunks[0], chunks[1]
    assert img.n_tokens == img.nx * img.ny and img.n_pos == max(img.nx, img.ny)

    b0 = api.Batch.tokens(text0.tokens, pos0=0)
    assert target.decode(b0) == 0
    assert spec.process_ok(b0)

    n_past = text0.n_tokens
    seen: list[api.ImageBatch] = []
    result = projector.decode_image(target, img, n_past, on_batch=seen.append, speculative=spec)
    assert result.rc == 0
    assert result.n_past == n_past + max(img.nx, img.ny)
    assert sum(v.n_tokens for v in seen) == img.n_tokens
    for view in seen:
        assert view.n_pos == 4 and view.pos.shape == (4, view.n_tokens)
        assert set(view.pos[0].tolist()) == {n_past}  # one temporal position for the whole image
        assert view.embd.shape == (view.n_tokens, target_model.n_embd_inp)
    rows_y = np.concatenate([v.pos[1] for v in seen])
    rows_x = np.concatenate([v.pos[2] for v in seen])
    assert rows_y.max() - rows_y.min() == img.ny - 1 and rows_x.max() - rows_x.min() == img.nx - 1
    # the driver skipped the pinned rows and said so with "true", as llama-server sees it
    assert result.spec_results == [1] * len(seen)


def test_callback_exception_propagates(target: api.Context, projector: api.Projector) -> None:
    chunks = projector.tokenize(projector.marker, [image.rgb(56, 56)])
    img = next(c for c in chunks if c.type == "image")

    def boom(_view: api.ImageBatch) -> None:
        raise RuntimeError("boom from the callback")

    with pytest.raises(RuntimeError, match="boom from the callback"):
        projector.decode_image(target, img, 0, on_batch=boom)


def test_a_decode_without_encode_takes_only_the_chunk_last_encoded(
    target: api.Context, projector: api.Projector
) -> None:
    """decode_image(encode=False) decodes what mtmd's output buffer holds (to time a decode alone): the last
    encode's chunk, and no other."""
    first = next(c for c in projector.tokenize(projector.marker, [image.rgb(56, 56)]) if c.type == "image")
    other = next(c for c in projector.tokenize(projector.marker, [image.rgb(84, 56)]) if c.type == "image")
    with pytest.raises(ValueError, match=f"the last encode\\(\\) was not of chunk {first.index}"):
        projector.decode_image(target, first, 0, encode=False)
    projector.encode(first)
    with pytest.raises(ValueError, match="was not of chunk"):
        projector.decode_image(target, other, 0, encode=False)
    target.clear()
    assert projector.decode_image(target, first, 0, encode=False).rc == 0


# ---- bad inputs -----------------------------------------------------------------------------------------


def test_missing_file_raises_with_path_and_reason(lib_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(api.ModelLoadError, match="no such file") as info:
        api.Model(missing)
    assert str(missing) in str(info.value)


def test_non_gguf_file_raises_with_path_and_reason(lib_dir: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 definitely not a model")
    with pytest.raises(api.ModelLoadError, match="not a GGUF file") as info:
        api.Model(junk)
    assert str(junk) in str(info.value)


def test_truncated_gguf_is_refused_by_llama_cpp_without_crashing(
    lib_dir: Path, tmp_path: Path, models: tiny.TinyModels
) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(models.target.read_bytes()[:4096])
    with pytest.raises(api.ModelLoadError) as info:
        api.Model(cut)
    assert str(cut) in str(info.value) and info.value.reason


def test_draft_with_other_n_embd_is_refused(target: api.Context, tmp_path_factory: pytest.TempPathFactory) -> None:
    narrow = tiny.write_models(tmp_path_factory.mktemp("narrow"), config=tiny.TinyConfig(n_embd=32))
    with api.Model(narrow.draft) as other:
        assert other.n_embd != target.model.n_embd
        with pytest.raises(api.IncompatibleModelsError, match="n_embd") as info:
            api.Context.draft(other, target)
    assert str(narrow.draft) in str(info.value) and str(target.model.path) in str(info.value)


def test_an_assistant_made_after_the_target_decoded_is_refused(lib_dir: Path, tmp_path: Path) -> None:
    target_file, assistant_file = gemma4.write_pair(tmp_path)
    with api.Model(target_file) as tm, api.Model(assistant_file) as am:
        with api.Context(tm, n_ctx=64, n_batch=16, n_ubatch=16) as target:
            with api.Context.assistant(am, target) as assistant:  # made first: the context libcommon makes
                assert assistant.target is target and assistant.is_draft
            assert target.process_rc(api.Batch.tokens(_prompt(tm), pos0=0)) == 0
            with pytest.raises(api.ContextError, match="before the target decodes") as info:
                api.Context.assistant(am, target)
    assert str(assistant_file) in str(info.value)


# ---- lifetime, loading and logs ------------------------------------------------------------------------


def test_closing_a_model_closes_its_dependents_first(lib_dir: Path, models: tiny.TinyModels) -> None:
    tm = api.Model(models.target)
    dm = api.Model(models.draft)
    tgt = api.Context(tm, n_ctx=128, n_batch=32, n_ubatch=32)
    dft = api.Context.draft(dm, tgt)
    spec = api.Speculative(tgt, dft)
    tm.close()
    assert spec.closed and dft.closed and tgt.closed and tm.closed
    assert not dm.closed
    with pytest.raises(api.ClosedError):
        tgt.pos_max(0)
    dm.close()


def test_a_contiguous_embedding_array_is_used_in_place_and_others_are_copied(lib_dir):
    rows = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    pos = np.zeros((4, 8), dtype=np.int32)
    shared = api.Batch.embeddings(rows, pos)
    assert np.shares_memory(shared.embd, rows)
    strided = rows[:, ::2]  # not C-contiguous: must be copied into the batch's own memory
    copied = api.Batch.embeddings(strided, pos)
    assert not np.shares_memory(copied.embd, rows) and np.array_equal(copied.embd, strided)


def test_a_sequence_split_by_another_in_one_batch_is_refused(spec: api.Speculative) -> None:
    # libcommon's driver keeps each sequence's first and last row of a batch and reads the rows
    # between as that sequence's: [0, 1, 0] would hand sequence 1's row to sequence 0
    with pytest.raises(ValueError, match=r"rows of sequence 0 are not contiguous in the batch \(row 2 follows"):
        spec.process_tokens_ok([1, 2, 3], [0, 0, 1], seq_id=[0, 1, 0])
    with pytest.raises(ValueError, match="process_embd_ok: the rows of sequence 0 are not contiguous"):
        spec.process_embd_ok(np.zeros((3, 8), np.float32), np.array([0, 0, 1]), seq_id=[0, 1, 0])


# ---- the drafters of the family -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(tiny.DRAFTERS))
def test_each_drafter_gets_the_type_llama_server_detects_from_its_file(lib_dir, tmp_path, name) -> None:
    """libcommon's common_speculative_types_from_gguf (what llama-server runs for a -md given without
    --spec-type) names draft-dspark for a draft with a Markov head and draft-dflash for the others; a
    Speculative made without spec_type takes that type, and drafts."""
    form = tiny.drafter(name)
    m = tiny.write_models(tmp_path, form=form)
    assert api.detect_spec_type(m.draft) == form.spec_type
    with api.Model(m.target) as tm, api.Model(m.draft) as dm:
        target = api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32)
        draft = api.Context.draft(dm, target)
        with target, draft, api.Speculative(target, draft, n_max=3) as spec:
            assert spec.spec_type == form.spec_type
            toks = tm.tokenize("hello world, this is a prompt")
            batch = api.Batch.tokens(toks, pos0=0)
            assert target.process_rc(batch) == 0 and spec.process_ok(batch)
            drafted = spec.draft(0, target.argmax(), int(toks.size), n_max=3)
            assert 1 <= len(drafted) <= 3 and all(0 <= t < tm.n_vocab for t in drafted)


def test_an_unknown_spec_type_is_refused_by_name(draft: api.Context, target: api.Context) -> None:
    with pytest.raises(ValueError, match="unknown speculative type 'draft-nothing'"):
        api.Speculative(target, draft, spec_type="draft-nothing")


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_a_drafts_positions_are_read_from_its_cell_records_gaps_included(lib_dir, model_set, kind) -> None:
    """kv_cells.held() reads b11434's state records: a gap inside the draft's memory shows, which its
    first and last positions cannot (the M-RoPE draft's cells carry the 2-D extension, the sliding-window
    draft's memory is an iSWA pair)."""
    with api.Model(model_set.target) as tm, api.Model(model_set.draft_for(kind)) as dm:
        with api.Context(tm, n_ctx=256, n_batch=64, n_ubatch=64) as target, api.Context.draft(dm, target) as draft:
            with api.Speculative(target, draft, n_max=3) as spec:
                toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship", add_special=False)
                n = toks.size
                assert n >= 7
                batch = api.Batch.tokens(toks, pos0=0)
                assert target.decode(batch) == 0 and spec.process_ok(batch)
                assert sorted(kv_cells.held(draft, 0)) == list(range(n))
                assert draft.seq_rm(0, 3, 5)
                assert (draft.pos_min(0), draft.pos_max(0)) == (0, n - 1)  # what the ends alone say
                assert sorted(kv_cells.held(draft, 0)) == [0, 1, 2, *range(5, n)]
                assert kv_cells.held(draft, 1) == []
