"""``repro`` through the real-model path on the committed trained pair: what it needs of a draft that is
not the tiny generator's. A draft marked as trained with image rows is judged as the definition (as-trained
serves it so), an unmarked one as the twin; S15 gives a draft whose DFlash block is longer than its ubatch
of 4 a ubatch of its block (llama.cpp decodes the noise block in one ubatch). The slow test runs the whole
matrix on both drafts and requires the default must-pass variant to pass, as docs/trained-target.md shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama_dflash.harness.repro.__main__ import main as repro_main
from pyllama_dflash.harness.repro.__main__ import parser as repro_parser
from pyllama_dflash.harness.repro.plan import models_and_config
from pyllama_dflash.harness.scenarios.catalog import Env
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG
from pyllama_dflash.harness.slotloop.record import Record
from pyllama_dflash.harness.tiny.image import png_bytes
from pyllama_dflash.lab.vlm.judge import chat_scenes

COMMITTED = Path(__file__).parent / "data" / "vlm"


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    name, image = next(iter(chat_scenes().items()))
    path = tmp_path_factory.mktemp("scene") / name
    path.write_bytes(png_bytes(image.pixels()))
    return path


def _args(draft: str, image: Path) -> list[str]:
    return [
        "--target", str(COMMITTED / "vlm-target.gguf"),
        "--draft", str(COMMITTED / f"vlm-dflash-{draft}.gguf"),
        "--mmproj", str(COMMITTED / "vlm-mmproj.gguf"),
        "--image", str(image),
    ]  # fmt: skip


@pytest.mark.parametrize(("draft", "marked"), [("text", False), ("images", True)])
def test_a_real_draft_is_judged_by_its_key(scene, draft, marked):
    models, _ = models_and_config(repro_parser().parse_args(_args(draft, scene)))
    assert models.image_rows is marked


def test_s15_gives_a_draft_of_blocks_of_8_a_ubatch_of_its_block(scene):
    models, _ = models_and_config(repro_parser().parse_args(_args("text", scene)))
    assert Env(models, Record(), DEFAULT_CONFIG).draft_block_size == 8


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.parametrize("draft", ["text", "images"])
def test_the_default_must_pass_variant_passes_on_the_trained_pair(variants, scene, draft):
    assert repro_main([*_args(draft, scene), "--no-build"]) == 0
