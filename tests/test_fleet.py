"""Fleet-wide state on a real redis-server (started on 127.0.0.1 by the ``redis_server``
fixture). Several ``RedisStore`` objects on one server stand for several processes: each has
its own view, refresh task and queues, exactly as separate processes would."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit import events, fleet
from latencykit.policies.breaker import BreakerState
from latencykit.policies.limiter import Limiter, Quota
from latencykit.testing import RedisServer

pytestmark = pytest.mark.anyio

FAST = 0.02  # refresh interval of the stores under test (seconds)


@pytest.fixture
def stores(redis_server: RedisServer) -> Iterator[list[lk.RedisStore]]:
    """Two stores on one server: two 'processes'."""
    made = [lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5) for _ in range(2)]
    yield made
    for store in made:
        store.close()


@pytest.fixture(autouse=True)
def _no_default_store() -> Iterator[None]:
    previous = lk.use_store(None)
    yield
    lk.use_store(previous)


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate()`` until it holds (within 10 s): the state changes in the store's
    background thread, where there is no event to wait on."""
    with anyio.fail_after(10.0):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the state itself
            await anyio.sleep(0.01)


def make_breaker(store: lk.RedisStore, key: str = "openai", **options: Any) -> lk.Breaker:
    defaults: dict[str, Any] = {
        "window_size": 10,
        "minimum_calls": 4,
        "open_duration": 0.3,
        "half_open_calls": 2,
    }
    return lk.Breaker(key, shared=store, **{**defaults, **options})


async def fail_once(breaker: lk.Breaker) -> None:
    async def boom() -> None:
        raise lk.ProviderUnavailable("down", target="t", status_code=503)

    with pytest.raises((lk.ProviderUnavailable, lk.CircuitOpen)):
        await breaker(boom)()


async def succeed_once(breaker: lk.Breaker) -> str:
    async def ok() -> str:
        return "ok"

    return await breaker(ok)()


# --- configuration -------------------------------------------------------------------------------


def test_bad_configuration_fails_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"RedisStore\.url"):
        lk.RedisStore("http://127.0.0.1:6379")
    with pytest.raises(ValueError, match=r"RedisStore\.namespace"):
        lk.RedisStore(namespace="has space")
    with pytest.raises(ValueError, match=r"RedisStore\.interval"):
        lk.RedisStore(interval=0)
    with pytest.raises(ValueError, match=r"RedisStore\.stale_after"):
        lk.RedisStore(interval=1.0, stale_after=0.5)
    with pytest.raises(TypeError, match=r"breaker\.shared"):
        lk.Breaker("x", shared="redis://")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use_store"):
        lk.use_store("redis://")  # type: ignore[arg-type]


def test_the_password_never_shows() -> None:
    store = lk.RedisStore("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in repr(store)
    assert "user" not in repr(store)
    with pytest.raises(ValueError, match=r"RedisStore\.url") as info:
        lk.RedisStore("http://user:s3cret@host/0")
    assert "s3cret" not in str(info.value)


def test_use_store_returns_the_previous_default(redis_server: RedisServer) -> None:
    store = lk.RedisStore(redis_server.url)
    assert lk.use_store(store) is None
    assert fleet.current_store() is store
    assert lk.use_store(None) is store


# --- breakers ----------------------------------------------------------------------------------


async def test_an_outage_seen_by_one_process_opens_the_breaker_of_the_others(
    stores: list[lk.RedisStore],
) -> None:
    seeing, other = make_breaker(stores[0]), make_breaker(stores[1])
    await succeed_once(seeing)  # a breaker's first use registers its key with its store
    await succeed_once(other)
    await until(lambda: stores[0].available and stores[1].available)
    await until(lambda: seeing.state is BreakerState.CLOSED and seeing._fleet_view()[1] is not None)
    for _ in range(4):
        await fail_once(seeing)
    await until(lambda: other.state is BreakerState.OPEN)
    with pytest.raises(lk.CircuitOpen) as info:
        await succeed_once(other)
    assert info.value.half_open_in is not None and 0 < info.value.half_open_in <= 0.3
    assert other.metrics().failures == 4  # the fleet's window


async def test_half_open_probes_are_bounded_across_the_fleet(
    stores: list[lk.RedisStore],
) -> None:
    a, b = make_breaker(stores[0]), make_breaker(stores[1])
    await succeed_once(b)
    await until(lambda: a._fleet_view()[1] is not None and b._fleet_view()[1] is not None)
    for _ in range(4):
        await fail_once(a)
    await until(lambda: b.state is BreakerState.OPEN)
    await anyio.sleep(0.35)  # the open spell is over: the fleet hands out two probes

    admitted = 0
    release = anyio.Event()

    async def hold() -> None:
        nonlocal admitted
        admitted += 1
        await release.wait()

    async def try_probe(breaker: lk.Breaker) -> None:
        with contextlib.suppress(lk.CircuitOpen):
            await breaker(hold)()

    async with anyio.create_task_group() as tg:
        for breaker in (a, b, a, b, a, b):
            tg.start_soon(try_probe, breaker)
        await until(lambda: admitted >= 2)
        await anyio.sleep(0.1)  # any seventh admission would show now
        assert admitted == 2
        release.set()
    # Both probes succeeded: the fleet closes, and both processes see it.
    await until(lambda: a.state is BreakerState.CLOSED and b.state is BreakerState.CLOSED)
    assert await succeed_once(b) == "ok"


async def test_isolate_and_reset_reach_the_fleet(stores: list[lk.RedisStore]) -> None:
    a, b = make_breaker(stores[0], "isolated"), make_breaker(stores[1], "isolated")
    await succeed_once(b)
    await until(lambda: a._fleet_view()[1] is not None)
    a.isolate()
    await until(lambda: b.state is BreakerState.FORCED_OPEN)
    with pytest.raises(lk.CircuitOpen):
        await succeed_once(b)
    a.reset()
    await until(lambda: b.state is BreakerState.CLOSED)


async def test_use_store_is_the_one_switch(redis_server: RedisServer) -> None:
    stores = [lk.RedisStore(redis_server.url, interval=FAST) for _ in range(2)]
    try:
        lk.use_store(stores[0])
        first = lk.Breaker("switch", window_size=10, minimum_calls=4)  # no shared=: the default
        second = lk.Breaker("switch", window_size=10, minimum_calls=4, shared=stores[1])
        await succeed_once(second)
        await until(lambda: first._fleet_view()[1] is not None)
        for _ in range(4):
            await fail_once(first)
        await until(lambda: second.state is BreakerState.OPEN)
    finally:
        for store in stores:
            store.close()


# --- budgets and quotas --------------------------------------------------------------------------


async def test_a_budget_caps_the_fleets_extra_requests(stores: list[lk.RedisStore]) -> None:
    budgets = [lk.RetryBudget(0.5, ttl=60, name="hedges", shared=store) for store in stores]
    for _ in range(10):  # ten calls in the fleet, all in the first process: 5 extra requests
        budgets[0].deposit()
    await until(lambda: all(b.balance >= 1 for b in budgets) and budgets[1].balance >= 4)
    granted = 0
    with anyio.fail_after(10):
        while sum(b.balance for b in budgets) >= 1 or granted < 5:
            for budget in budgets:
                granted += budget.try_withdraw()
            await anyio.sleep(FAST / 2)
            if granted >= 5:
                break
    await anyio.sleep(5 * FAST)
    assert granted == 5
    assert not any(budget.try_withdraw() for budget in budgets)


async def test_a_tenants_quota_is_the_fleets(stores: list[lk.RedisStore]) -> None:
    quota = Quota(requests_per_second=0.01, request_burst=3)
    limiters = [Limiter(tenant_quota=quota, max_wait=0, shared=store) for store in stores]
    for store in stores:
        store.breaker("warm-up", make_breaker(store)._fleet_options)  # start the refresh
    await until(lambda: all(store.available for store in stores))

    async def call(limiter: Limiter) -> bool:
        async def ok() -> str:
            return "ok"

        try:
            with lk.policies.limiter.tenant("acme"):
                await limiter(ok)()
        except lk.LimitExceeded:
            return False
        return True

    admitted = [await call(limiters[i % 2]) for i in range(8)]
    assert sum(admitted) == 3  # the burst, once for the fleet (per process it would be 6)


# --- failure --------------------------------------------------------------------------------------


async def test_calls_go_on_when_redis_dies_and_resync_when_it_returns(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.2, stale_after=0.2)
    seen: list[events.Event] = []
    subscription = events.subscribe(seen.append)
    try:
        breaker = make_breaker(store, "resilient")
        await succeed_once(breaker)
        await until(lambda: store.available)
        with caplog.at_level(logging.WARNING, logger="latencykit"):
            redis_server.kill()
            await until(lambda: not store.available)
            with anyio.fail_after(2):  # never waits on the dead server, never fails a call
                for _ in range(20):
                    assert await succeed_once(breaker) == "ok"
            for _ in range(10):  # the local breaker protects the process meanwhile
                await fail_once(breaker)
            assert breaker.state == BreakerState.OPEN
            await anyio.sleep(0.1)
            unavailable = [e for e in seen if isinstance(e, fleet.StoreUnavailable)]
            assert len(unavailable) == 1  # once per outage, not per refresh
            assert unavailable[0].reason in {"ConnectionError", "TimeoutError"}
            warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
            assert len(warnings) == 1

            redis_server.start()
            await until(lambda: store.available)
            await until(lambda: any(isinstance(e, fleet.StoreRecovered) for e in seen))
            # The fleet, which never saw the failures, is closed again: its state wins.
            await until(lambda: breaker.state is BreakerState.CLOSED)
            assert await succeed_once(breaker) == "ok"
    finally:
        subscription.close()
        store.close()


async def test_garbage_from_the_server_is_a_failure_not_a_crash(
    redis_server: RedisServer,
) -> None:
    import redis

    store = lk.RedisStore(redis_server.url, interval=FAST, namespace="garbage")
    try:
        breaker = make_breaker(store, "mangled")
        await succeed_once(breaker)
        await until(lambda: store.available)
        client = redis.Redis.from_url(redis_server.url)
        client.set("garbage:breaker:{mangled}", "not a hash")  # the script now errors
        await until(lambda: not store.available)
        assert await succeed_once(breaker) == "ok"  # local state: the call goes on
        client.delete("garbage:breaker:{mangled}")
        await until(lambda: store.available)
        client.close()
    finally:
        store.close()


async def test_keys_are_namespaced_and_expire(redis_server: RedisServer) -> None:
    import redis

    store = lk.RedisStore(redis_server.url, interval=FAST, namespace="app1")
    try:
        breaker = make_breaker(store, "ttl")
        budget = lk.RetryBudget(0.1, name="ttl", shared=store)
        await succeed_once(breaker)
        budget.deposit()
        await until(lambda: store.available and budget.balance is not None)
        await anyio.sleep(5 * FAST)
        client = redis.Redis.from_url(redis_server.url)
        keys = sorted(key.decode() for key in client.keys("*"))  # type: ignore[union-attr]
        assert keys and all(key.startswith("app1:") for key in keys)
        assert all(client.pttl(key) > 0 for key in keys)  # every key has a TTL
        client.close()
    finally:
        store.close()
