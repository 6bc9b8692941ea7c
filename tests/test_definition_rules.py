"""Rules of the definition (patch 0007) that no scenario reaches through mtmd, driven with hand-made
batches in a child process per variant (the variants share sonames):

- every row goes in at the draft's own next position, whatever the target's positions: a jump, and
  an image's rows pinned to one position;
- positions that go back within a sequence are refused before anything is injected;
- libcommon says which drafts keep positions of their own (common_speculative_own_positions), which
  is what llama-server trims and restores the draft by;
- EAGLE3 drafts after llama-server's call orders as after the same target passes without them.

pyllama_dflash.lab.mutate runs this file on each mutant of a fix judged against the definition, and of a fix
that serves drafts as trained (0008, 0009: then with drafts marked as trained with image rows).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from series_variants import DEFINED, SERVED_AS_TRAINED

from pyllama_dflash.harness.slotloop.models import ModelSet, sibling_models, tiny_models

# how far apart the draft's last logits may be from those of a fresh draft fed the same history in one
# pass, for the one call order that is nothing but passes (a cut back into the last batch). The
# target's features of a row differ in the last bits with the passes' shapes, by how much depends on
# the CPU's instructions (the cancelled draft's case: 3.8e-6 with AVX-512, 4.9e-3 with AVX2), so the
# other call orders are compared with the same passes alone, to the bit. The margins of this bound:
# test_eagle3_drafts_after_a_cut_back_into_the_last_batch_as_after_one_pass
ONE_PASS_APART = 1e-4

_CHILD = r"""
import json, sys
import numpy as np
from pyllama_dflash import api, load
from pyllama_dflash.harness.slotloop.models import ModelSet

variant, models = sys.argv[1], ModelSet.from_json(json.loads(sys.argv[2]))
load(variant)
out = {}


def feed(target, spec, calls):
    # each call's rows decoded by the target and handed to the driver, at consecutive positions: whether
    # the driver took each, and how many rows went in
    pos0, took = 0, []
    for rows in calls:
        batch = api.Batch.tokens(rows, pos0=pos0)
        assert target.process_rc(batch) == 0
        took.append(spec.process_ok(batch))
        pos0 += len(rows)
    return took, pos0


def eagle3_call_orders(m):
    # EAGLE3's draft after call orders llama-server can make, against two references in fresh contexts:
    # the same target passes without the call order's extra calls (the target's features of every row
    # then agree to the bit, whatever the CPU rounds), and one pass over the same history (they differ
    # in the last bits with the passes' shapes); and batches at the draft's n_batch
    import contextlib

    def opened(stack):
        target = stack.enter_context(api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32, n_rs_seq=4))
        draft = stack.enter_context(api.Context.draft(dm, target, n_batch=32, n_ubatch=32))
        # sampling on the CPU: a backend sampler leaves the logits buffer without the full logits
        spec = api.Speculative(target, draft, n_max=3, spec_type="draft-eagle3", backend_sampling=False)
        return target, draft, stack.enter_context(spec)

    def pick(history):
        with api.Context(tm, n_ctx=256, n_batch=64, n_ubatch=64) as c:
            assert c.process_rc(api.Batch.tokens(history)) == 0
            return c.argmax(-1)

    def take(target, spec, tokens, pos0, logits="last"):
        batch = api.Batch.tokens(tokens, pos0=pos0, logits=logits)
        assert target.process_rc(batch) == 0 and spec.process_ok(batch)

    def cut(target, draft, pos):
        assert target.seq_rm(0, pos, -1) and draft.seq_rm(0, pos, -1)

    def next_draft(target, draft, spec, n):
        # the draft after the target's n rows, and the logits of its last step
        return spec.draft(0, target.argmax(-1), n, trim_at=n), draft.logits(-1)

    def replay(passes, n):
        # fresh contexts fed these passes: (tokens, pos0, logits) to take, or a position to cut back to
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            for step in passes:
                cut(target, draft, step) if isinstance(step, int) else take(target, spec, *step)
            return next_draft(target, draft, spec, n)

    def versus(target, draft, spec, history, passes):
        # passes: the target's passes of the call order without its other calls (None where the call
        # order is nothing but passes, so that only one pass differs from it)
        n = len(history)
        drafted, logits = next_draft(target, draft, spec, n)
        out = {"drafted": drafted}
        for name, steps in (("same_passes", passes), ("one_pass", [(history, 0, "last")])):
            if steps is not None:
                ref, ref_logits = replay(steps, n)
                out[name] = {"drafted": ref, "apart": float(np.abs(logits - ref_logits).max())}
        return out

    found = {}
    with api.Model(m.target) as tm, api.Model(m.draft) as dm:
        prompt = [int(t) for t in tm.tokenize("tree blue moon rock fish lamp ", add_special=False)]
        n, first = len(prompt), pick(prompt)
        # a verify that accepts one draft, then a round with nothing to draft (a reply's last token) whose
        # token is the rejected verify's last: its process() must still complete the accepted row's pair
        x = pick(prompt + [first])
        w = pick(prompt + [first, x])
        y = (w + 1) % tm.n_vocab
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            take(target, spec, prompt, 0)
            spec.draft(0, first, n, trim_at=n)
            take(target, spec, [first, x, y, w], n, logits="all")
            assert [target.argmax(i) for i in range(2)] == [x, w]
            spec.accept(0, 1)
            cut(target, draft, n + 2)
            take(target, spec, [w], n + 2)
            passes = [(prompt, 0, "last"), ([first, x, y, w], n, "all"), n + 2, ([w], n + 2, "last")]
            found["accepted_then_no_draft"] = versus(target, draft, spec, prompt + [first, x, w], passes)
        # a draft whose verify never comes (its request cancelled), then the conversation goes on with
        # another token than the one drafted from, here the prompt's last again, in two passes whose
        # second starts with the token drafted from: each pass must pair the row before it anew
        last = prompt[-1]
        assert last != first, "the case needs a prompt whose last token is not the target's next"
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            take(target, spec, prompt, 0)
            spec.draft(0, first, n, trim_at=n)
            take(target, spec, [last], n)
            take(target, spec, [first], n + 1)
            passes = [(prompt, 0, "last"), ([last], n, "last"), ([first], n + 1, "last")]
            found["cancelled_draft"] = versus(target, draft, spec, prompt + [last, first], passes)
        # a cut back into the last process()'s rows, to its first (a cached prefix that ends there), then
        # the conversation goes on with that batch's last token: the row before the cut pairs with it
        a, b, c = prompt[:3]
        assert len({a, b, c}) == 3, "the case needs three distinct tokens"
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            take(target, spec, [a, b, c], 0, logits="all")
            cut(target, draft, 1)
            take(target, spec, [c], 1)
            found["cut_back_into_the_last_batch"] = versus(target, draft, spec, [a, c], None)
        # batches that fill the draft's n_batch (32) with the bridged row, and one that overflows it
        # by that row: the rows go in, in pieces of n_batch
        text = "tree blue moon rock fish lamp wind gold ship " * 8
        many = [int(t) for t in tm.tokenize(text, add_special=False)]
        assert len(many) >= 4 + 31 + 32 + 1
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            batches = [many[:4], many[4:35], many[35:67]]
            assert batches[1][0] != batches[0][-1] and batches[2][0] != batches[1][-1], "each must bridge"
            took, pos0 = feed(target, spec, batches)
            found["batches_at_n_batch"] = {"took": took, "pos_max": draft.pos_max(0), "rows": pos0}
        # a context checkpoint saved before a draft() and loaded after it, its pending row with it
        # (get_state / set_state): the next process() must pair the row anew, whatever token the
        # driver last saw (here the one the conversation goes on with again)
        continued = [(prompt, 0, "last"), ([first], n, "last")]
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            take(target, spec, prompt, 0)
            checkpoint = (target.state_seq_get(0), draft.state_seq_get(0), spec.get_state(0))
            assert checkpoint[2], "the driver keeps no state with the checkpoint: nothing is tested"
            spec.draft(0, first, n, trim_at=n)
            take(target, spec, [first], n)
            cut(target, draft, -1)
            assert target.state_seq_set(0, checkpoint[0]) and draft.state_seq_set(0, checkpoint[1])
            spec.set_state(0, checkpoint[2])
            take(target, spec, [first], n)
            found["checkpoint_with_pending_row"] = versus(target, draft, spec, prompt + [first], continued)
        # a slot restored without the driver's state (set_state with none, as llama-server does), saved
        # right after a draft() paired its last row, over a conversation whose last process() ended with
        # one row at that row's position: the row must keep its saved pair, not take the other
        # conversation's g (however the driver would find it: its pending row, or its last rows)
        with contextlib.ExitStack() as stack:
            target, draft, spec = opened(stack)
            take(target, spec, prompt, 0)
            spec.draft(0, first, n, trim_at=n)
            slot = (target.state_seq_get(0), draft.state_seq_get(0))
            cut(target, draft, -1)
            spec.set_state(0)
            other = [int(t) for t in tm.tokenize("gold ship wind wind moon lamp tree gold ship ", add_special=False)]
            assert len(other) >= n, "the other conversation must reach the restored row"
            take(target, spec, other[: n - 1], 0)
            take(target, spec, other[n - 1 : n], n - 1)
            cut(target, draft, -1)
            assert target.state_seq_set(0, slot[0]) and draft.state_seq_set(0, slot[1])
            spec.set_state(0)
            take(target, spec, [first], n)
            found["slot_restored_without_state"] = versus(target, draft, spec, prompt + [first], continued)
    return found

with api.Model(models.target) as tm, api.Model(models.draft_for("plain")) as dm:
    with api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        out["own_positions"] = spec.own_positions
        out["own_positions_text"] = spec.own_positions_text
        toks = tm.tokenize("tree blue moon rock fish lamp wind gold ship ", add_special=False)
        jump = api.Batch.tokens(toks, [0, 1, 2, 3, 8, 9, 10, 11, 12])  # the target (M-RoPE) takes it
        assert target.process_rc(jump) == 0
        out["jump"] = spec.process_ok(jump)
        out["jump_pos_max"] = draft.pos_max(0)
        # an image's rows pinned to the position after the text, as mtmd hands them to the driver
        rows = np.random.default_rng(0).normal(size=(4, tm.n_embd)).astype(np.float32)
        pinned = api.Batch.embeddings(rows, np.array([[13] * 4, [13, 13, 14, 14], [13, 14, 13, 14], [0] * 4]))
        assert target.process_rc(pinned) == 0
        out["pinned"] = spec.process_ok(pinned)
        out["pinned_pos_max"] = draft.pos_max(0)
        # positions that go back within a sequence: the target decodes the rows in order, the driver
        # gets them out of order; nothing of them may reach the draft
        assert target.process_rc(api.Batch.tokens(toks[:3], [15, 16, 17])) == 0
        out["back"] = spec.process_tokens_ok(toks[:3], [15, 17, 16])
        out["back_log"] = [str(x) for x in spec.last_log if "ERROR" in str(x)]
        out["back_pos_max"] = draft.pos_max(0)
    # more rows than the draft has cells: a draft context sized apart (256 cells) given 288 rows in one
    # batch; the decode of the chunk that does not fit fails, and process() must say so
    with api.Context(tm, n_ctx=512, n_batch=512, n_ubatch=64) as target, \
         api.Context.draft(dm, target, n_ctx=256, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3) as spec:
        many = tm.tokenize("tree blue moon rock fish lamp wind gold ship " * 60, add_special=False)[:288]
        assert len(many) == 288
        assert target.process_rc(api.Batch.tokens(many)) == 0
        out["overflow"] = spec.process_ok(api.Batch.tokens(many))
        out["overflow_log"] = [str(x) for x in spec.last_log if "ERROR" in str(x)]
        out["overflow_pos_max"] = draft.pos_max(0)
    # a batch of more rows than the draft's n_ubatch, within its n_batch: the draft's attention is not
    # causal, so one decode takes one ubatch at most, and process() must inject the rows in pieces of
    # n_ubatch; the draft then drafts what it drafts after the same rows in calls of n_ubatch rows
    many = tm.tokenize("tree blue moon rock fish lamp wind gold ship " * 10, add_special=False)[:40]
    assert len(many) == 40
    out["past_n_ubatch"] = []
    for calls in ([many], [many[i : i + 16] for i in range(0, 40, 16)]):
        with api.Context(tm, n_ctx=256, n_batch=64, n_ubatch=64) as target, \
             api.Context.draft(dm, target, n_batch=64, n_ubatch=16) as draft, \
             api.Speculative(target, draft, n_max=3) as spec:
            took, pos0 = feed(target, spec, calls)
            drafted = spec.draft(0, target.argmax(-1), pos0)
            out["past_n_ubatch"].append({"took": took, "pos_max": draft.pos_max(0), "drafted": drafted})
# the slot loop's check of a draft with positions of its own: a gap inside its memory, which its first
# and last positions do not show
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.record import DRAFT_ROWS, Record, StopScenario
from pyllama_dflash.harness.slotloop import Session

record = Record()
with Session(models, DEFAULT_CONFIG, record) as session:
    session.prompt(0, "tree blue moon rock fish lamp wind gold ship")
    out["rows_before_gap"] = [c.summary() for c in record.calls if c.api == DRAFT_ROWS]
    n = session.draft.pos_max(0) + 1
    if session.own_positions:
        assert n >= 6 and session.draft.seq_rm(0, 2, 4)
    try:
        session._check_draft_rows(0, "a gap made by hand")
    except StopScenario:  # a failing call ends a scenario: recorded first
        pass
    out["rows_after_gap"] = [c.log[0] for c in record.calls if c.api == DRAFT_ROWS and not c.ok]
    out["rows_n"] = n
# EAGLE3 on the same libcommon: positions of its own over the text rows under 0007, the target's before
eagle3 = ModelSet.from_json(json.loads(sys.argv[3]))
with api.Model(eagle3.target) as tm, api.Model(eagle3.draft) as dm:
    with api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32) as target, \
         api.Context.draft(dm, target, n_batch=32, n_ubatch=32) as draft, \
         api.Speculative(target, draft, n_max=3, spec_type="draft-eagle3") as spec:
        out["eagle3_own_positions"] = spec.own_positions
        out["eagle3_own_positions_text"] = spec.own_positions_text
if variant != "baseline":  # baseline's EAGLE3 decodes its bridge with another row's g (docs/fix.md)
    out["eagle3_call_orders"] = eagle3_call_orders(eagle3)
# MTP on the same libcommon: no positions of its own on any (its context is the target's)
mtp = ModelSet.from_json(json.loads(sys.argv[4]))
with api.Model(mtp.target, load_mtp=True) as tm:
    with api.Context(tm, n_ctx=256, n_batch=32, n_ubatch=32) as target, api.Context.mtp(target) as draft, \
         api.Speculative(target, draft, n_max=3, spec_type="draft-mtp") as spec:
        out["mtp_own_positions"] = spec.own_positions
print(json.dumps(out))
"""


def _run_child(variant: str, model_set: ModelSet) -> dict:
    models = json.dumps(model_set.to_json())
    eagle3 = json.dumps(sibling_models("eagle3").to_json())
    mtp = json.dumps(sibling_models("mtp").to_json())
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, models, eagle3, mtp], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, (variant, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# the fixes these rules judge: the definition's, and each that serves drafts as trained (0008, 0009), which
# serves drafts marked as trained with image rows, and every EAGLE3 and MTP draft, by the definition; in a
# mutant's series (pyllama_dflash.lab.mutate), its one fix of either role
RULED = tuple(v for v in (DEFINED, *SERVED_AS_TRAINED) if v)


@pytest.fixture(scope="module")
def runs(variants, model_set, tmp_path_factory) -> dict[str, dict]:
    # an as-trained fix serves a DFlash draft by the definition only when the draft is marked (the
    # definition's fix and the baseline read no mark)
    marked = tiny_models(tmp_path_factory.mktemp("marked"), image_rows=True) if SERVED_AS_TRAINED else None
    out = {"baseline": _run_child("baseline", model_set)}
    for variant in RULED:
        out[variant] = _run_child(variant, marked if variant in SERVED_AS_TRAINED else model_set)
    return out


@pytest.fixture(scope="module", params=RULED)
def ruled(request, runs) -> dict:
    """What the child measured on one fix these rules judge."""
    return runs[request.param]


def test_libcommon_says_which_drafts_keep_positions_of_their_own(runs, ruled):
    assert ruled["own_positions"] is True
    assert ruled["eagle3_own_positions"] is True  # 0007: EAGLE3 too, over the text rows only
    assert runs["baseline"]["own_positions"] is False  # no such query there: the target's positions
    assert runs["baseline"]["eagle3_own_positions"] is False
    # MTP drafts in the target's own context, at the target's positions, on every libcommon
    assert ruled["mtp_own_positions"] is False and runs["baseline"]["mtp_own_positions"] is False


def test_libcommon_says_which_drafts_count_the_text_rows_only(runs, ruled):
    """The session's rule for EAGLE3 (an image's rows out of its context) is libcommon's answer."""
    assert ruled["eagle3_own_positions_text"] is True
    assert ruled["own_positions_text"] is False  # the DFlash family: every row
    assert runs["baseline"]["eagle3_own_positions_text"] is False


def test_a_jump_goes_in_at_the_drafts_own_next_positions(runs, ruled):
    """Nine rows at target positions 0..3 and 8..12 sit at draft positions 0..8; baseline refuses the jump."""
    assert ruled["jump"] is True and ruled["jump_pos_max"] == 8
    assert runs["baseline"]["jump"] is False


def test_an_images_pinned_rows_go_in_one_draft_position_each(runs, ruled):
    """The definition injects the four rows after the nine; baseline skips a pinned batch (its draft, which
    refused the jump, stays empty)."""
    assert ruled["pinned"] is True and ruled["pinned_pos_max"] == 12
    assert runs["baseline"]["pinned"] is True and runs["baseline"]["pinned_pos_max"] == -1


def test_a_batch_past_the_drafts_n_ubatch_goes_in_in_pieces(ruled):
    """A DFlash draft's attention is not causal, so one decode takes one ubatch at most (llama_decode
    asserts it): 40 rows in one call to a draft of n_ubatch 16 and n_batch 64 go in in pieces of 16,
    and the draft drafts what it drafts after the same rows handed over in calls of 16."""
    whole, pieces = ruled["past_n_ubatch"]
    assert whole["took"] == [True] and pieces["took"] == [True] * 3
    assert whole["pos_max"] == pieces["pos_max"] == 39
    assert whole["drafted"] == pieces["drafted"]


def test_the_slot_loop_sees_a_gap_inside_the_drafts_memory(runs, ruled):
    """Session's check of a draft with positions of its own reads every position the draft holds: a gap
    cut inside (2..3) fails it, though the memory still spans 0..N-1. Baseline's draft keeps the target's
    positions, so nothing is checked there."""
    n = ruled["rows_n"]
    assert ruled["rows_before_gap"] == [], ruled
    held = f"0..1, 4..{n - 1}" if n > 5 else f"0..1, {n - 1}"
    message = f"the draft's memory of seq 0 holds positions {held}, not its {n} rows' 0..{n - 1}"
    assert ruled["rows_after_gap"] == [message]
    assert runs["baseline"]["rows_after_gap"] == []


def test_positions_that_go_back_are_refused_before_anything_is_injected(ruled):
    assert ruled["back"] is False and ruled["back_pos_max"] == 12, ruled
    assert any("positions go back" in line for line in ruled["back_log"]), ruled["back_log"]


def test_rows_past_the_drafts_cells_are_refused(ruled):
    """A decode of the draft that fails (its cells are full) is process()'s failure, as on b11434: the
    eight chunks of 32 that fit stay, the ninth is refused, and the caller hears of it."""
    assert ruled["overflow"] is False, ruled["overflow_log"]
    assert ruled["overflow_pos_max"] == 255
    assert any("llama_process(ctx_dft) failed" in line for line in ruled["overflow_log"]), ruled["overflow_log"]


@pytest.mark.parametrize(
    "case",
    ["accepted_then_no_draft", "cancelled_draft", "checkpoint_with_pending_row", "slot_restored_without_state"],
)
def test_eagle3_drafts_after_each_call_order_as_after_the_same_passes_alone(ruled, case):
    """EAGLE3 under 0007 holds every text row's pair (the next token, its g). After each of four call
    orders llama-server can make, its next draft is, to the bit, the one a fresh draft makes after the
    same target passes without the call order's other calls: the target's features of every row are
    then the same bits on any CPU, so nothing but a row paired otherwise can move the logits.

    - a verify that accepted one draft, then a round with nothing to draft;
    - a draft whose verify never came (a cancelled request), then the conversation going on in two
      passes;
    - a context checkpoint saved before a draft and loaded after it, with the driver's state;
    - a slot restored without the driver's state, over a conversation whose last process() ended at
      the restored last row's position.

    Each call order is made with the one token that makes a mutant of 0007's pairing bookkeeping skip
    or misdo the re-pairing (docs/regression.md)."""
    r = ruled["eagle3_call_orders"][case]
    assert len(r["drafted"]) == 3, r  # the draft drafts (n_max), so its logits are the last step's
    assert r["drafted"] == r["same_passes"]["drafted"] and r["same_passes"]["apart"] == 0.0, r


def test_eagle3_drafts_after_a_cut_back_into_the_last_batch_as_after_one_pass(ruled):
    """A cut back to the first row of the last process()'s, then the conversation going on with that
    batch's last token: the row before the cut pairs with it. The call order is nothing but the target's
    passes, so its reference is one pass over the same history, to ONE_PASS_APART: the fix is 3.8e-6
    apart with AVX-512, 6.7e-6 with AVX2 (--cpu avx2) and 0 on the x86-64 baseline (--cpu portable),
    15 times under the bound; the twelve mutants this case kills move the logits by 2.8 or more
    (docs/regression.md)."""
    r = ruled["eagle3_call_orders"]["cut_back_into_the_last_batch"]
    assert len(r["drafted"]) == 3, r
    assert r["drafted"] == r["one_pass"]["drafted"] and r["one_pass"]["apart"] < ONE_PASS_APART, r


def test_eagle3_takes_batches_that_fill_its_n_batch_with_the_bridged_row(ruled):
    """A batch of 31 rows after another fills the draft's n_batch of 32 with the row the bridge writes
    again, and one of 32 overflows it by that row: both go in (in pieces of n_batch), every row kept."""
    r = ruled["eagle3_call_orders"]["batches_at_n_batch"]
    assert r["took"] == [True, True, True] and r["pos_max"] == r["rows"] - 1, r


if __name__ == "__main__":
    # the figures docs/regression.md quotes ("On every x86 CPU"): EAGLE3's call orders on a built variant,
    # each against its references, one JSON line a case; $PYLLAMA_DFLASH_CPU picks the build (native,
    # avx2, portable). python tests/test_definition_rules.py [VARIANT]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        found = _run_child(sys.argv[1] if len(sys.argv) > 1 else DEFINED, tiny_models(Path(tmp)))
    for case, r in found["eagle3_call_orders"].items():
        print(json.dumps({"case": case, **r}))
