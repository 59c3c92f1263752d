"""Queueing nobody sees (issue 27, item 6): calls beyond a host's connection pool, before and
after latencykit's connection slots.

Run it from the repository root::

    .venv/bin/python benchmarks/pool_queue.py                       # this tree, both parts
    .venv/bin/python benchmarks/pool_queue.py --before /tmp/before/src   # and an older tree
    .venv/bin/python benchmarks/pool_queue.py --quick               # smoke run

1. **Visibility.** For each lane (``litellm``, the fast lane ``openai``), in a fresh process:
   ``--calls`` (1,000) concurrent ``lk.LLM.acompletion`` calls to one host, the fake provider
   (in that process) answering each after ``--ttft`` (1 s). litellm's pool takes 500 per host;
   the rest wait client-side. Reported: how many requests the provider was serving at most at
   once, the calls' own time (p50, max), the provider latency latencykit recorded (its
   latency window, what the hedge reads: p50, max), and what it says of the wait (the
   ``connection_wait`` window: attempts that waited, p50, max; the peak of ``waiting``,
   sampled every 20 ms). ``--before PATH`` runs the same in a process importing latencykit
   from ``PATH`` (e.g. ``git archive a68a9c5``), one after the other: there, the wait is in the
   latency, and nothing counts it.

2. **Cost of the slots per call**, in one process, side by side: a pipeline of the
   connection slots alone around a no-op attempt, against the same pipeline without them
   (``Pipeline([])``), on asyncio and trio. In each of ``rounds`` rounds, a batch of ``batch``
   calls of each, in a shuffled order; the cost is the per-call difference in the same round.
   Reported: median [95 % bootstrap CI] in microseconds and the ratio of the medians; then
   ``lk.LLM`` with ``mock_response`` (no network) with and without the slots, interleaved
   call by call: the ratio of medians [CI], the slots next to litellm's own per-call work.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MESSAGES = [{"role": "user", "content": "hello"}]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def bootstrap(values: Sequence[float], stat: Callable[[list[float]], float]) -> tuple[float, float]:
    rng = random.Random(0)
    found = [stat([rng.choice(values) for _ in values]) for _ in range(1000)]
    return percentile(found, 2.5), percentile(found, 97.5)


# --- part 1: visibility (one lane, in this process) ------------------------------------------


async def _visibility(lane: str, calls: int, ttft: float) -> dict[str, Any]:
    import anyio

    import latencykit as lk
    from latencykit.testing import Behavior, FakeProvider

    with FakeProvider() as fake:
        llm = lk.LLM("openai/slow", api_base=fake.base_url, api_key="sk-x", transport=lane)
        await llm.warm()
        fake.reset()
        fake.script("slow", Behavior(ttft=ttft))
        took: list[float] = []
        peak = 0
        done = anyio.Event()

        async def call() -> None:
            started = time.perf_counter()
            await llm.acompletion(messages=MESSAGES)
            took.append(time.perf_counter() - started)

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, getattr(llm.stats()["openai/slow"], "waiting", 0))
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            async with anyio.create_task_group() as callers:
                for _ in range(calls):
                    callers.start_soon(call)
            done.set()
        attempts = fake.attempts
        stats = llm.stats()["openai/slow"]
        wait = getattr(stats, "connection_wait", None)
        window = llm._recorder.latency_window("openai/slow")
        latencies = window._sorted
        found = getattr(llm._recorder, "waits", {}).get("openai/slow")
        waits = [] if found is None else found._sorted
    edges = sorted(
        [(a.arrived_at, 1) for a in attempts] + [(a.ended_at or 0.0, -1) for a in attempts]
    )
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    return {
        "lane": lane,
        "calls": calls,
        "served_at_once": most,
        "call_p50": statistics.median(took),
        "call_max": max(took),
        "latency_p50": statistics.median(latencies),
        "latency_max": max(latencies),
        "measured": wait is not None,
        "waited": len(waits),
        "wait_p50": statistics.median(waits) if waits else 0.0,
        "wait_max": max(waits, default=0.0),
        "waiting_peak": peak,
    }


def _run_visibility(python_path: str, lane: str, calls: int, ttft: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": python_path}
    args = [sys.executable, __file__, "--child", lane, "--calls", str(calls), "--ttft", str(ttft)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def visibility(trees: dict[str, str], calls: int, ttft: float) -> None:
    print(f"1. {calls} concurrent calls to one host answering after {ttft:g} s (seconds)")
    header = (
        f"  {'tree':<8} {'lane':<8} {'served':>6} {'call50':>7} {'callmax':>7} "
        f"{'lat50':>6} {'latmax':>6}  {'waited':>6} {'wait50':>6} {'waitmax':>7} {'peak':>5}"
    )
    print(header)
    for lane in ("litellm", "openai"):
        for name, path in trees.items():
            r = _run_visibility(path, lane, calls, ttft)
            wait = f"{'-':>6} {'-':>6} {'-':>7} {'-':>5}"  # not measured there
            if r["measured"]:
                wait = (
                    f"{r['waited']:>6} {r['wait_p50']:>6.2f} {r['wait_max']:>7.2f} "
                    f"{r['waiting_peak']:>5}"
                )
            print(
                f"  {name:<8} {lane:<8} {r['served_at_once']:>6} {r['call_p50']:>7.2f} "
                f"{r['call_max']:>7.2f} {r['latency_p50']:>6.2f} {r['latency_max']:>6.2f}  {wait}",
                flush=True,
            )
    print(
        "  served: most requests the provider served at once; call: the calls' time; lat: the "
        "provider latency latencykit recorded\n  (what the hedge reads); waited/wait: attempts "
        "that waited for a connection and how long; peak: most waiting at once (stats())."
    )


# --- part 2: the cost of the slots per call --------------------------------------------------


def cost(rounds: int, batch: int, llm_calls: int) -> None:
    import anyio

    for backend in ("asyncio", "trio"):
        anyio.run(_policy_cost, rounds, batch, backend=backend)
    anyio.run(_llm_cost, llm_calls)


async def _policy_cost(rounds: int, batch: int) -> None:
    import sniffio

    import latencykit as lk
    from latencykit._slots import ConnectionSlots
    from latencykit.pipeline import Call, Pipeline

    async def noop() -> int:
        return 1

    target = lk.Target("openai/x", api_base="http://127.0.0.1:9/v1", transport="openai")
    variants = {"bare": Pipeline([]), "slots": Pipeline([ConnectionSlots()])}
    call = Call(noop, target=target)
    per_call: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(rounds + 5):
        order = list(variants)
        random.shuffle(order)
        gc.collect()
        gc.disable()
        try:
            for name in order:
                run = variants[name].run
                started = time.perf_counter_ns()
                for _ in range(batch):
                    await run(call)
                if index >= 5:  # warm-up rounds are left out
                    per_call[name].append((time.perf_counter_ns() - started) / batch / 1000)
        finally:
            gc.enable()
    diffs = [s - b for s, b in zip(per_call["slots"], per_call["bare"], strict=True)]
    low, high = bootstrap(diffs, statistics.median)
    bare = statistics.median(per_call["bare"])
    print(
        f"  {sniffio.current_async_library():<8} slots {statistics.median(diffs):+.2f} us/call "
        f"[{low:+.2f}, {high:+.2f}] on a pipeline run of {bare:.1f} us "
        f"(ratio {statistics.median(per_call['slots']) / bare:.3f})",
        flush=True,
    )


async def _llm_cost(calls: int) -> None:
    import anyio

    import latencykit as lk
    from latencykit._slots import ConnectionSlots
    from latencykit.pipeline import Pipeline

    with_slots = lk.LLM("openai/gpt-4o-mini", api_key="sk-x")
    without = lk.LLM("openai/gpt-4o-mini", api_key="sk-x")
    without._pipeline = Pipeline(
        p for p in without._pipeline.policies if not isinstance(p, ConnectionSlots)
    )
    llms = {"slots": with_slots, "bare": without}
    took: dict[str, list[float]] = {name: [] for name in llms}
    for index in range(calls + 100):
        order = list(llms)
        random.shuffle(order)
        for name in order:
            started = time.perf_counter()
            await llms[name].acompletion(messages=MESSAGES, mock_response="hi")
            if index >= 100:
                took[name].append(time.perf_counter() - started)
            for _ in range(5):  # litellm's logging tasks run here, not in the next call
                await anyio.lowlevel.checkpoint()
    ratios = [s / b for s, b in zip(took["slots"], took["bare"], strict=True)]
    low, high = bootstrap(ratios, statistics.median)
    bare = statistics.median(took["bare"]) * 1000
    print(
        f"  lk.LLM with mock_response (asyncio, {calls} calls each): {bare:.2f} ms/call without "
        f"the slots; with/without {statistics.median(ratios):.4f} [{low:.4f}, {high:.4f}]",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="PATH", help="src/ of an older tree to compare")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--ttft", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=("1", "2"), help="one part only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import anyio

        result = anyio.run(_visibility, args.child, args.calls, args.ttft)
        print(json.dumps(result))
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    trees = {"after": os.path.abspath(here)}
    if args.before:
        trees = {"before": os.path.abspath(args.before), **trees}
    if args.part in (None, "1"):
        visibility(trees, 100 if args.quick else args.calls, args.ttft)
    if args.part in (None, "2"):
        sys.path.insert(0, trees["after"])
        print("2. The cost of the connection slots per call (side by side)")
        if args.quick:
            cost(rounds=20, batch=200, llm_calls=200)
        else:
            cost(rounds=100, batch=1000, llm_calls=2000)


if __name__ == "__main__":
    main()
