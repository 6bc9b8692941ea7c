"""python -m pyllama_dflash.harness.tiny OUT_DIR [--drafter NAME] [--target KIND] [--twin] [--draft-swa N] [--seed S]
[--image WxH ...]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ... import command
from ...files import atomic_write_bytes, default_file_mode
from ...flags import tool_prog
from . import DRAFTERS, TARGET_KINDS, TinyModels, drafter, write_models
from .config import TinyConfig
from .image import png_bytes, rgb
from .mmproj import image_grid


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    return int(w), int(h)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.harness.tiny"), description="Write the tiny target/draft/mmproj GGUFs."
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--twin",
        action="store_true",
        help="give the draft rope.dimension_sections (control: it then accepts position jumps)",
    )
    ap.add_argument(
        "--draft-swa", type=int, default=None, metavar="N", help="give the draft a sliding window of N positions"
    )
    ap.add_argument(
        "--drafter", choices=list(DRAFTERS), default="dflash", help="which drafter of the family the draft is"
    )
    ap.add_argument("--target", choices=list(TARGET_KINDS), default="dense", help="the target's kind")
    ap.add_argument(
        "--gguf-tree",
        type=Path,
        default=None,
        help="llama.cpp tree whose gguf-py to use (default: $PYLLAMA_DFLASH_GGUF_PY or the pristine tree)",
    )
    ap.add_argument(
        "--image",
        type=_size,
        action="append",
        default=[],
        metavar="WxH",
        help="also write a synthetic PNG of this size (repeatable)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    m = write_models(
        args.out_dir,
        seed=args.seed,
        twin=args.twin,
        draft_swa=args.draft_swa,
        form=drafter(args.drafter),
        target_kind=args.target,
        gguf_tree=args.gguf_tree,
    )
    images = _write_images(args.out_dir, args.image, args.seed, m.config)
    print(json.dumps(_summary(m, images), indent=2))
    return 0


def _write_images(out_dir: Path, sizes: list[tuple[int, int]], seed: int, config: TinyConfig) -> dict[str, dict]:
    """The synthetic PNGs asked for, and what the projector makes of each."""
    images = {}
    for w, h in sizes:
        p = out_dir / f"tiny-{w}x{h}-s{seed}.png"
        data = png_bytes(rgb(w, h, seed))
        if not (p.is_file() and p.read_bytes() == data):  # an identical image is left as it is
            atomic_write_bytes(p, data, mode=default_file_mode())
        nx, ny = image_grid(w, h, config)
        images[str(p)] = {"nx": nx, "ny": ny, "n_tokens": nx * ny, "n_pos": max(nx, ny)}
    return images


def _summary(m: TinyModels, images: dict[str, dict]) -> dict:
    return {
        "target": str(m.target),
        "draft": str(m.draft),
        "mmproj": str(m.mmproj),
        "written": list(m.written),
        "n_embd": m.n_embd,
        "n_vocab": m.n_vocab,
        "bos_id": m.bos_id,
        "eos_id": m.eos_id,
        "mask_id": m.mask_id,
        "drafter": m.form.name,
        "spec_type": m.form.spec_type,
        "block_size": m.block_size,
        "images": images,
    }


if __name__ == "__main__":
    sys.exit(command.run(main))
