"""The benchmark report as Markdown (docs/performance.md carries a copy)."""

from __future__ import annotations

from ...figures import heading, table


def _s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.2f} ms" if abs(x) < 1 else f"{x:.1f} s"


def _figures(r: dict) -> list[tuple[str, str]]:
    """The table's rows, section by section: (figure, value)."""
    return [*_build_rows(r), *_matrix_rows(r), *_loop_rows(r), *_fill_rows(r), *_batch_rows(r), *_round_rows(r)]


def _ci(x: dict, digits: int = 2) -> str:
    lo, hi = x["ci95"]
    return f"{x['median']:.{digits}f} (95% CI {lo:.{digits}f}-{hi:.{digits}f})"


def _round_rows(r: dict) -> list[tuple[str, str]]:
    if "round" not in r or "pairs" not in r["round"]:
        return []
    rows = []
    for name, p in r["round"]["pairs"].items():
        n, parts = p["drafted"], p["part_over_decode"]
        rows += [
            (
                f"{name}: one plain decode (`{p['target']}`, {p['weight_bytes']['target'] / 2**20:.1f} MiB)",
                _s(p["decode_s"]),
            ),
            (f"{name}: the draft's step / one plain decode", _ci(parts["draft"], 3)),
            (f"{name}: the verify of {n + 1} tokens / one plain decode", _ci(parts["verify"])),
            (f"{name}: process() of the verify batch / one plain decode", _ci(parts["process"], 3)),
            (f"{name}: a round (draft, verify, process) / one plain decode, c", _ci(p["round_over_decode"])),
            (
                f"{name}: tokens accepted per round where drafting breaks even, c - 1 (of {n})",
                _ci(p["break_even_accepted"]),
            ),
            (f"{name}: the speed-up were every drafted token accepted, {n + 1} / c", _ci(p["speedup_all_accepted"])),
        ]
    return rows


def _batch_rows(r: dict) -> list[tuple[str, str]]:
    if "batch" not in r or "ratio" not in r["batch"]:
        return []
    b = r["batch"]
    mb = b["weight_bytes"] / 2**20
    llc = (
        f" / last-level cache {b['llc_bytes'] / 2**20:.0f} MiB = {b['weight_bytes'] / b['llc_bytes']:.1f}x"
        if b["llc_bytes"]
        else ""
    )
    name = b.get("label", "bench pair target")  # the bench pair's, unless --batch-target named another
    rows = [
        (f"{name} (`{b['target']}`): weights{llc}" if "label" not in b else f"{name}: weights{llc}", f"{mb:.0f} MiB"),
        (f"{name}: one token's decode", _s(b["one_token_s"]["median"])),
    ]
    for k, x in b["ratio"].items():
        aim = " (aim ≤ 1.5)" if k == "4" else ""
        rows.append((f"{name}: decode of {k} tokens / one token{aim}, {b['rounds']} rounds", _ci(x)))
    return rows


def _build_rows(r: dict) -> list[tuple[str, str]]:
    if "build" not in r:
        return []
    b = r["build"]
    rows = [("build: first variant (cold)", _s(b["first_s"]))]
    rows += [(f"build: + variant `{v}`", _s(t)) for v, t in b["extra_s"].items()]
    rows.append(("build: no-op rebuild of all variants", _s(b["noop_s"])))
    if b.get("ratio_second_to_first") is not None:
        rows.append(("build: second variant / first (aim < 0.25)", f"{b['ratio_second_to_first']:.3f}"))
    return rows


def _matrix_rows(r: dict) -> list[tuple[str, str]]:
    if "matrix" not in r:
        return []
    x = r["matrix"]
    refs = f", {x['references']} of them drift references" if x.get("references") else ""
    return [
        (f"repro matrix on the tiny models: {x['runs']} runs{refs}, wall time (aim < 30 s)", _s(x["wall_s"])),
        ("repro matrix: share of child time spent starting up", f"{100 * x['startup_share']:.0f}%"),
    ]


def _loop_rows(r: dict) -> list[tuple[str, str]]:
    """The text-only loop's ratios (and, after the first, the sections that were not measured)."""
    rows: list[tuple[str, str]] = []
    if "overhead" in r:
        o = r["overhead"]
        lo, hi = o["ratio_ci95"]
        rows.append(
            (
                f"text-only speculative loop, tok/s `full` / `baseline` (aim 1.00 ± 0.02), {o['rounds']} rounds",
                f"{o['ratio_median']:.3f} (95% CI {lo:.3f}-{hi:.3f})",
            )
        )
    rows += [
        (f"section `{name}`", f"not measured: {sec['skipped']}")
        for name, sec in r.items()
        if isinstance(sec, dict) and "skipped" in sec
    ]
    if "portable" in r and "ratio_median" in r["portable"]:
        o = r["portable"]
        lo, hi = o["ratio_ci95"]
        rows.append(
            (
                f"the same loop, tok/s `full` portable build / native build, {o['rounds']} rounds",
                f"{o['ratio_median']:.3f} (95% CI {lo:.3f}-{hi:.3f})",
            )
        )
    if "instructions" in r and "ratio" in r["instructions"]:
        x = r["instructions"]
        rows.append(
            (
                f"the same loop under callgrind ({x.get('cpu', 'native')} builds): instructions per token "
                f"`full` / `baseline` ({x['per_token']['baseline'] / 1e6:.2f} M per token)",
                f"{x['ratio']:.4f}",
            )
        )
    return rows


def _fill_rows(r: dict) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if "fill" in r and "plain_draft" in r["fill"]:
        fit, fit_swa = r["fill"]["plain_draft"]["fit"], r["fill"]["swa_draft"]["fit"]
        rows.append(
            (
                "draft fill and removal per position (slope over h = 3..1024)",
                f"{fit['per_position_s'] * 1e6:.1f} µs "
                f"(sliding-window draft: {fit_swa['per_position_s'] * 1e6:.1f} µs)",
            )
        )
    if "bindings" in r:
        rows += [
            (
                f"{p['rows']}-row embedding batch, n_embd {p['n_embd']}: numpy vs per-row loop (aim ≥ 50x)",
                f"{p['ratio']:.0f}x ({_s(p['numpy_s'])} vs {_s(p['loop_s'])})",
            )
            for p in r["bindings"]["points"]
        ]
    return rows


def _fill_table(fill: dict) -> list[str]:
    out = [
        "Draft fill and removal for a hole of h positions (`full`), against the target's decode of the "
        "h x 3 image chunk that makes such a hole (medians):",
        "",
        "| h | fill | removal | per position | seen as extra process() time | image encode | image decode | "
        "(fill + removal) / decode | fill + removal, sliding-window draft |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    swa = {p["hole"]: p for p in fill["swa_draft"]["points"]}
    for p in fill["plain_draft"]["points"]:
        q = swa.get(p["hole"])
        out.append(
            f"| {p['hole']} | {_s(p['fill_s'])} | {_s(p['remove_s'])} | {p['per_position_us']:.1f} µs | "
            f"{_s(p['process_delta_s'])} | {_s(p['image_encode_s'])} | {_s(p['image_decode_s'])} | "
            f"{p['fill_over_decode']:.3f} | {_s(q['fill_remove_s']) if q else 'n/a'} |"
        )
    return out


def model_against_measure(s: dict, pair: dict) -> str:
    """Per column and phase: the speed model's (1 + a) / c from the served acceptance and the round's
    measured cost, beside the measured tokens/s ratio."""
    from pyllama_dflash.lab.acceptance.chat import TURN_PHASES
    from pyllama_dflash.lab.acceptance.served import ratio_cell

    n, c = pair["drafted"], pair["round_over_decode"]
    rows = []
    for name, entry in s["table"].items():
        for phase in TURN_PHASES:
            acc, measured = entry["phases"].get(phase), entry.get("speed", {}).get(phase, {}).get("tok_s")
            if acc is None or measured is None:
                continue
            a, (a_lo, a_hi) = acc["rate"] * n, (x * n for x in acc["ci95"])
            model = (1 + a) / c["median"]
            lo, hi = (1 + a_lo) / c["ci95"][1], (1 + a_hi) / c["ci95"][0]
            rows.append(
                [
                    name,
                    phase,
                    f"{a:.2f} [{a_lo:.2f}, {a_hi:.2f}]",
                    f"{model:.2f} [{lo:.2f}, {hi:.2f}]",
                    ratio_cell(measured),
                ]
            )
    header = ["column", "phase", "accepted per round a", "model (1 + a) / c", "measured tok/s with / without"]
    return table(header, rows)


def _speed_tables(s: dict, round_pairs: dict) -> list[str]:
    from pyllama_dflash.lab.acceptance.served import server_markdown, speed_markdown

    draft = (
        f"the draft trained for it (`{s['draft']['file']}`, sha256 {s['draft']['sha256'][:12]})"
        if s.get("draft", {}).get("trained")
        else "its draft untrained"
    )
    out = [
        "",
        f"The bench pair through llama-server, {s['conversations']} conversations, {draft}"
        + (f", images of {s['image_px']} px" if s.get("image_px") else "")
        + ": acceptance rate "
        "per turn, tokens/s with the draft over without, and the image turns' time to first token with the "
        "draft over without:",
        "",
        server_markdown(s),
    ]
    if all("speed" in e for e in s["table"].values()):
        out += [
            "",
            "The same runs by phase: tokens/s with the draft over without; time to first token with the "
            "draft over without [95% intervals over conversations]; the median turn's milliseconds a token:",
            "",
            speed_markdown(s),
        ]
        if "bench pair" in round_pairs:
            pair = round_pairs["bench pair"]
            c = pair["round_over_decode"]["median"]
            out += [
                "",
                f"The speed model against the measure: a is the served acceptance rate times {pair['drafted']} "
                f"(every round drafts that many but the last of a reply), c = {c:.2f} the bench pair's round "
                "in plain decodes from the round section of this run; the model's interval combines a's and "
                "c's ends:",
                "",
                model_against_measure(s, pair),
            ]
    lib = s.get("library", {})
    if "error" in lib:
        out += ["", f"The same conversations through the library: not measured ({lib['error'].splitlines()[0]})."]
    elif lib:
        out += [
            "",
            f"The same conversations through the library ({lib['conversations']} conversations; "
            "`acceptance/timed.py`: the slot "
            "loop on each variant's libraries, with the draft and with none), by phase: tokens/s with the draft "
            "over without; the prompt's time with the draft over without [95% intervals over conversations]; "
            "the median turn's milliseconds a token:",
            "",
            speed_markdown(lib),
        ]
    return out


def markdown(r: dict) -> str:
    out = [heading(r)]
    figures = _figures(r)
    if figures:  # a run of the table sections alone (acceptance, paired) has none
        out += ["", "| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in figures)]
    if "fill" in r and "plain_draft" in r["fill"]:
        out += ["", *_fill_table(r["fill"])]
    if "acceptance" in r and "table" in r["acceptance"]:
        from pyllama_dflash.lab.acceptance.measure import markdown as acceptance_table
        from pyllama_dflash.lab.acceptance.served import server_markdown

        a = r["acceptance"]
        out += [
            "",
            f"Mean accepted tokens per round (of {a['session']['n_max']}) [95% interval], "
            + (f"{a['image_px']} px images, " if a.get("image_px") else "")
            + f"{a['conversations']} conversations, the {a.get('target', 'dense')} target's "
            f"{a.get('trained_on', 'images')}-trained draft, through the library:",
            "",
            acceptance_table(a),
        ]
        if "server" in a:
            out += [
                "",
                f"Acceptance rate (accepted / drafted) per turn [95% interval], tokens/s with the draft over "
                f"without, and the image turns' prompt processing (time to first token) with the draft over "
                f"without, {a['server']['conversations']} conversations, through llama-server:",
                "",
                server_markdown(a["server"]),
            ]
    if "speed" in r and "table" in r["speed"]:
        out += _speed_tables(r["speed"], r.get("round", {}).get("pairs", {}))
    if "paired" in r and "runs" in r["paired"]:
        from pyllama_dflash.lab.acceptance.paired import markdown as paired_tables

        out += [
            "",
            f"Paired acceptance, {r['paired']['conversations']} conversations, through the library:",
            "",
            paired_tables(r["paired"]["runs"]),
        ]
    return "\n".join(out) + "\n"
