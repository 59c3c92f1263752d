"""The adaptive concurrency limit against a provider with a knee: what it learns, and what it
does to latency and throughput under an open-loop load above the knee, side by side with no
limit.

Run it from the repository root::

    .venv/bin/python benchmarks/adaptive_concurrency.py             # knees 8, 16, 32; 40 s each
    .venv/bin/python benchmarks/adaptive_concurrency.py --quick     # smoke run, knee 8, 10 s

The fake provider (real HTTP on 127.0.0.1, the fast lane) answers in ``--base`` seconds (0.5)
alone and serves ``N`` requests at a time (``Behavior(concurrency_knee=N)``: with ``k`` in
flight each answer takes ``max(1, k / N)`` times as long), so it completes at most ``N / base``
calls per second. Calls arrive open-loop (Poisson) at ``--load`` (1.5) times that rate, each
with ``deadline=`` ``--deadline`` seconds (5), for ``--seconds`` (40) per variant:

- ``none``: no limit (``LLM()``): every call is sent at once;
- ``adaptive``: ``LLM(governor=True)``: attempts beyond the learned limit wait in its queue,
  and those whose wait cannot end within their deadline are refused at once
  (``LimitExceeded``), before anything is sent.

Each variant uses its own model name, so the provider's in-flight count starts at zero. For
``adaptive`` the learned limit is printed every 2 s; its converged value is the median of the
readings over the second half of the run (the probe rounds, at half the limit for about a
round every 30 s, are in it). Reported per variant: calls answered per second (goodput),
p50 and p99 latency of the answered calls (the queue wait included), calls refused at once,
calls that ran out of time (``DeadlineExceeded``), and the ratio of goodputs.

**Priority lanes** (``--lanes``): per knee, interactive streams arrive at 2 per second and the
time to their first chunk is measured (after 10 s of warm-up, for ``--seconds``), alone, then
beside a batch flood at ``--load`` times the capacity with ``governor=True``, then with the
same flood and no limit (every call is sent; the provider's queue serves no lane first;
``--skip-none``: not this one). Reported: p50 and p99 time to first chunk, the p99 over the p99
alone, batch calls answered per second, refused and failed, and the learned limit (the median
and range of readings every second; probe rounds at half included).

**Fleet** (``--fleet``): ``--processes`` (3) ``LLM(governor=True)``, each with its own
``RedisStore`` on one real ``redis-server`` (as separate processes would have), share the
knee; each gets an open-loop share of ``--load`` times the capacity for ``--seconds``, first
with the store (the limit shared), then without (each learns its own). Reported: the fleet's
attempts in flight (the sum of the processes', sampled every 0.5 s) over the second half of
the run, median and 90th percentile, against the knee; goodput and p99 latency.

**Cost per call** (``--overhead``): a pipeline with the adaptive concurrency stage against the
same pipeline without it, around a trivial async function (a slot free: no wait), variants
interleaved per round, batches of 2,000 calls with the garbage collector off; reported: the
median and range of the per-round differences.

The machine this runs on may be shared and noisy: repeat, and read ranges. The script
reports; it always exits 0.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import anyio.abc

import latencykit as lk
from latencykit.errors import LimitExceeded
from latencykit.testing import Behavior, FakeProvider

KEY = "sk-bench-adaptive-0123456789"
MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    shed: int = 0
    timed_out: int = 0
    failed: int = 0
    limits: list[tuple[float, int]] = field(default_factory=list)  # (seconds, limit)
    batch: int = 0  # --lanes: batch calls answered (started while measuring)
    seconds: float = 0.0

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(
    fake: FakeProvider, model: str, *, governed: bool, rate: float, seconds: float, deadline: float
) -> Result:
    llm = lk.LLM(
        f"openai/{model}",
        api_base=fake.base_url,
        api_key=KEY,
        transport="openai",
        deadline=deadline,
        governor=governed,
    )
    await llm.warm()
    result = Result()
    rng = random.Random(7)

    async def one() -> None:
        started = time.monotonic()
        try:
            await llm.acompletion(messages=MESSAGES, max_tokens=4)
        except LimitExceeded:
            result.shed += 1
        except lk.DeadlineExceeded:
            result.timed_out += 1
        except Exception:
            result.failed += 1
        else:
            result.latencies.append(time.monotonic() - started)

    async def watch(start: float) -> None:
        while True:
            await anyio.sleep(2.0)
            row = llm.stats().get(llm.targets[0].key)
            if row is not None and row.concurrency is not None:
                at = time.monotonic() - start
                result.limits.append((at, row.concurrency.limit))
                print(
                    f"    {at:5.1f}s limit {row.concurrency.limit:4d} "
                    f"in flight {row.concurrency.in_flight:4d} waiting {row.concurrency.waiting}",
                    flush=True,
                )

    start = time.monotonic()
    async with anyio.create_task_group() as calls:
        if governed:
            calls.start_soon(watch, start)
        await open_loop(calls, one, rate, start + seconds, rng)
        result.seconds = time.monotonic() - start
        calls.cancel_scope.cancel()  # the calls still running are not counted
    await llm.aclose()
    return result


async def open_loop(
    calls: anyio.abc.TaskGroup,
    one: Callable[[], Coroutine[Any, Any, None]],
    rate: float,
    until: float,
    rng: random.Random,
) -> None:
    """Start ``one()`` in ``calls`` at Poisson arrivals of ``rate`` per second until ``until``."""
    next_at = time.monotonic()
    while (now := time.monotonic()) < until:
        if now >= next_at:
            calls.start_soon(one)
            next_at += rng.expovariate(rate)
        else:
            await anyio.sleep(next_at - now)


async def lanes(fake: FakeProvider, knee: int, args: argparse.Namespace) -> None:
    """The interactive lane's time to first chunk, alone and beside a batch flood."""
    print(
        f"lanes, knee {knee}: interactive streams at 2/s; batch flood at {args.load:g}x the "
        f"capacity ({args.load * knee / args.base:.0f}/s); {args.seconds:g}s measured after 10s",
        flush=True,
    )
    variants = [("alone", False, True), ("flood, adaptive", True, True)]
    if not args.skip_none:
        variants.append(("flood, none", True, False))
    alone = math.nan
    for name, flood, governed in variants:
        result = await lane_run(fake, knee, args, name, flood=flood, governed=governed)
        if name == "alone":
            alone = result.quantile(0.99)
        limits = sorted(limit for _, limit in result.limits) or [0]
        print(
            f"  {name:<16} interactive first chunk p50 {result.quantile(0.5):6.3f}s "
            f"p99 {result.quantile(0.99):6.3f}s ({result.quantile(0.99) / alone:.2f}x alone; "
            f"{len(result.latencies)} streams, {result.failed} failed); batch answered "
            f"{result.batch / args.seconds:.1f}/s, refused {result.shed}, failed "
            f"{result.timed_out}; limit median {statistics.median(limits):g} "
            f"(range {limits[0]}-{limits[-1]})",
            flush=True,
        )


async def lane_run(
    fake: FakeProvider,
    knee: int,
    args: argparse.Namespace,
    name: str,
    *,
    flood: bool,
    governed: bool,
) -> Result:
    """One variant of ``--lanes``: the interactive streams' times to first chunk."""
    model = f"lanes-{knee}-{name.replace(', ', '-')}"
    fake.script(model, Behavior(ttft=args.base, concurrency_knee=knee))
    llm = lk.LLM(
        f"openai/{model}",
        api_base=fake.base_url,
        api_key=KEY,
        transport="openai",
        deadline=args.deadline,
        governor=governed,
    )
    await llm.warm()
    result = Result()
    measure_from = time.monotonic() + 10.0

    async def interactive() -> None:
        started = time.monotonic()
        try:
            stream = await llm.acompletion(
                messages=MESSAGES, stream=True, max_tokens=4, priority="interactive"
            )
            async with stream:
                async for _ in stream:
                    if started >= measure_from:
                        result.latencies.append(time.monotonic() - started)
                    break
        except Exception:
            result.failed += started >= measure_from

    async def batch() -> None:
        started = time.monotonic()
        try:
            await llm.acompletion(messages=MESSAGES, max_tokens=4, priority="batch")
        except LimitExceeded:
            result.shed += started >= measure_from
        except Exception:
            result.timed_out += started >= measure_from
        else:
            result.batch += started >= measure_from

    async def watch() -> None:
        while True:
            await anyio.sleep(1.0)
            row = llm.stats().get(llm.targets[0].key)
            if time.monotonic() >= measure_from and row is not None and row.concurrency:
                result.limits.append((time.monotonic() - measure_from, row.concurrency.limit))

    until = measure_from + args.seconds
    async with anyio.create_task_group() as calls:
        if governed:
            calls.start_soon(watch)
        if flood:
            rate = args.load * knee / args.base
            calls.start_soon(open_loop, calls, batch, rate, until, random.Random(3))
        await open_loop(calls, interactive, 2.0, until, random.Random(5))
        calls.cancel_scope.cancel()
    await llm.aclose()
    return result


def report(name: str, result: Result, knee: int) -> float:
    goodput = len(result.latencies) / result.seconds
    line = (
        f"  {name:<9} goodput {goodput:6.1f}/s  p50 {result.quantile(0.5):6.3f}s  "
        f"p99 {result.quantile(0.99):6.3f}s  refused {result.shed:5d}  "
        f"timed out {result.timed_out:5d}  failed {result.failed}"
    )
    if result.limits:
        later = [limit for at, limit in result.limits if at >= result.seconds / 2]
        converged = statistics.median(later or [result.limits[-1][1]])
        line += f"  limit {converged:g} ({converged / knee - 1:+.0%} of the knee {knee})"
    print(line, flush=True)
    return goodput


async def fleet(fake: FakeProvider, knee: int, args: argparse.Namespace) -> None:
    """The fleet's attempts in flight, with the limit shared and without."""
    from latencykit.testing import RedisServer

    rate = args.load * knee / args.base
    print(
        f"fleet, knee {knee}: {args.processes} processes, arrivals {rate:.0f}/s in all, "
        f"{args.seconds:g}s per variant",
        flush=True,
    )
    with RedisServer() as server:
        for shared in (True, False):
            result, totals = await fleet_run(fake, server.url if shared else None, knee, args)
            totals.sort()
            middle, p90 = statistics.median(totals), totals[int(0.9 * (len(totals) - 1))]
            print(
                f"  {'shared' if shared else 'each its own':<13} fleet in flight median "
                f"{middle:5.1f} ({middle / knee:.2f}x the knee), p90 {p90:4d} "
                f"({p90 / knee:.2f}x); goodput {len(result.latencies) / result.seconds:6.1f}/s, "
                f"p99 {result.quantile(0.99):6.3f}s, refused {result.shed}, "
                f"timed out {result.timed_out}, failed {result.failed}",
                flush=True,
            )


async def fleet_run(
    fake: FakeProvider, url: str | None, knee: int, args: argparse.Namespace
) -> tuple[Result, list[int]]:
    """One variant of ``--fleet`` (``url``: the store's; ``None``: none): the calls' results
    and the fleet's attempts in flight, sampled over the second half."""
    model = f"fleet-{knee}-{'own' if url is None else 'shared'}"
    fake.script(model, Behavior(ttft=args.base, concurrency_knee=knee))
    stores = [None if url is None else lk.RedisStore(url) for _ in range(args.processes)]
    llms = [
        lk.LLM(
            f"openai/{model}",
            api_base=fake.base_url,
            api_key=KEY,
            transport="openai",
            deadline=args.deadline,
            governor=True,
            shared=store,
        )
        for store in stores
    ]
    key = llms[0].targets[0].key
    result, totals = Result(), []
    for llm in llms:
        await llm.warm()

    async def call(llm: lk.LLM) -> None:
        started = time.monotonic()
        try:
            await llm.acompletion(messages=MESSAGES, max_tokens=4)
        except LimitExceeded:
            result.shed += 1
        except lk.DeadlineExceeded:
            result.timed_out += 1
        except Exception:
            result.failed += 1
        else:
            result.latencies.append(time.monotonic() - started)

    start = time.monotonic()
    async with anyio.create_task_group() as calls:
        for n, llm in enumerate(llms):
            one = functools.partial(call, llm)
            until = start + args.seconds
            rng = random.Random(n)
            calls.start_soon(
                open_loop, calls, one, args.load * knee / args.base / len(llms), until, rng
            )
        while (at := time.monotonic() - start) < args.seconds:
            await anyio.sleep(0.5)
            rows = [llm.stats()[key].concurrency for llm in llms]
            if at >= args.seconds / 2:
                totals.append(sum(row.in_flight for row in rows if row is not None))
        result.seconds = time.monotonic() - start
        calls.cancel_scope.cancel()
    for llm in llms:
        await llm.aclose()
    for store in stores:
        if store is not None:
            store.close()
    return result, totals


async def overhead(rounds: int = 30, batch: int = 2000) -> None:
    import gc

    from latencykit.pipeline import Call, Pipeline
    from latencykit.policies.concurrency import AdaptiveConcurrency

    async def answer() -> str:
        return "ok"

    call = Call(answer, target=lk.Target(name="t"))
    variants = {"plain": Pipeline(()), "adaptive": Pipeline((AdaptiveConcurrency(),))}
    differences = []
    for index in range(rounds):
        took = {}
        for name in sorted(variants, reverse=index % 2 == 1):
            gc.disable()
            started = time.perf_counter()
            for _ in range(batch):
                await variants[name].run(call)
            took[name] = (time.perf_counter() - started) / batch
            gc.enable()
        differences.append(took["adaptive"] - took["plain"])
    us = sorted(d * 1e6 for d in differences)
    plain = took["plain"] * 1e6
    print(
        f"adaptive concurrency stage: median per-round difference {statistics.median(us):.1f} us "
        f"per call (rounds {us[0]:.1f} to {us[-1]:.1f}; the plain pipeline {plain:.1f} us)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--knees", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--base", type=float, default=0.5, help="seconds per answer alone")
    parser.add_argument("--load", type=float, default=1.5, help="arrivals / capacity")
    parser.add_argument("--seconds", type=float, default=40.0, help="per variant")
    parser.add_argument("--deadline", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--overhead", action="store_true", help="the cost per call only")
    parser.add_argument("--lanes", action="store_true", help="the interactive lane under a flood")
    parser.add_argument("--skip-none", action="store_true", help="with --lanes: no unlimited run")
    parser.add_argument("--fleet", action="store_true", help="the limit shared by processes")
    parser.add_argument("--processes", type=int, default=3, help="with --fleet")
    args = parser.parse_args()
    if args.overhead:
        await overhead()
        return
    if args.fleet:
        with FakeProvider() as fake:
            for knee in args.knees:
                await fleet(fake, knee, args)
        return
    if args.lanes:
        with FakeProvider() as fake:
            for knee in args.knees:
                await lanes(fake, knee, args)
        return
    if args.quick:
        args.knees, args.seconds = [8], 10.0
    with FakeProvider() as fake:
        for knee in args.knees:
            fake.script(f"none-{knee}", Behavior(ttft=args.base, concurrency_knee=knee))
            fake.script(f"adaptive-{knee}", Behavior(ttft=args.base, concurrency_knee=knee))
        for knee in args.knees:
            rate = args.load * knee / args.base
            print(
                f"knee {knee}: capacity {knee / args.base:.0f}/s, arrivals {rate:.0f}/s, "
                f"deadline {args.deadline:g}s, {args.seconds:g}s per variant",
                flush=True,
            )
            options = {"rate": rate, "seconds": args.seconds, "deadline": args.deadline}
            adaptive = await run(fake, f"adaptive-{knee}", governed=True, **options)
            plain = await run(fake, f"none-{knee}", governed=False, **options)
            ratio = report("adaptive", adaptive, knee) / max(report("none", plain, knee), 1e-9)
            print(f"  goodput adaptive / none: {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    anyio.run(main)
