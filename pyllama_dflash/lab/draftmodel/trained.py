"""The trained drafts committed as test data: where they are, what they were trained for, and the
model sets that run them.

``tests/data/trained/manifest.json`` records, per file, its sha256, the tiny target it was trained
on (kind and the fingerprint stored in the generated target file), the corpus and recipe, the
held-out figures and the command that regenerates it. A file whose bytes or whose target changed is
refused with that command, never run as if it still were the draft it was.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import PyllamaError
from ...files import sha256_file
from ...harness.slotloop.models import ModelSet, tiny_models
from ...harness.tiny._write import stored_fingerprint
from ...paths import REPO_DIR, cache_root
from ...product.upgrade.draft import inspect, reconverted_twin

TRAINED_DIR = REPO_DIR / "tests" / "data" / "trained"
MANIFEST = "manifest.json"
# the bench pair's draft is too large to commit; its record (the manifest ``train --pair bench --out DIR``
# writes beside it) is, so a draft given to the bench can be told to be that one or not
BENCH_PAIR_RECORD = TRAINED_DIR / "bench-pair.json"
TARGET_KINDS = ("dense", "moe")
# what a draft's training conversations held: images (every row at the draft's own positions, as
# SpecForge's multimodal DFlash training has it) or text only (as the public DFlash drafts were trained)
TRAINED_ON = ("images", "text")


class StaleTrainedDraft(PyllamaError, RuntimeError):
    """A committed trained draft that no longer matches its record or its target."""


def regenerate_command(target_kind: str, trained_on: str = "images") -> str:
    extra = "" if trained_on == "images" else f" --trained-on {trained_on}"
    return f"pyllama-dflash train --target {target_kind}{extra}"


def file_name(target_kind: str, trained_on: str = "images") -> str:
    return f"dflash-{target_kind}.gguf" if trained_on == "images" else f"dflash-{target_kind}-{trained_on}.gguf"


def read_manifest(directory: Path = TRAINED_DIR) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        return {"files": {}}
    return json.loads(path.read_text())


def trained_models(target_kind: str = "dense", directory: Path = TRAINED_DIR, trained_on: str = "images") -> ModelSet:
    """The tiny target of that kind with its draft trained on ``trained_on`` conversations (and the
    draft's reconverted twin)."""
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"target kind {target_kind!r}: trained drafts exist for {', '.join(TARGET_KINDS)}")
    if trained_on not in TRAINED_ON:
        raise ValueError(f"trained_on {trained_on!r}: drafts are trained on {' or '.join(TRAINED_ON)}")
    name = file_name(target_kind, trained_on)
    path = directory / name
    record = read_manifest(directory)["files"].get(name)
    remedy = f"regenerate it with: {regenerate_command(target_kind, trained_on)}"
    if record is None or not path.is_file():
        raise StaleTrainedDraft(f"{path}: no trained draft recorded in {directory / MANIFEST}; {remedy}")
    if sha256_file(path) != record["sha256"]:
        raise StaleTrainedDraft(f"{path}: its sha256 is not the one {MANIFEST} records; {remedy}")
    models = tiny_models(target=target_kind)
    now = stored_fingerprint(models.target)
    if now != record["target_fingerprint"]:
        raise StaleTrainedDraft(
            f"{path} was trained on the tiny {target_kind} target with fingerprint "
            f"{record['target_fingerprint'][:12]}, "
            f"but {models.target} now has {str(now)[:12]} (the generator changed); {remedy}"
        )
    twin = reconverted_twin(path, cache_root() / "trained")
    return ModelSet(
        models.target,
        path,
        models.mmproj,
        twin=twin,
        drafter="dflash",
        target_kind=target_kind,
        image_rows=inspect(path).image_rows,
    )


def bench_pair_draft_record(sha256: str, record: Path = BENCH_PAIR_RECORD) -> dict | None:
    """The committed record of the bench pair's draft whose bytes have this sha256 (with its file name
    under ``file``), or None: training is not known to be bit-reproducible across CPUs, so another draft
    is named, not refused."""
    if not record.is_file():
        return None
    files = json.loads(record.read_text())["files"]
    return next(({**r, "file": name} for name, r in files.items() if r["sha256"] == sha256), None)
