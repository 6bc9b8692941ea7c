"""pyllama-dflash: reproduce, fix and regression-test llama.cpp's DFlash image hole.

Layers, bottom up: ``llamabuild`` (pinned source, patches, side-by-side builds and their
manifests), ``bindings`` (cffi, one compiled module per variant), the owning wrappers and
``api`` (``Model``, ``Context``, ``Batch``, ``Speculative``, ``Projector``), ``tiny`` (generated
GGUF models), the scenarios and the fuzzer, run by ``pyllama-dflash repro`` and ``fuzz``.
"""

__version__ = "0.1.0"


def load(variant: str | None = None, *, backend: str | None = None, patches_dir=None, cpu: str | None = None):
    """Load a built variant's libraries and bindings into this process; returns its manifest.

    Builds are found through their manifests only, and one whose patches or native sources
    changed since is refused as stale (rebuild with ``python build.py --variants NAME``). All
    variants share sonames, so a process holds one variant; run others in child processes.
    ``cpu`` (native | avx2 | portable, default ``$PYLLAMA_DFLASH_CPU``) picks among builds for different
    CPUs; a native build made for features this CPU lacks is refused, never loaded. ``variant`` defaults to
    what ``--must-pass`` defaults to: the last variant of role as-trained, each draft served as it was trained.
    """
    from . import api
    from .llamabuild import find_built
    from .llamabuild.patchset import load_series
    from .llamabuild.variants import default_must_pass
    from .paths import default_patches_dir

    if variant is None:
        variant = default_must_pass(load_series(patches_dir or default_patches_dir()).variants, patches_dir)

    (manifest,) = find_built([variant], backend=backend, patches_dir=patches_dir, cpu_mode=cpu)
    api.init(manifest.lib_dir)
    return manifest
