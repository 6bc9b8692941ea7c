"""``repro --schedule FILE``: a schedule (as the fuzzer writes) on every variant instead of the scenarios,
run, judged and reported as a one-row table."""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from ..errors import UsageError
from ..files import atomic_write_json
from ..slotloop.record import PASS, TIE
from .plan import Plan
from .report import format_table
from .tables import backend


def replay_schedule(args: argparse.Namespace, plan: Plan) -> int:
    """One table row: the schedule on every variant; 0 when the fix variant keeps the invariant.
    UsageError for a schedule file that does not parse (an OSError for one that cannot be read)."""
    from ..engine.schedule import Schedule, ScheduleError
    from ..engine.schedule_runner import replay_variants

    variants, fix = plan.variants, plan.fix
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
    ok = results[fix]["status"] in (PASS, TIE)
    if not ok:
        print(f"repro: {fix} {results[fix]['status']} on {row}: {results[fix].get('first_failure')}", file=sys.stderr)
    print(
        f"repro: schedule {args.schedule} on {len(variants)} variants in {time.monotonic() - t0:.1f}s; "
        f"fix variant {fix!r}: {'OK' if ok else 'NOT OK'}"
    )
    if args.json:
        atomic_write_json(
            args.json, {"schedule": schedule.to_json(), "variants": variants, "fix": fix, "results": results, "ok": ok}
        )
    return 0 if ok else 1
