#!/usr/bin/env python3
"""Build the pinned llama.cpp with each variant of patches/series side by side.

    python build.py --variants all        # baseline and every patched variant
    python build.py --list               # what is built
    python build.py --check              # dry-run the patch series

The logic lives in pyllama_dflash.product.llamabuild so that ``pip install .`` can run it too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyllama_dflash.command import run
from pyllama_dflash.product.llamabuild.__main__ import main

if __name__ == "__main__":
    sys.exit(run(main, prog="build.py"))
