"""The matrix as a text table, with each first failure quoted underneath; and the drafters of a
target side by side, one letter per variant."""

from __future__ import annotations

from ...figures import heading, provenance
from ...words import Status

# one letter per status, for the drafters side by side
LETTERS = {
    Status.PASS: "P",
    Status.TIE: "T",
    Status.DRIFT: "D",
    Status.DEGRADED: "G",
    Status.FAIL: "F",
    Status.CRASH: "C",
    Status.ERROR: "E",
    Status.SKIP: "s",
    "-": "-",
}
LEGEND = "P PASS, T TIE, D DRIFT, G DEGRADED, F FAIL, C CRASH, E ERROR, s SKIP, . not run"


def cell(result: dict) -> str:
    status = result["status"]
    if status == Status.CRASH and result.get("signal"):
        return f"CRASH ({result['signal']})"
    return status


def _in_order(sids, scenarios: dict) -> list[str]:
    """The scenario ids in the catalogue's order (a record read back from JSON has its keys sorted)."""
    present = set(sids)
    return [sid for sid in scenarios if sid in present] + sorted(present - set(scenarios))


def format_table(table: dict[str, dict[str, dict]], variants: list[str], scenarios: dict) -> str:
    table = {sid: table[sid] for sid in _in_order(table, scenarios)}
    titles = {sid: f"{sid:4s} {scenarios[sid].title}" for sid in table}
    w0 = max(len(t) for t in titles.values()) + 2
    widths = [max(len(v), max(len(cell(table[sid][v])) for sid in table)) + 2 for v in variants]
    lines = ["scenario".ljust(w0) + "".join(v.ljust(w) for v, w in zip(variants, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for sid in table:
        cells = (cell(table[sid][v]).ljust(w) for v, w in zip(variants, widths, strict=True))
        lines.append(titles[sid].ljust(w0) + "".join(cells))
    notes = []
    for sid, row in table.items():
        for v in variants:
            r = row[v]
            if r["status"] not in (Status.PASS, Status.SKIP) and r.get("first_failure"):
                notes.append(f"  {sid} {v}: {r['first_failure']}")
            elif r["status"] == Status.DEGRADED:
                notes.append(f"  {sid} {v}: a drafting round produced no tokens although every call succeeded")
    if notes:
        lines += ["", "first failures:", *notes]
    return "\n".join(lines)


def format_server_table(server: dict[str, dict[str, dict]], variants: list[str]) -> str:
    """llama-server checks down, variants across: the HTTP codes, and whether that was expected."""
    checks = list(next(iter(server.values())))

    def cell(r: dict) -> str:
        st = r.get("status")
        codes = "/".join(str(c) for c in st) if isinstance(st, list) else str(st)
        return codes + ("" if r["ok"] else " (!)")

    w0 = max(len("llama-server check"), *(len(c) for c in checks)) + 2
    widths = [max(len(v), *(len(cell(server[v][c])) for c in checks)) + 2 for v in variants]
    lines = ["llama-server check".ljust(w0) + "".join(v.ljust(w) for v, w in zip(variants, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for c in checks:
        lines.append(c.ljust(w0) + "".join(cell(server[v][c]).ljust(w) for v, w in zip(variants, widths, strict=True)))
    lines.append("(!) marks a result other than the expected one")
    return "\n".join(lines)


def format_drafters(
    tables: dict[str, dict[str, dict[str, dict]]], drafters: list[str], columns: list[str], scenarios: dict, title: str
) -> str:
    """One target's tables side by side: a scenario per row, a drafter per column, and in each cell
    one letter per column (variant, then the reference), in the order of ``columns``."""
    rows = _in_order({sid for d in drafters for sid in tables[d]}, scenarios)
    titles = {sid: f"{sid:4s} {getattr(scenarios.get(sid), 'title', scenarios.get(sid, ''))}" for sid in rows}
    w0 = max(len(t) for t in titles.values()) + 2
    width = max(len(columns) * 2, *(len(d) for d in drafters)) + 2

    def cell(drafter: str, sid: str) -> str:
        row = tables[drafter].get(sid)
        if row is None:
            return "."
        return " ".join(LETTERS.get(row[c]["status"], "?") if c in row else "." for c in columns)

    lines = [title, "scenario".ljust(w0) + "".join(d.ljust(width) for d in drafters)]
    lines.append("-" * len(lines[1]))
    for sid in rows:
        lines.append(titles[sid].ljust(w0) + "".join(cell(d, sid).ljust(width) for d in drafters))
    lines.append(f"each cell: {' / '.join(columns)}; {LEGEND}")
    return "\n".join(lines)


def drafting_around_images(result: dict) -> dict:
    """What a run drafted before the first image and after it: rounds, tokens drafted per round, rounds
    that drafted nothing, accepted tokens (a measurement of a sibling drafter, not a verdict)."""
    rounds = result.get("rounds") or []
    first = next((i for i, r in enumerate(rounds) if r.get("after_image")), None)
    before, after = (rounds, []) if first is None else (rounds[:first], rounds[first:])

    def side(rs: list[dict]) -> dict:
        drafted = [r["drafted"] for r in rs]
        return {
            "rounds": len(rs),
            "drafted_per_round": round(sum(drafted) / len(rs), 2) if rs else None,
            "empty_rounds": sum(1 for d in drafted if d == 0),
            "accepted": sum(r["accepted"] for r in rs),
            "drafted": sum(drafted),
        }

    return {"before_image": side(before), "after_image": side(after)}


def format_siblings(tables: dict[str, dict[str, dict[str, dict]]], variants: list[str], scenarios: dict) -> str:
    """The sibling drafters after an image: per scenario and variant, the run's status, then tokens drafted
    per round before / after the first image (and rounds after it that drafted nothing). Measurements."""
    lines = []
    for sibling, table in tables.items():

        def cell(r: dict) -> str:
            if r["status"] not in (Status.PASS, Status.DEGRADED, Status.DRIFT):
                return r["status"]
            m = r.get("around_images") or drafting_around_images(r)
            b, a = m["before_image"], m["after_image"]
            fmt = lambda side: "-" if side["drafted_per_round"] is None else f"{side['drafted_per_round']:g}"
            empty = f", {a['empty_rounds']} empty" if a["empty_rounds"] else ""
            exact = "" if r.get("exact") in (True, None) else ", NOT EXACT"
            return f"{r['status']} {fmt(b)}/{fmt(a)}{empty}{exact}"

        titles = {sid: f"{sid:4s} {scenarios[sid].title}" for sid in table}
        w0 = max(len(t) for t in titles.values()) + 2
        widths = [max(len(v), *(len(cell(table[sid][v])) for sid in table)) + 2 for v in variants]
        lines.append(f"== {sibling} after an image (measured, no expectation) ==")
        lines.append("scenario".ljust(w0) + "".join(v.ljust(w) for v, w in zip(variants, widths, strict=True)))
        lines.append("-" * len(lines[-1]))
        for sid in table:
            lines.append(
                titles[sid].ljust(w0)
                + "".join(cell(table[sid][v]).ljust(w) for v, w in zip(variants, widths, strict=True))
            )
        lines.append("each cell: status, then tokens drafted per round before / after the first image")
        lines.append("")
    return "\n".join(lines)


# ---- the run as printed, and as JSON -----------------------------------------------------------


def matrix_text(cases: list[dict], columns: list[str], rows: dict, *, detail: bool) -> str:
    """The first table in full, with its first failures (every table with ``detail``); then, unless
    ``detail``, every drafter of a target side by side. ``cases``: as ``--json`` writes them (the drafter,
    target, spec type, key and results of each, in the order they ran)."""
    out, several = [], len(cases) > 1
    for i, case in enumerate(cases):
        if i == 0 or detail:
            if several:
                out.append(f"== {case_title(case)} ==")
            out += [format_table(case["results"], columns, rows), ""]
    if several and not detail:
        for target, image_rows in dict.fromkeys((c["target"], c["image_rows"]) for c in cases):
            on_target = [c for c in cases if (c["target"], c["image_rows"]) == (target, image_rows)]
            keyed = ", the drafts marked as trained with image rows" if image_rows else ""
            title = f"== every drafter on the {target} target ({_target_arch(target)}){keyed} =="
            tables = {c["drafter"]: c["results"] for c in on_target}
            out += [format_drafters(tables, list(tables), columns, rows, title), ""]
    return "\n".join(out)


def _case(models, results: dict) -> dict:
    return {
        "drafter": models.drafter,
        "target": models.target_kind,
        "spec_type": models.spec_type,
        "image_rows": models.image_rows,
        "results": results,
    }


def print_matrix(matrix, rows: dict, *, detail: bool) -> None:
    """matrix_text of the run, printed."""
    from pyllama_dflash.harness.engine.matrix import case_name

    print(
        matrix_text(
            [_case(m, matrix.tables[case_name(m)]) for m, _ in matrix.cases], matrix.columns, rows, detail=detail
        )
    )


def print_server(server: dict[str, dict], family: dict | None, variants: list[str], *, measured: bool = False) -> None:
    """The llama-server tables: the plan's models' (by variant), then each other case's; with
    ``measured``, ``server`` holds a table per sibling drafter instead."""
    if measured:
        for sibling, results in server.items():
            print(f"== llama-server, {sibling} (measured) ==")
            print(format_server_table(results, variants))
        return
    print(format_server_table(server, variants))
    for case, results in (family or {}).items():
        print(f"\n== llama-server, {case} ==")
        print(format_server_table(results, variants))


def case_title(case: dict) -> str:
    from pyllama_dflash.harness.tiny import DRAFTERS

    form = DRAFTERS.get(case["drafter"])
    drafter = f"{form.title} ({case['drafter']}, {case['spec_type']})" if form else case["drafter"]
    keyed = "; marked as trained with image rows" if case["image_rows"] else ""
    return f"drafter: {drafter}; target: {case['target']}{keyed}"


def _target_arch(kind: str) -> str:
    from pyllama_dflash.harness.tiny.target import ARCHS

    return ARCHS.get(kind, kind)


def print_summary(matrix, reasons: list[str], must_pass: str, wall_s: float) -> None:
    """The reasons the run is NOT OK, one a line on stderr, then the line that sums it up."""
    import sys

    for r in reasons:
        print(f"repro: {r}", file=sys.stderr)
    n_runs, n_refs = matrix.n_runs()
    print(
        f"repro: {n_runs} runs ({n_refs} of them references) in {len(matrix.cases)} table(s) in {wall_s:.1f}s; "
        f"must-pass variant {must_pass!r}: {'OK' if not reasons else 'NOT OK'}"
    )


def json_report(plan, matrix, args, server, family, siblings, ok: bool, wall_s: float) -> dict:
    """The full report ``--json`` writes: the source, the variants and their references, every case's
    models, expectations and results, the server checks and siblings where they ran."""
    drift = not args.no_drift
    from pyllama_dflash.harness.engine.matrix import case_name
    from pyllama_dflash.harness.oracles.references import reference_of
    from pyllama_dflash.harness.scenarios.catalog import expectations
    from pyllama_dflash.product.llamabuild.patchset import BASELINE

    manifest, variants = plan.manifests[0], plan.variants
    where = provenance(manifest)
    n_runs, n_refs = matrix.n_runs()
    return {
        "command": args.command_line,
        "date": where["date"],
        "machine": where["machine"],
        "llama_cpp": manifest.data["source"] | where["llama_cpp"],
        "variants": variants,
        "columns": matrix.columns,
        "runs": n_runs,
        "reference_runs": n_refs,
        "must_pass": plan.must_pass,
        "reference": {"variant": BASELINE, "draft": "reconverted twin"} if drift else None,
        # the column each variant's drafts were judged against, per case
        "references": {case_name(m): {v: reference_of(v, m) for v in variants} for m, _ in matrix.cases}
        if drift
        else {},
        "cases": [
            {
                **_case(m, matrix.tables[case_name(m)]),
                "models": m.to_json(),
                "expected": {
                    v: {
                        s: list(e)
                        for s, e in expectations(
                            v, drafter=m.drafter, target=m.target_kind, image_rows=m.image_rows
                        ).items()
                    }
                    for v in variants
                },
            }
            for m, _ in matrix.cases
        ],
        **({"server": server} if server is not None else {}),
        **({"server_family": family} if family is not None else {}),
        **({"siblings": siblings.tables} if siblings is not None else {}),
        **({"server_siblings": siblings.server} if siblings is not None and siblings.server is not None else {}),
        "ok": ok,
        "wall_s": round(wall_s, 3),
    }


# what a run's result keeps in the compact record (--record): what the tables show of it
RECORDED = ("status", "first_failure", "signal")


def compact_record(report: dict) -> dict:
    """The ``--json`` report less what the tables do not show (each run's calls and rounds, the models'
    paths, the server checks): the record docs/figures/repro.json is, a few hundred kB where the report is
    tens of MB."""
    out = {k: v for k, v in report.items() if k in ("command", "date", "machine", "llama_cpp", "variants")}
    out |= {k: report[k] for k in ("must_pass", "columns", "runs", "reference_runs", "ok", "wall_s")}
    out["cases"] = [
        {k: case[k] for k in ("drafter", "target", "spec_type", "image_rows")}
        | {
            "results": {
                sid: {col: {k: r[k] for k in RECORDED if r.get(k) is not None} for col, r in row.items()}
                for sid, row in case["results"].items()
            }
        }
        for case in report["cases"]
    ]
    return out


def markdown(record: dict) -> str:
    """scenarios.md's tables from a ``--json`` record: the heading, the command and what it ran, then the
    first table in full and every drafter of a target side by side, as the command printed them."""
    from pyllama_dflash.harness.engine import ctest_row
    from pyllama_dflash.harness.scenarios.catalog import SCENARIOS

    rows = {**SCENARIOS, ctest_row.ROW: ctest_row.TITLE}
    text = matrix_text(record["cases"], record["columns"], rows, detail=False).rstrip()
    return "\n".join(
        [
            heading(record),
            "",
            f"`{record['command']}`: {record['runs']} runs ({record['reference_runs']} of them references) in "
            f"{len(record['cases'])} tables in {record['wall_s']:.0f} s, "
            + ("every expectation met." if record["ok"] else "NOT OK."),
            "",
            "```",
            text,
            "```",
        ]
    )
