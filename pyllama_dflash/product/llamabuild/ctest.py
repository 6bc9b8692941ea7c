"""The series' C++ regression tests: built with each variant, published beside it, run by ctest.

The series' test patches (variant column ``*``) add each test to every variant, baseline included,
and register it with upstream's ``llama_build_and_test``: ``test-speculative-eagle3-passes`` (EAGLE3
after a prompt split into passes) and ``test-speculative-dflash-image`` (DFlash across images). Patch
0012 brings ``test-speculative-mtp-image`` (MTP fed an image's rows) to 0009's variant and those that
carry it. The builder compiles those a variant has with it and copies them into the variant's
folder, recording the labels upstream's registration gives each. :func:`testfile` writes a ``CTestTestfile.cmake``
registering those copies the same way, so ctest runs them long after the shared build folder has
moved on to another variant, without writing into the variant's folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ...errors import BuildError
from .patchset import Series

TESTS = ("test-speculative-eagle3-passes", "test-speculative-dflash-image", "test-speculative-mtp-image")
TESTFILE = "CTestTestfile.cmake"


def source(test: str) -> str:
    """The test's source, relative to the tree root."""
    return f"tests/{test}.cpp"


def built_with(series: Series, variant: str) -> list[str]:
    """The tests the variant's patches bring (a series given with --patches may bring none)."""
    return [t for t in TESTS if series.adds(variant, source(t))]


def publish(build_dir: Path, dest: Path, tests: list[str]) -> list[dict]:
    """Copy the tests from the build folder into dest; returns the manifest's ``ctest`` entries."""
    entries = []
    for test in tests:
        binary = build_dir / "bin" / test
        if not binary.is_file():
            raise BuildError(f"{binary}: not built")
        labels = registered_labels(build_dir, test)
        shutil.copy2(binary, dest / test)
        entries.append({"test": test, "binary": test, "labels": labels})
    return entries


def registered_labels(build_dir: Path, test: str) -> str:
    """The labels upstream's registration gives ``test`` in the build folder's llama.cpp tree."""
    return _labels(build_dir / "llama.cpp" / "tests" / TESTFILE, test)


def testfile(tests: list[tuple[str, Path, str]], dest_dir: Path) -> Path:
    """Write dest_dir/CTestTestfile.cmake registering each (test, binary, labels) as upstream does."""
    lines = ["# the series' regression tests, registered as llama.cpp's tests/CMakeLists.txt registers them\n"]
    for test, binary, labels in tests:
        lines.append(f'add_test([=[{test}]=] "{binary}")\n')
        properties = f'LABELS "{labels}" WORKING_DIRECTORY "{dest_dir}"'
        lines.append(f"set_tests_properties([=[{test}]=] PROPERTIES {properties})\n")
    path = dest_dir / TESTFILE
    path.write_text("".join(lines))
    return path


def _labels(testfile: Path, test: str) -> str:
    try:
        text = testfile.read_text()
    except OSError as e:
        raise BuildError(f"{testfile}: cannot read the test registrations ({e.strerror})") from None
    m = re.search(rf"set_tests_properties\(\[=\[{re.escape(test)}\]=\] PROPERTIES .*?LABELS \"([^\"]*)\"", text)
    if m is None:
        raise BuildError(f"{testfile}: {test} is not registered (did the patch's tests/CMakeLists.txt hunk apply?)")
    return m.group(1)
