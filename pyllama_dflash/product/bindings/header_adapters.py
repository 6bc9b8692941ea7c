"""The one place where our curated declarations meet llama.cpp's real headers.

API mode compiles the generated module against the real headers, so a declaration of ours
that no longer matches llama.cpp's fails the build (loudly, at build time) instead of
corrupting memory at run time. Struct layouts are never ours: every struct in decl/ that
llama.cpp may grow ends in ``...;`` and the compiler fills in offsets and size.

What does not match the pinned b11434 headers one to one is adapted here, and only here:

* ``mtmd_image_tokens_get_nx/ny`` are marked DEPRECATED (upstream wants
  ``mtmd_image_tokens_get_decoder_pos``). We still want the grid size, the quantity the
  positional hole is made of, so two tiny wrappers call them with the warning silenced.
* ``GGML_MROPE_SECTIONS``, ``LLAMA_TOKEN_NULL`` and the enum values are declared with ``...``
  so their values come from the headers, not from copies of ours.
* ``llama_batch_init`` allocates ``pos`` for one row per token, too small for the 4 position
  rows an M-RoPE embedding batch needs; ``product/owning.py`` therefore owns the batch arrays
  itself instead of calling it (documented there; nothing to adapt in C).
* libcommon's logger has no callback; the shim mirrors it into a file (see logs.py).

When moving to another release: update decl/*.h, this preamble, and bump
``PYLLAMA_DFLASH_SHIM_ABI`` in the shim header whenever a shim signature changes.
"""

from __future__ import annotations

# Declaration files, in the order they are concatenated into one cdef (later ones use
# the types of earlier ones).
DECL_FILES: tuple[str, ...] = ("ggml.h", "llama.h", "mtmd.h", "shim.h", "callbacks.h")

# Shim ABI this binding was written for; checked against pyllama_dflash_shim_abi() at load.
SHIM_ABI = 4

# C source of the generated module: the real headers plus the adapters listed above.
SOURCE_PREAMBLE = r"""
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include "pyllama_dflash_shim.h"

/* drift: deprecated in b11434, still the simplest way to read the image grid */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static size_t pyllama_dflash_image_tokens_nx(const mtmd_image_tokens * image_tokens) {
    return mtmd_image_tokens_get_nx(image_tokens);
}
static size_t pyllama_dflash_image_tokens_ny(const mtmd_image_tokens * image_tokens) {
    return mtmd_image_tokens_get_ny(image_tokens);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
"""
