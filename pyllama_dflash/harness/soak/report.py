"""The soak's ``--json`` record as Markdown (``--markdown``; docs/server.md carries the committed run's)."""

from __future__ import annotations

from ...figures import heading, table


def _row(r: dict) -> list[str]:
    failures = sum(r["failures"].values())
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["failures"].items()))
    rss = r["rss_kib"]
    memory = f"{rss['start']} -> {rss['end']} KiB" if rss.get("start") and rss.get("end") else "not measured"
    ratio = f"{r['throughput_ratio']:.3f}" if r["throughput_ratio"] is not None else "n/a"
    return [
        f"`{r['variant']}`",
        str(r["requests"]),
        f"{failures} ({kinds})" if failures else "0",
        str(r["http_500"]),
        f"{r['differs']} of {r['compared']}",
        f"{r['wall_s'].get('draft', 0):.1f} s / {r['wall_s'].get('no_draft', 0):.1f} s",
        ratio,
        memory,
        "yes" if r["server_alive"] else "no",
    ]


def markdown(record: dict) -> str:
    """The record's heading, the workload, and one row per variant: failures (a baseline's HTTP 500s are
    counted, not failures), the chats that differ from the same request without the draft (measured), the
    walls and the tokens/s ratio with the draft over without, and the draft server's resident memory."""
    w = record["workload"]
    header = [
        "variant",
        "requests",
        "failures",
        "HTTP 500",
        "chats differing without the draft",
        "wall with / without the draft",
        "tokens/s ratio",
        "resident memory, start -> end",
        "alive at the end",
    ]
    out = [
        heading(record),
        "",
        f"`pyllama-dflash soak --variants {','.join(record['variants'])} --requests {w['requests']} "
        f"--clients {w['clients']} --seed {w['seed']} --drafter {w['drafter']}"
        + (f" --kinds {','.join(w['kinds'])}" if w.get("kinds") else "")
        + "`:",
        "",
        table(header, [_row(record["variants"][v]) for v in record["variants"]]),
    ]
    return "\n".join(out) + "\n"
