"""The committed records of measured figures (docs/figures/) and the command whose ``--markdown`` writes
each one's tables.

A record's file name says which command wrote it, by its first word: ``bench``, ``acceptance``,
``paired`` and ``speed`` are the bench's, ``fuzz`` the fuzzer's, ``soak`` the soak's, ``mutate`` the
mutation run's, ``vlm`` the trained target's stages, ``repro`` the scenario matrix's. So the docs' tables
can be written again from the records alone: ``tests/test_figures.py`` does so and fails on any difference.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path

# the module of each command's report, named as a string as cli.py names the commands: the commands sit
# on top, and nothing below them imports one
WRITERS = {
    "bench": "pyllama_dflash.lab.bench.report",
    "acceptance": "pyllama_dflash.lab.bench.report",
    "paired": "pyllama_dflash.lab.bench.report",
    "speed": "pyllama_dflash.lab.bench.report",
    "fuzz": "pyllama_dflash.harness.fuzz.report",
    "soak": "pyllama_dflash.harness.soak.report",
    "mutate": "pyllama_dflash.lab.mutate.report",
    "vlm": "pyllama_dflash.lab.vlm.report",
    "repro": "pyllama_dflash.harness.repro.report",
    "pulls": "pyllama_dflash.lab.pulls.report",
}


def writer_of(path: Path) -> Callable[[dict], str]:
    """The ``--markdown`` of the command that wrote the record at ``path``, by the file name's first word."""
    kind = path.stem.split("-")[0]
    if kind not in WRITERS:
        raise ValueError(f"{path}: no command writes records named {kind}-... (known: {', '.join(WRITERS)})")
    return importlib.import_module(WRITERS[kind]).markdown


def render(path: Path) -> str:
    """The Markdown its command writes from the record at ``path``."""
    return writer_of(path)(json.loads(path.read_text()))
