"""Rules of the fix that no scenario reaches through mtmd, driven with hand-made batches, and the one
way its drafts can still differ from the twin's.

Each case runs in a child process per (variant, draft), since the variants share sonames:
- a forward jump *inside* one batch (a sequence's rows injected together): the fix injects it in
  runs of consecutive positions, and the legacy draft then drafts what its twin drafts on baseline;
- positions that go back within a sequence: the fix gives baseline's answer, whatever it is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from series_variants import TWIN_FIX

_CHILD = r"""
import hashlib, json, sys
import numpy as np
from pyllama_dflash import api, load
from pyllama_dflash.harness.slotloop.models import ModelSet

variant, twin, models = sys.argv[1], sys.argv[2] == "twin", ModelSet.from_json(json.loads(sys.argv[3]))
load(variant)
out = {}
with api.Model(models.target) as tm, api.Model(models.draft_for("plain", twin=twin)) as dm:
    with api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship ", add_special=False)
        jump = api.Batch.tokens(toks, [0, 1, 2, 3, 8, 9, 10, 11, 12])  # the target (M-RoPE) takes it
        assert target.process_rc(jump) == 0
        out["jump"] = spec.process_ok(jump)
        out["jump_log"] = [str(x) for x in spec.last_log]
        out["draft_pos_max"] = draft.pos_max(0)
        if out["jump"]:
            out["drafts"] = [spec.draft(0, target.argmax(8), 13)]
        # positions that go back, or repeat after a jump (the target decodes them in order, once each)
        for name, pos, decoded in (
            ("back", [13, 15, 14], [13, 14, 15]),
            ("back_gap", [13, 16, 14], [13, 14, 16]),
            ("repeat_gap", [13, 16, 16], [13, 14, 16]),
        ):
            # from the same state on every variant and draft: positions 0..12 without a jump
            target.clear(), draft.clear()
            plain = api.Batch.tokens(list(toks) + list(toks[:4]), pos0=0)
            assert target.process_rc(plain) == 0 and spec.process_ok(plain) and draft.pos_max(0) == 12
            # the Python API refuses such positions for a decode, but libcommon's driver takes any
            # batch: the target decodes the rows in order, the driver gets them out of order
            assert target.process_rc(api.Batch.tokens(toks[:3], decoded)) == 0
            out[name] = spec.process_tokens_ok(toks[:3], pos)
            out[name + "_log"] = [str(x) for x in spec.last_log if "ERROR" in str(x) or "WARN" in str(x)]
            out[name + "_pos_max"] = draft.pos_max(0)
    # a hole larger than the draft's free cells (the draft sized apart; llama-server gives it the
    # target's n_ctx, and the target holds more cells than the hole): the fill cannot fit
    with api.Context(tm, n_ctx=512, n_batch=32, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_ctx=256, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        toks = tm.tokenize("tree blue moon rock fish lamp ", add_special=False)
        far = api.Batch.tokens(toks, [0, 1, 2, 3, 400, 401])
        assert target.process_rc(far) == 0
        out["far"] = spec.process_ok(far)
        out["far_log"] = [str(x) for x in spec.last_log if "ERROR" in str(x)]
        out["far_pos_max"] = draft.pos_max(0)
        # two jumps in one batch, the second one's fill past the free cells: the first one's fill,
        # kept for the batch's later rows, goes too
        target.clear(), draft.clear()
        toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship milk ", add_special=False)[:10]
        two = api.Batch.tokens(toks, [0, 1, 2, 3, 100, 101, 102, 103, 400, 401])
        assert target.process_rc(two) == 0
        out["two_jumps"] = spec.process_ok(two)
        out["two_jumps_pos_max"] = draft.pos_max(0)
        draft.seq_rm(0, 100, -1)
        out["two_jumps_below_rows"] = draft.pos_max(0)  # 3 unless a filled row is left
    # a draft sized apart with room for the fill and the first chunk of the rows after it, not for
    # the fill beside every chunk: the fix keeps the fill until the batch's last row is injected
    with api.Context(tm, n_ctx=512, n_batch=128, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_ctx=256, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship " * 10, add_special=False)[:68]
        tight = api.Batch.tokens(toks, [0, 1, 2, 3, *range(200, 264)])  # chunks of 32: 0..3 and 200..227, ...
        assert target.process_rc(tight) == 0
        out["tight"] = spec.process_ok(tight)
        out["tight_log"] = [str(x) for x in spec.last_log if "ERROR" in str(x)]
        out["tight_pos_max"] = draft.pos_max(0)
        draft.seq_rm(0, 200, -1)
        out["tight_below_rows"] = draft.pos_max(0)  # 3 unless a filled row is left
    # a draft ahead of its target (the target restored alone) meets one image row (a 1x1 image) at
    # a position the draft holds: an M-RoPE draft takes a row at its last position, so only the
    # rows past it must go; the row already there stays, as the unpatched tree would keep it
    with api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship sun sea sky cat ", add_special=False)[:13]
        whole = api.Batch.tokens(toks, pos0=0)
        assert target.process_rc(whole) == 0 and spec.process_ok(whole)
        target.clear()
        assert target.process_rc(api.Batch.tokens(toks[:10], pos0=0)) == 0  # the draft still holds 0..12
        row = np.random.default_rng(0).normal(size=(1, tm.n_embd)).astype(np.float32)
        image = api.Batch.embeddings(row, np.array([[10], [10], [10], [0]], dtype=np.int32))
        assert target.process_rc(image) == 0
        out["ahead_image"] = spec.process_ok(image)
        out["ahead_image_pos_max"] = draft.pos_max(0)
        sizes = [len(draft.state_seq_get(0))]  # cells at 0..10, position 10 once or twice
        for p in (10, 9):
            draft.seq_rm(0, p, -1)
            sizes.append(len(draft.state_seq_get(0)))
        cell = sizes[1] - sizes[2]
        out["ahead_image_rows_at_10"] = (sizes[0] - sizes[1]) // cell if cell else None
        # a draft one position ahead of its target (the target restored alone, one token shorter)
        target.clear(), draft.clear()
        whole = api.Batch.tokens(toks, pos0=0)
        assert target.process_rc(whole) == 0 and spec.process_ok(whole)
        target.clear()
        assert target.process_rc(api.Batch.tokens(toks[:12], pos0=0)) == 0  # the draft holds 0..12
        one = api.Batch.tokens(toks[12:13], pos0=12)
        assert target.process_rc(one) == 0
        out["one_ahead"] = spec.process_ok(one)
        out["one_ahead_log"] = [str(x) for x in spec.last_log if "WARN" in str(x) or "ERROR" in str(x)]
        out["one_ahead_pos_max"] = draft.pos_max(0)
        # where the unpatched tree takes the rows (an empty memory; a jump on an M-RoPE draft), the
        # fix must leave the draft's cells exactly as it does, down to their order: the serialized
        # state after the rows and one more token (which lands in the first free cell)
        toks14 = list(toks) + [toks[0]]
        for name, first in (("cells_empty", [10, 11, 12]), ("cells_jump", [8, 9, 10, 11, 12])):
            target.clear(), draft.clear()
            assert target.process_rc(api.Batch.tokens(toks14, pos0=0)) == 0
            if name == "cells_jump":
                spec.process_tokens_ok(toks14[:4], [0, 1, 2, 3])
            took = spec.process_tokens_ok(toks14[: len(first)], first)
            out[name] = took and spec.process_tokens_ok(toks14[13:], [13])
            out[name + "_state"] = hashlib.sha256(draft.state_seq_get(0)).hexdigest()
        # the target restored alone to the end of an image's hole: the draft, which holds the text
        # on both sides of the hole (a hole the fix filled and emptied again), is trimmed to the
        # hole's start and must then be filled across it again
        target.clear(), draft.clear()
        assert target.process_rc(api.Batch.tokens(toks14, pos0=0)) == 0
        spec.process_tokens_ok(toks14[:9], list(range(9)))
        out["refill_jump"] = spec.process_tokens_ok(toks14[9:11], [12, 13])  # [9, 12) is the hole
        target.clear()
        assert target.process_rc(api.Batch.tokens(toks14[:12], pos0=0)) == 0  # restored: 0..11
        again = api.Batch.tokens(toks14[12:13], pos0=12)
        assert target.process_rc(again) == 0
        out["refill"] = spec.process_ok(again)
        out["refill_pos_max"] = draft.pos_max(0)
        # draft() meeting a draft behind the target (the target restored alone, further on): the
        # fill exists for the noise block's decode only, and the draft is left where it ended
        target.clear(), draft.clear()
        assert target.process_rc(api.Batch.tokens(toks14, pos0=0)) == 0
        spec.process_tokens_ok(toks14[:6], list(range(6)))  # the draft holds 0..5, the target 0..13
        out["behind_drafts"] = spec.draft(0, int(toks14[13]), 14)
        out["behind_pos_max"] = draft.pos_max(0)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(variants, model_set) -> dict[tuple[str, str], dict]:
    models = json.dumps(model_set.to_json())
    out = {}
    for variant, draft in (("baseline", "legacy"), ("baseline", "twin"), (TWIN_FIX, "legacy"), (TWIN_FIX, "twin")):
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, variant, draft, models], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, (variant, draft, proc.stderr[-3000:])
        out[(variant, draft)] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_baseline_refuses_a_jump_inside_one_batch_on_the_legacy_draft(runs):
    r = runs[("baseline", "legacy")]
    assert r["jump"] is False and any("not continuous" in line for line in r["jump_log"]), r["jump_log"]


def test_the_fix_injects_a_jump_inside_one_batch_as_the_twin_does(runs):
    fixed, twin = runs[(TWIN_FIX, "legacy")], runs[("baseline", "twin")]
    assert twin["jump"] is True and fixed["jump"] is True, fixed["jump_log"]
    assert fixed["draft_pos_max"] == twin["draft_pos_max"] == 12
    assert fixed["drafts"] == twin["drafts"] and fixed["drafts"][0], (fixed["drafts"], twin["drafts"])
    assert runs[(TWIN_FIX, "twin")]["drafts"] == twin["drafts"]  # and the twin itself is left alone


def _caller_unnamed(log: list[str]) -> list[str]:
    """The log lines with the name of the driver's function that logged them left out: llama.cpp's own
    lines are the answer; which of libcommon's functions passes it on (process(), or 0008's helper of
    it for a draft trained on text) is not."""
    return [re.sub(r"^\[common:(\w+)\] \w+: ", r"[common:\1] ", line) for line in log]


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_positions_that_do_not_increase_get_baselines_answer(runs, draft):
    """The fix neither fills nor trims such a batch: llama_process answers it as without the fix,
    with llama.cpp's own log line, and the draft's memory ends where baseline's does. Positions that
    go back are refused everywhere; a repeated one after a jump is refused by the legacy draft and
    taken by the M-RoPE twin, which requires only X <= Y."""
    base, fixed = runs[("baseline", draft)], runs[(TWIN_FIX, draft)]
    for case in ("back", "back_gap", "repeat_gap"):
        assert fixed[case] is base[case], (case, fixed[case + "_log"], base[case + "_log"])
        assert _caller_unnamed(fixed[case + "_log"]) == _caller_unnamed(base[case + "_log"]), case
        assert fixed[case + "_pos_max"] == base[case + "_pos_max"], case
        assert not any("WARN" in line for line in fixed[case + "_log"]), fixed[case + "_log"]  # no trim
        if case != "repeat_gap" or draft == "legacy":
            # refused, in llama.cpp's own words ("decreasing", or "not continuous" first for [13, 16, 14]
            # on a non-M-RoPE draft), and the draft's memory stays where it was
            assert base[case] is False and "[llama:ERROR]" in fixed[case + "_log"][0], case
            assert fixed[case + "_pos_max"] == 12, case
    assert (base["repeat_gap"], base["repeat_gap_pos_max"]) == ((False, 12) if draft == "legacy" else (True, 16))


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_a_fill_that_does_not_fit_is_refused_and_rolled_back(runs, draft):
    """The fix cannot follow a jump past the draft's free cells: process() says so (false), the
    filled rows are removed again, and the rows before the jump stay. The twin needs no fill."""
    fixed = runs[(TWIN_FIX, draft)]
    if draft == "twin":
        assert fixed["far"] is True and fixed["far_pos_max"] == 401
        return
    assert fixed["far"] is False and fixed["far_pos_max"] == 3, fixed["far_log"]
    # refused at the fill, in its own words, and the rows are not tried into the hole after it
    (line,) = fixed["far_log"]
    assert "inject_zero_rows: llama_process(ctx_dft) failed rc=1 (filling [" in line, line
    assert runs[("baseline", draft)]["far"] is False  # baseline refuses the jump itself
    # the same with a first jump whose fill fitted: that fill is removed as well
    assert fixed["two_jumps"] is False and fixed["two_jumps_pos_max"] == 103
    assert fixed["two_jumps_below_rows"] == 3


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_a_draft_sized_apart_needs_room_for_the_fill_beside_the_whole_batch(runs, draft):
    """The fill stays until the batch's last row is injected (so later chunks keep the twin's cells'
    order), so a legacy draft needs free cells for the fill and the whole batch at once. llama-server
    gives the draft the target's n_ctx, and the target holds a cell per position at least, so there
    it always fits. A draft sized smaller can refuse a batch that fits without the fill: here the
    second chunk, with the rows before it kept and nothing of the fill left. The twin needs no fill."""
    fixed = runs[(TWIN_FIX, draft)]
    if draft == "twin":
        assert fixed["tight"] is True and fixed["tight_pos_max"] == 263
        return
    assert fixed["tight"] is False, fixed["tight_log"]
    assert any("llama_process(ctx_dft) failed rc=1 (n_tokens=32, offset=32)" in x for x in fixed["tight_log"])
    assert fixed["tight_pos_max"] == 227 and fixed["tight_below_rows"] == 3


def test_an_m_rope_draft_ahead_of_its_target_is_trimmed_only_past_an_image_row(runs):
    """The unpatched twin refuses the row (its memory ends past it: X <= Y fails); the fix trims the
    rows past the row's position and no more, so the twin's own row at that position stays."""
    assert runs[("baseline", "twin")]["ahead_image"] is False
    fixed = runs[(TWIN_FIX, "twin")]
    assert fixed["ahead_image"] is True and fixed["ahead_image_pos_max"] == 10
    assert fixed["ahead_image_rows_at_10"] == 2  # the one the draft held, and the image's


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_a_draft_one_position_ahead_is_trimmed_by_that_position(runs, draft):
    """The smallest draft-ahead case: the next row's position is the draft's last. The legacy draft
    refuses it on baseline (Y = X): the fix removes that one position, says so, and injects the
    row. The M-RoPE twin takes it on baseline (X <= Y): the fix leaves it alone, as baseline does."""
    base, fixed = runs[("baseline", draft)], runs[(TWIN_FIX, draft)]
    assert fixed["one_ahead"] is True and fixed["one_ahead_pos_max"] == 12, fixed["one_ahead_log"]
    trimmed = any("removing positions [12, 12]" in line for line in fixed["one_ahead_log"])
    if draft == "legacy":
        assert base["one_ahead"] is False and trimmed, fixed["one_ahead_log"]
    else:
        assert base["one_ahead"] is True and not trimmed and fixed["one_ahead_log"] == base["one_ahead_log"]


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_where_baseline_takes_the_rows_the_fix_leaves_the_cells_as_baseline_does(runs, draft):
    """No fill where none is needed, not even one removed again: an empty memory takes any first
    position, and an M-RoPE draft takes a jump. A fill removed again would leave free cells that the
    next token takes, and the draft's cells would no longer be in baseline's order."""
    base, fixed = runs[("baseline", draft)], runs[(TWIN_FIX, draft)]
    cases = ["cells_empty"] + (["cells_jump"] if draft == "twin" else [])
    for case in cases:
        assert base[case] is True and fixed[case] is True, case
        assert fixed[case + "_state"] == base[case + "_state"], case


def test_a_trimmed_draft_is_filled_across_a_hole_it_was_filled_across_before(runs):
    fixed = runs[(TWIN_FIX, "legacy")]
    assert fixed["refill_jump"] is True
    assert fixed["refill"] is True and fixed["refill_pos_max"] == 12


@pytest.mark.parametrize("draft", ["legacy", "twin"])
def test_draft_leaves_a_draft_behind_where_it_ended(runs, draft):
    fixed = runs[(TWIN_FIX, draft)]
    assert fixed["behind_drafts"], "drafted nothing from a draft behind the target"
    assert fixed["behind_pos_max"] == 5  # neither the fill nor the noise block stays


_SAME_LAYOUT = r"""
import hashlib, json, sys
import numpy as np
from pyllama_dflash import api, load
from pyllama_dflash.harness.engine.execute import execute
from pyllama_dflash.harness.engine.schedule import Schedule
from pyllama_dflash.harness import slotloop
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.models import ModelSet

load("baseline")
models, same_layout = ModelSet.from_json(json.loads(sys.argv[1])), sys.argv[3] == "same-layout"
spec_process = slotloop.Session._spec_process

def laid_out_like_the_fix(self, batch, step, seq):
    # what 0004 does to a legacy draft's cells, done to the twin: zero rows in the hole before the
    # rows that follow, removed right after; the twin accepts either way
    x, y = self.draft.pos_max(seq) if seq >= 0 else -1, int(batch.pos[0].min())
    if not same_layout or x < 0 or y <= x + 1:
        return spec_process(self, batch, step, seq)
    pos = np.array([[p, p, p, 0] for p in range(x + 1, y)], dtype=np.int32).T
    rows = np.zeros((y - x - 1, self.draft.decode_embd_width), np.float32)
    assert self.draft.process_rc(api.Batch.embeddings(rows, pos, seq_id=seq)) == 0
    spec_process(self, batch, step, seq)
    assert self.draft.seq_rm(seq, x + 1, y)

slotloop.Session._spec_process = laid_out_like_the_fix
out = execute(Schedule.load(sys.argv[2]), models.with_draft(models.twin), DEFAULT_CONFIG,
              check=False)
print(json.dumps([r.tokens for r in out.record.rounds]))
"""


def test_the_only_drift_left_is_a_tie_broken_by_the_cells_order(variants, model_set, tmp_path):
    """Found by the fuzzer (seed 7, 300 examples): two images back to back, then generation. Round 3
    of full drafts otherwise than the twin on baseline. The cells hold the same values; only their
    order in the KV buffer differs (the freed fill cells are reused), so attention sums in another
    order. Laying the twin's cells out the same way on baseline makes it draft what full drafts. The
    oracle proves it by itself (TIE); this hand-made layout replay, written apart, agrees with it."""
    from pyllama_dflash.harness.engine.schedule import Schedule
    from pyllama_dflash.harness.engine.schedule_runner import replay_variants

    path = Path(__file__).parent / "data" / "schedules" / "tie-cell-order.json"
    fixed = replay_variants(Schedule.load(path), ["full"], model_set, work_dir=tmp_path)["full"]
    assert fixed["status"] == "TIE" and fixed["tie"]["round"] == 3, fixed
    twin = {}
    for layout in ("twin-layout", "same-layout"):
        proc = subprocess.run(
            [sys.executable, "-c", _SAME_LAYOUT, json.dumps(model_set.to_json()), str(path), layout],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        twin[layout] = json.loads(proc.stdout.strip().splitlines()[-1])
    drafted = [d["tokens"] for d in fixed["drafts"]]
    assert twin["twin-layout"] != drafted and twin["same-layout"] == drafted, (twin, drafted)
