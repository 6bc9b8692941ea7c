"""A mutation run's JSON report and its score, for a whole run, one slice of it (``--shard I/N``) or the
slices merged (``--merge``): one function scores them all, so a merged score is the whole run's.

The report: ``files``, ``variant``, ``selection`` (what was asked: ``every``, ``only``, ``limit``,
``mutants``, the ids selected before the slicing, in the run's order, and ``series_sha256``, the patches
the run judged them in), ``shard`` (``"I/N"``, or None
for a whole run), ``score``, ``counts``, ``killed_by``, ``outcomes`` (one per mutant tried, runner.Outcome
as JSON), ``wall_s``; a merged report adds ``shards``, each slice's ``shard``, ``mutants`` tried and
``wall_s`` (the merged ``wall_s`` is their sum: runner-seconds, not the time the slices took side by side),
and ``reruns``, each ``--only`` report of some of the run's mutants tried again on the same patches (after
a check was added for a survivor): its ``mutants``, ``wall_s`` and ``date``; their outcomes replace the
slices'.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ...figures import PROVENANCE, heading, table
from ...product.process.shard import Shard, check_slices, load_reports, shard_from_json, shard_json
from .runner import EQUIVALENT, KILLED, STILLBORN, SURVIVED


def scored(
    outcomes: list[dict], *, files: list[str], variant: str, selection: dict, shard: Shard | None, wall_s: float
) -> dict:
    """The report of these outcomes: counts, what killed them, and the score killed / (killed + survived)."""
    counts = Counter(o["status"] for o in outcomes)
    n_scored = counts[KILLED] + counts[SURVIVED]
    return {
        "files": files,
        "variant": variant,
        "selection": selection,
        "shard": shard_json(shard),
        "score": counts[KILLED] / n_scored if n_scored else 1.0,
        "counts": dict(counts),
        "killed_by": dict(Counter(o["killed_by"] for o in outcomes if o["status"] == KILLED)),
        "outcomes": outcomes,
        "wall_s": round(wall_s, 1),
    }


def print_summary(report: dict, stale: list[str] | None = None, equivalent_file: str = "equivalent.json") -> None:
    counts = report["counts"]
    killed, n_scored = counts.get(KILLED, 0), counts.get(KILLED, 0) + counts.get(SURVIVED, 0)
    print()
    where = f" (slice {report['shard']})" if report.get("shard") else ""
    shards = f", {_merged(report)}" if report.get("shards") else ""
    print(f"mutate: {len(report['outcomes'])} mutants{where} in {report['wall_s']:.0f}s{shards}: {counts}")
    print(f"mutation score: {killed}/{n_scored} = {report['score']:.3f} (equivalent and stillborn mutants not counted)")
    for o in report["outcomes"]:
        if o["status"] == SURVIVED:
            print(f"  survived: {o['id']} {o['mutant']}")
    if stale:
        print(f"  {equivalent_file} names mutants that no longer exist: {', '.join(stale)}")
    print(f"killed by: {report['killed_by']}")


def exit_code(report: dict, *, slice_of_run: bool = False) -> int:
    """0 when nothing survived and not everything was stillborn; an empty slice of a run passes (the merge
    judges the whole), an empty whole run does not."""
    counts, n = report["counts"], len(report["outcomes"])
    if n == 0:
        return 0 if slice_of_run else 1
    return 0 if counts.get(SURVIVED, 0) == 0 and counts.get(STILLBORN, 0) < n else 1


def merge(reports: list[dict]) -> dict:
    """The slices' reports as one run's: the same variant, files and selection in each, every slice 1..N once,
    and together every mutant selected tried exactly once. A rerun (a whole ``--only`` report, not a slice)
    of mutants the slices tried, on the same patches, replaces their outcomes; where every report is an
    ``--only`` one, the first is the run and the others its reruns. ValueError says what does not fit."""
    if reports and all(map(_is_rerun, reports)):
        # a run of some mutants (--only) and reruns of some of them: the first given is the run
        reports, reruns = reports[:1], reports[1:]
    else:
        reruns = [r for r in reports if _is_rerun(r)]
        reports = [r for r in reports if not any(r is x for x in reruns)]
    if not reports:
        raise ValueError("no reports to merge")
    first = reports[0]
    series = {r["selection"].get("series_sha256") for r in reports + reruns}
    if len(series) != 1:
        raise ValueError(f"the slices ran on different patches (series sha256 {', '.join(sorted(map(str, series)))})")
    for key in ("variant", "files", "selection"):
        if len({json.dumps(r.get(key), sort_keys=True) for r in reports}) != 1:
            raise ValueError(f"the reports are not slices of one run: their {key!r} differ")
        if key != "selection" and any(r.get(key) != first.get(key) for r in reruns):
            raise ValueError(f"a rerun is not of this run's mutants: its {key!r} differs")
    check_slices([shard_from_json(r.get("shard")) for r in reports], "mutation")
    by_id: dict[str, dict] = {}
    for r in reports:
        for o in r["outcomes"]:
            if o["id"] in by_id:
                raise ValueError(f"mutant {o['id']} is in two reports")
            by_id[o["id"]] = o
    wanted = first["selection"]["mutants"]
    missing, extra = [m for m in wanted if m not in by_id], sorted(set(by_id) - set(wanted))
    problems = [f"{len(x)} {what} ({_few(x)})" for what, x in (("not tried", missing), ("not selected", extra)) if x]
    if problems:
        raise ValueError(f"the reports do not hold the run's mutants: {'; '.join(problems)}")
    _replace_rerun(by_id, reruns)
    order = sorted(reports, key=lambda r: shard_from_json(r.get("shard")) or Shard(1, 1))
    out = scored(
        [by_id[m] for m in wanted],
        files=first["files"],
        variant=first["variant"],
        selection=first["selection"],
        shard=None,
        wall_s=sum(r.get("wall_s", 0.0) for r in reports + reruns),
    )
    out["shards"] = [
        {"shard": r.get("shard"), "mutants": len(r["outcomes"]), "wall_s": r.get("wall_s"), "date": r.get("date")}
        for r in order
    ]
    if reruns:
        out["reruns"] = [
            {"mutants": [o["id"] for o in r["outcomes"]], "wall_s": r.get("wall_s"), "date": r.get("date")}
            for r in reruns
        ]
    dates = sorted({r["date"] for r in reports if r.get("date")})
    provenance = {key: first[key] for key in PROVENANCE if key in first}
    if len(dates) > 1:  # slices of one run measured on several days
        provenance["date"] = f"{dates[0]} to {dates[-1]}"
    return provenance | out


def _is_rerun(report: dict) -> bool:
    return report.get("shard") is None and bool(report["selection"].get("only"))


def _replace_rerun(by_id: dict[str, dict], reruns: list[dict]) -> None:
    """The reruns' outcomes in place of the slices' (each mutant rerun once, and tried by a slice)."""
    seen: set[str] = set()
    for r in reruns:
        for o in r["outcomes"]:
            if o["id"] not in by_id:
                raise ValueError(f"rerun mutant {o['id']} is not one the slices tried")
            if o["id"] in seen:
                raise ValueError(f"mutant {o['id']} is rerun twice")
            seen.add(o["id"])
            by_id[o["id"]] = o


def _merged(report: dict) -> str:
    """What a merged report was merged from: its slices, or the one run its reruns were laid over."""
    n = len(report["shards"])
    if n == 1 and report.get("reruns"):
        return "merged with its reruns"
    return f"{n} slice{'s' if n > 1 else ''} merged"


def _few(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")


def load(paths: list[Path]) -> list[dict]:
    """The reports, each checked to be a mutation report; ValueError naming the file otherwise."""
    return load_reports(paths, ("outcomes", "selection"), "mutate --json (with its selection: written by this version)")


def command_line(report: dict) -> str:
    """The command that tries the report's selection (a slice's with its --shard)."""
    s, words = report["selection"], ["pyllama-dflash mutate", f"--variant {report['variant']}"]
    words += [f"--every {s['every']}"] if s.get("every", 1) > 1 else []
    words += [f"--only <{len(s['only'])} ids>"] if s.get("only") else []
    words += [f"--limit {s['limit']}"] if s.get("limit") else []
    words += [f"--shard {report['shard']}"] if report.get("shard") else []
    return " ".join(words)


def markdown(report: dict) -> str:
    """The report's heading and command, its score, one row per file mutated (what became of its mutants and
    which checks killed them), and one row per survivor."""
    statuses = (KILLED, EQUIVALENT, STILLBORN, SURVIVED)
    by_file: dict[str, list[dict]] = {f: [] for f in report["files"]}
    for o in report["outcomes"]:
        by_file[o["mutant"].split(":", 1)[0]].append(o)
    rows = []
    for path, outcomes in by_file.items():
        counts = Counter(o["status"] for o in outcomes)
        killers = Counter(o["killed_by"] for o in outcomes if o["status"] == KILLED).most_common()
        rows.append([f"`{path}`", str(len(outcomes)), *(str(counts[k]) for k in statuses), _killers(killers)])
    counts, n = report["counts"], len(report["outcomes"])
    scored_n = counts.get(KILLED, 0) + counts.get(SURVIVED, 0)
    slices = f", {_merged(report)}" if report.get("shards") else ""
    rerun = [m for r in report.get("reruns", []) for m in r["mutants"]]
    slices += f" ({', '.join(f'`{m}`' for m in rerun)} tried again with `--only`: that run's outcome)" if rerun else ""
    out = [
        heading(report),
        "",
        f"`{command_line(report)}`: {n} mutants, {report['wall_s']:.0f} s of runner time{slices}; "
        f"score {counts.get(KILLED, 0)}/{scored_n} (equivalent and stillborn mutants not counted).",
        "",
        table(["file", "mutants", *statuses, "killed by"], rows),
    ]
    survivors = [
        [f"`{o['id']}`", o["mutant"].split(" ", 1)[0], _code(o["mutant"].split(" ", 1)[1])]
        for o in report["outcomes"]
        if o["status"] == SURVIVED
    ]
    if survivors:
        out += ["", table(["surviving mutant", "where", "change"], survivors)]
    return "\n".join(out) + "\n"


def _killers(killers: list[tuple[str, int]]) -> str:
    return ", ".join(f"{k} {n}" if n > 1 else k for k, n in killers) or "none"


def _code(change: str) -> str:
    """A mutant's change as table text: its line before and after, pipes escaped."""
    return change.replace("|", "\\|")
