"""The fuzzer's ``--json`` report as Markdown (``--markdown``; docs/regression.md carries the committed run's)."""

from __future__ import annotations

from ...figures import heading, table


def command_line(report: dict) -> str:
    """The command that searches as the report's selection has it (the slicing aside)."""
    s = report["selection"]
    seeds = [int(x) for x in s["seeds"]]
    contiguous = len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1))
    words = [
        "pyllama-dflash fuzz",
        f"--variants {','.join(report['variants'])}",
        f"--examples {s['examples']}",
        f"--seeds {seeds[0]}-{seeds[-1]}" if contiguous else f"--seeds {','.join(map(str, seeds))}",
    ]
    words += [flag for flag, on in (("--exact", s["exact"]), ("--no-drift", not s["drift"])) if on]
    flags = (("--unweighted", not s["weighted"]), ("--trained-with-image-rows", s["image_rows"]))
    words += [flag for flag, on in flags if on]
    return " ".join(words)


def _result(r: dict) -> str:
    if "runs" not in r:  # the child itself failed
        return f"{r.get('status')}: {r.get('first_failure')}"
    return ", ".join(f["kind"] for f in r["failures"]) or "OK"


def _row(seed: str, variant: str, r: dict) -> list[str]:
    if "runs" not in r:
        return [seed, f"`{variant}`", _result(r), *["n/a"] * 7]
    st = r["stats"]
    return [
        seed,
        f"`{variant}`",
        _result(r),
        str(r["runs"]),
        str(st.get("exact_steps", 0)) if "exact_steps" in st else "not compared",
        str(st.get("drift_checked", 0)),
        str(st.get("drift_behind_only", 0)),
        str(st.get("ties", 0)),
        f"{st.get('behind_on_seq0', 0)} / {st.get('behind_on_seq1', 0)}",
        f"{r['wall_s']:.0f} s",
    ]


def markdown(report: dict) -> str:
    """The report's heading, its command, and one row per seed and variant: what the search found, the
    schedules it ran, how many were compared with decoding without the draft (exact steps) and with the
    drift oracle's reference, the documented exceptions it counted, and the wall time."""
    header = [
        "seed",
        "variant",
        "result",
        "schedules",
        "exact steps",
        "drift-checked",
        "behind only",
        "ties",
        "behind on seq 0 / seq 1",
        "wall",
    ]
    rows = [_row(seed, v, results[v]) for seed, results in report["seeds"].items() for v in report["variants"]]
    verdict = "NOT OK" if report["broken"] else "OK"
    out = [
        heading(report),
        "",
        f"`{command_line(report)}`: must-pass variant `{report['must_pass']}` {verdict}, "
        f"{report['wall_s']:.0f} s in all.",
        "",
        table(header, rows),
    ]
    return "\n".join(out) + "\n"
