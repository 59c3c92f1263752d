"""``latencykit lab``: command-line options of the lab."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..testing import LlmperfProfile
from .fast_lane import format_fast_lane
from .otlp import ENDPOINT_VARIABLE, exporting
from .outage import format_outage
from .report import format_stats, format_table
from .rows import ROWS
from .runner import LabConfig, run_lab, write_json
from .streaming import format_streaming
from .turn import format_turns


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The lab's argument parser (also mounted as ``latencykit lab``)."""
    defaults = LabConfig()
    parser = parser or argparse.ArgumentParser(
        prog="latencykit lab",
        description="Replay a real heavy-tailed LLM latency profile through litellm, bare and "
        "with latencykit policies, against a local fake provider (offline), and compare tails.",
    )
    parser.add_argument(
        "--run",
        default=defaults.run,
        help=f"llmperf run for the primary model (default {defaults.run}; see --list-runs)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=defaults.scale,
        help=f"time scale of the replayed latencies (default {defaults.scale})",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=defaults.requests,
        help=f"requests per row (default {defaults.requests})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=defaults.concurrency,
        help=f"requests in flight (default {defaults.concurrency})",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=defaults.deadline,
        help=f"lk.LLM deadline in seconds (default {defaults.deadline})",
    )
    parser.add_argument(
        "--degrade-after",
        type=float,
        default=defaults.degrade_after,
        help=f"Degrade(after=...) in seconds (default {defaults.degrade_after})",
    )
    parser.add_argument(
        "--degraded-run",
        default=defaults.degraded_run,
        help=f"llmperf run for the cheap model (default {defaults.degraded_run})",
    )
    parser.add_argument(
        "--hedge-quantile",
        type=float,
        default=defaults.hedge_quantile,
        help=f"hedge row: lk.quantile(q) delay (default {defaults.hedge_quantile})",
    )
    parser.add_argument(
        "--max-extra-load",
        type=float,
        default=defaults.max_extra_load,
        help=f"hedge row: max_extra_load (default {defaults.max_extra_load})",
    )
    parser.add_argument(
        "--rows",
        default=",".join(defaults.rows),
        help=f"comma-separated rows to run, from {', '.join(ROWS)} (default all)",
    )
    parser.add_argument(
        "--no-outage", action="store_true", help="skip the outage scenario (failover, breaker)"
    )
    parser.add_argument(
        "--no-streaming",
        action="store_true",
        help="skip the streaming scenario (time to first token, stalls)",
    )
    parser.add_argument(
        "--no-turn",
        action="store_true",
        help="skip the turn scenario (stage budgets and fan-out within a p95 budget)",
    )
    parser.add_argument(
        "--no-fast-lane",
        action="store_true",
        help="skip the many-streams scenario (litellm against the fast lane)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    parser.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="event loop (default asyncio)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("lab-results.json"),
        help="where to write the results as JSON (default lab-results.json; '-' to skip)",
    )
    parser.add_argument(
        "--otlp",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="export the lab's spans and metrics over OTLP/HTTP to URL (default: "
        f"${ENDPOINT_VARIABLE}, else http://localhost:4318); also on when ${ENDPOINT_VARIABLE} "
        "is set. Needs the 'otlp' extra",
    )
    parser.add_argument("--list-runs", action="store_true", help="list llmperf runs and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the lab from the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the lab for parsed arguments (shared with the ``latencykit`` command)."""
    if args.list_runs:
        print("\n".join(LlmperfProfile.runs()))
        return 0
    try:
        config = LabConfig(
            run=args.run,
            scale=args.scale,
            requests=args.requests,
            concurrency=args.concurrency,
            deadline=args.deadline,
            degrade_after=args.degrade_after,
            degraded_run=args.degraded_run,
            hedge_quantile=args.hedge_quantile,
            max_extra_load=args.max_extra_load,
            rows=tuple(r.strip() for r in args.rows.split(",") if r.strip()),
            seed=args.seed,
            outage=not args.no_outage,
            streaming=not args.no_streaming,
            turn=not args.no_turn,
            fast_lane=not args.no_fast_lane,
        )
    except (TypeError, ValueError) as exc:
        print(f"latencykit lab: {exc}", file=sys.stderr)
        return 2
    print(
        "latencykit lab: importing litellm, starting the fake provider on 127.0.0.1 ...",
        file=sys.stderr,
    )
    otlp = args.otlp
    if otlp is None and os.environ.get(ENDPOINT_VARIABLE):
        otlp = ""
    if otlp is None:
        result = run_lab(config, backend=args.backend)
    else:
        try:
            with exporting(otlp or None):
                result = run_lab(config, backend=args.backend)
        except RuntimeError as exc:  # the extra is not installed
            print(f"latencykit lab: {exc}", file=sys.stderr)
            return 2
    print()
    print(format_table(result))
    if result.streaming is not None:
        print()
        print(format_streaming(result.streaming))
    if result.turn is not None:
        print()
        print(format_turns(result.turn))
    if result.fast_lane is not None:
        print()
        print(format_fast_lane(result.fast_lane))
    if result.outage is not None:
        print()
        print(format_outage(result.outage))
    print()
    print(format_stats(result))
    if str(args.json) != "-":
        write_json(result, args.json)
        print(f"\nresults written to {args.json}")
    return 0
