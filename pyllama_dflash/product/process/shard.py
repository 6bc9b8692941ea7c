"""Slices of a long run, one per runner: ``--shard I/N`` of ``mutate`` and ``fuzz``, and the checks that
the slices' reports, merged, make the whole run again.

A mutant belongs to a slice by its id alone (a hash of it, modulo N): adding, removing or reordering
other mutants moves none of the rest from one slice to another. The fuzzer's seeds are few and each
costs minutes, so they are dealt out by their place in the sorted list instead, which keeps the
slices even (``--seeds 0-4 --shard 2/5`` runs seed 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class Shard:
    """Slice ``index`` (from 1) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, key: str) -> bool:
        """Whether the item named ``key`` is in this slice: by a hash of the name, whatever else there is."""
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index - 1

    def by_key(self, items: Iterable[T], key: Callable[[T], str]) -> list[T]:
        """The items whose key this slice holds, in their order."""
        return [x for x in items if self.holds(key(x))]

    def by_place(self, items: Iterable[T]) -> list[T]:
        """Every N-th item of the sorted items, from the I-th: even slices of a short list."""
        return sorted(items)[self.index - 1 :: self.count]


def parse_shard(text: str) -> Shard:
    """``I/N`` with 1 <= I <= N; an error argparse reports under the flag's name (``argument --shard: ...``)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N (slice I of N, from 1: 2/4 is the second of four)")
    shard = Shard(int(m.group(1)), int(m.group(2)))
    if shard.count < 1 or not 1 <= shard.index <= shard.count:
        raise argparse.ArgumentTypeError(f"{text!r}: I must lie between 1 and N (slice I of N, from 1)")
    return shard


def parse_seeds(text: str) -> list[int]:
    """``0,1,2``, ``0-4`` or a mix (``0-2,7``): the seeds, each once, in order; an error argparse reports
    under the flag's name."""
    seeds: list[int] = []
    for part in (p.strip() for p in (text or "").split(",")):
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise argparse.ArgumentTypeError(
                f"{text!r}: {part!r} is not a seed or a range of seeds (e.g. 0,1,2 or 0-4 or 0-2,7)"
            )
        first, last = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    return seeds


def check_slices(shards: list[Shard | None], what: str) -> int:
    """The slice count of reports that together make one run: each of 1..N exactly once. Returns N;
    raises ValueError saying which slice is missing or twice, or that the reports disagree on N.
    A report of a whole run (None) counts as slice 1/1."""
    got = [s or Shard(1, 1) for s in shards]
    counts = {s.count for s in got}
    if len(counts) != 1:
        raise ValueError(f"the {what} reports are slices of different runs: {', '.join(map(str, got))}")
    (n,) = counts
    twice = sorted({str(s) for s in got if got.count(s) > 1})
    missing = [f"{i}/{n}" for i in range(1, n + 1) if Shard(i, n) not in got]
    if twice or missing:
        problems = ([f"{', '.join(twice)} given twice"] if twice else []) + (
            [f"{', '.join(missing)} missing"] if missing else []
        )
        raise ValueError(f"the {what} reports do not make one run: slice {'; '.join(problems)}")
    return n


def shard_json(shard: Shard | None) -> str | None:
    return str(shard) if shard else None


def shard_from_json(value: str | None) -> Shard | None:
    return parse_shard(value) if value else None


def load_reports(paths: Iterable[str | Path], keys: tuple[str, ...], what: str) -> list[dict]:
    """The slices' JSON reports for a merge, each checked to carry ``keys``; ValueError naming the file
    otherwise (``what``: the report's kind, as the error says it)."""
    out = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{p}: cannot read a report ({e})") from None
        if not isinstance(data, dict) or any(k not in data for k in keys):
            raise ValueError(f"{p}: not a report of {what}")
        out.append(data)
    return out
