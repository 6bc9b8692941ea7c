"""The ``pyllama-dflash`` console command: one subcommand per tool, the shared flags defined once.

The command runs as installed (the script beside this Python) or, without it, as
``python -m pyllama_dflash.cli``; the older ``python -m pyllama_dflash.<tool>`` forms keep working.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_dflash import cli, flags
from pyllama_dflash.fuzz.__main__ import parser as fuzz_parser
from pyllama_dflash.llamabuild.cli import parser as build_parser
from pyllama_dflash.repro.__main__ import parser as repro_parser

SCRIPT = Path(sys.executable).parent / "pyllama-dflash"
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "pyllama_dflash.cli"]
SUBCOMMANDS = ("build", "repro", "fuzz", "mutate", "bench", "tiny", "soak", "upgrade", "develop", "write-back")
SHARED_IN_REPRO_AND_FUZZ = ("--variants", "--fix", "--backend", "--jobs", "--timeout", "--cpu", "--patches")


def run(*args: str, command: list[str] = COMMAND, timeout: float = 120) -> subprocess.CompletedProcess:
    # wide, so that argparse does not wrap a help line in the middle of a phrase
    env = {**os.environ, "COLUMNS": "1000"}
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
        assert (args.variants, args.fix, args.backend) == (None, None, None)
    build = build_parser()
    assert (build.parse_args([]).jobs, build.parse_args([]).backend) == (None, None)
    assert build.parse_args(["-j", "4"]).jobs == build.parse_args(["--jobs", "4"]).jobs == 4  # build keeps its -j


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
    for module in ("pyllama_dflash.repro", "pyllama_dflash.fuzz"):
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
    assert "fix variant 'full': OK" in proc.stdout


@pytest.mark.parametrize("tool", ["repro", "fuzz"])
def test_patches_names_another_series_and_a_missing_one_is_named(tool, tmp_path):
    extra = "--no-build" if tool == "repro" else "--examples=1"
    proc = run(tool, "--patches", str(tmp_path / "nowhere"), extra)
    assert proc.returncode == 2 and f"{tmp_path / 'nowhere'}/series: no series file" in proc.stderr, proc.stderr
