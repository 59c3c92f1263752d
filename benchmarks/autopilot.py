"""The SLO autopilot from a bad setting, on a replayed heavy-tailed trace (issue 25's done-when).

An ``lk.LLM`` with ``slo=lk.SLO(ttft_p99=..., max_extra_load=0.05, every=60)`` starts from a
deliberately bad setting (a 30 s first-token limit, no hedging) and takes streamed calls at a
Poisson rate for N minutes, each served by a record of the shipped llmperf trace
(``latencykit/testing/data/llmperf_per_request.csv``) drawn with the seed, on virtual time
(:func:`latencykit.lab.tune.autopilot_run`: the real policies, the autopilot's real loop and
replay check; the provider simulated in-process). For each seed it prints:

- the minute from which the p99 time to first chunk over the trailing 5 minutes (a failed call
  counting as never answering) meets the SLO at every later minute, and how many later minutes
  miss it on their own (a minute's p99 is one of its few slowest calls: it scatters);
- the extra attempts per call over the run, against the budget;
- whether every setting moved one way only (monotone: no oscillation) and the minute of the
  last change (settled);
- the replay's prediction of the p99 when the last change was applied, the p99 the calls then
  measured (after that change), and their ratio;
- next to them, the same calls with the bad setting and no SLO (its p99 and extra load).

Deterministic for a seed (virtual time): the same command prints the same numbers.

    .venv/bin/python benchmarks/autopilot.py                      # together/13b, seeds 0-4
    .venv/bin/python benchmarks/autopilot.py --target replicate/13b --ttft-p99 12 --seeds 0
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import time
from importlib import resources

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from latencykit.autopilot import SLO
from latencykit.lab.tune import BAD_START, autopilot_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default=None, help="trace file (default: the shipped llmperf)")
    parser.add_argument("--target", default="together/13b")
    parser.add_argument("--ttft-p99", type=float, default=1.5)
    parser.add_argument("--max-extra-load", type=float, default=0.05)
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--rate", type=float, default=5.0, help="calls per second")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between rounds")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--verbose", action="store_true", help="print each run's minutes")
    args = parser.parse_args()
    trace = args.trace or str(
        resources.files("latencykit.testing") / "data" / "llmperf_per_request.csv"
    )
    slo = SLO(ttft_p99=args.ttft_p99, max_extra_load=args.max_extra_load, every=args.every)
    print(
        f"trace {os.path.basename(trace)}, target {args.target}, SLO ttft_p99 {slo.ttft_p99:g}s, "
        f"max extra load {slo.max_extra_load:.0%}, {args.rate:g} calls/s for {args.minutes} min, "
        f"rounds every {slo.every:g}s, start {dict(BAD_START)}"
    )
    print(
        f"{'seed':>4} {'reached':>8} {'over':>4} {'extra':>7} {'monotone':>8} {'settled':>7} "
        f"{'predicted':>9} {'measured':>9} {'ratio':>6} {'bad p99':>8} {'bad extra':>9} "
        f"{'setting':<30} {'wall s':>6}"
    )
    for seed in (int(s) for s in args.seeds.split(",")):
        started = time.perf_counter()
        drive = functools.partial(
            autopilot_run,
            trace,
            target=args.target,
            minutes=args.minutes,
            rate=args.rate,
            seed=seed,
        )
        run = drive(slo)
        wall = time.perf_counter() - started
        # The same calls with the bad setting and an SLO nobody acts on: a round never comes.
        idle = dataclasses.replace(slo, every=10.0 * args.minutes * 60.0)
        bad = drive(idle)
        bad_p99 = bad.overall["ttft_p99"]
        predicted = run.predicted.get("ttft_p99", math.nan)
        measured = run.measured_after.get("ttft_p99", math.nan)
        setting = f"q={run.setting.hedge_quantile} first_token={_s(run.setting.first_token)}"
        print(
            f"{seed:>4} {_minute(run.reached):>8} {run.minutes_over:>4} {run.extra:>6.1%} "
            f"{run.monotone!s:>8} "
            f"{_minute(run.settled):>7} {predicted:>9.3f} {measured:>9.3f} "
            f"{predicted / measured:>6.3f} {bad_p99:>8.3f} {bad.extra:>8.1%} {setting:<30} "
            f"{wall:>6.1f}"
        )
        if args.verbose:
            print(run.report())


def _minute(value: int | None) -> str:
    return "-" if value is None else str(value)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}s"


if __name__ == "__main__":
    main()
