"""The matrix as a text table, with each first failure quoted underneath."""

from __future__ import annotations


def cell(result: dict) -> str:
    status = result["status"]
    if status == "CRASH" and result.get("signal"):
        return f"CRASH ({result['signal']})"
    return status


def format_table(table: dict[str, dict[str, dict]], variants: list[str], scenarios: dict) -> str:
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
            if r["status"] not in ("PASS", "SKIP") and r.get("first_failure"):
                notes.append(f"  {sid} {v}: {r['first_failure']}")
            elif r["status"] == "DEGRADED":
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

    w0 = max(len(c) for c in checks) + 2
    widths = [max(len(v), *(len(cell(server[v][c])) for c in checks)) + 2 for v in variants]
    lines = ["llama-server check".ljust(w0) + "".join(v.ljust(w) for v, w in zip(variants, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    for c in checks:
        lines.append(c.ljust(w0) + "".join(cell(server[v][c]).ljust(w) for v, w in zip(variants, widths, strict=True)))
    lines.append("(!) marks a result other than the expected one")
    return "\n".join(lines)
