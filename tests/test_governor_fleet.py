"""The governor's rooms shared by the fleet: ``LLM(governor=True, shared=RedisStore(...))`` on a
real redis-server (the ``redis_server`` fixture; under ``CI=true`` a missing one fails) and the
fake provider's quota over real HTTP.

A process has one room per (target, API key); two "processes" in one test are two
:class:`~latencykit.ratelimit.Room` objects, each with its own store (its own lease, view and
refresh task), exactly as separate processes would have.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from helpers import until
from latencykit import ratelimit
from latencykit._cancel import process_clock
from latencykit.ratelimit import RateLimits, Room
from latencykit.testing import FakeProvider, ProviderQuota, RedisServer

pytestmark = pytest.mark.anyio

FAST = 0.02  # refresh interval of the stores under test (seconds)
KEY = "sk-fleet-room-0123456789"
ROTATED = "sk-fleet-room-9876543210"
MESSAGES = [{"role": "user", "content": "x" * 40}]  # 10 prompt tokens
INTERACTIVE = 0


@pytest.fixture(autouse=True)
def _fresh_rooms() -> Iterator[None]:
    """Rooms are process-wide; no default store leaks in or out."""
    ratelimit._rooms.clear()
    previous = lk.use_store(None)
    yield
    lk.use_store(previous)
    ratelimit._rooms.clear()


@pytest.fixture
def ample() -> Iterator[FakeProvider]:
    """A provider with room for every test here: 6,000 requests and 600,000 tokens a minute."""
    with FakeProvider(
        quota=ProviderQuota(requests_per_minute=6000, tokens_per_minute=600_000)
    ) as provider:
        yield provider


def governed(fake: FakeProvider, store: lk.RedisStore, **options: Any) -> lk.LLM:
    return lk.LLM(
        options.pop("model", "openai/m"),
        api_base=options.pop("api_base", fake.base_url),
        api_key=options.pop("api_key", KEY),
        transport=options.pop("transport", "openai"),
        governor=True,
        shared=store,
        **options,
    )


async def answer(llm: lk.LLM, **kwargs: Any) -> None:
    await llm.acompletion(messages=MESSAGES, max_tokens=16, **kwargs)


def fleet_room(redis_server: RedisServer, target: str, api_key: str) -> dict[str, float]:
    """The room as the server keeps it."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        key = f"latencykit:room:{{{target}:{ratelimit.key_hash(api_key)}}}"
        stored = client.hgetall(key)
        return {name.decode(): float(value) for name, value in stored.items()}  # type: ignore[union-attr]
    finally:
        client.close()


async def test_two_workers_spend_one_room(redis_server: RedisServer) -> None:
    # A view stays fresh for 5 s: a refresh late on a loaded machine does not send a worker
    # to its own room (which, knowing nothing, would let one call find out).
    stores = [
        lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5, stale_after=5.0)
        for _ in range(2)
    ]
    rooms = [Room(), Room()]
    try:
        for room, store in zip(rooms, stores, strict=True):
            room.attach(store.room("openai/m", ratelimit.key_hash(KEY)))
        # Worker 0 hears an answer: 3 of 6 requests left (one back every 10 s).
        rooms[0].read(RateLimits(6, 3, 30.0, 600, 600, 0.0), process_clock())

        def told() -> bool:
            views = [room.lease.view() if room.lease else None for room in rooms]
            return all(view is not None and view.requests_limit == 6 for view in views)

        await until(told)
        taken = [0, 0]
        with anyio.move_on_after(1.0):  # both workers try, over many refreshes
            while True:
                for index, room in enumerate(rooms):
                    wait, _, fleet = room.take(10, process_clock(), INTERACTIVE)
                    if wait <= 0:
                        assert fleet
                        taken[index] += 1
                await anyio.sleep(FAST / 2)
        # Alone, each would have spent the 3 it heard of: 6, 3 of them refused.
        assert sum(taken) == 3
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("form", ["openai", "anthropic"])
async def test_each_header_form_tells_the_fleet(
    redis_server: RedisServer, quota: FakeProvider, form: str
) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5)
    try:
        if form == "openai":
            llm = governed(quota, store)
        else:
            llm = governed(
                quota,
                store,
                model="anthropic/m",
                api_base=quota.anthropic_base_url,
                transport="litellm",
            )
        await answer(llm)
        target = llm.targets[0].key
        await until(lambda: fleet_room(redis_server, target, KEY).get("r_limit") == 6)
        room = fleet_room(redis_server, target, KEY)
        assert room["t_limit"] == 600
        assert room["r_level"] <= 5.5  # what the answer said was left (refilling), less leases
        assert room["r_rate"] == pytest.approx(6 / 60)  # per minute: one every 10 s
    finally:
        store.close()


async def test_the_lease_makes_no_round_trip_per_call(
    redis_server: RedisServer, ample: FakeProvider
) -> None:
    import redis

    store = lk.RedisStore(redis_server.url, interval=0.25, timeout=0.5)
    client = redis.Redis.from_url(redis_server.url)
    try:
        llm = governed(ample, store)
        await answer(llm)
        await until(lambda: (view := store.room("openai/m", ratelimit.key_hash(KEY)).view())
                    is not None and view.requests_limit == 6000)  # fmt: skip
        for _ in range(10):  # the lease learns the pace
            await answer(llm)
        client.config_resetstat()
        started = process_clock()
        calls = 60
        for _ in range(calls):
            await answer(llm)
        elapsed = process_clock() - started
        stats = client.info("commandstats")
        round_trips = stats.get("cmdstat_evalsha", {}).get("calls", 0)
        # One refresh per interval, and a few more when the lease ran out: far fewer than calls.
        assert round_trips <= elapsed / 0.25 + 2 + calls // 4, (round_trips, elapsed)
        assert round_trips < calls // 2
        room = llm.stats()["openai/m"].room
        # At most the first calls waited, a round trip, for the first lease.
        assert room is not None and room.fleet and room.waits <= 2
        assert 429 not in [a.status for a in ample.attempts]
    finally:
        client.close()
        store.close()


async def test_calls_go_on_when_redis_dies_and_the_room_resyncs(
    redis_server: RedisServer, ample: FakeProvider
) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.2, stale_after=0.2)
    try:
        llm = governed(ample, store, deadline=5.0)
        await answer(llm)
        await until(lambda: fleet_room(redis_server, "openai/m", KEY).get("r_limit") == 6000)
        redis_server.kill()
        await until(lambda: not store.available)
        with anyio.fail_after(5):  # never waits on the dead server, never fails a call
            for _ in range(20):
                await answer(llm)
        room = llm.stats()["openai/m"].room
        assert room is not None and not room.fleet  # the process's own room meanwhile
        redis_server.start()  # empty: the room is lost
        await until(lambda: store.available)
        await answer(llm)
        # The worker tells the new server what it knows: the room is the fleet's again.
        await until(lambda: fleet_room(redis_server, "openai/m", KEY).get("r_limit") == 6000)
        await until(lambda: (r := llm.stats()["openai/m"].room) is not None and r.fleet)
        assert 429 not in [a.status for a in ample.attempts]
    finally:
        store.close()


def told(redis_server: RedisServer, api_key: str) -> bool:
    return "r_limit" in fleet_room(redis_server, "openai/m", api_key)


async def test_a_rotated_key_is_a_room_of_its_own_and_no_key_reaches_redis(
    redis_server: RedisServer, ample: FakeProvider
) -> None:
    import redis

    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5)
    client = redis.Redis.from_url(redis_server.url)
    try:
        await answer(governed(ample, store))
        await answer(governed(ample, store, api_key=ROTATED))  # rotated mid-run
        for key in (KEY, ROTATED):
            await until(functools.partial(told, redis_server, key))
        everything = b""
        redis_client: Any = client  # redis' stubs type replies as bytes | str | Awaitable
        for name in redis_client.keys("*"):
            everything += name
            if redis_client.type(name) == b"hash":
                pairs = redis_client.hgetall(name).items()
                everything += b"".join(k + v for k, v in pairs)
            elif redis_client.type(name) == b"zset":
                everything += b"".join(redis_client.zrange(name, 0, -1))
        assert KEY.encode() not in everything and ROTATED.encode() not in everything
        assert ratelimit.key_hash(KEY).encode() in everything
        assert ratelimit.key_hash(ROTATED).encode() in everything
    finally:
        client.close()
        store.close()


@pytest.mark.parametrize("headers", ["missing", "full"])
async def test_without_honest_headers_the_fleet_falls_back_to_the_429(
    redis_server: RedisServer, quota: FakeProvider, headers: str
) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5)
    try:
        assert [await _plain(quota) for _ in range(6)] == [200] * 6  # spent elsewhere
        behaviour = {"extra_headers": {"x-fake-behavior": json.dumps({"limit_headers": headers})}}
        llm = governed(quota, store, deadline=2.0, defaults=behaviour)
        with pytest.raises(lk.RateLimited):
            await answer(llm)  # nothing (or a lie) learned: sent, refused
        sent = len(quota.attempts)
        with pytest.raises(lk.LimitExceeded):
            await answer(llm)  # the 429's retry-after (10 s) does not fit the deadline
        assert len(quota.attempts) == sent
    finally:
        store.close()


async def _plain(fake: FakeProvider) -> int:
    import httpx

    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake.base_url}/chat/completions",
            json={"model": "m", "messages": MESSAGES, "max_tokens": 1},
            headers={"authorization": f"Bearer {KEY}"},
        )
    return response.status_code


@pytest.mark.parametrize("skew", [-20.0, 40.0])
async def test_a_skewed_reset_keeps_the_per_minute_pace_on_the_servers_clock(
    redis_server: RedisServer, quota: FakeProvider, skew: float
) -> None:
    store = lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5)
    try:
        behaviour = {"extra_headers": {"x-fake-behavior": json.dumps({"reset_skew": skew})}}
        await answer(governed(quota, store, defaults=behaviour))
        await until(lambda: "r_limit" in fleet_room(redis_server, "openai/m", KEY))
        room = fleet_room(redis_server, "openai/m", KEY)
        # The provider says "full in 10 s + skew": never slower than a per-minute limit, and
        # (a reset told too soon) at most the pace the reset told.
        assert room["r_rate"] >= 6 / 60
        told = 1 / max(10.0 + skew, 1e-9)
        assert room["r_rate"] <= max(6 / 60, told) + 1e-9
    finally:
        store.close()


# --- a room nobody has heard of: one probe for the fleet ------------------------------------


def _attached(redis_server: RedisServer, workers: int) -> tuple[list[lk.RedisStore], list[Room]]:
    """``workers`` workers (a store and a room each), attached to one fleet room."""
    stores = [
        lk.RedisStore(redis_server.url, interval=FAST, timeout=0.5, stale_after=5.0)
        for _ in range(workers)
    ]
    rooms = [Room() for _ in stores]
    for room, store in zip(rooms, stores, strict=True):
        room.attach(store.room("openai/m", ratelimit.key_hash(KEY)))
    return stores, rooms


async def _sent_over(rooms: list[Room], seconds: float) -> list[int]:
    """How many calls each worker's room let go while every worker keeps trying, none coming
    back: until one went (within 10 s: a loaded machine's refreshes may be late), then for
    ``seconds`` more (many refreshes)."""
    sent = [0] * len(rooms)

    async def trying() -> None:
        while True:
            for index, room in enumerate(rooms):
                wait, _, fleet = room.take(10, process_clock())
                if wait <= 0:
                    assert not fleet  # nothing is leased before the fleet is told
                    sent[index] += 1
            await anyio.sleep(FAST / 2)

    async with anyio.create_task_group() as group:
        group.start_soon(trying)
        await until(lambda: sum(sent) > 0)
        await anyio.sleep(seconds)
        group.cancel_scope.cancel()
    return sent


async def test_one_worker_finds_out_a_room_nobody_has_heard_of(redis_server: RedisServer) -> None:
    stores, rooms = _attached(redis_server, 3)
    try:
        await until(lambda: all(room.lease and room.lease.view() for room in rooms))
        # One probe for the fleet, one call at a time: without it, one per worker.
        sent = await _sent_over(rooms, 1.0)
        assert sorted(sent) == [0, 0, 1]
        prober = rooms[sent.index(1)]
        assert all(r.requests.limit is None for r in rooms)
        prober.release(10, False)
        prober.read(RateLimits(6, 5, 10.0, 600, 590, 1.0), process_clock())  # its answer

        def told() -> bool:
            views = [room.lease.view() if room.lease else None for room in rooms]
            return all(view is not None and view.requests_limit == 6 for view in views)

        await until(told)
        # Every worker now spends from the fleet's room: 5 left, no more.
        taken = 0
        with anyio.move_on_after(2.0):
            while True:
                for room in rooms:
                    wait, _, fleet = room.take(10, process_clock())
                    if wait <= 0:
                        assert fleet
                        taken += 1
                await anyio.sleep(FAST / 2)
        assert 3 <= taken <= 5  # the room refills 0.1 a second; a lease holds it whole
        assert fleet_room(redis_server, "openai/m", KEY)["r_limit"] == 6
    finally:
        for store in stores:
            store.close()


async def test_an_answer_that_tells_no_limits_frees_the_fleet(redis_server: RedisServer) -> None:
    stores, rooms = _attached(redis_server, 2)
    try:
        await until(lambda: all(room.lease and room.lease.view() for room in rooms))
        sent = await _sent_over(rooms, 0.5)
        assert sorted(sent) == [0, 1]
        prober = rooms[sent.index(1)]
        prober.release(10, False)
        prober.came_back()  # a host that tells no limits: nothing to find out, nothing paced
        await until(lambda: fleet_room(redis_server, "openai/m", KEY).get("answered") == 1)
        # Each worker alone: one call finds out (as without a store), then none is held back.
        other = rooms[1 - sent.index(1)]
        assert (await _sent_over([other], 0.5)) == [1]
        other.release(10, False)
        other.came_back()
        assert (await _sent_over(rooms, 0.2))[0] > 1
    finally:
        for store in stores:
            store.close()


@pytest.mark.slow  # subprocesses: fresh interpreters import latencykit
def test_four_processes_send_one_probe_to_a_room_nobody_has_heard_of(
    redis_server: RedisServer, ample: FakeProvider
) -> None:
    import fleet_worker
    from latencykit.testing import Behavior
    from test_fleet_processes import CTX, STARTUP, Workers

    ample.script("m", Behavior(ttft=0.5))  # the probe's answer takes its time
    workers, go, calls = Workers(), CTX.Event(), 4
    try:
        for _ in range(4):
            workers.start(
                fleet_worker.probe_a_room, redis_server.url, ample.base_url, KEY, go, calls
            )
        workers.expect("ready", STARTUP)
        go.set()
        done = workers.expect("done", 60.0)
    finally:
        workers.close()
    assert sum(done.values()) == 4 * calls
    attempts = sorted(ample.attempts, key=lambda a: a.arrived_at)
    first_answer = min(a.ended_at for a in attempts if a.ended_at is not None)
    # Until the first answer came back, one request: the fleet's probe, not one per process.
    assert [a.arrived_at < first_answer for a in attempts].count(True) == 1
    assert {a.status for a in attempts} == {200}


async def test_a_worker_alone_goes_on_from_the_fleets_last_word(redis_server: RedisServer) -> None:
    stores, rooms = _attached(redis_server, 2)
    idle, busy = rooms
    try:
        # 600 requests a minute, none left: 10 a second refill, for the fleet.
        idle.read(RateLimits(600, 0, 60.0, 600_000, 600_000, 0.0), process_clock())
        await until(
            lambda: all((v := r.lease and r.lease.view()) and v.requests_limit for r in rooms)
        )
        assert idle.take(10, process_clock())[0] > 0  # it spends from the fleet's room
        with anyio.move_on_after(2.0):  # the other worker spends all that refills meanwhile
            while True:
                busy.take(10, process_clock())
                await anyio.sleep(FAST / 4)
        redis_server.kill()
        await until(lambda: idle.lease is not None and idle.lease.view() is None)
        # Its own word is 2 s old (20 requests of refill, its share 10), all spent by the
        # other: it goes on from the fleet's last word (what the other did not lease, about
        # 1, and its own lease, at most 1), refilling from now, at its share (1/2).
        went = 0
        for _ in range(20):
            wait, _, fleet = idle.take(10, process_clock())
            if wait > 0:
                break
            assert not fleet
            went += 1
        assert went <= 2
    finally:
        for store in stores:
            store.close()


async def test_a_restarted_server_learns_the_room_without_the_refill_spent_alone(
    redis_server: RedisServer,
) -> None:
    stores, rooms = _attached(redis_server, 1)
    room = rooms[0]
    try:
        room.read(RateLimits(600, 600, 0.0, 60_000, 60_000, 0.0), process_clock())
        await until(lambda: "r_limit" in fleet_room(redis_server, "openai/m", KEY))
        redis_server.kill()
        await until(lambda: room.lease is not None and room.lease.view() is None)
        # Alone, it hears the quota spent (10 requests and 1,000 tokens refill a second), and
        # spends its share of the refill while the server is away.
        room.read(RateLimits(600, 0, 60.0, 60_000, 0, 60.0), process_clock())
        await anyio.sleep(1.0)
        redis_server.start()  # empty
        await until(lambda: "r_limit" in fleet_room(redis_server, "openai/m", KEY))
        told = fleet_room(redis_server, "openai/m", KEY)
        # The word it tells again is over a second old: its refill since was the fleet's,
        # spent alone (the other workers' answers, merged next, only lower the room), so the
        # room starts from what it said, not from 10 requests and 1,000 tokens more.
        assert told["r_level"] < 2 and told["t_level"] < 200, told
    finally:
        for store in stores:
            store.close()
