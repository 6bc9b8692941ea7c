"""The reference model of the draft against llama.cpp, and the committed trained drafts.

The differential test is upstream's test-backend-ops in spirit: the same inputs through two
implementations, the outputs compared by NMSE. Here the inputs are a context of target features
(more rows than the draft's ubatch, so the cache is filled in several decodes) and a noise block;
the outputs are the block's logits. Tolerance: NMSE below 1e-5. llama.cpp keeps the draft's K and V
in an F16 cache, which the float64 reference does not: that rounding alone is about 6e-7 here.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pyllama_dflash.errors import GGUFError
from pyllama_dflash.harness.slotloop import Session
from pyllama_dflash.harness.slotloop.models import DraftKind, tiny_models
from pyllama_dflash.harness.slotloop.record import Record
from pyllama_dflash.lab.acceptance.measure import SESSION
from pyllama_dflash.lab.acceptance.script import run_conversation
from pyllama_dflash.lab.draftmodel import forward
from pyllama_dflash.lab.draftmodel.corpus import Conversation
from pyllama_dflash.lab.draftmodel.predictability import predictability, replies
from pyllama_dflash.lab.draftmodel.trained import (
    TRAINED_ON,
    StaleTrainedDraft,
    file_name,
    read_manifest,
    trained_models,
)
from pyllama_dflash.lab.draftmodel.weights import load_draft
from pyllama_dflash.product import api

NMSE_MAX = 1e-5
IMPLEMENTED = ("dflash", "dflash-causal", "dspark", "dspark-bonus", "dspark-vocab")
# each trained draft's text-only mean accepted tokens per round (of 3) through the library must stay
# above its floor, where the random drafts they were trained from accept about 0.01 and a broken
# training, export or load drafts near 0 (the measured means: docs/performance.md)
ACCEPTANCE_FLOOR = {"dense": 0.35, "moe": 0.15}


def _llamacpp_block_logits(target_path, draft_path, feats, tokens, mrope):
    n = feats.shape[0]
    with api.Model(target_path) as tm, api.Model(draft_path) as dm:
        with (
            api.Context(tm, n_ctx=256, n_batch=16, n_ubatch=16) as target,
            api.Context.draft(dm, target, n_batch=16, n_ubatch=16) as draft,
        ):
            for p0 in range(0, n, 16):
                pos = np.arange(p0, min(n, p0 + 16))
                positions = np.stack([pos, pos, pos, np.zeros_like(pos)]) if mrope else pos[None]
                assert draft.process_rc(api.Batch.embeddings(feats[p0 : p0 + 16], positions)) == 0
            assert draft.process_rc(api.Batch.tokens(tokens, pos0=n, logits="all")) == 0
            return np.stack([draft.logits(i) for i in range(len(tokens))])


def _nmse(got: np.ndarray, ref: np.ndarray) -> float:
    finite = np.isfinite(ref)
    assert (np.isfinite(got) == finite).all(), "the two disagree on which logits are -inf (d2t)"
    return float(((got[finite] - ref[finite]) ** 2).sum() / (ref[finite] ** 2).sum())


@pytest.mark.parametrize("mrope", [False, True], ids=["legacy", "twin"])
@pytest.mark.parametrize("drafter", IMPLEMENTED)
def test_reference_model_logits_match_llamacpp(lib_dir, drafter, mrope):
    models = tiny_models(drafter=drafter)
    path = models.draft_for(DraftKind.TWIN if mrope else DraftKind.PLAIN)
    w = load_draft(path, models.target)
    rng = np.random.default_rng(len(drafter))
    feats = rng.normal(size=(37, len(w.hp.target_layers) * w.hp.n_embd)).astype(np.float32)
    n_block = w.hp.n_draft_max + (0 if w.hp.sample_from_anchor else 1)
    tokens = np.array([int(rng.integers(8, w.n_vocab))] + [w.hp.mask_id] * (n_block - 1))
    got = _llamacpp_block_logits(models.target, path, feats, tokens, mrope)
    ref = forward.block_logits(w, feats, tokens)
    assert _nmse(got, ref) < NMSE_MAX
    assert forward.drafted(w, got) == forward.drafted(w, ref)


@pytest.mark.parametrize("trained_on", TRAINED_ON)
@pytest.mark.parametrize("kind", sorted(ACCEPTANCE_FLOOR))
def test_reference_model_logits_match_llamacpp_for_the_trained_draft(lib_dir, kind, trained_on):
    models = trained_models(kind, trained_on=trained_on)
    w = load_draft(models.draft, models.target)
    feats = np.random.default_rng(3).normal(size=(41, 128)).astype(np.float32)
    tokens = np.array([50, w.hp.mask_id, w.hp.mask_id, w.hp.mask_id])
    got = _llamacpp_block_logits(models.target, models.draft, feats, tokens, False)
    assert _nmse(got, forward.block_logits(w, feats, tokens)) < NMSE_MAX


def test_reference_model_refuses_a_form_it_does_not_implement():
    models = tiny_models(drafter="dflash2")
    with pytest.raises(GGUFError, match="selector_hidden.weight"):
        load_draft(models.draft, models.target)


def test_a_trained_draft_whose_bytes_changed_is_refused(tmp_path):
    src = trained_models("dense").draft
    shutil.copy(src.parent / "manifest.json", tmp_path / "manifest.json")
    data = bytearray(src.read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / src.name).write_bytes(bytes(data))
    with pytest.raises(StaleTrainedDraft, match="pyllama-dflash train --target dense"):
        trained_models("dense", tmp_path)


def test_the_trained_drafts_record_says_how_to_regenerate_them():
    files = read_manifest()["files"]
    # one per target kind and training corpus
    assert sorted(files) == sorted(file_name(kind, on) for kind in ACCEPTANCE_FLOOR for on in TRAINED_ON)
    for name, record in files.items():
        # the command a record was made with: the console form, or the module's form the first records name
        assert record["command"].startswith(
            ("pyllama-dflash train", "python -m pyllama_dflash.lab.draftmodel train")
        ), name
        assert record["held_out_mean_accepted"] > 0, name
        assert name == file_name(record["target"], record["trained_on"]), name


@pytest.mark.parametrize("trained_on", TRAINED_ON)
@pytest.mark.parametrize("kind", sorted(ACCEPTANCE_FLOOR))
def test_the_trained_draft_drafts_above_its_floor_without_images(lib_dir, kind, trained_on):
    """Text-only conversations through the library (baseline's libcommon and slot loop), held out from
    training: a training, export or loading regression drafts nothing the target accepts."""
    models = trained_models(kind, trained_on=trained_on)
    rounds = []
    for seed in (900, 901, 902):
        with Session(models, SESSION, Record()) as s:
            run_conversation(s, seed, rounds, images=False, restore=False)
    mean = sum(r.accepted for r in rounds) / len(rounds)
    assert mean > ACCEPTANCE_FLOOR[kind], f"{kind}: mean accepted {mean:.3f} over {len(rounds)} rounds"


def test_the_training_forward_is_the_reference_forward():
    """Training runs forward.py with jax.numpy: on the same draft and inputs it gives numpy's logits."""
    jnp = pytest.importorskip("jax.numpy", reason="JAX is the train extra's (pip install -e '.[train]')")
    models = tiny_models()
    w = load_draft(models.draft, models.target)
    feats = np.random.default_rng(5).normal(size=(9, 128)).astype(np.float32)
    tokens = np.array([40, w.hp.mask_id, w.hp.mask_id, w.hp.mask_id])
    outs = []
    for xp in (np, jnp):
        p = {k: xp.asarray(v) for k, v in w.params.items()}
        ctx = forward.context_kv(xp, p, w.hp, xp.asarray(feats), xp.arange(9))
        hidden = forward.block_hidden(
            xp, p, w.hp, xp.asarray(w.tok_embd), ctx, xp.ones(9, dtype=bool), xp.asarray(tokens), xp.arange(9, 13)
        )
        outs.append(np.asarray(forward.head_logits(xp, hidden, xp.asarray(w.output)), dtype=np.float64))
    assert _nmse(outs[1], outs[0]) < 1e-10


def test_a_context_window_covering_every_row_trains_on_the_whole_context():
    """Recipe.context_rows gathers each block's latest rows at their own positions: a window as long as the
    conversation gives the whole-context loss, and a short one a different loss."""
    pytest.importorskip("jax", reason="JAX is the train extra's (pip install -e '.[train]')")
    import jax
    import jax.numpy as jnp

    from pyllama_dflash.lab.draftmodel.train import Recipe, _loss, prepare

    models = tiny_models()
    w = load_draft(models.draft, models.target)
    rng = np.random.default_rng(3)
    n = 40
    convs = [
        Conversation(
            rng.normal(size=(n, w.params["fc.weight"].shape[1])).astype(np.float32),
            rng.integers(10, 100, size=n),
            np.arange(n) >= 8,
        )
        for _ in range(2)
    ]
    data = prepare(convs, w.hp.block_size)
    params = {k: jnp.asarray(v) for k, v in w.params.items()}
    conv_idx, anchor = jnp.asarray([0, 1]), jnp.asarray([[9, 20, 30], [12, 25, 31]])

    length = jnp.full(anchor.shape, w.hp.block_size)

    def loss(rows: int) -> float:
        return float(_loss(jax, jnp, w, data, Recipe(context_rows=rows))(params, conv_idx, anchor, length)[0])

    assert loss(n) == pytest.approx(loss(0), rel=1e-5)
    assert loss(4) != pytest.approx(loss(0), rel=1e-3)


def test_a_shorter_block_trains_as_a_block_of_that_length_alone():
    """Recipe.block_lengths: a block of length 3 inside the draft's longer block is scored as the numpy
    reference scores a block of 3 rows alone (its later rows unseen, unscored), and differs from the full."""
    pytest.importorskip("jax", reason="JAX is the train extra's (pip install -e '.[train]')")
    import jax
    import jax.numpy as jnp

    from pyllama_dflash.lab.draftmodel.train import Recipe, _block_lengths, _loss, prepare

    models = tiny_models()
    w = load_draft(models.draft, models.target)
    rng = np.random.default_rng(4)
    n, short = 30, 3
    feats = rng.normal(size=(n, w.params["fc.weight"].shape[1])).astype(np.float32)
    conv = Conversation(feats, rng.integers(10, 100, size=n), np.arange(n) >= 6)
    data = prepare([conv], w.hp.block_size)
    params = {k: jnp.asarray(v) for k, v in w.params.items()}
    recipe = Recipe(decay=1.0)
    anchor = 12

    def trained_loss(length: int) -> float:
        fn = _loss(jax, jnp, w, data, recipe)
        return float(fn(params, jnp.asarray([0]), jnp.asarray([[anchor]]), jnp.asarray([[length]]))[0])

    ctx = forward.context_kv(np, w.params, w.hp, feats[:anchor], np.arange(anchor))
    block = np.array([conv.tokens[anchor]] + [w.hp.mask_id] * (short - 1))
    hidden = forward.block_hidden(
        np, w.params, w.hp, w.tok_embd, ctx, np.ones(anchor, bool), block, np.arange(anchor, anchor + short)
    )
    logits = forward.head_logits(np, hidden[1:], w.output).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    labels = conv.tokens[anchor + 1 : anchor + short]
    reference = float(-logp[np.arange(short - 1), labels].mean())
    assert trained_loss(short) == pytest.approx(reference, rel=1e-4)
    assert trained_loss(w.hp.block_size) != pytest.approx(reference, rel=1e-3)
    with pytest.raises(ValueError, match="block_lengths"):
        _block_lengths(Recipe(block_lengths=(w.hp.block_size + 1,)), w.hp.block_size)


def _conversation(replies_: list[list[int]]) -> Conversation:
    """A corpus conversation of generated replies, each after three prompt rows (an image row among them)."""
    tokens, generated = [], []
    for r in replies_:
        tokens += [5, -1, 6, *r]
        generated += [False] * 3 + [True] * len(r)
    return Conversation(np.zeros((len(tokens), 4), np.float32), np.array(tokens), np.array(generated))


def test_predictability_counts_successors_within_replies_and_learns_them_from_the_training_part():
    """A target that always follows t with t + 1 is fully predictable from the training part's table; a
    held-out pair whose previous token the table never saw counts as missed; no pair spans two replies."""
    chain = _conversation([[1, 2, 3, 4], [2, 3, 4, 5]])
    held = _conversation([[3, 4, 5], [9, 1]])  # 9 never seen: (9, 1) misses
    r = predictability([chain], [held])
    assert r["held_out_pairs"] == 3  # (3,4) (4,5) (9,1): not (5, 9) across the replies
    assert r["successor"] == pytest.approx(2 / 3) and r["successor_seen"] == pytest.approx(2 / 3)
    assert r["repeat"] == 0 and r["distinct"] == 6
    assert [x.tolist() for x in replies(chain)] == [[1, 2, 3, 4], [2, 3, 4, 5]]
    flat = predictability([_conversation([[7, 7, 7]])], [_conversation([[7, 7]])])
    assert flat["repeat"] == 1 and flat["successor"] == 1 and flat["entropy_bits"] == 0


def test_a_training_whose_loss_stops_being_a_number_stops_with_the_step_and_writes_nothing():
    """A diverged training (the bench pair's 1024-wide draft at lr 3e-3, near step 500) left NaN weights that
    were written as a draft; it now stops at the first step whose loss is not finite, naming it."""
    pytest.importorskip("jax", reason="JAX is the train extra's (pip install -e '.[train]')")
    from pyllama_dflash.lab.draftmodel.train import Recipe, TrainingDiverged, train

    models = tiny_models()
    w = load_draft(models.draft, models.target)
    n = 40
    feats = np.full((n, 128), np.nan, dtype=np.float32)  # the tiny target's features: 2 layers of 64
    conv = Conversation(feats, np.arange(n, dtype=np.int32) % 50 + 8, np.ones(n, dtype=bool))
    with pytest.raises(TrainingDiverged, match=r"training diverged at step 1 of 3 \(lr"):
        train(w, [conv] * 16, Recipe(steps=3), log=lambda _line: None)


def test_the_draft_ffn_gate_keeps_a_finite_gradient_far_below_zero():
    """``x / (1 + exp(-x))`` is -0 below x = -88.7 in float32, but autodiff's gradient there is inf / inf:
    one such gate turns every weight to NaN at the next step. The capped form has the same values above
    -80 (bit for bit, so the reference forward llama.cpp is judged against is unchanged) and a finite
    gradient everywhere."""
    from pyllama_dflash.lab.draftmodel.forward import silu

    x = np.linspace(-80, 30, 20001, dtype=np.float32)
    assert np.array_equal(silu(np, x), x / (1 + np.exp(-x)))
    with np.errstate(over="raise"):
        assert np.all(silu(np, np.array([-100.0, -1e4], dtype=np.float32)) <= 0)
    jax = pytest.importorskip("jax", reason="JAX is the train extra's (pip install -e '.[train]')")
    import jax.numpy as jnp

    far = jnp.asarray([-89.0, -100.0, -1e4], dtype=jnp.float32)
    assert not np.isfinite(np.asarray(jax.grad(lambda g: jnp.sum(g / (1 + jnp.exp(-g))))(far))).all()
    assert np.isfinite(np.asarray(jax.grad(lambda g: jnp.sum(silu(jnp, g)))(far))).all()


def _per_round_by_definition(w, conv: Conversation, first: int, n_max: int) -> list[int]:
    """Each round drafted from a context of the rows before its anchor alone (forward.block_logits)."""
    out, a, n = [], first, len(conv.tokens)
    while a + n_max < n:
        draft = forward.drafted(w, forward.block_logits(w, conv.features[:a], _block(w, conv.tokens[a], n_max)))
        k = 0
        while k < n_max and draft[k] == conv.tokens[a + 1 + k]:
            k += 1
        out.append(k)
        a += k + 1
    return out


def _block(w, anchor: int, n_max: int) -> np.ndarray:
    return np.array([anchor] + [w.hp.mask_id] * n_max)


def test_the_one_pass_evaluation_drafts_what_a_context_of_each_round_drafts():
    """evaluate.accepted_per_round computes the context's K and V once; each round must draft what a
    context of the rows before its anchor alone drafts, on replies the draft misses and on one it hits."""
    from pyllama_dflash.lab.draftmodel import evaluate

    w = load_draft(tiny_models().draft, tiny_models().target).float64()
    rng = np.random.default_rng(9)
    feats = rng.normal(size=(30, 128)).astype(np.float32)
    generated = np.arange(30) >= 6
    random_reply = Conversation(feats, rng.integers(8, 120, size=30), generated)
    hit = random_reply.tokens.copy()
    for i in range(6, 29):  # each next token the draft's own first guess: every round accepts
        hit[i + 1] = forward.drafted(w, forward.block_logits(w, feats[:i], _block(w, hit[i], 3)))[0]
    for conv in (random_reply, Conversation(feats, hit, generated)):
        assert evaluate.accepted_per_round(w, conv, 3) == _per_round_by_definition(w, conv, 6, 3)
    assert sum(evaluate.accepted_per_round(w, Conversation(feats, hit, generated), 3)) > 0
