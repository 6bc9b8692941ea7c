"""Runtime loader of the compiled ``_pyllama_dflash_cffi`` module.

Every build variant ships libraries with the same sonames (libllama.so.0, ...), so the dynamic
linker can hold only one variant per process: once a module from one lib_dir is loaded,
loading from a different lib_dir is refused instead of silently mixing libraries.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from ...errors import BindingLoadError
from . import header_adapters
from .ffibuild import MODULE_NAME

_lock = threading.Lock()
_loaded: tuple[Path, ModuleType] | None = None


def _find_module_file(lib_dir: Path) -> Path:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = lib_dir / f"{MODULE_NAME}{suffix}"
        if candidate.is_file():
            return candidate
    others = sorted(p.name for p in lib_dir.glob(f"{MODULE_NAME}*"))
    hint = f" (found {', '.join(others)}, built for another Python?)" if others else ""
    raise BindingLoadError(f"no {MODULE_NAME} extension for this Python in {lib_dir}{hint}")


def load_module(lib_dir: Path) -> tuple[Any, Any]:
    """Import the compiled module from lib_dir (by file location) and return ``(ffi, lib)``.

    Idempotent for the same lib_dir; raises BindingLoadError for a second, different one.
    """
    global _loaded
    wanted = Path(lib_dir).resolve()
    with _lock:
        if _loaded is not None:
            loaded_dir, module = _loaded
            if loaded_dir != wanted:
                raise BindingLoadError(
                    f"llama.cpp libraries from {loaded_dir} are already loaded in this process; "
                    f"cannot also load {wanted} (same sonames, one variant per process)"
                )
            return module.ffi, module.lib
        if not wanted.is_dir():
            raise BindingLoadError(f"library dir does not exist: {wanted}")
        path = _find_module_file(wanted)
        spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
        if spec is None or spec.loader is None:
            raise BindingLoadError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            raise BindingLoadError(f"cannot load {path}: {exc}") from exc
        abi = int(module.lib.pyllama_dflash_shim_abi())
        if abi != header_adapters.SHIM_ABI:
            raise BindingLoadError(
                f"{path}: shim ABI {abi}, bindings expect {header_adapters.SHIM_ABI}; rebuild the shim and module"
            )
        _loaded = (wanted, module)
        return module.ffi, module.lib


def loaded_lib_dir() -> Path | None:
    """The lib_dir whose module is loaded in this process, if any."""
    with _lock:
        return _loaded[0] if _loaded else None
