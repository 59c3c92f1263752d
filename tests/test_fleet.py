"""Fleet-wide state on a real redis-server (started on 127.0.0.1 by the ``redis_server``
fixture). Several ``RedisStore`` objects on one server stand for several processes: each has
its own view, refresh task and queues, exactly as separate processes would."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import latencykit as lk
from helpers import until
from latencykit import events, fleet
from latencykit.policies.breaker import BreakerState, reset_breakers
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
    reset_breakers()  # registered breakers hold this test's stores


def make_breaker(store: lk.RedisStore, key: str = "openai", **options: Any) -> lk.Breaker:
    """A new breaker of ``key``, as another process would have: the registry is forgotten."""
    reset_breakers()
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
    # The address stays as written (an IPv6 host keeps its brackets).
    store = lk.RedisStore("redis://:s3cret@[::1]:6379/0")
    assert repr(store) == "RedisStore('redis://***@[::1]:6379/0', namespace='latencykit')"
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
        reset_breakers()  # the second is another process's
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
        make_breaker(store, "warm-up")._fleet_view()  # start the refresh
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


# --- latency windows ----------------------------------------------------------------------------


async def test_latency_windows_pool_the_fleets_samples(
    stores: list[lk.RedisStore], redis_server: RedisServer
) -> None:
    from latencykit.stats import Recorder

    here, there = (Recorder(shared=store) for store in stores)
    assert there.latency_window("gpt", ttft=True).count() == 0
    for i in range(1, 21):
        here.first_chunk("gpt", 0.05 * i)
    await until(lambda: there.latency_window("gpt", ttft=True).count() == 20)
    assert there.latency_window("gpt", ttft=True).quantile(0.5) == pytest.approx(0.5)
    await anyio.sleep(5 * FAST)
    assert here.latency_window("gpt", ttft=True).count() == 20  # its own samples come once
    assert there.latency_window("gpt").count() == 0  # end-to-end windows are another stream

    late = lk.RedisStore(redis_server.url, interval=FAST)
    try:  # a process that starts now starts warm: the window's samples come at once
        newcomer = Recorder(shared=late)
        await until(lambda: newcomer.latency_window("gpt", ttft=True).count() == 20)
    finally:
        late.close()


async def test_an_llm_hands_its_store_to_its_breakers_and_windows(
    stores: list[lk.RedisStore],
) -> None:
    llm = lk.LLM(
        "openai/fleet-model",
        api_base="http://127.0.0.1:9/v1",
        api_key="sk-test",
        breaker={"minimum_calls": 3},
        hedge=lk.hedge(lk.quantile(0.9)),
        shared=stores[0],
    )
    assert llm.shared is stores[0]
    assert llm._recorder.shared is stores[0]
    assert lk.breaker("openai/fleet-model", minimum_calls=3, shared=stores[0]).shared is stores[0]
    with pytest.raises(TypeError, match=r"LLM\.shared"):
        lk.LLM("openai/x", shared="redis://")  # type: ignore[arg-type]


async def test_an_unreachable_store_is_an_event_a_log_line_and_a_metric(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from latencykit import telemetry

    port = redis_server.port
    redis_server.stop()  # nothing listens there now
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    seen: list[events.Event] = []
    store = lk.RedisStore(f"redis://:pw-s3cret@127.0.0.1:{port}/0", interval=FAST)
    with (
        caplog.at_level(logging.WARNING, logger="latencykit"),
        telemetry.instrument(meter_provider=meter_provider),
        events.subscribe(seen.append),
    ):
        try:
            breaker = make_breaker(store, "unreachable")
            assert await succeed_once(breaker) == "ok"  # local state: the call goes on
            await until(lambda: any(isinstance(e, fleet.StoreUnavailable) for e in seen))
            await anyio.sleep(10 * FAST)  # more failed refreshes: still one outage
        finally:
            store.close()
        data = reader.get_metrics_data()
    points = [
        point
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "latencykit.store.unavailable"
        for point in metric.data.data_points
    ]
    assert [getattr(point, "value", None) for point in points] == [1]
    outage = next(e for e in seen if isinstance(e, fleet.StoreUnavailable))
    assert outage.reason == "ConnectionError"
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "unavailable" in logged
    assert "s3cret" not in logged and "s3cret" not in repr(seen)
    meter_provider.shutdown()


async def test_a_hung_server_never_holds_a_call(redis_server: RedisServer) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.1)
    try:
        breaker = make_breaker(store, "hung")
        limiter = Limiter(tenant_quota=Quota(requests_per_second=100.0), shared=store)
        await succeed_once(breaker)
        await until(lambda: store.available)
        redis_server.pause()  # accepts connections, answers nothing
        try:
            await until(lambda: not store.available)
            with anyio.fail_after(2):  # each call is bounded by the store's timeout, at most
                for _ in range(5):
                    assert await succeed_once(breaker) == "ok"
                    with lk.policies.limiter.tenant("acme"):
                        assert await limiter(checkpoint_ok)() == "ok"
        finally:
            redis_server.resume()
        await until(lambda: store.available)
    finally:
        store.close()


async def checkpoint_ok() -> str:
    await anyio.lowlevel.checkpoint()
    return "ok"
