"""Where things are: the project checkout, the patch series, the build cache."""

from __future__ import annotations

import os
from pathlib import Path

from .env import CACHE_ENV, PATCHES_ENV

PACKAGE_DIR = Path(__file__).resolve().parent
# Present in a checkout (and an editable install); absent from an installed wheel,
# which carries the patch series inside the package instead (see pyproject.toml).
REPO_DIR = PACKAGE_DIR.parent
NATIVE_DIR = PACKAGE_DIR / "product" / "native"


def cache_root() -> Path:
    """The build cache: ``$PYLLAMA_DFLASH_CACHE``, else ``$XDG_CACHE_HOME/pyllama-dflash``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "pyllama-dflash").resolve()


def default_patches_dir() -> Path:
    """The patch series: ``$PYLLAMA_DFLASH_PATCHES``, the checkout's ``patches/``, or the packaged copy."""
    explicit = os.environ.get(PATCHES_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    return package_patches_dir()


def package_patches_dir() -> Path:
    """The project's own series: the checkout's ``patches/``, or the packaged copy."""
    for candidate in (REPO_DIR / "patches", PACKAGE_DIR / "_patches"):
        if (candidate / "series").is_file():
            return candidate
    return REPO_DIR / "patches"


def vendor_dir() -> Path:
    return REPO_DIR / "vendor" / "llama.cpp"
