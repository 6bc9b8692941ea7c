"""``python -m pyllama_dflash.product.upgrade DRAFT [-o OUT | --in-place] [--check] [--target TARGET]
[--trained-with-image-rows]``.

Exit codes: ``--check`` gives 1 when the draft is (or may be) affected, 0 when not; upgrading
gives 0 (written or nothing to do); any error gives 2 with one ``PROG: error: ...`` line on stderr,
Ctrl-C 130 (command.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ... import command
from ...flags import tool_prog
from .draft import IMAGE_ROWS_KEY, DraftInfo, DraftUpgradeError, inspect, upgrade


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.product.upgrade"),
        description="Add dflash.rope.dimension_sections = [head_dim/2, 0, 0, 0] to a legacy DFlash draft "
        "for an M-RoPE target, as llama.cpp b11434's converter writes it. The input is never "
        "modified (unless --in-place, which replaces it atomically).",
    )
    p.add_argument("draft", type=Path, metavar="DRAFT", help="the DFlash draft GGUF")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "-o",
        "--out",
        type=Path,
        metavar="OUT",
        help="write the upgraded draft here (default: DRAFT-twin.gguf beside it)",
    )
    where.add_argument("--in-place", action="store_true", help="replace DRAFT itself, atomically")
    p.add_argument(
        "--check", action="store_true", help="only say whether the draft is affected: exit 1 if so, 0 if not"
    )
    p.add_argument(
        "--target", type=Path, metavar="TARGET", help="the target GGUF; the draft needs sections only if it uses M-RoPE"
    )
    p.add_argument(
        "--trained-with-image-rows",
        action="store_true",
        help=f"the draft was trained with the target's image rows in its context (e.g. a SpecForge multimodal "
        f"DFlash draft): also write {IMAGE_ROWS_KEY} = true, so that patch 0008 serves it every row, image "
        "rows included, at positions of its own",
    )
    return p


def check(draft: Path, target: Path | None, image_rows: bool = False) -> tuple[int, str]:
    """The --check verdict: (exit code, one human line); the image-rows key is noted, never judged."""
    info = inspect(draft, target)
    code, line = _verdict(info)
    if info.image_rows:
        line += "; marked as trained with image rows"
    elif image_rows:
        line += f"; not marked as trained with image rows (--trained-with-image-rows adds {IMAGE_ROWS_KEY} = true)"
    return code, line


def _verdict(info: DraftInfo) -> tuple[int, str]:
    """Whether the draft is affected by the missing sections: (exit code, one human line)."""
    draft, target = info.path, info.target
    if not info.is_dflash:
        found = repr(info.architecture) if info.architecture is not None else "missing"
        raise DraftUpgradeError(draft, f"not a DFlash draft (general.architecture is {found})")
    if info.has_sections:
        return 0, f"{draft}: not affected: already has rope.dimension_sections {list(info.sections or ())}"
    adds = list(info.sections_to_write or ())
    if target is None:
        return 1, f"{draft}: no sections; affected if its target uses M-RoPE (upgrade would add {adds})"
    if info.affected:
        return 1, f"{draft}: affected: no rope.dimension_sections and target {target} uses M-RoPE (upgrade adds {adds})"
    return 0, f"{draft}: not affected: no rope.dimension_sections, but target {target} does not use M-RoPE"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check:
        if args.out is not None or args.in_place:
            raise DraftUpgradeError(args.draft, "--check writes nothing; drop -o/--in-place")
        code, line = check(args.draft, args.target, args.trained_with_image_rows)
        print(line)
        return code
    result = upgrade(args.draft, args.out, args.in_place, target=args.target, image_rows=args.trained_with_image_rows)
    print(result.reason)
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
