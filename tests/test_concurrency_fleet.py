"""Adaptive concurrency shared by the fleet: ``AdaptiveConcurrency(shared=RedisStore(...))`` (what
``LLM(governor=True, shared=...)`` builds) on a real redis-server (the ``redis_server`` fixture;
under ``CI=true`` a missing one fails), calls over real HTTP to the fake provider.

Each "process" is an ``LLM`` with its own store (its own worker id, view and refresh task),
exactly as separate processes would have. The limits are fixed here (``ConcurrencyLimit`` with
``min_limit == max_limit``) so that what is tested is the sharing, not the learning.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, until
from latencykit.policies.concurrency import AdaptiveConcurrency, ConcurrencyLimit
from latencykit.testing import Behavior, FakeProvider, RedisServer

pytestmark = pytest.mark.anyio

FAST = 0.02  # refresh interval of the stores under test (seconds)
LIMIT = 8  # each process's limit: the fleet's, when shared
PROCESSES = 3


@pytest.fixture(autouse=True)
def _no_default_store() -> Iterator[None]:
    previous = lk.use_store(None)
    yield
    lk.use_store(previous)


def fixed(n: int) -> Callable[[], ConcurrencyLimit]:
    return lambda: ConcurrencyLimit(initial=n, min_limit=n, max_limit=n)


def store(redis_server: RedisServer, **options: Any) -> lk.RedisStore:
    # A view stays fresh for 5 s unless told otherwise: a refresh late on a loaded machine
    # does not send a worker back to the share it last knew.
    options = {"interval": FAST, "timeout": 0.5, "stale_after": 5.0, **options}
    return lk.RedisStore(redis_server.url, **options)


def process(fake: FakeProvider, model: str, stage: AdaptiveConcurrency) -> lk.LLM:
    return lk.LLM(
        f"openai/{model}", api_base=fake.base_url, api_key=KEY, transport="openai", limiter=stage
    )


async def flood(llms: list[lk.LLM], stages: list[AdaptiveConcurrency], seconds: float) -> list[int]:
    """Keep 12 calls going per process for ``seconds``; the fleet's attempts in flight, sampled
    every 20 ms after the first 0.3 s."""
    key = llms[0].targets[0].key
    totals: list[int] = []

    async def worker(llm: lk.LLM) -> None:
        while True:
            await llm.acompletion(messages=MESSAGES, max_tokens=2)

    async with anyio.create_task_group() as tg:
        for llm in llms:
            for _ in range(12):
                tg.start_soon(worker, llm)
        await anyio.sleep(0.3)
        with anyio.move_on_after(seconds):
            while True:
                rows = [stage.stats(key) for stage in stages]
                totals.append(sum(row.in_flight for row in rows if row is not None))
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    return totals


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "each-its-own"])
async def test_the_fleet_keeps_one_limit_not_one_per_process(
    fake: FakeProvider, redis_server: RedisServer, shared: bool
) -> None:
    fake.script("fleet", Behavior(ttft=0.1, concurrency_knee=LIMIT))
    stores = [store(redis_server) for _ in range(PROCESSES)] if shared else []
    stages = [
        AdaptiveConcurrency(fixed(LIMIT), shared=stores[i] if shared else None)
        for i in range(PROCESSES)
    ]
    llms = [process(fake, "fleet", stage) for stage in stages]
    try:
        totals = await flood(llms, stages, 1.5)
    finally:
        for llm in llms:
            await llm.aclose()
        for each in stores:
            each.close()
    middle = statistics.median(totals)
    if shared:
        # Each takes its share of the fleet's 8 (rounded, at least one): not 3 x 8.
        assert middle <= LIMIT + PROCESSES, totals
        [row] = [stages[0].stats(llms[0].targets[0].key)]
        assert row is not None and row.workers == PROCESSES and row.share is not None
    else:
        assert middle == PROCESSES * LIMIT, totals  # what sharing prevents


async def test_a_process_joining_takes_the_fleet_s_limit(
    fake: FakeProvider, redis_server: RedisServer
) -> None:
    fake.script("join", Behavior(ttft=0.05))
    stores = [store(redis_server) for _ in range(2)]
    first = AdaptiveConcurrency(lambda: ConcurrencyLimit(initial=20), shared=stores[0])
    late = AdaptiveConcurrency(lambda: ConcurrencyLimit(initial=4), shared=stores[1])
    llms = [process(fake, "join", first), process(fake, "join", late)]
    key = llms[0].targets[0].key
    try:
        await llms[0].acompletion(messages=MESSAGES, max_tokens=2)
        await until(lambda: getattr(first.stats(key), "workers", None) == 1)
        await llms[1].acompletion(messages=MESSAGES, max_tokens=2)
        # The first the late one hears of the fleet: the mean of the estimates, (20 + 4) / 2.
        limit = late.limit_of(key)
        await until(lambda: limit is not None and limit.limit == 12)
    finally:
        for llm in llms:
            await llm.aclose()
        for each in stores:
            each.close()


async def test_with_the_store_down_each_keeps_its_share_and_resyncs(
    fake: FakeProvider, redis_server: RedisServer
) -> None:
    fake.script("down", Behavior(ttft=0.1))
    stores = [store(redis_server, stale_after=0.3) for _ in range(2)]
    stages = [AdaptiveConcurrency(fixed(LIMIT), shared=each) for each in stores]
    llms = [process(fake, "down", stage) for stage in stages]
    key = llms[0].targets[0].key
    try:
        await flood(llms, stages, 0.3)  # both heard the fleet: 4 each
        assert [stage.stats(key).share for stage in stages] == [4, 4]  # type: ignore[union-attr]
        redis_server.pause()
        try:
            await until(lambda: not stores[0].available and not stores[1].available)
            # Conservative: the share last known, not the whole limit each.
            totals = await flood(llms, stages, 0.5)
            assert max(totals) <= LIMIT, totals
            row = stages[0].stats(key)
            assert row is not None and row.share is None  # no view of the fleet now
        finally:
            redis_server.resume()
        await until(lambda: stores[0].available and stores[1].available)
        await flood(llms, stages, 0.2)
        assert [stage.stats(key).workers for stage in stages] == [2, 2]  # type: ignore[union-attr]
    finally:
        for llm in llms:
            await llm.aclose()
        for each in stores:
            each.close()


async def test_governed_llms_share_the_limit_through_their_store(
    fake: FakeProvider, redis_server: RedisServer
) -> None:
    fake.script("governed", Behavior(ttft=0.1))
    stores = [store(redis_server) for _ in range(2)]
    llms = [
        lk.LLM(
            "openai/governed",
            api_base=fake.base_url,
            api_key=KEY,
            transport="openai",
            governor=True,
            shared=each,
        )
        for each in stores
    ]
    key = llms[0].targets[0].key
    try:

        def rows() -> list[Any]:
            return [llm.stats()[key].concurrency for llm in llms]

        for llm in llms:
            await llm.acompletion(messages=MESSAGES, max_tokens=2)
        # Both heard the fleet; idle, each may use half of its limit (8 at first).
        await until(lambda: [(row.workers, row.share) for row in rows()] == [(2, 4), (2, 4)])
    finally:
        for llm in llms:
            await llm.aclose()
        for each in stores:
            each.close()
