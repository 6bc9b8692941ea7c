"""Import the `gguf` package vendored in a llama.cpp tree (`<tree>/gguf-py`).

The PyPI `gguf` lacks the DFlash constants and writer calls (`add_target_layers`,
`add_block_size`); the copy inside the pinned tree has them. That copy imports
itself by the absolute name `gguf` (e.g. `from gguf.constants import ...` in the
reader), so it cannot live under a private module name. We import it as `gguf`
and then put back whatever `gguf` modules were loaded before, so an installed
PyPI `gguf` used elsewhere in the process is left alone.

Runtime needs of the vendored package when writing/reading files: numpy and
PyYAML (`gguf.metadata` imports yaml at import time). tqdm is only imported by
`GGUFWriter.write_tensors_to_file(progress=True)`, requests only by the remote
safetensors helpers; we use neither.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from ...env import GGUF_PY_ENV as ENV_VAR
from ...errors import GgufUnavailable

_cache: dict[Path, ModuleType] = {}


def _default_gguf_py() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    try:
        from pyllama_dflash.product.llamabuild.source import pristine_tree  # type: ignore[import-not-found]
    except ImportError as exc:
        raise GgufUnavailable(
            f"no gguf-py given: pass tree=, set {ENV_VAR} to a llama.cpp gguf-py directory, "
            f"or provide pyllama_dflash.product.llamabuild.source.pristine_tree() ({exc})"
        ) from exc
    try:
        tree = Path(pristine_tree())
    except Exception as exc:  # the source module may fail to fetch/extract; say why
        raise GgufUnavailable(f"pristine_tree() failed, so no gguf-py is available: {exc}") from exc
    return tree / "gguf-py"


def _is_gguf_modname(name: str) -> bool:
    return name == "gguf" or name.startswith("gguf.")


def _import_from(gguf_py: Path) -> ModuleType:
    saved = {k: v for k, v in sys.modules.items() if _is_gguf_modname(k)}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(gguf_py))
    try:
        importlib.invalidate_caches()
        mod = importlib.import_module("gguf")
    finally:
        sys.path.remove(str(gguf_py))
        # drop ours from the global registry and restore the previous state; our
        # module objects stay alive through `mod` and their own references
        for k in [k for k in sys.modules if _is_gguf_modname(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
    return mod


def gguf_module(tree: Path | None = None) -> ModuleType:
    """Return the `gguf` package from `<tree>/gguf-py` (or env / pristine tree)."""
    gguf_py = Path(tree) / "gguf-py" if tree is not None else _default_gguf_py()
    gguf_py = gguf_py.resolve()
    if gguf_py in _cache:
        return _cache[gguf_py]
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        raise GgufUnavailable(f"{gguf_py} does not contain a gguf package (gguf/__init__.py)")
    try:
        mod = _import_from(gguf_py)
    except ImportError as exc:
        raise GgufUnavailable(f"importing gguf from {gguf_py} failed: {exc} (it needs numpy and PyYAML)") from exc
    missing = [
        a for a in ("add_target_layers", "add_block_size", "add_mask_token_id") if not hasattr(mod.GGUFWriter, a)
    ]
    if missing or not hasattr(mod.MODEL_ARCH, "DFLASH"):
        raise GgufUnavailable(f"gguf-py at {gguf_py} has no DFlash support (missing {missing or 'MODEL_ARCH.DFLASH'})")
    _cache[gguf_py] = mod
    return mod
