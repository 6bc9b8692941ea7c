"""The trained target on llama.cpp: its logits against the reference forward, its rows where mtmd
puts them, its captions of images it never saw, its padding, and every stage's smoke at toy size."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama_dflash.errors import UsageError
from pyllama_dflash.files import sha256_file
from pyllama_dflash.lab.vlm import __main__ as vlm_cli
from pyllama_dflash.lab.vlm.config import TOY
from pyllama_dflash.lab.vlm.corpus import Image, caption_turn, draw_conversation, prose_turn, render
from pyllama_dflash.lab.vlm.evaluate import llama_logits, nmse, reference_logits
from pyllama_dflash.lab.vlm.imagerows import encode_images, write_projector
from pyllama_dflash.lab.vlm.judge import captions, held_out_images
from pyllama_dflash.lab.vlm.padded import PaddingForm, pad_embedded, pad_to, weight_bytes, widened_rows
from pyllama_dflash.lab.vlm.pipeline import HELD_OUT_IMAGE_SEEDS, PHASES
from pyllama_dflash.lab.vlm.prose import Paragraph
from pyllama_dflash.lab.vlm.scenes import Scene
from pyllama_dflash.lab.vlm.train import pack
from pyllama_dflash.lab.vlm.weights import init_params, read_target, trained_names, write_target
from pyllama_dflash.product import api

COMMITTED = Path(__file__).parent / "data" / "vlm"
PARAGRAPHS = [
    Paragraph(f"topic {k}", f"Sentence number {k} says something. Then another one follows it.") for k in range(8)
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    """A toy-sized target of random weights (the reference must match whatever the weights) and its projector."""
    d = tmp_path_factory.mktemp("vlm-toy")
    write_target(d / "toy.gguf", TOY, init_params(TOY, 3), name="toy")
    write_projector(d / "mmproj.gguf", TOY)
    return d / "toy.gguf", d / "mmproj.gguf"


def _conversation(target: Path, mmproj: Path, rows: int, seed: int = 0):
    conv = draw_conversation("mixed", np.random.default_rng(seed), PARAGRAPHS, rows, HELD_OUT_IMAGE_SEEDS)
    encoded = encode_images(target, mmproj, [t.image for t in conv if t.image is not None])
    rendered = render(conv, {key[3]: (nx, ny) for key, (_r, nx, ny) in encoded.items()})
    return rendered, {key: r for key, (r, _nx, _ny) in encoded.items()}


@pytest.mark.parametrize("rows", [9, 64])
def test_the_reference_forward_gives_llama_cpps_logits_on_text_and_image_rows(lib_dir, toy, rows):
    target, mmproj = toy
    cfg, params = read_target(target)
    rendered, rows_of = _conversation(target, mmproj, rows)
    got, want = llama_logits(target, rendered, rows_of), reference_logits(cfg, params, rendered, rows_of)
    image = rendered.tokens < 0
    assert image.sum() == 2 * rows
    assert nmse(got[~image], want[~image]) <= 1e-4
    assert nmse(got[image], want[image]) <= 1e-4
    # and it can fail: the same logits one position off are far apart
    assert nmse(got[1:], want[:-1]) > 1e-2


def test_the_committed_target_gives_its_reference_logits(lib_dir):
    target, mmproj = COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf"
    cfg, params = read_target(target)
    rendered, rows_of = _conversation(target, mmproj, 64, seed=1)
    got, want = llama_logits(target, rendered, rows_of), reference_logits(cfg, params, rendered, rows_of)
    image = rendered.tokens < 0
    assert nmse(got[~image], want[~image]) <= 1e-4 and nmse(got[image], want[image]) <= 1e-4


def test_rendered_rows_sit_where_mtmd_puts_them(lib_dir, toy):
    target, mmproj = toy
    image = Image(Scene("red", "circle", "top"), 224, 5)
    rendered = render([prose_turn(PARAGRAPHS[0]), caption_turn(image)], {224: (8, 8)})
    first = rendered.image_rows[0][0]
    with api.Model(target) as model, api.Projector(mmproj, model) as proj:
        with proj.tokenize(proj.marker, [image.pixels()]) as chunks:
            (chunk,) = [c for c in chunks if c.type == "image"]
            d = chunk.decoder_positions(int(rendered.pos[0, first]))
            assert (chunk.nx, chunk.ny, chunk.n_pos) == (8, 8, 8)
    # mtmd's columns are (t, x, y, z); a batch's rows are t, y, x, z
    mtmd_rows = np.stack([d[:, 0], d[:, 2], d[:, 1], d[:, 3]])
    assert np.array_equal(rendered.pos[:, first : first + 64], mtmd_rows)
    assert rendered.pos[0, first + 64] == rendered.pos[0, first] + 8  # text resumes max(nx, ny) on


def test_the_committed_target_names_what_held_out_images_show(lib_dir):
    """The judge's captions (90 held-out images of each size): at every size the target was trained to
    caption, the colour and the place, and a caption that changes with the image; the shape at 64 rows.
    At 9 rows a shape spans about one cell and at 256 rows the target's shape falls short of 80%, and at
    1024 rows, a size it never captioned in training, it writes broken words (docs/trained-target.md):
    asserted as measured, not as hoped."""
    target, mmproj = COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf"
    assert all(im.seed not in range(8) for im in held_out_images(90, 64))  # the pool's seeds are 0..7
    record = json.loads((COMMITTED / "vlm-target.json").read_text())
    trained = {str(rows) for phase in record["phases"] for rows, _share in phase["pool"]["caption_rows"]}
    scores = captions(target, mmproj, 90)
    assert set(scores) == {"9", "64", "256", "1024"} and trained == {"9", "64", "256"}
    for rows in trained:
        s = scores[rows]
        assert s["colour"] >= 0.9 and s["place"] >= 0.8, (rows, s)
        assert s["changed_with_the_image"] >= 0.9, (rows, s)
        assert s["shape"] > 0.5, (rows, s)  # above chance (1 in 3)
    assert scores["64"]["shape"] >= 0.8, scores["64"]
    assert scores["1024"]["parsed"] < 0.5, scores["1024"]  # mostly not even a caption's words


@pytest.mark.slow
def test_the_target_retrained_at_every_size_names_what_held_out_images_show(lib_dir):
    """The third phase (docs/trained-target.md, "The target retrained at every size"): the file its record
    names, and its captions as the judge measured them: colour and place at every size, 1024 rows
    included, the shape in at least 80% at 64, 256 and 1024 rows; at 9 rows still short (69%)."""
    retrained = COMMITTED / "every-size"
    record = json.loads((retrained / "vlm-target.json").read_text())
    assert record["files"]["vlm-target.gguf"] == sha256_file(retrained / "vlm-target.gguf")
    assert sha256_file(retrained / "vlm-mmproj.gguf") == sha256_file(COMMITTED / "vlm-mmproj.gguf")
    (phase,) = record["phases"]
    assert phase["pool"]["image_seeds"] == 64 and record["started_from"] == "vlm-target.gguf"
    scores = captions(retrained / "vlm-target.gguf", retrained / "vlm-mmproj.gguf", 90)
    for rows, s in scores.items():
        assert s["colour"] >= 0.9 and s["place"] >= 0.8 and s["changed_with_the_image"] >= 0.9, (rows, s)
    assert all(scores[rows]["shape"] >= 0.8 for rows in ("64", "256", "1024")), scores
    assert 0.5 < scores["9"]["shape"] < 0.8, scores["9"]


@pytest.mark.parametrize("form", list(PaddingForm))
def test_padding_keeps_the_function_and_adds_the_weights(lib_dir, toy, tmp_path, form):
    target, mmproj = toy
    cfg, params = read_target(target)
    core = {k: params[k] for k in trained_names(cfg)}
    padded_cfg, padded = pad_to(form, cfg, core, 4 * weight_bytes(cfg))
    assert weight_bytes(padded_cfg) >= 4 * weight_bytes(cfg)
    write_target(tmp_path / "padded.gguf", padded_cfg, padded, name="padded")
    rendered, rows_of = _conversation(target, mmproj, 9)
    padded_rows = {key: widened_rows(r, padded_cfg.n_embd) for key, r in rows_of.items()}
    got, want = llama_logits(tmp_path / "padded.gguf", rendered, padded_rows), llama_logits(target, rendered, rows_of)
    assert nmse(got, want) <= 1e-6
    assert nmse(got[rendered.tokens < 0], want[rendered.tokens < 0]) <= 1e-6  # the image's rows too


def test_embedding_rescales_the_norms_or_the_function_changes(lib_dir, toy, tmp_path):
    """The embedded form's norms divide by the wider stream: without their weights and epsilon rescaled,
    every logit moves (so the test above can fail for that form)."""
    target, mmproj = toy
    cfg, params = read_target(target)
    padded_cfg, padded = pad_embedded(cfg, {k: params[k] for k in trained_names(cfg)}, 4 * cfg.n_embd, cfg.n_ff)
    wide_norm = (padded_cfg.n_embd,)
    unscaled = {k: 2 * a if k.endswith("norm.weight") and a.shape == wide_norm else a for k, a in padded.items()}
    write_target(tmp_path / "unscaled.gguf", padded_cfg, unscaled, name="unscaled")
    rendered, rows_of = _conversation(target, mmproj, 9)
    padded_rows = {key: widened_rows(r, padded_cfg.n_embd) for key, r in rows_of.items()}
    got = llama_logits(tmp_path / "unscaled.gguf", rendered, padded_rows)
    assert nmse(got, llama_logits(target, rendered, rows_of)) > 1e-3
    with pytest.raises(ValueError, match="times a power of four"):
        pad_embedded(cfg, params, 2 * cfg.n_embd, cfg.n_ff)


def test_packing_keeps_each_conversation_to_itself():
    convs = [render([prose_turn(p)]) for p in PARAGRAPHS]
    packed = pack(convs, {}, 256)
    assert packed.tokens.shape[0] < len(convs)  # several to a row
    for seg in packed.segment:
        for s in set(seg.tolist()) - {-1}:
            at = np.flatnonzero(seg == s)
            assert np.array_equal(np.diff(at), np.ones(len(at) - 1))  # one contiguous run
    assert packed.weight.sum() == sum(c.weight.sum() - c.weight[-1] for c in convs)


def test_the_weights_come_back_from_their_gguf(tmp_path):
    params = init_params(TOY, 1)
    write_target(tmp_path / "t.gguf", TOY, params, name="t")
    cfg, back = read_target(tmp_path / "t.gguf")
    assert cfg == TOY
    assert all(np.array_equal(params[k], back[k]) for k in params)
    assert not back["blk.0.ssm_out.weight"].any()  # the gated delta net adds nothing


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyllama_dflash.cli", "vlm", *args], capture_output=True, text=True, timeout=timeout
    )


def _target_args(**flags) -> argparse.Namespace:
    none = dict(smoke=False, steps=0, lr=0.0, mix=None, init=None, corpus=None)
    return argparse.Namespace(
        **none | dict(caption_rows=None, mixed_rows=None, length=0, batch=0, image_seeds=0) | flags
    )


def test_the_target_flags_describe_one_phase():
    """Without flags, the two phases the committed target was made by; with them, one phase as they say."""
    assert vlm_cli._phases(_target_args())[1] == PHASES
    _cfg, (phase,) = vlm_cli._phases(_target_args(caption_rows="9:0.5,1024:0.5", length=1152, batch=5))
    assert phase.pool.caption_rows == ((9, 0.5), (1024, 0.5)) and phase.pool.mixed_rows == PHASES[0].pool.mixed_rows
    assert (phase.recipe.length, phase.recipe.batch, phase.recipe.steps) == (1152, 5, PHASES[0].recipe.steps)


@pytest.mark.parametrize(
    "flags, says",
    [
        ({"caption_rows": "9:0.5,100:0.5"}, r"--caption-rows '9:0.5,100:0.5': \[100\] rows is no image size"),
        ({"mixed_rows": "64"}, r"--mixed-rows '64': ROWS:SHARE pairs"),
        ({"caption_rows": "64:0,256:1"}, r"--caption-rows '64:0,256:1': every share must be above 0"),
        ({"image_seeds": 1001}, r"--image-seeds 1001: from 1 to 1000 \(held out above\)"),
    ],
)
def test_a_bad_image_size_flag_names_itself_and_why(flags, says):
    with pytest.raises(UsageError, match=says):
        vlm_cli._phases(_target_args(**flags))


@pytest.mark.slow
def test_every_stage_runs_at_toy_size(variants, tmp_path):
    """The vocabulary, the pool (through mtmd), the target (JAX training, GGUF), its judge, its padding and
    its drafts."""
    proc = _run("vocab", "--out", str(tmp_path / "vocab.json"))
    assert proc.returncode == 0 and json.loads((tmp_path / "vocab.json").read_text())["n_vocab"] == 264
    proc = _run("corpus", "--smoke", "--out", str(tmp_path / "pool"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run("target", "--smoke", "--out", str(tmp_path), "--corpus", str(tmp_path / "pool"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "vlm-target.json").read_text())
    assert record["files"]["vlm-target.gguf"] == sha256_file(tmp_path / "vlm-target.gguf")
    assert [h["step"] for h in record["phases"][0]["history"]] == [1, 2, 3]
    target = tmp_path / "vlm-target.gguf"
    proc = _run("judge", "--target", str(target), "--images", "2", "--conversations", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["differential"]["text_nmse_max"] <= 1e-4 and report["differential"]["image_nmse_max"] <= 1e-4
    proc = _run("pad", "--core", str(target), "--out", str(tmp_path / "padded.gguf"), "--min-mib", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "padded.json").read_text())["logits_nmse_against_core"] <= 1e-6
    bench = [sys.executable, "-m", "pyllama_dflash.cli", "bench", "--only", "batch", "--rounds", "2"]
    bench += ["--batch-target", str(tmp_path / "padded.gguf"), "--json", str(tmp_path / "batch.json")]
    proc = subprocess.run(bench, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "target `padded.gguf`: decode of 4 tokens / one token" in proc.stdout
    proc = _run("drafts", "--smoke", "--target", str(target), "--out", str(tmp_path / "drafts"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for kind in ("text", "images"):
        rec = json.loads((tmp_path / "drafts" / f"vlm-dflash-{kind}.json").read_text())
        assert rec["sha256"] == sha256_file(tmp_path / "drafts" / rec["file"])


@pytest.mark.parametrize("kind", ["text"])  # the image-trained draft is not trained yet (docs/trained-target.md)
def test_the_committed_drafts_are_the_files_their_records_name(kind):
    record = json.loads((COMMITTED / f"vlm-dflash-{kind}.json").read_text())
    assert record["sha256"] == sha256_file(COMMITTED / record["file"])
    assert record["target_sha256"] == sha256_file(COMMITTED / "vlm-target.gguf")
    assert record["trained_on"] == kind
    # the text-trained draft was trained at every distance the bench's two 1024-row images reach
    if kind == "text":
        assert record["positions_covered"][1] >= 2 * 1024 + 600


def test_the_embedded_pair_drafts_what_the_cores_pair_drafts(lib_dir, tmp_path):
    """The committed pair embedded four times as wide (FFNs kept narrow, to stay small): the text-trained
    draft drafts the same ids at every position of a held-out text, and the projector, rebuilt from its
    seed, gives the committed projector's rows with zeros after them."""
    from pyllama_dflash.lab.vlm.embedded_pair import drafted_along, embedded_draft, embedded_projector

    target, mmproj, draft = (
        COMMITTED / "vlm-target.gguf",
        COMMITTED / "vlm-mmproj.gguf",
        COMMITTED / "vlm-dflash-text.gguf",
    )
    cfg, params = read_target(target)
    wide_cfg, wide = pad_embedded(cfg, {k: params[k] for k in trained_names(cfg)}, 4 * cfg.n_embd, cfg.n_ff)
    write_target(tmp_path / "embedded.gguf", wide_cfg, wide, name="embedded")
    embedded_draft(draft, tmp_path / "embedded-draft.gguf", cfg, wide_cfg.n_embd)
    text = api_tokens(target, "The result is a new list. If the argument is omitted, the value is returned unchanged.")
    want = drafted_along(target, draft, text, n_max=3)
    assert drafted_along(tmp_path / "embedded.gguf", tmp_path / "embedded-draft.gguf", text, n_max=3) == want
    assert len(set(map(tuple, want))) > len(want) // 2  # a trained draft: what it drafts follows the text

    embedded_projector(tmp_path / "embedded-mmproj.gguf", cfg, wide_cfg.n_embd)
    image = Image(Scene("red", "circle", "top"), 84, 1000)
    ((core_rows, *_),) = encode_images(target, mmproj, [image]).values()
    ((rows, *_),) = encode_images(tmp_path / "embedded.gguf", tmp_path / "embedded-mmproj.gguf", [image]).values()
    assert rows.shape[1] == wide_cfg.n_embd and np.array_equal(rows, widened_rows(core_rows, wide_cfg.n_embd))


def api_tokens(model_path: Path, text: str) -> np.ndarray:
    with api.Model(model_path) as model:
        return model.tokenize(text, add_special=False)
