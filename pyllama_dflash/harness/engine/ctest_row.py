"""The series' C++ regression tests as one more row of the matrix (``C1``): ctest, per variant.

Each variant's copies of the series' tests (see llamabuild/ctest.py) run under ctest with upstream's
labels, and their printed checks decide the cell, in the matrix's terms: FAIL when a call failed
(baseline: the legacy draft's process() after the image), DRIFT when every call succeeded but
drafted tokens differ (the zero-fill's rows; baseline's EAGLE3 after a prompt split into passes),
PASS otherwise. The DFlash test prints every run's drafted tokens; on text only they must equal
baseline's, which no single build can check, so the row does: a variant that drafts otherwise on
text only is DRIFT too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from ...product.llamabuild import ctest
from ...product.llamabuild.manifest import Manifest
from ...product.llamabuild.patchset import BASELINE
from ..scenarios.catalog import CTEST_ROW
from ..slotloop.record import CRASH, DRIFT, ERROR, FAIL, PASS, SKIP, TIE

ROW = CTEST_ROW
TITLE = SimpleNamespace(title="the series' C++ tests (ctest)")
TEXT_ONLY = "text-only"  # the test's cases whose drafts must not depend on the fix: text-only, <drafter>-text-only
CALLS_CHECK = "every call succeeds"  # the test's check for return codes; the others compare drafts
TIE_CHECK = "a tie broken by the cells' order"  # the test's words for drafts its layout replay explains

_CHECK = re.compile(r"^  (OK|FAIL) +(.*)$")
_DRAFTS = re.compile(r"^  drafts (\w+):(.*)$")
_CASE = re.compile(r"^([\w-]+):$")
# ctest's words for a test that died of a signal
_CRASH = re.compile(r"\*\*\*Exception: *[A-Za-z][A-Za-z ]*[A-Za-z]|Subprocess aborted|Child aborted")
_TIME = re.compile(rf"(?:{'|'.join(map(re.escape, ctest.TESTS))}) \.+.*?([0-9.]+) sec")


def run_ctest(m: Manifest, timeout: float = 120.0) -> dict:
    """Run the variant's C++ tests under ctest, one after the other; a result in the matrix's shape."""
    entries = m.data.get("ctest") or []
    if not entries:
        return {"status": SKIP, "first_failure": "this variant's patches bring no C++ test"}
    return run_tests([(e["test"], m.lib_dir / e["binary"], e["labels"]) for e in entries], str(m.lib_dir), timeout)


def run_tests(tests: list[tuple[str, Path, str]], where: str, timeout: float = 120.0) -> dict:
    """Run (test, binary, labels) under ctest, one after the other, as upstream registers them; a result in
    the matrix's shape. ``where``: the build the binaries belong to, for the command line recorded."""
    exe = shutil.which("ctest")
    if exe is None:
        return {"status": ERROR, "first_failure": "ctest not found on PATH (it comes with cmake)"}
    names = [t[0] for t in tests]
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-ctest-") as tmp:
        ctest.testfile(tests, Path(tmp))
        label = tests[0][2].split(";")[0]
        selected = f"^({'|'.join(map(re.escape, names))})$"
        cmd = [exe, "--test-dir", tmp, "-L", label, "-R", selected, "-V", "--timeout", str(int(timeout))]
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=len(tests) * timeout + 30)
        except subprocess.TimeoutExpired:
            return {"status": ERROR, "first_failure": f"ctest did not finish in {len(tests) * timeout + 30:.0f}s"}
        wall = time.monotonic() - t0
    text = out.stdout + out.stderr
    result = _judge(text, out.returncode, names)
    timings = [float(t) for t in _TIME.findall(text)]
    result.update(
        command=f"ctest -L {label} -R '{selected}' -V, over {where}",
        returncode=out.returncode,
        test_s=round(sum(timings), 3) if len(timings) == len(tests) else None,
        wall_s=round(wall, 3),
        log_tail=text.splitlines()[-15:] if result["status"] != PASS else [],
    )
    return result


def _judge(text: str, returncode: int, tests: list[str] | None = None) -> dict:
    """The row's cell from ctest's output; ``tests``: the names, in the order they were registered (ctest -V
    prefixes each test's lines with its number), so that each check says which test printed it."""
    checks, drafts, case = [], {}, None
    for raw in text.splitlines():
        number = re.match(r"^(\d+): ", raw)
        line = raw[number.end() :] if number else raw
        if m := _CASE.match(line):
            case = m.group(1)
        elif (m := _CHECK.match(line)) and case:
            index = int(number.group(1)) - 1 if number else 0
            test = tests[index] if tests and 0 <= index < len(tests) else None
            checks.append({"test": test, "case": case, "ok": m.group(1) == "OK", "check": m.group(2)})
        elif (m := _DRAFTS.match(line)) and case:
            drafts.setdefault(case, {})[m.group(1)] = [r.split() for r in m.group(2).split("|")]
        elif checks and line.startswith("         failed: "):
            checks[-1].setdefault("failed", []).append(line.strip()[len("failed: ") :])
    failed = [c for c in checks if not c["ok"]]
    base = {"checks": checks, "drafts": drafts}
    if "***Timeout" in text:
        return {**base, "status": ERROR, "first_failure": "the test did not finish within ctest's --timeout (a hang?)"}
    crash = _CRASH.search(text)
    if crash:
        signal = crash.group(0).removeprefix("***Exception:").strip()
        return {**base, "status": CRASH, "signal": signal, "first_failure": f"the test died: {crash.group(0)}"}
    if not checks:
        return {**base, "status": ERROR, "first_failure": f"the test printed no checks (ctest exit {returncode})"}
    if not failed:
        if returncode != 0:
            return {**base, "status": ERROR, "first_failure": f"every check passed but ctest exited {returncode}"}
        ties = [c for c in checks if TIE_CHECK in c["check"]]
        if ties:  # the legacy draft drafted otherwise, and the twin laid out as the fix lays it drafts the same
            return {**base, "status": TIE, "first_failure": f"{ties[0]['case']}: {ties[0]['check']}"}
        return {**base, "status": PASS, "first_failure": None}
    calls = [c for c in failed if c["check"].endswith(CALLS_CHECK)]
    first = (calls or failed)[0]  # the failure that decides the status
    detail = f"{first['case']}: {first['check']}" + (f" ({first['failed'][0]})" if first.get("failed") else "")
    return {**base, "status": FAIL if calls else DRIFT, "first_failure": detail}


def judge_text_only(row: dict[str, dict]) -> None:
    """A variant whose text-only drafts (of any drafter) differ from baseline's changes what needs no
    fix: DRIFT."""
    base = (row.get(BASELINE) or {}).get("drafts", {})
    for case in (c for c in base if c.endswith(TEXT_ONLY)):
        for variant, r in row.items():
            mine = r.get("drafts", {}).get(case)
            if variant == BASELINE or not mine or r["status"] not in (PASS, TIE, DRIFT):
                continue
            for draft_kind, rounds in mine.items():
                if rounds != base[case].get(draft_kind) and r["status"] in (PASS, TIE):
                    r["status"] = DRIFT
                    r["first_failure"] = f"{case}: the {draft_kind} draft drafts otherwise than on {BASELINE}"
                    break


def run_row(manifests: list[Manifest], parallel: int = 2, timeout: float = 120.0) -> dict[str, dict]:
    """The C1 row: every variant's test, ``parallel`` at once, judged against baseline on text only."""
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {m.variant: pool.submit(run_ctest, m, timeout) for m in manifests}
        row = {variant: f.result() for variant, f in futures.items()}
    judge_text_only(row)
    return row
