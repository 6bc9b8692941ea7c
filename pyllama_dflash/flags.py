"""The flags several of the project's tools take, each defined once; every tool's parser picks its own.

``--variants``, ``--must-pass``, ``--backend``, ``--jobs`` and ``--timeout`` keep one spelling and one
help text across ``pyllama-dflash build|repro|fuzz|...`` (see cli.py). This module imports no
tool, so the tools import it and cli.py imports them, one way.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from pyllama_dflash.product.llamabuild.cpu import MODES as CPU_MODES
from pyllama_dflash.product.process.shard import parse_shard

from .env import CPU_ENV, PATCHES_ENV
from .errors import UsageError

PROG = "pyllama-dflash"


@dataclass(frozen=True)
class _Shared:
    """One shared flag: its spellings, its help (without the default) and what no value means."""

    flags: tuple[str, ...]
    help: str
    unset: str = ""  # shown as the default when the tool's default is None
    short: str | None = None  # only for tools that ask for short options (build's -j)
    kwargs: dict = field(default_factory=dict)
    retired: tuple[str, ...] = ()  # old spellings still taken, each saying its new name


class RetiredFlag(argparse.Action):
    """An old spelling of a flag: it still works, and says on stderr what it is called now."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is now {self.new}; the old name still works", file=sys.stderr)
        taken = getattr(namespace, self.dest, None)
        if isinstance(values, list) and isinstance(taken, list):  # a list flag's old spelling, given again
            values = [*taken, *values]
        setattr(namespace, self.dest, values)


SHARED: dict[str, _Shared] = {
    "variants": _Shared(
        ("--variants",),
        "comma-separated variants (baseline, names of patches/series, or all)",
        unset="every variant of patches/series",
        kwargs={"type": lambda text: comma_list(text), "metavar": "LIST"},
    ),
    "must_pass": _Shared(
        ("--must-pass",),
        "the variant whose verdict decides the exit code: it must pass every scenario in repro, every schedule in fuzz",
        unset="the last variant of role as-trained run (each draft served as it was trained), else the "
        "last of role twin, else the last run",
        kwargs={"metavar": "VARIANT"},
        retired=("--fix",),
    ),
    "backend": _Shared(
        ("--backend",),
        "compute backend: which build of each variant to make or use",
        unset="$PYLLAMA_DFLASH_BACKEND or auto: CUDA when nvcc and a GPU are present for a build, "
        "the newest build of any backend for a lookup",
        kwargs={"choices": ("auto", "cpu", "cuda")},
    ),
    "jobs": _Shared(
        ("--jobs",),
        "how many at once: child processes, or compile jobs for build",
        unset="all cores",
        short="-j",
        kwargs={"type": int, "metavar": "N"},
    ),
    "timeout": _Shared(
        ("--timeout",),
        "seconds a child may run before it counts as CRASH: one scenario in repro, one variant's whole search in fuzz",
        kwargs={"type": float, "metavar": "S"},
    ),
    "cpu": _Shared(
        ("--cpu",),
        "the CPU a build targets: native (-march=native, keyed by this CPU's features), avx2 (x86-64-v3: "
        "AVX2 without AVX-512, how an AVX2 machine rounds) or portable (the "
        "x86-64 baseline, runs on any x86-64 CPU); for a lookup, the builds to use",
        unset="$PYLLAMA_DFLASH_CPU, else native for a build and native first for a lookup",
        kwargs={"choices": CPU_MODES},
    ),
    "drafters": _Shared(
        ("--drafters",),
        "comma-separated drafters of the DFlash family to run the tiny draft as: dflash, dflash-causal, "
        "dflash2, dspark, dspark-bonus, dspark-vocab, or all",
        unset="all",
    ),
    "targets": _Shared(
        ("--targets",),
        "comma-separated tiny target kinds: dense (qwen35) and moe (qwen35moe), or all",
        unset="all",
    ),
    "shard": _Shared(
        ("--shard",),
        "run slice I of N (from 1) of the work, one slice per runner: mutate's mutants (by id) or fuzz's "
        "seeds; --merge adds the slices' --json reports into the whole run's",
        unset="the whole run",
        kwargs={"type": parse_shard, "metavar": "I/N"},
    ),
    "patches": _Shared(
        ("--patches",),
        "another patch series folder (its series file names the variants)",
        unset="$PYLLAMA_DFLASH_PATCHES, else the checkout's patches/",
        kwargs={"type": Path, "metavar": "DIR"},
    ),
}


def export(args: argparse.Namespace) -> None:
    """Put the shared flags that every child process must see into the environment they inherit:
    the CPU the builds are looked up for, and the patch series."""
    if getattr(args, "cpu", None):
        os.environ[CPU_ENV] = args.cpu
    if getattr(args, "patches", None):
        os.environ[PATCHES_ENV] = str(Path(args.patches).resolve())


def common_parser(*names: str, short: bool = False, **defaults) -> argparse.ArgumentParser:
    """A parent parser (``add_help=False``) with the shared flags ``names``, for ``parents=[...]``.

    ``defaults`` gives a tool's own default for a flag it picked (``jobs=2``); a flag left out of
    ``defaults`` defaults to None, and its help then says what None means. ``short`` also adds
    the short spelling a flag has (``-j`` for ``--jobs``). The flags keep the order of ``SHARED``
    whatever the order of ``names``, so every tool lists them alike.
    """
    unknown = [n for n in (*names, *defaults) if n not in SHARED]
    if unknown:
        raise ValueError(f"common_parser: unknown shared flag(s) {', '.join(unknown)} (known: {', '.join(SHARED)})")
    stray = [n for n in defaults if n not in names]
    if stray:
        raise ValueError(f"common_parser: default(s) given for flag(s) not picked: {', '.join(stray)}")
    ap = argparse.ArgumentParser(add_help=False)
    group = ap.add_argument_group("options shared by the pyllama-dflash tools")
    for name, spec in SHARED.items():
        if name not in names:
            continue
        default = defaults.get(name)
        shown = spec.unset if default is None else "%(default)s"
        flags = (*spec.flags, spec.short) if short and spec.short else spec.flags
        group.add_argument(*flags, default=default, help=f"{spec.help} (default: {shown})", **spec.kwargs)
        for old in spec.retired:
            group.add_argument(old, dest=name, action=RetiredFlag, new=spec.flags[0], help=argparse.SUPPRESS)
    return ap


_prog: ContextVar[str | None] = ContextVar("pyllama_dflash_prog", default=None)


def tool_prog(default: str) -> str:
    """A tool parser's ``prog``: ``pyllama-dflash NAME`` when run through this command, else ``default``."""
    return _prog.get() or default


def comma_list(text: str) -> list[str]:
    """The names of a comma-separated flag value, stripped, empty ones dropped."""
    return [n.strip() for n in text.split(",") if n.strip()]


def pick(text: str | None, known: tuple[str, ...] | list[str], flag: str) -> list[str]:
    """The names of a comma-separated flag value (``all`` or None: every known name, in order);
    UsageError naming the flag and the known names for an unknown one."""
    if text is None or text.strip() == "all":
        return list(known)
    names = comma_list(text)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"{flag}: unknown {', '.join(unknown) or 'empty value'} (known: {', '.join(known)}, all)")
    return names
