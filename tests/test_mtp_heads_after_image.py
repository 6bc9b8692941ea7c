"""The MTP drafters with more than Qwen3.5's one head after an image (patch 0009), on tiny GGUF files: a
chain of heads (Step 3.5) and an assistant that reads the target's memory (Gemma 4), judged against the
definition (pyllama_dflash.harness.oracles.mtp_heads: an image whose rows are some tokens' embeddings drafts what
those tokens draft). b11434 skips the image for both heads, and the tests below show what that costs."""

from __future__ import annotations

import pytest
from series_variants import FEEDS_MTP

from pyllama_dflash.harness.oracles import mtp_heads


@pytest.fixture(scope="module")
def runs(variants) -> dict[str, dict]:
    assert FEEDS_MTP is not None, "the series has no patch that feeds MTP an image (0009)"
    found = {v: mtp_heads.run(v) for v in ("baseline", FEEDS_MTP)}
    assert "error" not in found["baseline"], found["baseline"]["error"]
    return found


def test_every_head_drafts_after_an_image_of_token_embeddings_as_after_those_tokens(runs):
    assert mtp_heads.first_failure(runs[FEEDS_MTP]) is None


def test_b11434s_chained_heads_keep_a_hole_the_next_text_row_cannot_follow(runs):
    after = runs["baseline"]["chained, text after: True"]["image"]
    assert after["calls"] == [True, True, False], after  # the image skipped, the text after it refused
    assert any("Y = X + 1" in line for line in after["log"]), after["log"]
    assert runs["baseline"]["chained, text after: False"]["image"]["drafted"] == []  # its draft fails too


def test_b11434s_assistant_drafts_right_after_an_image_from_the_state_before_it(runs):
    right_after = runs["baseline"]["assistant, text after: False"]
    assert right_after["image"]["drafted"] != right_after["tokens"]["drafted"], right_after
    # text after the image brings its own state: there b11434 drafts as the definition has it already
    later = runs["baseline"]["assistant, text after: True"]
    assert later["image"]["drafted"] == later["tokens"]["drafted"], later


def test_the_oracle_names_what_falls_short(runs):
    assert "drafted [] after the image" in mtp_heads.first_failure(runs["baseline"])  # its first case
    assert "timed out" in mtp_heads.first_failure({"error": "timed out after 1 s"})
