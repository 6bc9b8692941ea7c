"""What the ``vlm`` command's stages share: where the committed pair lies, the log line, the provenance a
record carries, and how a record names its files and its command."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from ...errors import GGUFError
from ...files import atomic_write_json
from ...paths import REPO_DIR

COMMITTED = REPO_DIR / "tests" / "data" / "vlm"
TARGET_FILE = "vlm-target.gguf"
MMPROJ_FILE = "vlm-mmproj.gguf"


def log(msg: str) -> None:
    print(f"[vlm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    import os

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_at_start": round(os.getloadavg()[0], 2),
    }


def existing(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise GGUFError(p, f"no such file (the {what})")
    return p


def shown(path: Path) -> str:
    """A path as a record shows it: relative to the working folder where it lies inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def kept(args: argparse.Namespace, report: dict, command: str) -> dict:
    """The record: the report with the command line that makes it (``--json`` included where given),
    written to ``--json`` atomically where given."""
    report = {**report, "command": command + (f" --json {shown(Path(args.json))}" if args.json else "")}
    if args.json:
        atomic_write_json(Path(args.json), report)
    return report


def load_baseline() -> dict:
    """The images are encoded, and the target judged, on baseline's build (made here if missing); returns
    the provenance a record carries (figures.provenance)."""
    from pyllama_dflash import load
    from pyllama_dflash.figures import provenance
    from pyllama_dflash.product.llamabuild import BuildOptions, build

    build(["baseline"], BuildOptions(quiet=True))
    return provenance(load("baseline"))
