"""One side of a pull request of ``patches/pulls``: its patches applied to b11434 alone, compiled in the
shared build folder, and the request's tests run on it: its C++ tests under ctest, and its tests of
llama-server's kind with upstream's own pytest harness over the side's llama-server (llamabuild.pulls says
which patches each side has). Nothing is published: the folder is left holding the last side built, and
its lock is held while a side's tests run on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from ...errors import BuildError, PatchError
from ...product.llamabuild import builder, ctest
from ...product.llamabuild.patchset import Patch, Series
from ..slotloop.record import ERROR, FAIL, PASS
from .ctest_row import run_tests

SERVER_TEST_TIMEOUT_S = 600


def build_and_test(
    series: Series, chain: tuple[Patch, ...], tests: list[str], server_tests: list[str], opts, folder: Path
) -> dict:
    """``chain`` on b11434, compiled, and the tests run on it: the patches' numbers, the build's seconds, and
    a cell in the matrix's shape (status, checks, first_failure) for the C++ tests (``ctest``) and for the
    server's (``server``); one ERROR cell where the chain does not build."""
    side: dict = {"patches": [p.name[:4] for p in chain]}
    t0 = time.monotonic()
    try:
        # the folder's lock held until the tests end: another build would stage the folder anew under them
        with builder.holding_chain(series, chain, opts, folder) as staged:
            side["build_s"] = round(time.monotonic() - t0, 1)
            _run_side_tests(side, staged, tests, server_tests)
    except (BuildError, PatchError) as e:
        return {**side, "status": ERROR, "first_failure": f"does not build: {e}"}
    return side


def _run_side_tests(side: dict, staged: builder.Staged, tests: list[str], server_tests: list[str]) -> None:
    if tests:
        binaries = [(t, staged.build_dir / "bin" / t, ctest.registered_labels(staged.build_dir, t)) for t in tests]
        side["ctest"] = run_tests(binaries, str(staged.build_dir))
    if server_tests:
        server_binary = staged.build_dir / "bin" / "llama-server"
        side["server"] = run_server_tests(staged.tree / "tools" / "server" / "tests", server_binary, server_tests)


def run_server_tests(tests_dir: Path, server_binary: Path, files: list[str]) -> dict:
    """Upstream's harness (``tools/server/tests``: its ``utils.py`` and pytest) on ``files``, over
    ``server_binary``, with neither its conftest (which downloads every preset model first) nor a byte
    written into the tree; a cell in the matrix's shape, one check per test case."""
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-server-tests-") as tmp:
        report = Path(tmp) / "junit.xml"
        env = {
            **os.environ,
            "PYTHONPATH": str(tests_dir),
            "PYTHONDONTWRITEBYTECODE": "1",
            "LLAMA_SERVER_BIN_PATH": str(server_binary),
            "LLAMA_CACHE": str(Path(tmp) / "cache"),
        }
        cmd = [sys.executable, "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-q"]
        cmd += ["--junitxml", str(report), "-o", "junit_family=xunit2", *files]
        try:
            out = subprocess.run(
                cmd, cwd=tests_dir, env=env, capture_output=True, text=True, timeout=SERVER_TEST_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return {"status": ERROR, "first_failure": f"the server tests did not finish in {SERVER_TEST_TIMEOUT_S}s"}
        checks = _cases(report) if report.is_file() else []
    text = out.stdout + out.stderr
    if not checks:
        return {
            "status": ERROR,
            "first_failure": f"pytest ran no test (exit {out.returncode})",
            "log_tail": text.splitlines()[-15:],
        }
    failed = [c for c in checks if not c["ok"]]
    return {
        "status": FAIL if failed else PASS,
        "checks": checks,
        "first_failure": f"{failed[0]['case']}: {failed[0]['check']}" if failed else None,
        "command": f"pytest --noconftest {' '.join(files)}, in {tests_dir}",
        "returncode": out.returncode,
    }


def _cases(report: Path) -> list[dict]:
    """One check per test case of a junit report: its file, its name, whether it passed, and why not."""
    checks = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = next((c for c in case if c.tag in ("failure", "error")), None)
        why = (problem.get("message") or "").splitlines()[0][:200] if problem is not None else "passed"
        checks.append({"test": case.get("classname"), "case": case.get("name"), "ok": problem is None, "check": why})
    return checks
