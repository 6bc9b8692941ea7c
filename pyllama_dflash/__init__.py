"""pyllama-dflash: reproduce, fix and regression-test llama.cpp's DFlash image hole.

Layers, bottom up: ``build`` (pinned source, patches, side-by-side builds and their
manifests), ``bindings`` (cffi, one compiled module per variant), the owning
wrappers and API (``Model``, ``Context``, ``Batch``, ``Speculative``, ``Projector``),
``tiny`` (generated GGUF models) and the scenarios run by ``python -m pyllama_dflash.repro``.
"""

__version__ = "0.1.0"
