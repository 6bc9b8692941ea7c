"""The ``pyllama-dflash`` console command: one subcommand per tool, the shared flags defined once.

The command runs as installed (the script beside this Python) or, without it, as
``python -m pyllama_dflash.cli``; the older ``python -m pyllama_dflash.<layer>.<tool>`` forms keep working.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyllama_dflash import cli, flags
from pyllama_dflash.env import CACHE_ENV, PATCHES_ENV
from pyllama_dflash.harness.fuzz.__main__ import parser as fuzz_parser
from pyllama_dflash.harness.repro.__main__ import parser as repro_parser
from pyllama_dflash.product.llamabuild.__main__ import parser as build_parser

SCRIPT = Path(sys.executable).parent / "pyllama-dflash"
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "pyllama_dflash.cli"]
SUBCOMMANDS = (
    "build",
    "repro",
    "fuzz",
    "mutate",
    "bench",
    "tiny",
    "soak",
    "upgrade",
    "train",
    "vlm",
    "pulls",
    "develop",
    "write-back",
)
SHARED_IN_REPRO_AND_FUZZ = ("--variants", "--must-pass", "--backend", "--jobs", "--timeout", "--cpu", "--patches")


def run(
    *args: str, command: list[str] = COMMAND, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    # wide, so that argparse does not wrap a help line in the middle of a phrase
    env = {**os.environ, "COLUMNS": "1000", **(env or {})}
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=timeout)


def help_line(text: str, flag: str) -> str:
    """The help of ``flag`` in a --help output (COLUMNS wide enough that it is one line)."""
    (line,) = [ln for ln in text.splitlines() if re.match(rf"\s+{re.escape(flag)}\b", ln)]
    return line.split("  ", 2)[-1].strip()


def test_help_lists_every_subcommand_with_one_line():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: pyllama-dflash ")
    lines = proc.stdout.splitlines()
    for name in SUBCOMMANDS:
        (i,) = [i for i, ln in enumerate(lines) if ln.split()[:1] == [name]]
        # the name and its one line of help (argparse puts the help of a name past 8 characters below it)
        help_words = lines[i].split()[1:] or lines[i + 1].split()
        assert len(help_words) > 1, lines[i : i + 2]
    assert set(cli.TOOLS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_shows_its_own_help(name):
    proc = run(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: pyllama-dflash {name} "), proc.stdout[:200]


def test_repro_help_is_repros():
    proc = run("repro", "--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--scenarios", "--expect-baseline-fail", "--no-build", "--schedule", "--target", "--n-batch"):
        assert flag in proc.stdout


def test_the_shared_flags_read_the_same_in_repro_and_fuzz():
    repro, fuzz = run("repro", "--help"), run("fuzz", "--help")
    assert repro.returncode == fuzz.returncode == 0
    for flag in SHARED_IN_REPRO_AND_FUZZ:
        r, f = help_line(repro.stdout, flag), help_line(fuzz.stdout, flag)
        # only the tool's own default may differ
        assert r.rpartition(" (default: ")[0] == f.rpartition(" (default: ")[0], (flag, r, f)
    # the help is one string in both parsers, not two copies that happen to agree
    helps = [
        {a.option_strings[0]: a.help for a in p._actions if a.option_strings} for p in (repro_parser(), fuzz_parser())
    ]
    for flag in SHARED_IN_REPRO_AND_FUZZ:
        assert helps[0][flag] == helps[1][flag]


def test_each_tool_keeps_its_defaults():
    repro, fuzz = repro_parser().parse_args([]), fuzz_parser().parse_args([])
    assert (repro.jobs, repro.timeout) == (os.cpu_count() or 2, 300.0)
    assert (fuzz.jobs, fuzz.timeout) == (2, 1800.0)
    for args in (repro, fuzz):
        assert (args.variants, args.must_pass, args.backend) == (None, None, None)
    build = build_parser()
    assert (build.parse_args([]).jobs, build.parse_args([]).backend) == (None, None)
    assert build.parse_args(["-j", "4"]).jobs == build.parse_args(["--jobs", "4"]).jobs == 4  # build keeps its -j


def test_a_retired_flag_still_works_and_says_its_new_name(capsys):
    from pyllama_dflash.lab.mutate.__main__ import parser as mutate_parser

    assert repro_parser().parse_args(["--fix", "slots"]).must_pass == "slots"
    assert fuzz_parser().parse_args(["--fix", "slots"]).must_pass == "slots"
    assert mutate_parser().parse_args(["--fix", "slots"]).variant == "slots"
    err = capsys.readouterr().err
    assert err.count("--fix is now --must-pass") == 2 and "--fix is now --variant" in err, err
    assert "--fix" not in repro_parser().format_help()  # the old name is not offered


def test_common_parser_refuses_a_flag_it_does_not_share():
    with pytest.raises(ValueError, match="unknown shared flag"):
        flags.common_parser("variants", "nope")
    with pytest.raises(ValueError, match="not picked"):
        flags.common_parser("variants", jobs=2)


def test_an_unknown_subcommand_fails_and_says_so():
    proc = run("nope")
    assert proc.returncode != 0
    assert "invalid choice: 'nope'" in proc.stderr and "repro" in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_no_subcommand_fails_and_says_so():
    proc = run()
    assert proc.returncode != 0
    assert "required: COMMAND" in proc.stderr, proc.stderr


def test_the_module_forms_still_work():
    for module in ("pyllama_dflash.harness.repro", "pyllama_dflash.harness.fuzz"):
        proc = run("--help", command=[sys.executable, "-m", module])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: python -m {module} "), proc.stdout[:200]
    proc = run("--help", command=[sys.executable, str(Path(__file__).resolve().parent.parent / "build.py")])
    assert proc.returncode == 0 and proc.stdout.startswith("usage: build.py "), proc.stdout[:200]


def test_repro_through_the_command_prints_the_table(variants):
    assert "full" in variants, sorted(variants)
    proc = run(
        "repro", "--no-build", "--scenarios", "S8", "--variants", "full", "--drafters", "dflash", "--targets", "dense"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = proc.stdout.splitlines()[0].split()
    assert header[:2] == ["scenario", "full"], proc.stdout  # one drafter and target: one table, no heading
    assert re.search(r"^S8 .*\bPASS\b", proc.stdout, re.M), proc.stdout
    assert "must-pass variant 'full': OK" in proc.stdout


@pytest.mark.parametrize("tool", ["repro", "fuzz"])
def test_patches_names_another_series_and_a_missing_one_is_named(tool, tmp_path):
    extra = "--no-build" if tool == "repro" else "--examples=1"
    proc = run(tool, "--patches", str(tmp_path / "nowhere"), extra)
    assert proc.returncode == 2 and f"{tmp_path / 'nowhere'}/series: no series file" in proc.stderr, proc.stderr


# ---- one runner for every command: its error line, exit 2 on an error, 130 on Ctrl-C --------------


def _missing_file_args(name: str, missing: Path) -> tuple[list[str], dict[str, str]]:
    """Each command given a file (or folder) that is not there: (its arguments, environment)."""
    by_flag = {
        "build": ["--variants", "full", "--patches", str(missing)],
        "repro": ["--no-build", "--patches", str(missing)],
        "fuzz": ["--examples", "1", "--patches", str(missing)],
        "soak": ["--requests", "1", "--patches", str(missing)],
        "develop": ["full", "--dir", str(missing.parent / "tree"), "--patches", str(missing)],
        "upgrade": [str(missing)],
        "write-back": ["--dir", str(missing)],
        "tiny": [str(missing.parent / "out"), "--gguf-tree", str(missing)],
        "vlm": ["judge", "--target", str(missing)],
        "pulls": ["--patches", str(missing)],
    }
    if name in by_flag:
        return by_flag[name], {}
    # mutate, bench and train take no such flag: the series they read is the environment's
    return {"mutate": ["--list"], "bench": ["--only", "bindings"], "train": []}[name], {PATCHES_ENV: str(missing)}


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_command_names_a_missing_file_in_one_line_and_exits_2(name, tmp_path):
    missing = tmp_path / "not-there"
    args, env = _missing_file_args(name, missing)
    proc = run(name, *args, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pyllama-dflash {name}: error: ") and str(missing) in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def _stub_cache(tmp_path: Path) -> Path:
    """An empty cache whose pinned source tree seems fetched: resolving it takes the cache's source
    lock first (llamabuild/source.py), so a command that needs the source waits while a test holds it."""
    from pyllama_dflash.product.llamabuild import pinned, source

    if source._populated(source.vendor_dir()):
        pytest.skip("vendor/llama.cpp is populated: the source resolves without the cache's lock")
    cache = tmp_path / "cache"
    tree = cache / "sources" / f"llama.cpp-{pinned.RELEASE}-{pinned.SDIST_SHA256[:12]}"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("# a stand-in: the command never gets past the lock\n")
    (cache / "locks").mkdir()
    return cache


def _interruptible(name: str, tmp_path: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
    """Each command at work, or waiting (on the held source lock, or on a pipe it reads): its
    arguments and environment. Only fuzz and soak do real work, on the built variants, and briefly."""
    if name in ("fuzz", "soak"):
        if name == "fuzz":
            return ["fuzz", "--examples", "1", "--variants", "full", "--no-drift", "--drafters", "dflash"], {}
        return ["soak", "--variants", "full", "--requests", "4"], {}
    if name == "upgrade":
        fifo = tmp_path / "draft.gguf"
        os.mkfifo(fifo)  # open() waits for a writer
        return ["upgrade", str(fifo), "--check"], {}
    if name == "write-back":
        tree = tmp_path / "tree"
        subprocess.run(["git", "init", "-q", str(tree)], check=True)
        os.mkfifo(tree / ".git" / "pyllama-dflash-develop.json")  # the develop record, read first
        return ["write-back", "--dir", str(tree)], {}
    waits = {  # resolving the source: past the held lock only after the interrupt
        "build": ["--variants", "full"],
        "repro": ["--scenarios", "S1", "--variants", "full"],
        "mutate": ["--list"],
        "bench": ["--only", "bindings", "--json", str(tmp_path / "bench.json")],
        "tiny": [str(tmp_path / "out")],
        "develop": ["full", "--dir", str(tmp_path / "tree")],
        "train": ["--out", str(tmp_path / "trained")],
        "vlm": ["target", "--smoke", "--out", str(tmp_path / "vlm")],
        "pulls": ["--only", "eagle3-bridge"],
    }
    return [name, *waits[name]], {CACHE_ENV: str(cache)}


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM: the runner installs one as it starts the command."""
    status = Path(f"/proc/{pid}/status").read_text()
    (mask,) = [ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")]
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))


def _interrupt(args: list[str], env: dict[str, str], sig: int = signal.SIGINT) -> subprocess.CompletedProcess:
    """Start the command, wait until the runner runs it, send ``sig`` to it alone; how it ended."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_DIR"} | {"COLUMNS": "1000", **env}
    # as from a terminal: a suite started in the background (``.ci/run &``) has SIGINT ignored, which the
    # command would inherit and rightly keep
    proc = subprocess.Popen(
        [*COMMAND, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not _catches_sigterm(proc.pid):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)  # into its work
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_ctrl_c_stops_each_command_with_one_line_and_130(name, variants, tmp_path):
    lock = _stub_cache(tmp_path) / "locks" / "source.lock"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        args, env = _interruptible(name, tmp_path, lock.parent.parent)
        proc = _interrupt(args, env)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"pyllama-dflash {name}: interrupted(; .+)?", last), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if name == "develop":
        assert last.endswith("; nothing was made") and not (tmp_path / "tree").exists()


def test_sigterm_ends_a_command_as_ctrl_c_does(tmp_path):
    lock = _stub_cache(tmp_path) / "locks" / "source.lock"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = _interrupt(["build", "--variants", "full"], {CACHE_ENV: str(lock.parent.parent)}, signal.SIGTERM)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "pyllama-dflash build: interrupted; run it again to resume"


def test_the_older_forms_say_their_own_prog(tmp_path):
    proc = run("--no-build", "--must-pass", "nope", command=[sys.executable, "-m", "pyllama_dflash.harness.repro"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("python -m pyllama_dflash.harness.repro: error: --must-pass 'nope' is not among"), (
        proc.stderr
    )
    build_py = [sys.executable, str(Path(__file__).resolve().parent.parent / "build.py")]
    proc = run("--patches", str(tmp_path / "nowhere"), command=build_py)
    assert proc.returncode == 2 and proc.stderr.startswith("build.py: error: "), proc.stderr


# a command without a package of its extra: the module hidden as if it were not installed
WITHOUT = (
    "import sys; sys.modules[{module!r}] = None; from pyllama_dflash.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "name,module,args", [("fuzz", "hypothesis", ["--examples", "1"]), ("soak", "openai", ["--requests", "1"])]
)
def test_a_command_without_its_extra_stops_at_once_naming_it(name, module, args):
    proc = run(name, *args, command=[sys.executable, "-c", WITHOUT.format(module=module)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"pyllama-dflash {name}: error: {name} needs {module}, which is not installed: "
        f"pip install 'pyllama-dflash[{name}]'"
    )
    assert proc.stdout == ""
    # its help does not need it
    proc = run(name, "--help", command=[sys.executable, "-c", WITHOUT.format(module=module)], timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: pyllama-dflash {name} "), proc.stderr
