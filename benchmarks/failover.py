"""Failover cost: how much a dead primary costs once its breaker is open, and before.

Against the fake provider on 127.0.0.1 (secondary answers in ~20 ms):

1. **Breaker open**, primary dead (connection refused; then answering 503): after the breaker
   opened, calls through ``lk.LLM(primary, failover=[secondary], breaker=...)`` are timed
   against calling the secondary directly with bare ``litellm.acompletion``, interleaved call by
   call. Target: ratio of medians <= 1.05 (the dead primary costs nothing but a breaker check).
2. **Breaker still closed**, the very first call: a silent primary (accepts, never answers) with
   a 0.5 s attempt timeout, and a refused one. Target: first call <= one attempt timeout + the
   secondary's own time (median of direct calls) + 50 ms.

    .venv/bin/python benchmarks/failover.py [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

import latencykit as lk
from latencykit.lab.runner import prepare_litellm
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "hello"}]
ATTEMPT_TIMEOUT = 0.5
KEY = "bench-key-not-secret"


def closed_port_url() -> str:
    with FakeProvider() as gone:
        return gone.base_url  # nothing listens there any more: connection refused


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


def make_llm(primary_base: str, secondary_base: str, name: str, **primary: Any) -> lk.LLM:
    return lk.LLM(
        f"openai/{name}",
        api_base=primary_base,
        api_key=KEY,
        failover=[{"model": "openai/secondary", "api_base": secondary_base, "api_key": KEY}],
        breaker=lambda key: lk.Breaker(
            key, window_size=10, minimum_calls=3, failure_rate=0.5, open_duration=3600
        ),
        **primary,
    )


async def breaker_open(
    fake: FakeProvider, primary_base: str, name: str, calls: int
) -> dict[str, float]:
    import litellm

    llm = make_llm(primary_base, fake.base_url, name)
    for _ in range(5):  # trip the breaker
        await llm.acompletion(messages=MESSAGES)

    async def direct() -> Any:
        return await litellm.acompletion(
            model="openai/secondary", api_base=fake.base_url, api_key=KEY, messages=MESSAGES
        )

    async def through() -> Any:
        return await llm.acompletion(messages=MESSAGES)

    times: dict[str, list[float]] = {"direct": [], "failover": []}
    rng = random.Random(1)
    for _ in range(calls):
        pair = [("direct", direct), ("failover", through)]
        rng.shuffle(pair)
        for key, fn in pair:
            times[key].append(await timed(fn))
    primary_requests = sum(a.model == name for a in fake.attempts)
    return {
        "direct_ms": statistics.median(times["direct"]) * 1000,
        "failover_ms": statistics.median(times["failover"]) * 1000,
        "ratio": statistics.median(times["failover"]) / statistics.median(times["direct"]),
        "primary_requests": primary_requests,
    }


async def first_call(fake: FakeProvider, primary_base: str, name: str) -> float:
    llm = make_llm(primary_base, fake.base_url, name, timeout=ATTEMPT_TIMEOUT)
    return await timed(lambda: llm.acompletion(messages=MESSAGES))


async def main_async(calls: int) -> list[tuple[str, bool]]:
    import litellm

    refused = closed_port_url()
    checks: list[tuple[str, bool]] = []
    with FakeProvider() as fake:
        fake.script("secondary", Behavior(ttft=0.02, output_tokens=8))
        fake.script("down", Behavior(fault=Fault.HTTP_503))
        fake.script("silent", Behavior(fault=Fault.HANG))
        for _ in range(20):  # warm litellm and the connection pool
            await litellm.acompletion(
                model="openai/secondary", api_base=fake.base_url, api_key=KEY, messages=MESSAGES
            )
        direct = statistics.median(
            [
                await timed(
                    lambda: litellm.acompletion(
                        model="openai/secondary",
                        api_base=fake.base_url,
                        api_key=KEY,
                        messages=MESSAGES,
                    )
                )
                for _ in range(30)
            ]
        )
        print("1. breaker open: time to answer, failover vs the secondary called directly")
        for label, base, name in (
            ("connection refused", refused, "refused"),
            ("503", fake.base_url, "down"),
        ):
            r = await breaker_open(fake, base, name, calls)
            ok = r["ratio"] <= 1.05
            print(
                f"   dead primary ({label}): failover {r['failover_ms']:.2f} ms, direct "
                f"{r['direct_ms']:.2f} ms, ratio {r['ratio']:.3f} ({calls} calls each); requests "
                f"the fake provider saw for the primary: {r['primary_requests']:.0f}"
            )
            checks.append((f"breaker open, {label}: ratio {r['ratio']:.3f} <= 1.05", ok))
        print("2. breaker closed: the first call")
        bound = ATTEMPT_TIMEOUT + direct + 0.05
        for label, base, name in (
            ("silent (never answers)", fake.base_url, "silent"),
            ("connection refused", refused, "refused-first"),
        ):
            took = await first_call(fake, base, name)
            print(
                f"   primary {label}: first call {took * 1000:.0f} ms (attempt timeout "
                f"{ATTEMPT_TIMEOUT * 1000:.0f} ms + secondary {direct * 1000:.0f} ms = "
                f"{(ATTEMPT_TIMEOUT + direct) * 1000:.0f} ms)"
            )
            checks.append(
                (
                    f"breaker closed, {label}: {took * 1000:.0f} ms <= {bound * 1000:.0f} ms",
                    took <= bound,
                )
            )
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="calls per variant (default 300)")
    args = parser.parse_args(argv)
    prepare_litellm()
    checks = anyio.run(main_async, args.calls)
    print("\nTargets")
    for name, ok in checks:
        print(f"   {'PASS' if ok else 'FAIL'}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
