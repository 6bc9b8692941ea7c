"""``pyllama-dflash write-back`` (``python -m pyllama_dflash.lab.develop.writeback``): the commits of a
develop work tree, back into the series' patch files, one patch per commit (see the package).
Exit 0 when written (or nothing to write); any error gives 2 with one ``PROG: error: ...`` line on
stderr (command.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .... import command
from ....flags import tool_prog
from . import find_tree, write_back


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.lab.develop.writeback"),
        description="Write the commits of a work tree made by develop back into the series, one patch "
        "per commit: same file names, each patch's header and form kept, nothing written for a patch "
        "that did not change.",
    )
    ap.add_argument(
        "--dir",
        type=Path,
        metavar="PATH",
        help="the work tree (default: the one the current folder is in, else the one llama.cpp-dev-* here)",
    )
    ap.add_argument(
        "--patches",
        type=Path,
        metavar="DIR",
        help="the series folder to write into (default: the one develop read, recorded in the work tree)",
    )
    ap.add_argument("--dry-run", action="store_true", help="say which patches would change, write nothing")
    ap.add_argument(
        "--force",
        action="store_true",
        help="write even where a patch changed on disk since develop, or where another variant of the "
        "series would no longer apply",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr)
    tree = args.dir if args.dir is not None else find_tree()
    outcomes = write_back(tree, args.patches, force=args.force, dry_run=args.dry_run, log=say)
    verb = "would write" if args.dry_run else "written"
    for out in outcomes:
        print(f"{out.name}: {verb if out.changed else 'unchanged'} (commit {out.commit[:12]})")
    if any(o.changed for o in outcomes) and not args.dry_run:
        print(
            "next: pyllama-dflash build, then pyllama-dflash repro --check-expected and pyllama-dflash mutate "
            "(docs/changing-the-fix.md)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(command.run(main))
