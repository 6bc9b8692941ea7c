"""Build script of the cffi extension module ``_pyllama_dflash_cffi`` (out-of-line API mode).

The build system calls :func:`compile_module` once the llama.cpp libraries and the shim are
built, and :func:`source_hash` to tell whether a rebuild is due. Nothing here imports the
compiled module or touches native code.

By hand (for development)::

    python -m pyllama_dflash.product.bindings.ffibuild --tree TREE --lib-dir LIBS --out LIBS
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

from cffi import FFI

from ...files import atomic_path
from . import header_adapters

MODULE_NAME = "_pyllama_dflash_cffi"

# Link order matters for static fallbacks only; with shared libs any order works.
LIBRARIES: tuple[str, ...] = ("pyllama_dflash_shim", "mtmd", "llama", "ggml", "ggml-base")

_BINDINGS_DIR = Path(__file__).resolve().parent
_DECL_DIR = _BINDINGS_DIR / "decl"
_NATIVE_DIR = _BINDINGS_DIR.parent / "native"
SHIM_SOURCE = _NATIVE_DIR / "shim.cpp"
SHIM_HEADER = _NATIVE_DIR / "pyllama_dflash_shim.h"


def decl_paths() -> list[Path]:
    """The declaration headers, in cdef order."""
    return [_DECL_DIR / name for name in header_adapters.DECL_FILES]


def cdef_text() -> str:
    """All declaration headers joined into one cdef."""
    parts = []
    for path in decl_paths():
        parts.append(f"/* ---- {path.name} ---- */\n{path.read_text()}")
    return "\n".join(parts)


def source_hash() -> str:
    """sha256 over everything that shapes the module or the shim: a changed hash means rebuild."""
    digest = hashlib.sha256()
    adapters = Path(header_adapters.__file__).resolve()
    inputs = [*decl_paths(), Path(__file__).resolve(), adapters, SHIM_SOURCE, SHIM_HEADER]
    for path in inputs:
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def build_ffi(include_dirs: list[Path], lib_dir: Path) -> FFI:
    """An FFI with our cdef and set_source() pointing at the real headers and libraries."""
    ffi = FFI()
    ffi.cdef(cdef_text())
    ffi.set_source(
        MODULE_NAME,
        header_adapters.SOURCE_PREAMBLE,
        include_dirs=[str(p) for p in include_dirs],
        library_dirs=[str(lib_dir)],
        libraries=list(LIBRARIES),
        # the module is installed next to the libraries it links
        extra_link_args=["-Wl,-rpath,$ORIGIN"],
        extra_compile_args=["-O2"],
        define_macros=[("LLAMA_SHARED", None)],
    )
    return ffi


def compile_module(out_dir: Path, include_dirs: list[Path], lib_dir: Path, tmp_dir: Path) -> Path:
    """Compile ``_pyllama_dflash_cffi`` into out_dir and return the path of the extension."""
    out_dir = Path(out_dir)
    tmp_dir = Path(tmp_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    missing = [str(p) for p in include_dirs if not Path(p).is_dir()]
    if missing:
        raise FileNotFoundError(f"include dirs not found: {', '.join(missing)}")
    ffi = build_ffi([Path(p) for p in include_dirs], Path(lib_dir))
    built = Path(ffi.compile(tmpdir=str(tmp_dir), verbose=False))
    target = out_dir / built.name
    if built.resolve() != target.resolve():
        # copy then rename: a process that has the old module mapped keeps its inode
        with atomic_path(target) as staging:
            shutil.copy2(built, staging)
    return target


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument(
        "--lib-dir", type=Path, required=True, help="dir with libllama.so ... libpyllama_dflash_shim.so"
    )
    parser.add_argument("--out", type=Path, required=True, help="where the module goes (normally --lib-dir)")
    parser.add_argument("--tmp", type=Path, default=None)
    args = parser.parse_args(argv)
    tree = args.tree
    include_dirs = [
        tree / "include",
        tree / "ggml/include",
        tree / "tools/mtmd",
        tree / "common",
        tree / "src",
        SHIM_HEADER.parent,
    ]
    with tempfile.TemporaryDirectory() as scratch:
        path = compile_module(args.out, include_dirs, args.lib_dir, args.tmp or Path(scratch))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
