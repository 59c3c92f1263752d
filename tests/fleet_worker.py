"""What each worker process of ``tests/test_fleet_processes.py`` (and of the fleet test of
``tests/test_governor_fleet.py``) runs.

Every entry point takes its index, the queue it reports on and the events the parent sets to
move it from one phase to the next. A worker reports ``(index, kind, payload)`` tuples: one
per phase it reaches, and ``"error"`` with a traceback if anything fails, so the parent never
waits for a worker that died. Workers run on asyncio or trio (``backend``); every wait is
bounded.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Coroutine
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any

import anyio
import anyio.lowlevel

import latencykit as lk
from latencykit import events, fleet
from latencykit.policies.breaker import BreakerState
from latencykit.policies.limiter import Limiter, Quota, tenant

INTERVAL = 0.05  # the stores' refresh interval (seconds)
WAIT = 15.0  # the longest a worker waits for anything: the parent's own bounds are shorter
MESSAGES = [{"role": "user", "content": "hi"}]


class Boom:
    """A dead provider: an async function that always fails transiently, counting calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        raise lk.ProviderUnavailable("down", target="t", status_code=503)


async def ok() -> str:
    await anyio.lowlevel.checkpoint()
    return "ok"


async def until(predicate: Callable[[], bool]) -> float:
    """Poll ``predicate()`` until it holds (within ``WAIT``); the seconds it took."""
    started = time.monotonic()
    with anyio.fail_after(WAIT):
        while not predicate():  # noqa: ASYNC110 - state changed by another thread or process
            await anyio.sleep(0.005)
    return time.monotonic() - started


async def wait_for(event: ProcessEvent) -> float:
    """Wait for the parent to set ``event``; the seconds it took."""
    return await until(event.is_set)


def run(
    main: Callable[..., Coroutine[Any, Any, None]],
    index: int,
    report: Queue[tuple[int, str, Any]],
    backend: str,
    *args: Any,
) -> None:
    """Run ``main(index, report, *args)`` on ``backend``, reporting any failure."""
    try:
        anyio.run(main, index, report, *args, backend=backend)
    except BaseException:
        report.put((index, "error", traceback.format_exc()))
        raise


async def fail_calls(breaker: lk.Breaker, dead: Boom, n: int) -> None:
    """Make ``n`` calls to ``dead`` through ``breaker``."""
    for _ in range(n):
        with contextlib.suppress(lk.ProviderUnavailable, lk.CircuitOpen):
            await breaker(dead)()


def fleet_ready(breaker: lk.Breaker) -> bool:
    """Whether the breaker reads the fleet's state (its store has refreshed it at least once
    since the breaker registered)."""
    return breaker._fleet_view()[1] is not None


# --- a. one breaker and one budget shared by the fleet ------------------------------------


async def share_breaker_and_budget(
    index: int,
    report: Queue[tuple[int, str, Any]],
    url: str,
    fail: ProcessEvent,
    spend: ProcessEvent,
    granted_total: Any,  # a multiprocessing Value("i")
    tokens: int,
) -> None:
    """Worker 0 fails the shared breaker's calls; every worker sees it open and refuses.
    Then every worker deposits into the shared budget and withdraws until the fleet has
    taken ``tokens`` tokens, and goes on trying a while longer (an over-spend would show)."""
    store = lk.RedisStore(url, interval=INTERVAL, timeout=1.0, stale_after=5.0)
    try:
        breaker = lk.Breaker(
            "fleet-a", window_size=20, minimum_calls=8, open_duration=120, shared=store
        )
        budget = lk.RetryBudget(0.25, ttl=120, name="fleet-a", shared=store)
        shared_budget = store.budget("fleet-a", ratio=0.25, ttl=120.0, reserve=0.0)
        breaker.allows()  # registers the breaker with the store, without counting a call
        await until(lambda: fleet_ready(breaker) and shared_budget.balance() is not None)
        report.put((index, "ready", None))

        await wait_for(fail)
        dead = Boom()
        if index == 0:
            # All 8 admitted: the fleet learns of them at the next refresh.
            await fail_calls(breaker, dead, 8)
        seen_after = await until(lambda: breaker.state is BreakerState.OPEN)
        sent = dead.calls
        refused = 0
        for _ in range(3):
            try:
                await breaker(dead)()
            except lk.CircuitOpen:
                refused += 1
            except lk.ProviderUnavailable:
                pass  # it reached the dead provider: counted in dead.calls
        found = {"after": seen_after, "sent": sent, "more": dead.calls - sent, "refused": refused}
        report.put((index, "open", found))

        await wait_for(spend)
        for _ in range(10):  # 10 calls x ratio 0.25: this process earns the fleet 2.5 tokens
            budget.deposit()
        granted, local = 0, 0
        deadline = time.monotonic() + WAIT - 3
        all_taken_at: float | None = None
        while time.monotonic() < deadline:
            fleet_view = shared_budget.balance() is not None
            if budget.try_withdraw():
                granted += 1
                local += not fleet_view
                with granted_total.get_lock():
                    granted_total.value += 1
            if all_taken_at is None and granted_total.value >= tokens:
                all_taken_at = time.monotonic()
            if all_taken_at is not None and time.monotonic() - all_taken_at > 1.0:
                break  # a second more of trying, to catch any token granted twice
            await anyio.sleep(0.005)
        report.put((index, "spent", {"granted": granted, "local": local}))
    finally:
        store.close()


# --- b. Redis killed mid-run and restarted ------------------------------------------------


async def ride_out_an_outage(
    index: int,
    report: Queue[tuple[int, str, Any]],
    url: str,
    fail: ProcessEvent,
    stop: ProcessEvent,
    outages: int,
) -> None:
    """Call through a shared breaker, budget and tenant quota in a loop, reporting when the
    store is up, then down and back ``outages`` times; after that worker 0 opens another
    shared breaker, which every worker must see."""
    store = lk.RedisStore(url, interval=INTERVAL, timeout=0.25)
    seen: list[events.Event] = []
    subscription = events.subscribe(seen.append)
    stats = {"calls": 0, "errors": 0, "while_down": 0, "max_seconds": 0.0}
    errors: list[str] = []
    try:
        breaker = lk.Breaker(
            "fleet-b", window_size=10, minimum_calls=5, open_duration=120, shared=store
        )
        after = lk.Breaker(
            "fleet-b-after", window_size=10, minimum_calls=5, open_duration=120, shared=store
        )
        budget = lk.RetryBudget(0.2, ttl=60, name="fleet-b", shared=store)
        limiter = Limiter(
            tenant_quota=Quota(requests_per_second=100_000, request_burst=100_000),
            max_wait=0,
            shared=store,
        )
        guarded = breaker(limiter(ok))
        after.allows()

        async def call_in_a_loop() -> None:
            while not stop.is_set():
                down = not store.available
                started = time.monotonic()
                try:
                    with anyio.fail_after(5.0), tenant("acme"):
                        budget.deposit()
                        await guarded()
                        if stats["calls"] % 5 == 0:
                            budget.try_withdraw()
                except Exception as exc:  # any error is a failure of the test
                    stats["errors"] += 1
                    errors.append(repr(exc))
                took = time.monotonic() - started
                stats["calls"] += 1
                stats["while_down"] += down and not store.available
                stats["max_seconds"] = max(stats["max_seconds"], took)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_in_a_loop)
            await until(lambda: store.available and fleet_ready(breaker) and fleet_ready(after))
            report.put((index, "up", None))
            for outage in range(outages):
                await until(lambda: not store.available)
                report.put((index, f"down {outage}", dict(stats)))
                await until(lambda: store.available and fleet_ready(breaker) and fleet_ready(after))
                report.put((index, f"back {outage}", dict(stats)))

            await wait_for(fail)
            dead = Boom()
            if index == 0:
                await fail_calls(after, dead, 5)
            seen_after = await until(lambda: after.state is BreakerState.OPEN)
            sent = dead.calls
            refused = False
            try:
                await after(dead)()
            except lk.CircuitOpen:
                refused = True
            except lk.ProviderUnavailable:
                pass
            report.put((index, "open", {"after": seen_after, "sent": sent, "refused": refused}))
            await wait_for(stop)
        found = {
            **stats,
            "error_list": errors[:5],
            "unavailable": sum(isinstance(e, fleet.StoreUnavailable) for e in seen),
            "recovered": sum(isinstance(e, fleet.StoreRecovered) for e in seen),
        }
        report.put((index, "stats", found))
    finally:
        subscription.close()
        store.close()


# --- c. a provider outage seen by one process protects the others -------------------------


async def llm_outage(
    index: int,
    report: Queue[tuple[int, str, Any]],
    url: str,
    base_url: str,
    role: str,
    go: ProcessEvent,
    protect: ProcessEvent,
) -> None:
    """``role``: ``"seer"`` calls the dead model until its breaker refuses; ``"refused"``
    and ``"failover"`` then call it (the latter with a healthy failover target) and must
    never reach it. Requests carry the worker's index in the ``x-fleet-worker`` header."""
    store = lk.RedisStore(url, interval=INTERVAL, timeout=1.0)
    lk.use_store(store)
    try:
        options: dict[str, Any] = {"window_size": 10, "minimum_calls": 4, "open_duration": 120}
        failover = (
            [{"model": "openai/backup", "api_base": base_url, "api_key": "fake"}]
            if role == "failover"
            else []
        )
        llm = lk.LLM(
            "openai/down",
            api_base=base_url,
            api_key="fake",
            breaker=options,
            failover=failover,
            timeout=10.0,
        )
        headers = {"x-fleet-worker": str(index)}
        # litellm's first request in a process is slow: pay for it on another model.
        warm = lk.LLM("openai/warm", api_base=base_url, api_key="fake", timeout=10.0)
        await warm.acompletion(messages=MESSAGES, extra_headers=headers)
        breaker = lk.breaker("openai/down", **options)  # the LLM's: the registry's
        breaker.allows()
        await until(lambda: fleet_ready(breaker))
        report.put((index, "ready", None))

        if role == "seer":
            await wait_for(go)
            sent = 0
            refused = False
            for _ in range(200):
                try:
                    await llm.acompletion(messages=MESSAGES, extra_headers=headers)
                except lk.CircuitOpen:
                    refused = True
                    break
                except lk.ProviderUnavailable:
                    sent += 1
                await anyio.sleep(0.01)
            report.put((index, "done", {"sent": sent, "refused": refused}))
            return

        await wait_for(protect)
        seen_after = await until(lambda: breaker.state is BreakerState.OPEN)
        outcomes: list[str] = []
        slowest = 0.0
        for _ in range(5):
            started = time.monotonic()
            try:
                response = await llm.acompletion(messages=MESSAGES, extra_headers=headers)
            except lk.CircuitOpen:
                outcomes.append("CircuitOpen")
            except Exception as exc:
                outcomes.append(repr(exc))
            else:
                outcomes.append(f"answered by {lk.report(response).target}")
            slowest = max(slowest, time.monotonic() - started)
        report.put((index, "done", {"after": seen_after, "outcomes": outcomes, "slowest": slowest}))
    finally:
        lk.use_store(None)
        store.close()


# --- d. a room nobody has heard of: one probe for the fleet -------------------------------


async def probe_a_room(
    index: int,
    report: Queue[tuple[int, str, Any]],
    url: str,
    base_url: str,
    api_key: str,
    go: ProcessEvent,
    calls: int,
) -> None:
    """Send ``calls`` calls at once through ``LLM(governor=True)`` on the fleet's store, to a
    room no worker has heard of yet; report how many were answered."""
    from latencykit import ratelimit

    store = lk.RedisStore(url, interval=INTERVAL, timeout=1.0, stale_after=5.0)
    try:
        llm = lk.LLM(
            "openai/m",
            api_base=base_url,
            api_key=api_key,
            transport="openai",
            governor=True,
            shared=store,
            deadline=WAIT - 5,
        )
        room = store.room("openai/m", ratelimit.key_hash(api_key))  # as a worker long up
        await until(lambda: room.view() is not None)
        report.put((index, "ready", None))

        await wait_for(go)
        answered = 0

        async def one() -> None:
            nonlocal answered
            await llm.acompletion(messages=MESSAGES, max_tokens=16)
            answered += 1

        async with anyio.create_task_group() as group:
            for _ in range(calls):
                group.start_soon(one)
        report.put((index, "done", answered))
        await llm.aclose()
    finally:
        store.close()
