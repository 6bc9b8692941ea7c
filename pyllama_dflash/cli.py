"""``pyllama-dflash``: one console command for the project's tools.

    pyllama-dflash build --variants all     # = python build.py --variants all
    pyllama-dflash repro                   # = python -m pyllama_dflash.harness.repro
    pyllama-dflash fuzz --examples 200     # = python -m pyllama_dflash.harness.fuzz --examples 200
    pyllama-dflash mutate --list           # = python -m pyllama_dflash.lab.mutate --list

Each subcommand hands the rest of the line to that tool's own ``main(argv)``, run as every command
is (command.py: its prog, its error line, exit 2 on an error, 130 on Ctrl-C or SIGTERM), so
``pyllama-dflash repro --help`` is repro's help and the older forms keep working as they were.
The flags several tools take (``--variants``, ``--must-pass``, ``--backend``, ``--jobs``,
``--timeout``) are defined once, in ``flags.py``, and each tool's parser picks those it uses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import command
from .flags import PROG

# ---- the subcommands -------------------------------------------------------------------------------

# name: (module holding main(argv), one line of help); imported only when chosen
TOOLS: dict[str, tuple[str, str]] = {
    "build": (
        "pyllama_dflash.product.llamabuild.__main__",
        "build llama.cpp (pinned) with each variant of patches/series, side by side (python build.py)",
    ),
    "repro": ("pyllama_dflash.harness.repro.__main__", "the scenario matrix across every variant of the series"),
    "fuzz": ("pyllama_dflash.harness.fuzz.__main__", "search image/text schedules on every built variant"),
    "mutate": ("pyllama_dflash.lab.mutate.__main__", "mutation testing: does the harness notice the fix broken?"),
    "bench": ("pyllama_dflash.lab.bench.__main__", "the project's performance figures, as side-by-side ratios"),
    "tiny": ("pyllama_dflash.harness.tiny.__main__", "write the tiny target/draft/mmproj GGUFs"),
    "soak": ("pyllama_dflash.harness.soak.__main__", "a bounded soak of a variant's llama-server through real clients"),
    "upgrade": (
        "pyllama_dflash.product.upgrade.__main__",
        "add rope.dimension_sections to a legacy DFlash draft for an M-RoPE target",
    ),
    "train": (
        "pyllama_dflash.lab.draftmodel.__main__",
        "train a tiny target's DFlash draft and commit it to tests/data/trained (the train extra: JAX)",
    ),
    "vlm": (
        "pyllama_dflash.lab.vlm.__main__",
        "build the trained vision-language target, its padded twin and its drafts (the train extra: JAX)",
    ),
    "pulls": (
        "pyllama_dflash.lab.pulls.__main__",
        "the pull requests of patches/pulls: each test run on b11434 without its fix and with it",
    ),
    "develop": ("pyllama_dflash.lab.develop.__main__", "a git work tree of the pinned source, one commit per patch"),
    "write-back": (
        "pyllama_dflash.lab.develop.writeback.__main__",
        "write a develop tree's commits back into the patch series",
    ),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Reproduce, fix and regression-test llama.cpp's DFlash speculative decoding.",
        epilog=f"'{PROG} COMMAND --help' shows a command's own flags. The older forms still work: "
        "python build.py, python -m pyllama_dflash.<layer>.<tool>.",
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, line) in TOOLS.items():
        sub.add_parser(name, help=line, add_help=False)  # the tool parses its own flags, --help included
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # only the first word is ours: --help, or a command; an unknown one ends here with argparse's message
    name = parser().parse_args(argv[:1]).command
    tool_main = importlib.import_module(TOOLS[name][0]).main
    return command.run(tool_main, argv[1:], prog=command.name_prog(name))


if __name__ == "__main__":
    # through the package's modules, not this __main__ copy, so that the tools see the same prog state
    from pyllama_dflash.cli import main as _main

    sys.exit(_main())
