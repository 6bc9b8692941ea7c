"""MTP fed an image's rows (patch 0009), through the library on the tiny MTP target.

The MTP head's input at a row is a pair: the row's input embedding and the target's hidden state of the
row before. b11434 can carry the pair for a text row only (the token, with the hidden state in the
entry's embedding): llama_batch_ext_set_embd_state, which would carry the state beside an embedding, is
a stub that refuses every state, and MTP's process() skips an image. 0009 implements the state row
and feeds the image. These tests judge it at both levels:

- libllama: an embedding row holding token t's embedding, with a state h, is to the bit the row of
  token t with the state h (the head's logits, and those of a row after it, which reads its keys and
  values), and the state is what reaches h;
- libcommon: after an image, the MTP context's memory is byte for byte that of an MTP context fed the
  same rows by hand, in the same passes (the reference: each row's embedding or token with the target's
  hidden state of the row before).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from series_variants import FEEDS_MTP

from pyllama_dflash.harness.slotloop.models import sibling_models

_CHILD = r"""
import contextlib, json, sys
import numpy as np
from pyllama_dflash import api, load
from pyllama_dflash.harness.oracles.mtp_heads import token_embeddings
from pyllama_dflash.harness.slotloop.models import ModelSet

variant, models = sys.argv[1], ModelSet.from_json(json.loads(sys.argv[2]))
load(variant)
out = {}
rng = np.random.default_rng(7)


def text_pos(p0, n):
    # the positions a text row gets on an M-RoPE model: [p, p, p, 0]
    p = np.arange(p0, p0 + n, dtype=np.int32)
    return np.stack([p, p, p, np.zeros_like(p)])


def image_pos(p0, ny, nx):
    # an image's rows as mtmd places them on an M-RoPE target: all at p0, then row and column
    y, x = np.divmod(np.arange(ny * nx, dtype=np.int32), nx)
    return np.stack([np.full_like(y, p0), p0 + y, p0 + x, np.zeros_like(y)])


def head(tm, rows):
    # the MTP head's logits of the last row after one batch in a fresh context, and of a probe row after
    # it (which reads the batch's keys and values: the memory, but for the cells' token ids, which the
    # state file holds and an embedding row has none of)
    with api.Context(tm, n_ctx=128, n_batch=64, n_ubatch=64) as target, api.Context.mtp(target) as mtp:
        try:
            batch = rows()
            rc = mtp.process_rc(batch)
        except ValueError as e:
            return {"refused": str(e)}
        assert rc == 0, rc
        logits = mtp.logits(-1)
        probe = np.ones((1, tm.n_embd), np.float32)  # a row without a state, which b11434 takes too
        assert mtp.process_rc(api.Batch.embeddings(probe, text_pos(batch.n_tokens, 1), logits="last")) == 0
        return {"logits": logits, "probe": mtp.logits(-1)}


def libllama(tm):
    embd = token_embeddings(models.target)
    tokens = [5, 9, 13, 2, 31]
    n, n_embd = len(tokens), embd.shape[1]
    h = rng.normal(size=(n, n_embd)).astype(np.float32)
    by_token = head(tm, lambda: api.Batch.tokens(tokens, pos0=0, logits="last", state=h))
    by_embd = head(tm, lambda: api.Batch.embeddings(embd[tokens], text_pos(0, n), logits="last", state=h))
    other = head(tm, lambda: api.Batch.embeddings(embd[tokens], text_pos(0, n), logits="last", state=h[::-1]))
    # without a state the embedding is also the hidden state (b11434's only form): as a state equal to it
    plain = head(tm, lambda: api.Batch.embeddings(embd[tokens], text_pos(0, n), logits="last"))
    as_state = head(tm, lambda: api.Batch.embeddings(embd[tokens], text_pos(0, n), logits="last", state=embd[tokens]))
    if "refused" in by_token:
        return {"refused": by_token["refused"], "plain_runs": "logits" in plain}
    apart = lambda a, b: float(np.abs(a["logits"] - b["logits"]).max())
    return {
        "token_vs_embedding": apart(by_token, by_embd),
        "probe_apart": apart(by_token | {"logits": by_token["probe"]}, by_embd | {"logits": by_embd["probe"]}),
        "other_state_apart": apart(by_embd, other),
        "plain_vs_state_equal_to_it": apart(plain, as_state),
    }


def libcommon(tm):
    # text, an image, text: libcommon's MTP context against one fed the same rows by hand
    n_embd = tm.n_embd
    with contextlib.ExitStack() as stack:
        enter = stack.enter_context
        target = enter(api.Context(tm, n_ctx=128, n_batch=64, n_ubatch=64))
        fed = enter(api.Context.mtp(target))
        spec = enter(api.Speculative(target, fed, n_max=3, spec_type="draft-mtp", backend_sampling=False))
        by_hand = enter(api.Context.mtp(target))
        pending = np.zeros((1, n_embd), np.float32)
        found = {"by_hand": True}
        text = [int(t) for t in tm.tokenize("tree blue moon rock fish lamp ", add_special=False)]
        ny, nx = 3, 4
        p_image = len(text)
        image = rng.normal(size=(ny * nx, n_embd)).astype(np.float32)
        after = [int(t) for t in tm.tokenize("sun cat", add_special=False)]
        p_after = p_image + max(ny, nx)
        passes = [
            (lambda **k: api.Batch.tokens(text, pos0=0, **k)),
            (lambda **k: api.Batch.embeddings(image, image_pos(p_image, ny, nx), **k)),
            (lambda **k: api.Batch.tokens(after, pos0=p_after, **k)),
        ]
        for i, rows in enumerate(passes):
            batch = rows(logits="last" if i != 1 else "none")
            assert target.process_rc(batch) == 0
            assert spec.process_ok(batch)
            h = spec.target_hidden_states(batch.n_tokens)
            if i == 1:
                found["pos_max_after_image"] = fed.pos_max(0)
            if found["by_hand"]:
                try:
                    assert by_hand.process_rc(rows(logits="none", state=np.vstack([pending, h[:-1]]))) == 0
                except ValueError as e:
                    found["by_hand"] = str(e)
            pending = h[-1:]
        found["p_image"], found["p_end"] = p_image, p_after + len(after)
        found["pos_max"] = fed.pos_max(0)
        if found["by_hand"] is True:
            found["same_memory"] = fed.state_seq_get(0) == by_hand.state_seq_get(0)
        found["drafted"] = spec.draft(0, target.argmax(-1), p_after + len(after))
        # embedding rows wider than the head reads (a projector of another width): skipped, with a warning;
        # at positions the target holds, as the driver's caller guards
        before = fed.state_seq_get(0)
        wide = np.ones((2, 2 * n_embd), np.float32)
        found["wide_ok"] = spec.process_embd_ok(wide, image_pos(p_image, 1, 2))
        found["wide_log"] = [str(x) for x in spec.last_log]
        found["wide_left_memory_alone"] = fed.state_seq_get(0) == before
    return found


with api.Model(models.target, load_mtp=True) as tm:
    out["libllama"] = libllama(tm)
    out["libcommon"] = libcommon(tm)
print(json.dumps(out))
"""


def _run_child(variant: str) -> dict:
    models = json.dumps(sibling_models("mtp").to_json())
    proc = subprocess.run([sys.executable, "-c", _CHILD, variant, models], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (variant, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(variants) -> dict[str, dict]:
    assert FEEDS_MTP is not None, "the series has no patch that feeds MTP an image (0009)"
    return {v: _run_child(v) for v in ("baseline", FEEDS_MTP)}


def test_b11434_refuses_a_state_beside_a_row(runs):
    found = runs["baseline"]["libllama"]
    assert "llama_batch_ext_set_embd_state refused" in found["refused"], found
    assert found["plain_runs"]  # the embedding rows alone, b11434's form, still decode


def test_an_embedding_row_with_a_state_is_to_the_bit_the_token_row_with_that_state(runs):
    found = runs[FEEDS_MTP]["libllama"]
    assert found["token_vs_embedding"] == 0.0 and found["probe_apart"] == 0.0, found


def test_the_state_is_what_reaches_the_heads_hidden_input(runs):
    found = runs[FEEDS_MTP]["libllama"]
    assert found["other_state_apart"] > 1e-3, found  # another state, other logits
    # a row without a state is read as before 0009: its embedding is also its hidden state
    assert found["plain_vs_state_equal_to_it"] == 0.0, found


def test_b11434s_mtp_skips_the_image(runs):
    found = runs["baseline"]["libcommon"]
    assert found["pos_max_after_image"] == found["p_image"] - 1, found  # nothing at the image's position
    assert "refused" in found["by_hand"], found


def test_mtp_after_an_image_holds_what_a_head_fed_the_rows_by_hand_holds(runs):
    found = runs[FEEDS_MTP]["libcommon"]
    assert found["pos_max_after_image"] == found["p_image"], found  # the image's rows, at its position
    assert found["by_hand"] is True and found["same_memory"] is True, found
    assert found["pos_max"] == found["p_end"] - 1, found
    assert len(found["drafted"]) == 3, found


def test_mtp_skips_embedding_rows_wider_than_its_head_reads_and_says_so(runs):
    found = runs[FEEDS_MTP]["libcommon"]
    assert found["wide_ok"] is True and found["wide_left_memory_alone"] is True, found
    assert any("the MTP head reads" in line for line in found["wide_log"]), found["wide_log"]
