"""``latencykit lab``: command-line options of the lab."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..testing import LlmperfProfile
from .fast_lane import format_fast_lane
from .otlp import ENDPOINT_VARIABLE, exporting
from .outage import format_outage
from .plots import Series, format_text_plots, write_plots
from .report import format_stats, format_table
from .rows import ROWS
from .runner import ARRIVALS, LabConfig, run_lab, write_json
from .streaming import format_streaming
from .turn import format_turns

if TYPE_CHECKING:
    from ..autopilot import SLO
    from ..config import LLMConfig
    from .replay import ReplayResult

SCENARIOS = ("streaming", "turn", "fast-lane", "outage")
"""The scenarios ``--rows`` may name besides the rows (each also has a ``--no-...`` flag)."""


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
        default=None,
        help=f"comma-separated rows and scenarios to run, and only those: rows from "
        f"{', '.join(ROWS)} (at least one), scenarios from {', '.join(SCENARIOS)} "
        "(default: all)",
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
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default=defaults.arrival,
        help="how requests arrive: a closed loop of --concurrency workers, or an open loop at "
        "--rate requests/s, evenly spaced (fixed) or random (poisson) "
        f"(default {defaults.arrival})",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=defaults.rate,
        help=f"open loop: offered requests/s (default {defaults.rate:g})",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=defaults.drain,
        help="open loop: seconds to wait after the last arrival before cancelling what is "
        f"still in flight (default {defaults.drain:g})",
    )
    parser.add_argument(
        "--plot-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the latency CDFs and the outage timeline as PNG files into DIR (needs the "
        "'plots' extra); without it, they are printed as text",
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
    _add_trace_commands(parser)
    return parser


def _add_trace_commands(parser: argparse.ArgumentParser) -> None:
    """``lab replay`` and ``lab tune``: a recorded trace through policies, on virtual time."""
    actions = parser.add_subparsers(dest="action", metavar="{replay,tune}")
    replay = actions.add_parser(
        "replay",
        help="replay a recorded trace through policies on a virtual clock",
        description="Replay recorded per-request latencies (llmperf CSV, JSON lines, or the "
        "slow-call log) through a real lk.LLM against a provider simulated from the trace, "
        "on virtual time: bare, next to the policy (or the lab's default policies).",
    )
    tune = actions.add_parser(
        "tune",
        help="sweep one policy parameter over a trace replay and recommend a setting",
        description="Replay a trace once per value of one config parameter and print the "
        "p50/p95/p99 and cost frontier; with --p99, recommend the cheapest setting meeting it.",
    )
    for command in (replay, tune):
        command.add_argument("trace", type=Path, help="the trace file (.csv, .jsonl)")
        command.add_argument(
            "--policy",
            type=Path,
            default=None,
            help="an LLM config file (.yaml, .yml, .json; see docs/config.md); default: the "
            "lab's default policies",
        )
        command.add_argument(
            "--target",
            default=None,
            help="whose requests replay without --policy (default: the trace's first target)",
        )
        command.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        command.add_argument(
            "--rate",
            type=float,
            default=None,
            help="requests/s, Poisson (default: the trace's recorded arrival times)",
        )
        command.add_argument(
            "--stream",
            action="store_true",
            help="stream the calls (first chunk at the recorded time to first token)",
        )
    replay.add_argument(
        "--plot", type=Path, default=None, help="write the latency CDFs as a PNG to this path"
    )
    tune.add_argument(
        "--param", help="the dotted config path to sweep, e.g. hedge.delay.q (or --slo)"
    )
    tune.add_argument("--values", help="comma-separated values, e.g. 0.5,0.75,0.9,0.95")
    tune.add_argument(
        "--slo",
        default=None,
        help="instead of a sweep: run the SLO autopilot on the trace from a bad setting (or "
        "--policy) and print what it did minute by minute and the whole setting it reached; "
        "e.g. ttft_p99=2,total_p99=20,max_extra_load=0.05,every=60 (see docs/autopilot.md)",
    )
    tune.add_argument(
        "--minutes", type=int, default=20, help="with --slo: minutes of calls (default 20)"
    )
    tune.add_argument(
        "--p99", type=float, default=None, help="the p99 target in seconds, to recommend"
    )


def run_trace_command(args: argparse.Namespace) -> int:
    """``lab replay`` / ``lab tune`` for parsed arguments."""
    from ..config import _yaml, load
    from .replay import replay_rows
    from .tune import tune

    try:
        policy = None if args.policy is None else load(args.policy)
        if args.action == "replay":
            result = replay_rows(
                args.trace,
                policy=policy,
                target=args.target,
                seed=args.seed,
                rate=args.rate,
                stream=args.stream,
            )
            print(result.report(), end="")
            panels = replay_panels(result)
            if args.plot is not None:
                from .plots import plot_cdf

                (title, series), *more = panels
                plot_cdf(f"{result.title}\n{title}", series, args.plot, panels=more)
                print(f"plot written: {args.plot}")
            else:
                from .plots import format_text_cdf

                ascii_only = not _prints_unicode(sys.stdout)
                for title, series in panels:
                    print(format_text_cdf(title, series, ascii_only=ascii_only))
            return 0
        if args.slo is not None:
            return _run_autopilot(args, policy)
        if args.param is None or args.values is None:
            raise ValueError("give --param and --values (a sweep), or --slo")
        values = [_yaml(value) for value in args.values.split(",") if value.strip()]
        found = tune(
            args.trace,
            args.param,
            values,
            policy=None if policy is None else policy.model_dump(exclude_unset=True),
            target=args.target,
            p99=args.p99,
            seed=args.seed,
            rate=args.rate,
            stream=args.stream,
        )
        print(found.report(), end="")
        return 0
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"latencykit lab {args.action}: {exc}", file=sys.stderr)
        return 2


def parse_slo(text: str) -> SLO:
    """An :class:`~latencykit.SLO` from ``name=value`` pairs separated by commas
    (``"ttft_p99=2,max_extra_load=0.05"``); ``ValueError`` naming what is wrong."""
    from ..autopilot import SLO

    fields: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, equals, value = pair.partition("=")
        if not equals or name.strip() not in SLO.__dataclass_fields__:
            raise ValueError(
                f"--slo: expected name=value with a name among "
                f"{', '.join(SLO.__dataclass_fields__)}, got {pair!r}"
            )
        try:
            fields[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {name.strip()} must be a number, got {value!r}") from None
    return SLO(**fields)


def _run_autopilot(args: argparse.Namespace, policy: LLMConfig | None) -> int:
    from .tune import BAD_START, autopilot_run

    slo = parse_slo(args.slo)
    start = BAD_START if policy is None else policy.model_dump(exclude_unset=True)
    start = {k: v for k, v in start.items() if k not in ("model", "slo")}
    target = args.target or (policy.model if policy is not None else None)
    found = autopilot_run(
        args.trace,
        slo,
        target=target,
        start=start,
        minutes=args.minutes,
        rate=args.rate or 5.0,
        seed=args.seed,
        stream=args.stream or slo.ttft_p99 is not None,
    )
    print(found.report(), end="")
    return 0


def replay_panels(result: ReplayResult) -> list[tuple[str, Sequence[Series]]]:
    """What a replay plots: each row's latency, and for streams its time to first chunk; each
    line named by its row and what the row ran."""
    labels = [f"{row.name}: {row.policy}" if row.policy else row.name for row in result.rows]
    panels: list[tuple[str, Sequence[Series]]] = [
        (
            "latency from arrival to answer" + (" (the stream's end)" if result.streamed else ""),
            [(label, row.latencies) for label, row in zip(labels, result.rows, strict=True)],
        )
    ]
    if result.streamed:
        ttfts = [(label, row.ttfts) for label, row in zip(labels, result.rows, strict=True)]
        panels.append(("time to first chunk, from arrival", ttfts))
    return panels


def _prints_unicode(stream: TextIO) -> bool:
    try:
        "▁█".encode(stream.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the lab from the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def config_from_args(args: argparse.Namespace) -> LabConfig:
    """The :class:`LabConfig` of parsed arguments: ``--rows`` names everything that runs (its
    rows, and its scenarios unless their ``--no-...`` flag is given); without it, all of them.

    Raises:
        ValueError: an unknown name in ``--rows``, or no row in it; a bad option.
    """
    named = None if args.rows is None else [n.strip() for n in args.rows.split(",") if n.strip()]
    rows = tuple(ROWS)
    if named is not None:
        rows = tuple(name for name in named if name not in SCENARIOS)
        unknown = [name for name in rows if name not in ROWS]
        if unknown or not rows:
            raise ValueError(
                f"--rows: unknown {unknown}; name at least one row of {list(ROWS)}, and any "
                f"scenarios of {list(SCENARIOS)}"
            )

    def runs(scenario: str, skipped: bool) -> bool:
        return not skipped and (named is None or scenario in named)

    return LabConfig(
        run=args.run,
        scale=args.scale,
        requests=args.requests,
        concurrency=args.concurrency,
        deadline=args.deadline,
        degrade_after=args.degrade_after,
        degraded_run=args.degraded_run,
        hedge_quantile=args.hedge_quantile,
        max_extra_load=args.max_extra_load,
        rows=rows,
        seed=args.seed,
        outage=runs("outage", args.no_outage),
        streaming=runs("streaming", args.no_streaming),
        turn=runs("turn", args.no_turn),
        fast_lane=runs("fast-lane", args.no_fast_lane),
        arrival=args.arrival,
        rate=args.rate,
        drain=args.drain,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run the lab for parsed arguments (shared with the ``latencykit`` command)."""
    if getattr(args, "action", None) is not None:
        return run_trace_command(args)
    if args.list_runs:
        print("\n".join(LlmperfProfile.runs()))
        return 0
    try:
        config = config_from_args(args)
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
        result = run_lab(config, backend=args.backend, progress=sys.stderr)
    else:
        try:
            with exporting(otlp or None):
                result = run_lab(config, backend=args.backend, progress=sys.stderr)
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
    if args.plot_dir is None:
        print()
        print(format_text_plots(result, ascii_only=not _prints_unicode(sys.stdout)))
    else:
        try:
            written = write_plots(result, args.plot_dir)
        except RuntimeError as exc:  # the extra is not installed
            print(f"latencykit lab: {exc}", file=sys.stderr)
            return 2
        print("\nplots written: " + ", ".join(str(path) for path in written))
    if str(args.json) != "-":
        write_json(result, args.json)
        print(f"\nresults written to {args.json}")
    return 0
