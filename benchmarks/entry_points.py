"""What the new entry points cost per call: ``LLM.aembedding`` next to bare ``litellm.aembedding``
and a bare httpx POST, and the sync forms (``LLM.embedding``, ``LLM.completion``) next to their
async ones, all against the fake provider on loopback.

Run it from the repository root::

    .venv/bin/python benchmarks/entry_points.py             # about a minute
    .venv/bin/python benchmarks/entry_points.py --rounds 5  # a smoke run

Method: the variants are interleaved in a freshly shuffled order in each round, each timed over a
batch of sequential calls (``time.perf_counter``); a variant's per-call time in a round is its
batch time over the batch size, and its ratio to its baseline is taken *in the same round*. The
report gives the median per-call time of each variant and the median [min-max] of its per-round
ratio. The machine is noisy: compare ratios, not absolute times, and repeat the run.

- Embeddings, async (one asyncio loop): ``bare httpx`` (a POST of the same body on a kept-alive
  ``httpx.AsyncClient``: the floor), ``bare litellm.aembedding``, ``LLM.aembedding`` (litellm
  lane) and ``LLM.aembedding`` (fast lane); ratios against ``bare litellm.aembedding``.
- Sync (no running loop): ``LLM.embedding`` and ``LLM.completion`` on the fast lane (the call hops
  to the LLM's loop thread and back), ratios against the same LLM's async call awaited on a
  loop of the caller's own (``asyncio.run`` per batch is outside the timing: the loop is kept).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

import latencykit as lk
from latencykit._litellm import litellm
from latencykit.testing import FakeProvider

MESSAGES = [{"role": "user", "content": "hello"}]


def report(title: str, times: dict[str, list[float]], base: str) -> None:
    print(f"\n{title} (per call, median of rounds; ratio to {base!r} in the same round)")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, times[base], strict=True)]
        ms, ratio = statistics.median(values) * 1e3, statistics.median(ratios)
        print(f"  {name:34} {ms:7.3f} ms   x{ratio:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


async def async_rounds(fake: FakeProvider, rounds: int, batch: int) -> dict[str, list[float]]:
    module = litellm()
    litellm_lane = lk.LLM("openai/e", api_base=fake.base_url, api_key="sk-b")
    fast_lane = lk.LLM("openai/e", api_base=fake.base_url, api_key="sk-b", transport="openai")
    client = httpx.AsyncClient()
    url = f"{fake.base_url}/embeddings"
    headers = {"Authorization": "Bearer sk-b"}

    async def bare_httpx() -> Any:
        return (await client.post(url, json={"model": "e", "input": "x"}, headers=headers)).json()

    async def bare_litellm() -> Any:
        return await module.aembedding(
            model="openai/e", input="x", api_base=fake.base_url, api_key="sk-b", timeout=600
        )

    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare httpx POST": bare_httpx,
        "bare litellm.aembedding": bare_litellm,
        "LLM.aembedding (litellm lane)": lambda: litellm_lane.aembedding(input="x"),
        "LLM.aembedding (fast lane)": lambda: fast_lane.aembedding(input="x"),
    }
    for call in variants.values():  # warm: clients, connections, litellm's first call
        for _ in range(3):
            await call()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in random.sample(list(variants), len(variants)):
            call = variants[name]
            started = time.perf_counter()
            for _ in range(batch):
                await call()
            times[name].append((time.perf_counter() - started) / batch)
    await client.aclose()
    await fast_lane.aclose()
    return times


def sync_rounds(fake: FakeProvider, rounds: int, batch: int) -> dict[str, list[float]]:
    llm = lk.LLM("openai/e", api_base=fake.base_url, api_key="sk-b", transport="openai")
    loop = asyncio.new_event_loop()

    async def awaited(make: Callable[[], Awaitable[Any]]) -> None:
        for _ in range(batch):
            await make()

    def async_batch(make: Callable[[], Awaitable[Any]]) -> Callable[[], None]:
        return lambda: loop.run_until_complete(awaited(make))

    def sync_batch(call: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(batch):
                call()

        return run

    variants: dict[str, Callable[[], None]] = {
        "await LLM.aembedding": async_batch(lambda: llm.aembedding(input="x")),
        "LLM.embedding (sync)": sync_batch(lambda: llm.embedding(input="x")),
        "await LLM.acompletion": async_batch(lambda: llm.acompletion(messages=MESSAGES)),
        "LLM.completion (sync)": sync_batch(lambda: llm.completion(messages=MESSAGES)),
    }
    for run in variants.values():
        run()  # warm: each loop's client and connection
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in random.sample(list(variants), len(variants)):
            started = time.perf_counter()
            variants[name]()
            times[name].append((time.perf_counter() - started) / batch)
    loop.run_until_complete(llm.aclose())
    loop.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("--batch", type=int, default=20, help="calls per batch (default 20)")
    options = parser.parse_args()
    with FakeProvider() as fake:
        embeddings = asyncio.run(async_rounds(fake, options.rounds, options.batch))
        report("Embeddings, async", embeddings, "bare litellm.aembedding")
        sync = sync_rounds(fake, options.rounds, options.batch)
        print("\nSync calls, fast lane (ratio to the async call of the same kind)")
        for kind, base in (
            ("embedding", "await LLM.aembedding"),
            ("completion", "await LLM.acompletion"),
        ):
            pair = {k: v for k, v in sync.items() if kind in k.lower()}
            report(f"  {kind}", pair, base)


if __name__ == "__main__":
    main()
