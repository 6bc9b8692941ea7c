"""The benchmark report as Markdown (the README carries a copy)."""

from __future__ import annotations


def _s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.1f} s"


def markdown(r: dict) -> str:
    m, lc = r["machine"], r["llama_cpp"]
    out = [f"Measured {r['date']} on {m['cpus']} cores ({m['machine']}, Python {m['python']}), "
           f"llama.cpp {lc['release']} ({(lc['commit'] or '')[:7]}), {lc['backend']} build.", ""]
    out += ["| figure | value |", "|---|---|"]
    if "build" in r:
        b = r["build"]
        out.append(f"| build: first variant (cold) | {_s(b['first_s'])} |")
        for v, t in b["extra_s"].items():
            out.append(f"| build: + variant `{v}` | {_s(t)} |")
        out.append(f"| build: no-op rebuild of all variants | {_s(b['noop_s'])} |")
        if b.get("ratio_second_to_first") is not None:
            out.append(f"| build: second variant / first (aim < 0.25) | {b['ratio_second_to_first']:.3f} |")
    if "matrix" in r:
        x = r["matrix"]
        out.append(f"| repro matrix: {x['runs']} runs, wall time | {_s(x['wall_s'])} |")
        out.append(f"| repro matrix: share of child time spent starting up | {100 * x['startup_share']:.0f}% |")
    if "overhead" in r:
        o = r["overhead"]
        lo, hi = o["ratio_ci95"]
        out.append(f"| text-only spec loop, tok/s `full` / `baseline` (aim 1.00 ± 0.02), {o['rounds']} rounds | "
                   f"{o['ratio_median']:.3f} (95% CI {lo:.3f}-{hi:.3f}) |")
    if "bindings" in r:
        for p in r["bindings"]["points"]:
            out.append(f"| {p['rows']}-row embedding batch, n_embd {p['n_embd']}: numpy vs per-row loop (aim ≥ 50x) | "
                       f"{p['ratio']:.0f}x ({_s(p['numpy_s'])} vs {_s(p['loop_s'])}) |")
    if "fill" in r:
        out += ["", "Draft fill for a hole of h positions (`full`), against the target's decode of the h x 3 image "
                "chunk that makes it (median of repeats):", "",
                "| h | fill | per position | image encode | image decode | fill / decode | fill, SWA draft |",
                "|---|---|---|---|---|---|---|"]
        swa = {p["hole"]: p for p in r["fill"]["swa_draft"]["points"]}
        for p in r["fill"]["plain_draft"]["points"]:
            q = swa.get(p["hole"])
            out.append(f"| {p['hole']} | {_s(p['fill_s'])} | {p['per_position_us']:.0f} µs | {_s(p['image_encode_s'])} | "
                       f"{_s(p['image_decode_s'])} | {p['fill_over_decode']:.3f} | {_s(q['fill_s']) if q else 'n/a'} |")
    return "\n".join(out) + "\n"
