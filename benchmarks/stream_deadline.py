"""Streamed deadlines under load: how late the caller learns a deadline expired, and its CPU.

Run it from the repository root::

    .venv/bin/python benchmarks/stream_deadline.py                  # about four minutes
    .venv/bin/python benchmarks/stream_deadline.py --rounds 3 --backend asyncio
    # the same, with latencykit from another tree as a third variant, side by side:
    .venv/bin/python benchmarks/stream_deadline.py --compare /tmp/before/src

Method. A fake provider in a child process answers model ``slow`` with a stream that outlives
every deadline (first chunk at once, then one chunk every ``--itl`` seconds, default 0.05, for
10 s). Each variant runs in a child process of its own (the garbage one variant leaves must
not pause the other), the variants taking turns in a freshly shuffled order each round. A
child starts streams open-loop at ``--rate`` per second (default 125) in phases of one second,
one to warm up and ``--phases`` measured (default 3); each stream reads until its ``--budget``
(default 0.3 s) runs out. Variants:

- ``lk``: ``lk.LLM("openai/slow", transport="openai", deadline=budget)``, streamed, each
  chunk's text read, until ``lk.DeadlineExceeded``;
- ``raw``: ``anyio.fail_after(budget)`` around raw httpx streaming the same request
  (``client.stream``, ``aiter_lines``, ``json.loads`` of each event, its text read), until
  ``TimeoutError``: what one would write by hand (the child builds the same ``lk.LLM``, so
  both heaps are alike);
- ``lk before`` (with ``--compare SRC``): ``lk`` with latencykit imported from ``SRC``.

The overshoot of a stream is the time from its deadline (its start + budget, on the loop's
clock) to the caller catching the error. A phase waits for all its streams to end before the
next starts; its CPU (``time.process_time``, the child only: the provider runs elsewhere)
divided by its streams is the CPU per expiring stream. Then the child counts the objects an
expiring stream leaves in reference cycles (``gc.DEBUG_SAVEALL`` over 20 streams): garbage
only a collection frees, which makes full collections longer. Reported per backend and
variant: overshoot p50/p99/max over all phases and the median of each round's p99 (a round's
tail follows the machine's load at that moment), the CPU per stream (median over phases), the
garbage per stream, the full collections seen and the longest; and each variant's CPU per
stream over raw's, paired by round (median).
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
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import httpx
from overhead import _load, percentile
from provider import provider_process

import latencykit as lk

PROVIDER = """
import logging, sys
from latencykit.testing import Behavior, FakeProvider
logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # each cut stream's lost connection
fake = FakeProvider()
fake.script("slow", Behavior(ttft=0.0, itl=float(sys.argv[1]), output_tokens=int(sys.argv[2])))
fake.start()
print(fake.base_url, flush=True)
sys.stdin.read()
fake.stop()
"""
MESSAGES = [{"role": "user", "content": "hi"}]


async def lk_stream(llm: lk.LLM, budget: float) -> float:
    started = anyio.current_time()
    try:
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for chunk in stream:
                chunk.choices[0].delta.content  # noqa: B018
    except lk.DeadlineExceeded:
        return anyio.current_time() - (started + budget)
    raise RuntimeError("the stream ended before its deadline")


async def raw_stream(client: httpx.AsyncClient, url: str, budget: float) -> float:
    started = anyio.current_time()
    body = {"model": "slow", "messages": MESSAGES, "stream": True}
    try:
        with anyio.fail_after(budget):
            async with client.stream("POST", url, json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:") and line != "data: [DONE]":
                        json.loads(line[5:])["choices"][0]["delta"].get("content")
    except TimeoutError:
        return anyio.current_time() - (started + budget)
    raise RuntimeError("the stream ended before its deadline")


async def phase(start: Any, rate: float) -> tuple[list[float], float]:
    """``rate`` streams over one second, open loop; their overshoots and CPU per stream."""
    overshoots: list[float] = []

    async def one() -> None:
        overshoots.append(await start())

    cpu = time.process_time()
    begin = anyio.current_time()
    async with anyio.create_task_group() as tasks:
        for i in range(int(rate)):
            await anyio.sleep(max(0.0, begin + i / rate - anyio.current_time()))
            tasks.start_soon(one)
    return overshoots, (time.process_time() - cpu) / len(overshoots)


async def run(base_url: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--phases`` phases of one variant in this process, after one to warm up."""
    llm = lk.LLM(  # made in both variants: the same heap (litellm imported)
        "openai/slow",
        api_base=base_url,
        api_key="k",
        transport="openai",
        deadline=args.budget,
    )
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        url = f"{base_url}/chat/completions"
        start = {
            "lk": lambda: lk_stream(llm, args.budget),
            "raw": lambda: raw_stream(client, url, args.budget),
        }[variant]
        await phase(start, args.rate)
        pauses: list[float] = []
        _time_collections(pauses)
        overshoots: list[float] = []
        cpu: list[float] = []
        for _ in range(args.phases):
            late, per_stream = await phase(start, args.rate)
            overshoots += late
            cpu.append(per_stream)
        collections = list(pauses)  # not the garbage count's own collections
        garbage = await cyclic_garbage(start)
    return {"overshoots": overshoots, "cpu": cpu, "gc": collections, "garbage": garbage}


async def cyclic_garbage(start: Any, streams: int = 20) -> float:
    """Objects per expiring stream that only a garbage collection frees (in reference cycles):
    what makes full collections longer."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(streams):
            await start()
        gc.collect()
        return len(gc.garbage) / streams
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _time_collections(pauses: list[float]) -> None:
    """Append the duration of every full (generation 2) garbage collection to ``pauses``."""
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(timed)


def report(backend: str, results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{backend}: overshoot in ms (streams); per expiring stream: CPU in us, garbage")
    columns = [("n", 5), ("p50", 7), ("p99", 7), ("max", 7), ("round p99", 9), ("CPU", 8)]
    columns.append(("garbage", 8))
    print(f"  {'variant':<10}" + "".join(f" {name:>{width}}" for name, width in columns), "GCs")
    for name, runs in results.items():
        ms = [x * 1e3 for run in runs for x in run["overshoots"]]
        cpu = [x for run in runs for x in run["cpu"]]
        pauses = [x * 1e3 for run in runs for x in run["gc"]]
        longest = max(pauses, default=0.0)
        garbage = statistics.median(run["garbage"] for run in runs)
        # A round's p99 rises with the machine's load at that moment: their median is steadier.
        p99s = statistics.median(percentile(run["overshoots"], 99) * 1e3 for run in runs)
        print(
            f"  {name:<10} {len(ms):>5} {percentile(ms, 50):>7.1f} {percentile(ms, 99):>7.1f}"
            f" {max(ms):>7.1f} {p99s:>9.1f} {statistics.median(cpu) * 1e6:>8.0f}"
            f" {garbage:>8.0f}  {len(pauses)}, longest {longest:.0f} ms"
        )
    for name in results:
        ratios = [
            statistics.median(run["cpu"]) / statistics.median(raw_run["cpu"])
            for run, raw_run in zip(results[name], results["raw"], strict=True)
        ]
        print(f"  CPU {name} / raw, median of rounds: {statistics.median(ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    parser.add_argument("--phases", type=int, default=3, help="phases per round (default 3)")
    parser.add_argument("--rate", type=float, default=125, help="streams started per second")
    parser.add_argument("--budget", type=float, default=0.3, help="each stream's deadline (s)")
    parser.add_argument("--itl", type=float, default=0.05, help="seconds between chunks")
    parser.add_argument("--backend", choices=("asyncio", "trio"), action="append")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument(
        "--compare", metavar="SRC", help="also the lk variant with latencykit from SRC"
    )
    parser.add_argument("--child", nargs=3, metavar=("BASE", "VARIANT", "BACKEND"), help="internal")
    args = parser.parse_args()
    if args.child:
        base_url, variant, backend = args.child
        print(json.dumps(anyio.run(run, base_url, variant, args, backend=backend)))
        return
    print(f"load average {_load()}, lk from {os.path.dirname(lk.__file__)}")
    tokens = int(10 / args.itl)  # a stream lasts 10 s: it outlives every deadline
    shuffle = random.Random(args.seed)
    with provider_process(PROVIDER, str(args.itl), str(tokens)) as base_url:
        for backend in args.backend or ("asyncio", "trio"):
            here = os.environ.get("PYTHONPATH", "")
            trees = {"lk": here, "raw": here}
            if args.compare:
                trees["lk before"] = args.compare
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for round_ in range(args.rounds):
                order = list(results)
                shuffle.shuffle(order)
                for name in order:
                    options = [f"--{option}={getattr(args, option)}" for option in OPTIONS]
                    child = [sys.executable, __file__, *options, "--child"]
                    done = subprocess.run(
                        [*child, base_url, name.split()[0], backend],
                        capture_output=True,
                        text=True,
                        check=True,
                        env={**os.environ, "PYTHONPATH": trees[name]},
                    )
                    results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"  {backend} round {round_ + 1}/{args.rounds}", file=sys.stderr)
            report(backend, results)


OPTIONS = ("phases", "rate", "budget")


if __name__ == "__main__":
    main()
