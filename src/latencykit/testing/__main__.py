"""``python -m latencykit.testing``: run the fake provider in the foreground.

Prints the base URLs (OpenAI, Anthropic, Gemini), then one line per finished request;
Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading

from ._behavior import Behavior, Fault
from ._profiles import LlmperfProfile
from ._quota import ProviderQuota
from ._records import RecordedAttempt
from ._server import FakeProvider

_SERVER_ABORTS = (Fault.CUT, Fault.RESET_BEFORE_HEADERS, Fault.CLOSE_BEFORE_HEADERS)


def _line(a: RecordedAttempt) -> str:
    if a.disconnected_at is not None:
        end, outcome = a.disconnected_at, "client disconnected"
    elif a.ended_at is not None:
        end, outcome = a.ended_at, f"status {a.status}"
    else:
        end, outcome = None, f"aborted by the server ({a.fault.value if a.fault else 'stop'})"
    took = f"{end - a.arrived_at:7.3f}s" if end is not None else "       -"
    ttfb = f"{a.first_byte_at - a.arrived_at:7.3f}s" if a.first_byte_at is not None else "       -"
    kind = "stream" if a.stream else "json  "
    return (
        f"#{a.index:<5} {a.wire:<9} {a.model:<20} {kind} first byte {ttfb} end {took} "
        f"tokens {a.tokens_sent:<5} conn {a.connection_id:<4} {outcome}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m latencykit.testing",
        description="Run latencykit's fake LLM server (OpenAI, Anthropic and Gemini formats) "
        "in the foreground.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any)")
    parser.add_argument(
        "--profile",
        metavar="RUN",
        help="answer every model with latencies replayed from this llmperf run, e.g. "
        "together/13b (default: instant answers). --list-profiles shows the runs.",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="time factor for --profile (default 1.0)"
    )
    parser.add_argument(
        "--ttft",
        type=float,
        default=0.0,
        help="seconds to first token without --profile (default 0)",
    )
    parser.add_argument(
        "--itl",
        type=float,
        default=0.0,
        help="seconds between tokens without --profile (default 0)",
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        default=16,
        metavar="N",
        help="tokens per answer without --profile (default 16)",
    )
    parser.add_argument(
        "--knee",
        type=int,
        metavar="N",
        help="latency grows in proportion past N requests in flight per model "
        "(Behavior.concurrency_knee; default: none)",
    )
    parser.add_argument(
        "--rpm", type=int, metavar="N", help="quota: requests per minute per API key (with --tpm)"
    )
    parser.add_argument(
        "--tpm", type=int, metavar="N", help="quota: tokens per minute per API key (with --rpm)"
    )
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    parser.add_argument("--list-profiles", action="store_true", help="list llmperf runs and exit")
    parser.add_argument("--quiet", action="store_true", help="do not print one line per request")
    return parser


def _configure(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[FakeProvider, str]:
    """The provider the options ask for (not started), and a phrase saying what it does."""
    if (args.rpm is None) != (args.tpm is None):
        parser.error("--rpm and --tpm go together")
    try:
        quota = (
            None
            if args.rpm is None
            else ProviderQuota(requests_per_minute=args.rpm, tokens_per_minute=args.tpm)
        )
        behavior = Behavior(
            ttft=args.ttft,
            itl=args.itl,
            output_tokens=args.output_tokens,
            concurrency_knee=args.knee,
        )
    except ValueError as exc:
        parser.error(str(exc))
    fake = FakeProvider(port=args.port, host=args.host, seed=args.seed, quota=quota)
    if args.profile:
        try:
            profile = LlmperfProfile.load(args.profile, scale=args.scale)
        except ValueError as exc:
            parser.error(str(exc))
        fake.default = profile
        if args.knee is not None:
            fake.default = lambda info: dataclasses.replace(
                profile(info), concurrency_knee=args.knee
            )
        what = f"llmperf profile {args.profile} x{args.scale:g}"
    else:
        fake.default = behavior
        what = f"{args.output_tokens} tokens, ttft {args.ttft:g}s, itl {args.itl:g}s"
    if args.knee is not None:
        what += f", slower past {args.knee} in flight per model"
    if quota is not None:
        what += f"; quota {args.rpm} requests and {args.tpm} tokens per minute per API key"
    return fake, what


def _follow(fake: FakeProvider) -> None:
    """Print one line per finished request, until interrupted."""
    printed: set[int] = set()
    first = 0  # every attempt before it is printed: a long run's tick stays short
    done = threading.Event()
    while not done.wait(0.1):
        with fake._cond:
            fresh = [a.snapshot() for a in fake._records[first:]]
        for a in fresh:
            finished = a.completed or a.disconnected or a.fault in _SERVER_ABORTS
            if finished and a.index not in printed:
                print(_line(a), flush=True)
                printed.add(a.index)
        while first in printed:
            printed.discard(first)
            first += 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_profiles:
        print("\n".join(LlmperfProfile.runs()))
        return 0
    fake, what = _configure(args, parser)
    try:
        fake.start()
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    print(
        f"fake provider listening: base_url={fake.base_url} "
        f"anthropic_base_url={fake.anthropic_base_url} gemini_base_url={fake.gemini_base_url}",
        flush=True,
    )
    print(f"default behaviour: {what}; Ctrl-C to stop", flush=True)
    try:
        if args.quiet:
            threading.Event().wait()
        else:
            _follow(fake)
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
