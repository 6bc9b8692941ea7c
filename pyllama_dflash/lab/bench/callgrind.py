"""The ``instructions`` section: the text-only speculative loop under callgrind, instructions per generated
token of ``full`` over ``baseline`` (a count, not a time: repeatable whatever else the machine does)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ...env import CPU_ENV, THREADS_ENV
from ...files import atomic_write_json
from ...product.llamabuild import BuildError, find_built
from ...product.process import child
from . import SectionUnavailable
from .job import BenchJob, SpecLoop


def _callgrind_cpu() -> str:
    """valgrind runs the x86-64 baseline anywhere; a native build only where it lacks nothing valgrind
    knows (3.19 cannot execute AVX-512): use the portable builds when they are there."""
    try:
        find_built(["baseline", "full"], cpu_mode="portable")
        return "portable"
    except BuildError:
        return "native"


def _callgrind_ir(variant: str, n_tokens: int, out_dir: Path, cpu: str = "native") -> int:
    """Instructions executed by one spec_loop child under callgrind (a count, not a time)."""
    out = out_dir / f"callgrind.{variant}.{n_tokens}"
    job = out_dir / f"{variant}-{n_tokens}.job.json"
    atomic_write_json(job, BenchJob(variant, SpecLoop(n_tokens=n_tokens, repeats=1)).to_json())
    done = child.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "pyllama_dflash.lab.bench.worker",
            str(job),
            str(out_dir / f"{variant}-{n_tokens}.result.json"),
        ],
        log=out_dir / f"{variant}-{n_tokens}.log",
        timeout=3600,
        env={"PYTHONHASHSEED": "0", THREADS_ENV: "1", CPU_ENV: cpu},
    )
    found = re.findall(r"Collected : (\d+)", "\n".join(done.tail(50)))
    if done.rc == -signal.SIGILL:
        raise SectionUnavailable(
            f"valgrind {_valgrind_version()} cannot execute an instruction of the {cpu} build (SIGILL: "
            "-march=native enabled CPU features it lacks); build the portable variants, which it can run: "
            "pyllama-dflash build --cpu portable"
        )
    if done.rc != 0 or not found:
        raise RuntimeError(f"callgrind run of {variant} failed ({done.how}):\n" + "\n".join(done.why()))
    return int(found[-1])


def _valgrind_version() -> str:
    proc = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
    return proc.stdout.strip().removeprefix("valgrind-") or "?"


def bench_overhead_instructions(short: int = 32, long: int = 288) -> dict:
    """The same loop counted in instructions: Ir(long) - Ir(short) is the cost of the extra tokens
    alone (start-up and model loading cancel out), repeatable whatever else the machine does."""
    if shutil.which("valgrind") is None:
        raise SectionUnavailable("valgrind not found (install it to count instructions)")
    cpu = _callgrind_cpu()
    with tempfile.TemporaryDirectory(prefix="pyllama-dflash-callgrind-") as tmp:
        ir = {v: {n: _callgrind_ir(v, n, Path(tmp), cpu) for n in (short, long)} for v in ("baseline", "full")}
    per_token = {v: (x[long] - x[short]) / (long - short) for v, x in ir.items()}
    return {
        "cpu": cpu,
        "tokens": [short, long],
        "instructions": ir,
        "per_token": per_token,
        "ratio": per_token["full"] / per_token["baseline"],
    }
