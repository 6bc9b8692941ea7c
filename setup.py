"""Only here to hook the llama.cpp variant builds into `pip install .`.

A regular install builds baseline and every patched variant into the build cache
(CPU by default, CUDA with PYLLAMA_DFLASH_BACKEND=cuda, CMAKE_ARGS=-DGGML_CUDA=on,
or when detected). Editable installs build on first use or via `python build.py`.
PYLLAMA_DFLASH_SKIP_BUILD=1 skips the build.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_and_variants(build_py):
    def run(self):
        super().run()
        # PYLLAMA_DFLASH_SKIP_BUILD: pyllama_dflash.env.SKIP_BUILD_ENV (spelt out: setup.py runs before the package)
        if getattr(self, "editable_mode", False) or os.environ.get("PYLLAMA_DFLASH_SKIP_BUILD"):
            return
        sys.path.insert(0, str(HERE))
        from pyllama_dflash.product.llamabuild import BuildError, BuildOptions, build

        try:
            build(["all"], BuildOptions(patches_dir=HERE / "patches", server=True))
        except BuildError as e:
            raise SystemExit(f"pyllama-dflash: building the llama.cpp variants failed: {e}") from e


setup(cmdclass={"build_py": build_py_and_variants})
