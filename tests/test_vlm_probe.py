"""The probe of the projector's rows: its classifier reads what is there and nothing else, and the
committed record is what it measures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyllama_dflash.lab.vlm.probe import kernel_ridge_accuracy, shape_probe

COMMITTED = Path(__file__).parent / "data" / "vlm"
RECORD = Path(__file__).parents[1] / "docs" / "figures" / "vlm-probe.json"


def _clusters(rng: np.random.Generator, n: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 3, n)
    centres = np.random.default_rng(1).normal(size=(3, 40))
    return centres[y] + spread * rng.normal(size=(n, 40)), y


def test_the_classifier_names_what_the_features_carry_and_guesses_what_they_do_not():
    rng = np.random.default_rng(0)
    x, y = _clusters(rng, 300, 0.3)
    x_test, y_test = _clusters(rng, 300, 0.3)
    assert kernel_ridge_accuracy(x, y, x_test, y_test) > 0.95
    noise, noise_test = rng.normal(size=x.shape), rng.normal(size=x_test.shape)  # features that carry nothing
    assert abs(kernel_ridge_accuracy(noise, y, noise_test, y_test) - 1 / 3) < 0.1


@pytest.mark.slow
def test_the_probe_record_is_what_the_probe_measures(lib_dir):
    """At 9 rows, every count of seeds the record holds, on the committed projector (mtmd's rows and the
    solve are deterministic)."""
    record = json.loads(RECORD.read_text())
    want = record["held_out_shape_accuracy"]["9"]
    got = shape_probe(COMMITTED / "vlm-target.gguf", COMMITTED / "vlm-mmproj.gguf", 9, map(int, want))
    assert got == pytest.approx(want, abs=1e-9)
