"""pyllama-dflash: reproduce, fix and regression-test llama.cpp's DFlash image hole.

Three folders, each importing only those before it: ``product`` (what a user installs and calls: the
builder of the variants, the bindings, the owning objects, ``api`` with ``Model``, ``Context``, ``Batch``,
``Speculative`` and ``Projector``, the child processes, and the remedy ``upgrade``); ``harness`` (what the
fix is tested with: the slot loop, the oracles, the scenarios and the matrix, the fuzzer, the llama-server
checks, the tiny models); ``lab`` (what it is measured and developed with: the trained target, acceptance,
the bench, mutation testing, the develop tree, the pull requests). ``pyllama_dflash.api`` is the API's
name here too: ``from pyllama_dflash import api``.
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
    from pyllama_dflash.product import api
    from pyllama_dflash.product.llamabuild import find_built
    from pyllama_dflash.product.llamabuild.patchset import load_series
    from pyllama_dflash.product.llamabuild.variants import default_must_pass

    from .paths import default_patches_dir

    if variant is None:
        variant = default_must_pass(load_series(patches_dir or default_patches_dir()).variants, patches_dir)

    (manifest,) = find_built([variant], backend=backend, patches_dir=patches_dir, cpu_mode=cpu)
    api.init(manifest.lib_dir)
    return manifest


def __getattr__(name: str):
    """``pyllama_dflash.api``: the friendly API keeps its short name (it lives in ``product``)."""
    if name == "api":
        from pyllama_dflash.product import api

        return api
    raise AttributeError(f"module 'pyllama_dflash' has no attribute {name!r}")
