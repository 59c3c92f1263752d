"""Load spread over equivalent deployments: latencykit's ``Balanced`` pool vs litellm's Router.

Three deployments of one model (three fake providers on 127.0.0.1, each answering ``gpt`` in a
log-normal time, median 0.2 s, sigma 0.3) take the same open-loop load (Poisson arrivals at
``--rate`` calls/s for ``--seconds``), non-streaming, through

* **latencykit**: ``lk.LLM(..., router=Balanced([d1, d2, d3]), breaker={})``: power of two
  choices over peak-EWMA latency x outstanding attempts, the breakers' defaults, failover inside
  the pool; no retry, no hedge;
* **litellm Router** with ``routing_strategy`` ``simple-shuffle``, ``least-busy`` and
  ``latency-based-routing``, each as configured by default (its retries, allowed fails and
  cooldown are printed as read from the Router).

A third of the way into each run one deployment degrades, and stays so: ``slow`` (its latency
x10: median 2 s) or ``errors`` (it answers 503). Printed per system: p50 and p99 of the calls
that answered, the error rate (a call that raised, or took over 30 s), the share of requests
the degraded deployment received after it degraded, and requests sent per call. The systems
run one after the other (fresh providers, clients warmed first); the machine's noise is not
removed: repeat (``--repeat``: every other repeat runs them in reverse order) and read ranges.
First it prints what the pool costs per call on the client: its pick among three members and
its count of an attempt (around an attempt that does nothing), best of 7 rounds.

    .venv/bin/python benchmarks/balance.py [--rate 20] [--seconds 20] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import random
import time
import timeit
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack, suppress
from typing import Any, NamedTuple

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

import latencykit as lk
from latencykit.lab.report import percentile
from latencykit.lab.runner import prepare_litellm, quiet_litellm
from latencykit.pipeline import Call as PipelineCall
from latencykit.routing import Balanced
from latencykit.target import Target
from latencykit.testing import Behavior, FakeProvider, Fault, Latency

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "bench-key-not-secret"
HEALTHY = Behavior(ttft=Latency.lognormal(0.2, 0.3), output_tokens=8)
DEGRADED = {
    "slow": Behavior(ttft=Latency.lognormal(2.0, 0.3), output_tokens=8),
    "errors": Behavior(fault=Fault.HTTP_503),
}
GIVE_UP = 30.0  # a call still running after this long counts as an error
STRATEGIES = ("simple-shuffle", "least-busy", "latency-based-routing")

Call = Callable[[], Awaitable[Any]]


class Result(NamedTuple):
    calls: int
    p50: float
    p99: float
    errors: float
    degraded_share: float
    requests_per_call: float


def latencykit_system(bases: Sequence[str]) -> tuple[Call, str]:
    names = [f"d{i}" for i in range(2, len(bases) + 1)]
    llm = lk.LLM(
        "openai/gpt",
        api_base=bases[0],
        api_key=KEY,
        failover=[
            {"model": "openai/gpt", "api_base": base, "api_key": KEY, "name": name}
            for base, name in zip(bases[1:], names, strict=True)
        ],
        router=Balanced(["openai/gpt", *names]),
        breaker={},
    )
    return lambda: llm.acompletion(messages=MESSAGES), "Balanced (P2C, peak-EWMA), breaker={}"


def router_system(bases: Sequence[str], strategy: str) -> tuple[Call, str]:
    from litellm.router import Router

    router = Router(
        model_list=[
            {
                "model_name": "gpt",
                "litellm_params": {"model": "openai/gpt", "api_base": base, "api_key": KEY},
            }
            for base in bases
        ],
        routing_strategy=strategy,
    )
    read = getattr(router, "settings", None)  # litellm 1.110; older ones keep them on the Router
    source = read() if callable(read) else router
    settings = f"num_retries={router.num_retries}, " + ", ".join(
        f"{name}={getattr(source, name, '?')}" for name in ("allowed_fails", "cooldown_time")
    )
    return lambda: router.acompletion(model="gpt", messages=MESSAGES), settings


async def open_loop(
    call: Call, rate: float, seconds: float, degrade: Callable[[], None], seed: int
) -> tuple[list[float], int]:
    """Poisson arrivals at ``rate``/s for ``seconds``; ``degrade()`` a third of the way in."""
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        started = time.perf_counter()
        try:
            with anyio.fail_after(GIVE_UP):
                await call()
        except Exception:
            errors += 1
        else:
            latencies.append(time.perf_counter() - started)

    async with anyio.create_task_group() as group:
        start, at, degraded = anyio.current_time(), 0.0, False
        while (at := at + rng.expovariate(rate)) < seconds:
            await anyio.sleep_until(start + at)
            if not degraded and at >= seconds / 3:
                degrade()
                degraded = True
            group.start_soon(one)
    return latencies, errors


async def run_one(
    system: Callable[[Sequence[str]], tuple[Call, str]],
    scenario: str,
    rate: float,
    seconds: float,
    seed: int,
) -> tuple[Result, str]:
    with ExitStack() as stack:
        fakes = [stack.enter_context(FakeProvider(seed=seed + i)) for i in range(3)]
        call, settings = system([fake.base_url for fake in fakes])
        for fake in fakes:
            fake.script("gpt", Behavior(output_tokens=8))
        for _ in range(6):  # litellm's first-call set-up and connections, on every deployment
            await call()
        for fake in fakes:
            fake.reset()
            fake.script("gpt", HEALTHY)
        before: list[int] = []

        def degrade() -> None:
            before.extend(len(fake.attempts) for fake in fakes)
            fakes[-1].script("gpt", DEGRADED[scenario])

        latencies, errors = await open_loop(call, rate, seconds, degrade, seed)
        latencies.sort()
        after = [len(fake.attempts) - b for fake, b in zip(fakes, before, strict=True)]
        calls = len(latencies) + errors
        requests = sum(len(fake.attempts) for fake in fakes)
    return (
        Result(
            calls=calls,
            p50=percentile(latencies, 0.5) if latencies else float("nan"),
            p99=percentile(latencies, 0.99) if latencies else float("nan"),
            errors=errors / max(1, calls),
            degraded_share=after[-1] / max(1, sum(after)),
            requests_per_call=requests / max(1, calls),
        ),
        settings,
    )


async def client_cost(rounds: int = 7, n: int = 20_000) -> tuple[float, float]:
    """Seconds per call of a pick among three members, and of counting one attempt."""
    pool = Balanced(["a", "b", "c"], clock=time.monotonic)
    for member in ("a", "b", "c"):
        pool.observe(member, 0.2)
    pick = min(timeit.repeat(pool.pick, number=n, repeat=rounds)) / n
    call = PipelineCall(lambda: None, target=Target(name="a"))

    async def attempt(call: PipelineCall) -> int:
        return 1

    counted = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            await pool.handle(call, attempt)
        middle = time.perf_counter()
        for _ in range(n):
            await attempt(call)
        counted = min(counted, ((middle - started) - (time.perf_counter() - middle)) / n)
    return pick, counted


async def warm_litellm() -> None:
    """litellm's first failed call in a process pays for lazy imports on its error path
    (hundreds of ms, blocking the loop): pay it before any system is measured."""
    from latencykit._litellm import litellm

    with FakeProvider() as fake:
        fake.script("down", DEGRADED["errors"])
        for model in ("openai/gpt", "openai/down"):
            with suppress(Exception):
                await litellm().acompletion(
                    model=model,
                    api_base=fake.base_url,
                    api_key=KEY,
                    messages=MESSAGES,
                    max_retries=0,
                )


def systems() -> list[tuple[str, Callable[[Sequence[str]], tuple[Call, str]]]]:
    found: list[tuple[str, Callable[[Sequence[str]], tuple[Call, str]]]] = [
        ("latencykit Balanced", latencykit_system)
    ]
    for strategy in STRATEGIES:
        found.append(
            (f"Router {strategy}", lambda bases, s=strategy: router_system(bases, s))  # type: ignore[misc]
        )
    return found


async def main_async(rate: float, seconds: float, repeat: int) -> None:
    print(
        f"3 deployments, median 0.2 s; open loop {rate:g} calls/s for {seconds:g} s; the third "
        f"degrades at {seconds / 3:.1f} s; repeat {repeat}"
    )
    header = (
        f"{'scenario':8} {'system':34} {'calls':>5} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'errors':>7} {'degraded':>8} {'req/call':>8}"
    )
    pick, counted = await client_cost()
    print(
        f"pool's cost per call: pick {pick * 1e6:.1f} us, "
        f"counting an attempt {counted * 1e6:.1f} us"
    )
    await warm_litellm()
    notes: dict[str, str] = {}
    for scenario in DEGRADED:
        print(f"\n{header}")
        for run in range(repeat):
            order = systems()
            for name, system in order if run % 2 == 0 else order[::-1]:  # drift hits all alike
                result, settings = await run_one(system, scenario, rate, seconds, seed=run)
                notes[name] = settings
                print(
                    f"{scenario:8} {name:34} {result.calls:5d} {result.p50 * 1000:7.0f} "
                    f"{result.p99 * 1000:7.0f} {result.errors:7.1%} "
                    f"{result.degraded_share:8.1%} {result.requests_per_call:8.2f}"
                )
    print("\nConfiguration as read:")
    for name, settings in notes.items():
        print(f"  {name}: {settings}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=20.0, help="calls per second (default 20)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per run (default 20)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per system (default 1)")
    args = parser.parse_args(argv)
    prepare_litellm()
    with quiet_litellm():
        anyio.run(main_async, args.rate, args.seconds, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
