"""``pyllama-dflash soak``: a bounded soak of the fix's llama-server through real clients.

Several hundred requests from concurrent clients on four slots, with the RAM prompt cache on: image
and text chats, streaming and not (part of them through the openai client), slot saves and restores,
and a few malformed requests. Every answer is judged (status, greedy output equal to the server
without the draft, no HTTP 500 on the fix); the summary gives requests, failures by kind, throughput
with and without the draft, and the server's memory at start and end. Exit 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ... import command
from ...figures import provenance
from ...files import atomic_write_bytes, atomic_write_json
from ...flags import common_parser, export, pick, tool_prog
from ...product.llamabuild import find_built, variant
from ...product.llamabuild.patchset import BASELINE
from ..slotloop.models import tiny_models
from .report import markdown
from .workload import KINDS, soak


def parser() -> argparse.ArgumentParser:
    shared = common_parser("variants", "backend", "cpu", "patches")
    ap = argparse.ArgumentParser(
        prog=tool_prog("python -m pyllama_dflash.harness.soak"), description=__doc__.split("\n\n")[0], parents=[shared]
    )
    ap.add_argument("--requests", type=int, default=300, help="requests in the workload (default: %(default)s)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients, one per slot (default: %(default)s)")
    ap.add_argument(
        "--time-limit", type=float, default=600.0, metavar="S", help="stop after S seconds (default: %(default)s)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the workload's seed (default: %(default)s)")
    ap.add_argument("--drafter", default="dflash", help="the tiny drafter to run (default: %(default)s)")
    ap.add_argument(
        "--kinds",
        help=f"comma-separated request kinds to draw from (default: all: {', '.join(KINDS)})",
    )
    ap.add_argument("--json", type=Path, metavar="PATH", help="write the reports as JSON")
    ap.add_argument("--markdown", type=Path, metavar="PATH", help="also write them as a Markdown table")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command.require("openai", extra="soak", command="soak")  # part of its clients talk through the openai client
    export(args)
    names = args.variants or None
    manifests = find_built(names or ["all"], backend=args.backend, server=True)
    if names is None:
        manifests = manifests[-1:]  # the last of the series, which carries every patch
    models = tiny_models(drafter=args.drafter)
    work = Path(tempfile.mkdtemp(prefix="pyllama-dflash-soak-"))
    reports, ok = {}, True
    for m in manifests:
        baseline = variant(m.variant).role is None
        r = soak(
            m.binary("llama-server"),
            models,
            variant=m.variant,
            n_requests=args.requests,
            clients=args.clients,
            time_limit_s=args.time_limit,
            seed=args.seed,
            kinds=tuple(pick(args.kinds, KINDS, "--kinds")),
            work_dir=work / m.variant,
            expect_500=baseline,
        )
        print(r.summary())
        reports[m.variant] = r.to_json()
        ok &= r.ok or m.variant == BASELINE
    record = {
        **provenance(manifests[0]),
        "workload": {
            "requests": args.requests,
            "clients": args.clients,
            "seed": args.seed,
            "drafter": args.drafter,
            "kinds": args.kinds.split(",") if args.kinds else None,
        },
        "variants": reports,
    }
    if args.json:
        atomic_write_json(args.json, record)
    if args.markdown:
        atomic_write_bytes(args.markdown, markdown(record).encode())
    print(f"soak: logs in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(command.run(main))
