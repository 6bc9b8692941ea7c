"""``repro --schedule FILE``: a schedule (as the fuzzer writes) on every variant instead of the scenarios,
run, judged and reported as a one-row table."""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from ...errors import UsageError
from ...files import atomic_write_json
from ..slotloop.record import PASS, TIE
from .plan import Plan
from .report import format_table
from .tables import backend


def replay_schedule(args: argparse.Namespace, plan: Plan) -> int:
    """One table row: the schedule on every variant; 0 when the must-pass variant keeps the invariant.
    UsageError for a schedule file that does not parse (an OSError for one that cannot be read)."""
    from pyllama_dflash.harness.engine.schedule import Schedule, ScheduleError
    from pyllama_dflash.harness.engine.schedule_runner import replay_variants

    variants, must_pass = plan.variants, plan.must_pass
    try:
        schedule = Schedule.load(args.schedule)
    except ScheduleError as e:
        raise UsageError(f"--schedule {args.schedule}: {e}") from None
    t0 = time.monotonic()
    results = replay_variants(
        schedule,
        variants,
        plan.models,
        config=plan.config,
        backend=backend(args),
        exact=not args.no_exact,
        parallel=args.jobs,
        timeout_s=args.timeout,
    )
    row = args.schedule.name
    print(format_table({row: results}, variants, {row: SimpleNamespace(title=f"({len(schedule.steps)} steps)")}))
    ok = results[must_pass]["status"] in (PASS, TIE)
    if not ok:
        print(
            f"repro: {must_pass} {results[must_pass]['status']} on {row}: {results[must_pass].get('first_failure')}",
            file=sys.stderr,
        )
    print(
        f"repro: schedule {args.schedule} on {len(variants)} variants in {time.monotonic() - t0:.1f}s; "
        f"must-pass variant {must_pass!r}: {'OK' if ok else 'NOT OK'}"
    )
    if args.json:
        atomic_write_json(
            args.json,
            {
                "schedule": schedule.to_json(),
                "variants": variants,
                "must_pass": must_pass,
                "results": results,
                "ok": ok,
            },
        )
    return 0 if ok else 1
