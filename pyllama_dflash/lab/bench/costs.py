"""What drafting costs against what it saves: the bench sections ``batch`` and ``round``.

Drafting pays only where the target's verify of a block costs about what one token costs. ``batch``
measures that for the bench pair's target (tiny/bench_pair.py) alone; ``round`` times every part of a
speculative round against one plain decode on the tiny pair and on the bench pair, the costs of the
speed model: a round that keeps a of its drafted tokens yields 1 + a tokens in the time of c plain
decodes, c its measured cost.
"""

from __future__ import annotations

from pathlib import Path

from ...bootstrap import median_interval
from ...harness.slotloop.models import bench_pair_models, tiny_models
from . import stats
from .job import BatchCost, RoundCosts, measure


def _llc_bytes() -> int | None:
    """The last-level cache's size (the highest level cpu0 reports in sysfs), or None where none is read."""
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
    sizes = []
    for c in caches:
        try:
            level, size = int((c / "level").read_text()), (c / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        sizes.append((level, int(size.rstrip("KM")) * unit))
    return max(sizes)[1] if sizes else None


def bench_batch(rounds: int, target: Path | None = None) -> dict:
    """The bench pair's target (or ``target``) on baseline (the decode is the same on every variant): a
    k-token batch over one token, per round of the interleaved child, then the median with a bootstrap
    interval."""
    path = Path(target) if target is not None else bench_pair_models().target
    res = measure("baseline", BatchCost(str(path), rounds=rounds))
    seconds = res["seconds"]
    one = seconds["1"]
    ratios = {}
    for k, times in seconds.items():
        if k != "1":
            pairs = [t / o for t, o in zip(times, one, strict=True)]
            ratios[k] = {"median": stats.summary(pairs)["median"], "ci95": list(median_interval(pairs))}
    return {
        "target": path.name,
        **({"label": f"target `{path.name}`"} if target is not None else {}),
        "weight_bytes": res["weight_bytes"],
        "llc_bytes": _llc_bytes(),
        "rounds": rounds,
        "one_token_s": stats.summary(one),
        "ratio": ratios,
        "seconds": seconds,
    }


def _median_ci(xs: list[float]) -> dict:
    return {"median": stats.summary(xs)["median"], "ci95": list(median_interval(xs))}


NO_SNAPSHOTS = "bench pair, no rollback snapshots"


def bench_round(rounds: int) -> dict:
    """A speculative round's parts over one plain decode, per pair (the tiny models, the bench pair), on
    baseline with text only. Per round: (draft + verify + process) / decode, the round's cost in plain
    decodes, c. With a tokens accepted a round yields 1 + a tokens for c decodes' time, so drafting
    breaks even at a = c - 1 and, were every drafted token accepted, speeds decoding up (1 + n) / c.
    Each round is as llama-server serves it (job.RoundCosts' rollback snapshots); the bench pair runs a
    second time without them, to show what they cost."""
    tiny, bench_pair = tiny_models(), bench_pair_models()
    out = {"rounds": rounds, "pairs": {}}
    runs = (
        ("tiny", tiny.target, tiny.draft, True),
        ("bench pair", bench_pair.target, bench_pair.draft, True),
        # what the hybrid target's rollback snapshots cost, the served round's share beyond the verify itself
        (NO_SNAPSHOTS, bench_pair.target, bench_pair.draft, False),
    )
    for name, target, draft, snapshots in runs:
        res = measure("baseline", RoundCosts(str(target), str(draft), rounds=rounds, rollback_snapshots=snapshots))
        sec = res["seconds"]
        cost = [
            (d + v + p) / one
            for d, v, p, one in zip(sec["draft"], sec["verify"], sec["process"], sec["decode"], strict=True)
        ]
        n = max(res["drafted"])
        out["pairs"][name] = {
            "target": Path(target).name,
            "weight_bytes": res["weight_bytes"],
            "drafted": n,
            "decode_s": stats.summary(sec["decode"])["median"],
            "part_over_decode": {
                part: _median_ci([t / one for t, one in zip(sec[part], sec["decode"], strict=True)])
                for part in ("draft", "verify", "process")
            },
            "round_over_decode": _median_ci(cost),
            "break_even_accepted": _median_ci([c - 1 for c in cost]),
            "speedup_all_accepted": _median_ci([(1 + n) / c for c in cost]),
            "seconds": sec,
        }
    return out
