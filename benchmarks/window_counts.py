"""What a breaker's and a retry budget's sliding windows cost per call, two source trees side by
side.

Run it from the repository root, naming the tree to compare with (e.g. an older commit's
``git archive``)::

    .venv/bin/python benchmarks/window_counts.py --baseline /tmp/before/src

Each round runs one process per tree, in a shuffled order; a process times ``ops`` calls of
each operation (admit and record a successful call on a closed breaker with a count window,
the same with a time window, and a budget's ``deposit()`` plus ``try_withdraw()``) and prints
nanoseconds per call (on an asyncio loop, whose clock they read). Reported: the median over
rounds of the per-round ratio (this tree / baseline) with a 95 % bootstrap interval. Below 1:
this tree is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

_PROBE = """
import asyncio, json, time
from latencykit.budget import RetryBudget
from latencykit.policies.breaker import Breaker

def timed(step, ops):
    start = time.perf_counter_ns()
    for _ in range(ops):
        step()
    return (time.perf_counter_ns() - start) / ops

def breaker(kind):
    b = Breaker(kind, window_type=kind, window_size=100 if kind == "count" else 10.0)
    def step():
        b.record(b.acquire(), True, 0.01)
    return step

budget = None
def spend():
    global budget
    budget = budget or RetryBudget(0.5)
    budget.deposit()
    budget.try_withdraw()

async def main(ops):  # on an event loop: the clock is the loop's, as in a call
    return {{
        "breaker count window": timed(breaker("count"), ops),
        "breaker time window": timed(breaker("time"), ops),
        "budget deposit + withdraw": timed(spend, ops),
    }}

print(json.dumps(asyncio.run(main({ops}))))
"""


def _run(src: Path, ops: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(ops=ops)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _interval(ratios: list[float], rng: random.Random) -> tuple[float, float]:
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return medians[50], medians[1949]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, required=True, help="the other tree's src/")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=20261126)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    here = Path(__file__).resolve().parent.parent / "src"
    trees = {"this": here, "baseline": args.baseline.resolve()}
    ratios: dict[str, list[float]] = {}
    times: dict[str, list[float]] = {}
    for n in range(args.rounds):
        order = list(trees)
        rng.shuffle(order)
        got = {name: _run(trees[name], args.ops) for name in order}
        for op, ns in got["this"].items():
            ratios.setdefault(op, []).append(ns / got["baseline"][op])
            times.setdefault(op, []).append(got["baseline"][op])
        print(f"round {n + 1}/{args.rounds}", file=sys.stderr)
    for op, found in ratios.items():
        low, high = _interval(found, rng)
        print(
            f"{op:28} this/baseline {statistics.median(found):.3f} [{low:.3f}, {high:.3f}]"
            f" (baseline median {statistics.median(times[op]):.0f} ns)"
        )


if __name__ == "__main__":
    main()
