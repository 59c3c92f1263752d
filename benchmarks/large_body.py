"""Deadline overshoot when the deadline expires while a large response body is being handled.

Run it from the repository root::

    .venv/bin/python benchmarks/large_body.py            # about 2 minutes
    .venv/bin/python benchmarks/large_body.py --quick    # about 40 seconds

Method. The fake provider (in this process, on its own thread) answers non-streaming requests
with bodies of about 0.3, 1 and 3 MB (``output_tokens`` of ~10 characters each) after a 50 ms
time to first byte. For each size, the full call through ``lk.LLM`` is timed first (median of
3), then ``lk.LLM(..., deadline=b)`` is called with budgets ``b`` spread evenly from 40 % to
95 % of that time (so the deadline expires while the body is read, parsed and turned into a
``ModelResponse``, litellm's synchronous work), ``reps`` times each, in shuffled order. The
overshoot of a call that raised ``DeadlineExceeded`` is its duration minus ``b``. Variants:
asyncio; trio (the call runs on the bridge's asyncio thread; the trio side waits at most
``_CANCEL_WAIT`` for it to finish cancelling); and trio with that wait set back to the old
5 s (a control: the trio side waits until the asyncio task has finished its synchronous work).
Reported per variant and size: deadlines hit, overshoot p50 / p90 / max in ms, and the loop lag
litellm's synchronous stretch causes on asyncio (the longest gap between 1 ms ticks of a
watcher task during a full call). It always exits 0.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

import latencykit as lk
from latencykit import _asyncio_bridge
from latencykit.testing import Behavior, FakeProvider

SIZES = {"0.3 MB": 30_000, "1 MB": 100_000, "3 MB": 300_000}
MESSAGES = [{"role": "user", "content": "hi"}]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0-1) of ``values``, by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def _longest_lag(call: Any) -> float:
    """The longest gap between 1 ms ticks of a watcher task while ``call()`` runs."""
    longest, running = 0.0, True

    async def watch() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await anyio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await call()
        running = False
    return longest


async def measure(base_url: str, reps: int, seed: int) -> dict[str, dict[str, Any]]:
    """Overshoots (ms) per size, on the running backend."""
    common: dict[str, Any] = {"api_base": base_url, "api_key": "sk-bench", "timeout": 60}
    warm = lk.LLM("openai/small", **common)
    for _ in range(3):
        await warm.acompletion(messages=MESSAGES)
    results: dict[str, dict[str, Any]] = {}
    rng = random.Random(seed)
    for label in SIZES:
        llm = lk.LLM(f"openai/{label}", **common)
        durations, lags = [], []
        for _ in range(3):
            begin = time.perf_counter()
            lags.append(await _longest_lag(lambda llm=llm: llm.acompletion(messages=MESSAGES)))
            durations.append(time.perf_counter() - begin)
        full = statistics.median(durations)
        budgets = [full * (0.4 + 0.55 * i / 9) for i in range(10)] * reps
        rng.shuffle(budgets)
        overshoots = []
        for budget in budgets:
            bounded = lk.LLM(f"openai/{label}", deadline=budget, **common)
            begin = time.perf_counter()
            try:
                await bounded.acompletion(messages=MESSAGES)
            except lk.DeadlineExceeded:
                overshoots.append((time.perf_counter() - begin - budget) * 1000)
        results[label] = {
            "full_ms": full * 1000,
            "lag_ms": max(lags) * 1000,
            "overshoots": overshoots,
            "calls": len(budgets),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1 call per budget, not 3")
    parser.add_argument("--seed", type=int, default=20261123)
    args = parser.parse_args()
    reps = 1 if args.quick else 3
    fake = FakeProvider()
    fake.script("small", Behavior(output_tokens=3))
    for label, tokens in SIZES.items():
        fake.script(label, Behavior(output_tokens=tokens, ttft=0.05, itl=0.0))
    fake.start()
    lk.LLM("openai/small", api_base=fake.base_url, api_key="sk-bench")  # import litellm (frozen)
    rows: list[tuple[str, dict[str, dict[str, Any]]]] = []
    try:
        for name, backend, wait in (
            ("asyncio", "asyncio", None),
            ("trio", "trio", _asyncio_bridge._CANCEL_WAIT),
            ("trio, waiting for the task (old)", "trio", 5.0),
        ):
            print(f"{name} ...", file=sys.stderr, flush=True)
            if wait is not None:
                _asyncio_bridge._CANCEL_WAIT = wait
            rows.append((name, anyio.run(measure, fake.base_url, reps, args.seed, backend=backend)))
    finally:
        fake.stop()
    print("Deadline overshoot when the deadline expires during a large body (ms)")
    print(
        "variant                           | body   | full call | asyncio loop lag | "
        "hit/calls | overshoot p50 |   p90 |   max"
    )
    for name, results in rows:
        for label, found in results.items():
            overs = found["overshoots"]
            if not overs:
                continue
            print(
                f"{name:<33} | {label:<6} | {found['full_ms']:9.0f} | "
                f"{found['lag_ms'] if name == 'asyncio' else float('nan'):16.1f} | "
                f"{len(overs):4d}/{found['calls']:<4d} | {statistics.median(overs):13.1f} | "
                f"{percentile(overs, 0.9):5.1f} | {max(overs):5.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
