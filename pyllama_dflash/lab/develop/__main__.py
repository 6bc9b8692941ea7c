"""``python -m pyllama_dflash.lab.develop [VARIANT] [--dir PATH]``: a git work tree to change the fix in.

A copy of the pinned llama.cpp source (real files, never links into the source cache) committed
as the ``pristine`` commit, then one commit per patch of the variant, in the order the build
applies them. Edit, fold each change into its patch's commit, then ``pyllama-dflash write-back``.
Exit 0 when made; any error gives 2 with one ``PROG: error: ...`` line on stderr (command.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ... import command
from ...flags import common_parser, tool_prog
from .tree import Developed, develop


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.lab.develop"),
        description="Make a git work tree of the pinned llama.cpp source with one commit per patch of a "
        "variant, to change the fix in. Every file is a copy: nothing done in the tree reaches the source cache.",
        epilog="Then edit, commit into the patch's commit, and run 'pyllama-dflash write-back' "
        "(docs/changing-the-fix.md).",
        parents=[common_parser("patches")],
    )
    ap.add_argument(
        "variant",
        nargs="?",
        metavar="VARIANT",
        help="the variant whose patches become commits (default: the last of the series, which carries them all)",
    )
    ap.add_argument(
        "--dir",
        type=Path,
        metavar="PATH",
        help="the work tree to make; it must not exist, or be empty (default: ./llama.cpp-dev-VARIANT)",
    )
    ap.add_argument(
        "--llama-dir",
        type=Path,
        metavar="PATH",
        help="the pristine llama.cpp tree to copy (default: the one the builds use: $LLAMA_CPP_DIR, "
        "vendor/llama.cpp, or the pinned sdist)",
    )
    return ap


def next_steps(made: Developed) -> str:
    here = Path.cwd()
    where = os.path.relpath(made.tree, here) if made.tree.is_relative_to(here) else str(made.tree)
    lines = [
        f"{made.tree}: variant {made.variant} as commits (branch {made.variant}) above the pristine "
        f"tree (tag pristine), one per patch of {made.patches_dir}:",
    ]
    lines += [f"  {commit[:12]} {name}  {summary}" for commit, name, summary in made.commits]
    lines += [
        "next:",
        f"  cd {where}",
        "  edit; fold each change into its patch's commit:",
        f"    the last one ({made.commits[-1][1] if made.commits else 'none'}): git commit -a --amend --no-edit",
        "    any other:  git commit -a --fixup=COMMIT",
        "                GIT_SEQUENCE_EDITOR=: git rebase -i --autosquash pristine",
        "  pyllama-dflash write-back    # one patch per commit, back into the series",
        "  then build and check: pyllama-dflash build, pyllama-dflash repro --check-expected, "
        "pyllama-dflash mutate (docs/changing-the-fix.md)",
    ]
    return "\n".join(lines)


@command.on_interrupt("nothing was made")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr)
    made = develop(args.variant, args.dir, args.patches, args.llama_dir, log=say)
    print(next_steps(made))
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
