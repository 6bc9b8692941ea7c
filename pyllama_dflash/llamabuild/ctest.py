"""The series' C++ regression test: built with each variant, published beside it, run by ctest.

Patch 0004 (variant column ``*``) adds ``tests/test-speculative-dflash-image.cpp`` to every
variant, baseline included, and registers it with upstream's ``llama_build_and_test``. The
builder compiles it with the variant and copies it into the variant's folder, recording the
labels upstream's registration gives it. :func:`testfile` writes a ``CTestTestfile.cmake``
registering that copy the same way, so ctest runs it long after the shared build folder has
moved on to another variant, without writing into the variant's folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..errors import BuildError
from .patchset import Series

TEST = "test-speculative-dflash-image"
SOURCE = f"tests/{TEST}.cpp"
TESTFILE = "CTestTestfile.cmake"


def built_with(series: Series, variant: str) -> bool:
    """Whether the variant's patches bring the test (a series given with --patches may not)."""
    return series.adds(variant, SOURCE)


def publish(build_dir: Path, dest: Path) -> dict:
    """Copy the test from the build folder into dest; returns the manifest's ``ctest`` entry."""
    binary = build_dir / "bin" / TEST
    if not binary.is_file():
        raise BuildError(f"{binary}: not built")
    labels = _labels(build_dir / "llama.cpp" / "tests" / TESTFILE)
    shutil.copy2(binary, dest / TEST)
    return {"test": TEST, "binary": TEST, "labels": labels}


def testfile(binary: Path, labels: str, dest_dir: Path) -> Path:
    """Write dest_dir/CTestTestfile.cmake registering binary as upstream registers the test."""
    path = dest_dir / TESTFILE
    path.write_text(
        "# the series' regression test, registered as llama.cpp's tests/CMakeLists.txt registers it\n"
        f'add_test([=[{TEST}]=] "{binary}")\n'
        f'set_tests_properties([=[{TEST}]=] PROPERTIES LABELS "{labels}" WORKING_DIRECTORY "{dest_dir}")\n'
    )
    return path


def _labels(testfile: Path) -> str:
    try:
        text = testfile.read_text()
    except OSError as e:
        raise BuildError(f"{testfile}: cannot read the test registrations ({e.strerror})") from None
    m = re.search(rf"set_tests_properties\(\[=\[{re.escape(TEST)}\]=\] PROPERTIES .*?LABELS \"([^\"]*)\"", text)
    if m is None:
        raise BuildError(f"{testfile}: {TEST} is not registered (did the patch's tests/CMakeLists.txt hunk apply?)")
    return m.group(1)
