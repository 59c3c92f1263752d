"""Circuit breakers: state machine, windows, registry, events; fake clock, no sleeps."""

from __future__ import annotations

import datetime
import math
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import latencykit as lk
from latencykit.pipeline import pipeline_of
from latencykit.policies.breaker import (
    TIME_BUCKETS,
    Breaker,
    BreakerPermit,
    BreakerRejected,
    BreakerState,
    BreakerStateChanged,
    CircuitOpen,
    breaker,
    breakers,
    reset_breakers,
)

pytestmark = pytest.mark.anyio

CLOSED, OPEN = BreakerState.CLOSED, BreakerState.OPEN
HALF_OPEN, FORCED_OPEN = BreakerState.HALF_OPEN, BreakerState.FORCED_OPEN


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def unavailable() -> lk.ProviderUnavailable:
    return lk.ProviderUnavailable("overloaded", target="t", status_code=503)


def small(clock: FakeClock, key: str = "t", **options: Any) -> Breaker:
    """A breaker that decides quickly: window 10 calls, 4 calls minimum, 3 probes."""
    defaults: dict[str, Any] = {
        "window_size": 10,
        "minimum_calls": 4,
        "open_duration": 10.0,
        "slow_call_duration": 2.0,
        "clock": clock,
    }
    return Breaker(key, **{**defaults, **options})


def outcome(b: Breaker, success: bool | None, duration: float = 0.1) -> None:
    permit = b.acquire()
    assert permit is not None
    b.record(permit, success, duration)


class Target:
    """An async callable whose behaviour the test sets; counts the calls that reached it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls = 0
        self.error: BaseException | None = None
        self.takes = 0.1

    async def __call__(self) -> str:
        self.calls += 1
        self.clock.advance(self.takes)
        await anyio.lowlevel.checkpoint()
        if self.error is not None:
            raise self.error
        return "ok"


# --- closed -> open --------------------------------------------------------------------------


async def test_opens_on_failure_rate_after_minimum_calls(clock: FakeClock) -> None:
    b = small(clock, failure_rate=0.5)
    target = Target(clock)
    ask = b(target)
    for _ in range(2):
        assert await ask() == "ok"
    target.error = unavailable()
    with pytest.raises(lk.ProviderUnavailable):
        await ask()
    assert b.state is CLOSED  # 1 failure in 3 calls: below minimum_calls anyway
    with pytest.raises(lk.ProviderUnavailable):
        await ask()
    assert b.state is OPEN  # 2 of 4 = 50 %
    metrics = b.metrics()
    assert (metrics.calls, metrics.failures, metrics.failure_rate) == (4, 2, 0.5)
    with pytest.raises(CircuitOpen):
        await ask()
    assert target.calls == 4


async def test_does_not_open_below_minimum_calls(clock: FakeClock) -> None:
    b = small(clock, minimum_calls=5)
    target = Target(clock)
    target.error = unavailable()
    ask = b(target)
    for _ in range(4):
        with pytest.raises(lk.ProviderUnavailable):
            await ask()
    assert b.state is CLOSED
    assert b.metrics().failure_rate == 1.0
    with pytest.raises(lk.ProviderUnavailable):
        await ask()
    assert b.state is OPEN


async def test_count_window_keeps_only_the_last_calls(clock: FakeClock) -> None:
    b = small(clock, window_size=4, minimum_calls=4, failure_rate=0.75)
    for success in (False, False, True, True, True, False, False):
        outcome(b, success)
    assert b.state is CLOSED  # the last 4: ok ok fail fail = 50 %
    assert b.metrics()[1:4] == (4, 2, 2)
    outcome(b, False)  # ok fail fail fail = 75 %
    assert b.state is OPEN


async def test_slow_call_rate_opens_it(clock: FakeClock) -> None:
    b = small(clock, slow_call_rate=0.75, slow_call_duration=2.0)
    target = Target(clock)
    ask = b(target)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        target.takes = 2.0  # a call of exactly slow_call_duration is slow
        for _ in range(3):
            assert await ask() == "ok"
        target.takes = 0.5
        assert await ask() == "ok"
        assert b.state is OPEN  # 3 slow of 4, although every call succeeded
    [changed] = [e for e in seen if isinstance(e, BreakerStateChanged)]
    assert (changed.from_state, changed.to_state) == (CLOSED, OPEN)
    assert (changed.failure_rate, changed.slow_call_rate, changed.calls) == (0.0, 0.75, 4)


async def test_slow_failures_count_as_slow_too(clock: FakeClock) -> None:
    b = small(clock, failure_rate=1.0, slow_call_rate=0.5)
    outcome(b, True)
    outcome(b, True)
    outcome(b, False, duration=5.0)
    outcome(b, True, duration=2.0)
    assert b.state is OPEN
    assert b.metrics().slow_calls == 2


@pytest.mark.parametrize(
    "error",
    [
        lk.BadRequest("bad", target="t", status_code=400),
        lk.ContextLengthExceeded("...", target="t"),
        lk.ContentPolicyViolation("refused", target="t"),
        lk.AuthenticationFailed("no key", target="t", status_code=401),
        KeyError("a bug"),
        ValueError("another bug"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_errors_that_do_not_count_are_ignored(clock: FakeClock, error: Exception) -> None:
    b = small(clock)
    target = Target(clock)
    target.error = error
    ask = b(target)
    for _ in range(20):
        with pytest.raises(type(error)) as raised:
            await ask()
        assert raised.value is error
    assert b.state is CLOSED
    assert b.metrics().calls == 0  # ignored: neither failures nor successes
    assert target.calls == 20


@pytest.mark.parametrize(
    "error",
    [
        lk.RateLimited("slow down", target="t", status_code=429),
        lk.ProviderUnavailable("down", target="t", status_code=503),
        lk.AttemptTimeout("late", target="t"),
        lk.StreamBroken("cut", target="t"),
        TimeoutError(),
        ConnectionResetError(),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_transient_errors_count_as_failures(clock: FakeClock, error: Exception) -> None:
    b = small(clock)
    target = Target(clock)
    target.error = error
    ask = b(target)
    for _ in range(4):
        with pytest.raises(type(error)):
            await ask()
    assert b.state is OPEN


async def test_counts_selects_the_failures(clock: FakeClock) -> None:
    b = small(clock, counts=KeyError)
    target = Target(clock)
    ask = b(target)
    target.error = unavailable()  # transient, but not what this breaker counts
    for _ in range(4):
        with pytest.raises(lk.ProviderUnavailable):
            await ask()
    assert b.metrics().calls == 0
    target.error = KeyError("counted")
    for _ in range(4):
        with pytest.raises(KeyError):
            await ask()
    assert b.state is OPEN
    by_predicate = small(clock, "u", counts=lambda exc: "bad" in str(exc))
    assert by_predicate.counts(RuntimeError("bad"))
    assert not by_predicate.counts(RuntimeError("fine"))


async def test_a_refusal_from_an_inner_breaker_does_not_count(clock: FakeClock) -> None:
    inner = small(clock)
    inner.isolate()
    outer = Breaker("outer", minimum_calls=1, window_size=1, counts=lambda exc: True, clock=clock)

    async def through_inner(call: lk.pipeline.Call) -> Any:
        return await inner.handle(call, lambda c: c.fn(*c.args, **c.kwargs))

    with pytest.raises(CircuitOpen) as raised:
        await outer.handle(lk.pipeline.Call(Target(clock)), through_inner)
    assert raised.value.key == "t"
    assert outer.state is CLOSED
    assert outer.metrics().calls == 0


# --- open ------------------------------------------------------------------------------------


async def test_open_rejects_without_calling_and_says_when_it_half_opens(clock: FakeClock) -> None:
    b = small(clock, open_duration=30.0)
    target = Target(clock)
    ask = b(target)
    for _ in range(4):
        outcome(b, False)
    clock.advance(12.5)
    with pytest.raises(CircuitOpen) as raised:
        await ask()
    assert target.calls == 0
    error = raised.value
    assert isinstance(error, lk.LatencykitError)
    assert (error.key, error.state) == ("t", OPEN)
    assert error.half_open_in == pytest.approx(17.5)
    assert "half-opens in 17.500s" in str(error)
    assert not b.allows()
    assert b.acquire() is None


def test_circuit_open_for_every_target_at_once() -> None:
    error = CircuitOpen.all_open(["openai/gpt-4o", "anthropic/claude"], half_open_in=3.0)
    assert (error.key, error.keys, error.state) == (
        "openai/gpt-4o",
        ("openai/gpt-4o", "anthropic/claude"),
        OPEN,
    )
    assert error.half_open_in == 3.0
    assert "'openai/gpt-4o', 'anthropic/claude'" in str(error)
    assert CircuitOpen("t", OPEN, 1.0).keys == ("t",)
    assert CircuitOpen.all_open([]).key == ""


async def test_open_turns_half_open_after_open_duration(clock: FakeClock) -> None:
    b = small(clock)
    for _ in range(4):
        outcome(b, False)
    clock.advance(9.5)
    assert b.state is OPEN
    clock.advance(0.5)
    assert b.state is HALF_OPEN
    assert b.allows()


# --- half-open -------------------------------------------------------------------------------


def open_then_half_open(b: Breaker, clock: FakeClock) -> None:
    for _ in range(b.minimum_calls):
        outcome(b, False)
    assert b.state is OPEN
    clock.advance(b.open_duration)


async def test_half_open_admits_exactly_half_open_calls_probes(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=3)
    open_then_half_open(b, clock)
    gate = anyio.Event()
    started = 0

    async def probe() -> str:
        nonlocal started
        started += 1
        await gate.wait()
        return "ok"

    ask = b(probe)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        assert started == 3
        assert b.metrics().probes == 3
        assert not b.allows()
        with pytest.raises(CircuitOpen) as raised:
            await ask()
        assert raised.value.state is HALF_OPEN
        assert raised.value.half_open_in is None
        assert b.state is HALF_OPEN
        gate.set()
    assert started == 3
    assert b.state is CLOSED
    assert b.metrics().calls == 0  # closing starts from an empty window


async def test_probes_that_succeed_close_it(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=2)
    open_then_half_open(b, clock)
    outcome(b, True)
    assert b.state is HALF_OPEN  # one probe left to hear from
    outcome(b, True)
    assert b.state is CLOSED
    outcome(b, False)  # a fresh window: the old failures are gone
    assert b.metrics()[1:4] == (1, 0, 1)


async def test_a_failed_probe_opens_it_again(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=1)
    open_then_half_open(b, clock)
    target = Target(clock)
    target.error = unavailable()
    with pytest.raises(lk.ProviderUnavailable):
        await b(target)()
    assert b.state is OPEN
    with pytest.raises(CircuitOpen) as raised:
        await b(target)()
    assert raised.value.half_open_in == pytest.approx(10.0)  # no backoff by default


async def test_probes_reopen_as_soon_as_the_rate_is_certain(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=4, failure_rate=0.5)
    open_then_half_open(b, clock)
    first, second, third = b.acquire(), b.acquire(), b.acquire()
    assert first and second and third
    b.record(first, False)
    assert b.state is HALF_OPEN  # 1 of 4 failed: 25 % so far
    b.record(second, False)
    assert b.state is OPEN  # 2 of 4 failed: 50 % whatever the others do
    b.record(third, True)  # a late probe of the finished half-open spell: dropped
    assert b.state is OPEN


async def test_a_minority_of_failed_probes_still_closes_it(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=3, failure_rate=0.5)
    open_then_half_open(b, clock)
    outcome(b, False)
    outcome(b, True)
    outcome(b, True)
    assert b.state is CLOSED  # 1 of 3 probes failed: 33 % < 50 %


async def test_reopening_doubles_the_open_duration_up_to_the_cap(clock: FakeClock) -> None:
    b = small(clock, open_duration=10.0, max_open_duration=35.0, half_open_calls=1)
    for _ in range(4):
        outcome(b, False)
    for expected in (10.0, 20.0, 35.0, 35.0):
        rejected = b.acquire()
        assert rejected is None
        with pytest.raises(CircuitOpen) as raised:
            await b(Target(clock))()
        assert raised.value.half_open_in == pytest.approx(expected)
        clock.advance(expected / 2)
        assert b.state is OPEN
        clock.advance(expected / 2)
        assert b.state is HALF_OPEN
        outcome(b, False)  # the probe fails: open again, for longer
    clock.advance(35.0)
    outcome(b, True)  # the probe succeeds: closed; the next opening starts again at 10 s
    assert b.state is CLOSED
    for _ in range(4):
        outcome(b, False)
    with pytest.raises(CircuitOpen) as raised:
        await b(Target(clock))()
    assert raised.value.half_open_in == pytest.approx(10.0)


# --- time window -----------------------------------------------------------------------------


async def test_time_window_forgets_old_calls(clock: FakeClock) -> None:
    b = small(clock, window_type="time", window_size=10.0, minimum_calls=3)
    outcome(b, False)
    outcome(b, False)
    assert b.metrics().calls == 2
    clock.advance(10.0)
    assert b.metrics().calls == 0  # both slid out of the window
    outcome(b, False)
    outcome(b, True)
    assert b.state is CLOSED  # 1 failure of 2 calls: below minimum_calls
    clock.advance(5.0)
    outcome(b, False)  # 2 of 3 in the last 10 s
    assert b.state is OPEN


async def test_time_window_counts_calls_for_about_window_size(clock: FakeClock) -> None:
    b = small(clock, window_type="time", window_size=datetime.timedelta(seconds=20))
    assert b.window_size == 20.0
    step = 20.0 / TIME_BUCKETS
    outcome(b, True)
    clock.advance(20.0 - step)
    assert b.metrics().calls == 1  # still inside (resolution: one bucket)
    clock.advance(step)
    assert b.metrics().calls == 0
    for _ in range(30):  # many calls in one bucket: a time window has no call cap
        outcome(b, True)
    assert b.metrics().calls == 30


# --- isolate and reset -----------------------------------------------------------------------


async def test_isolate_rejects_until_reset(clock: FakeClock) -> None:
    b = small(clock)
    outcome(b, False)
    target = Target(clock)
    ask = b(target)
    b.isolate()
    assert b.state is FORCED_OPEN
    clock.advance(3600)
    assert b.state is FORCED_OPEN  # time does not half-open it
    assert not b.allows()
    with pytest.raises(CircuitOpen) as raised:
        await ask()
    assert raised.value.state is FORCED_OPEN
    assert raised.value.half_open_in is None
    assert "reset()" in str(raised.value)
    assert target.calls == 0
    b.reset()
    assert b.state is CLOSED
    assert b.metrics().calls == 0
    assert await ask() == "ok"


async def test_reset_closes_an_open_breaker_with_an_empty_window(clock: FakeClock) -> None:
    b = small(clock)
    for _ in range(4):
        outcome(b, False)
    b.reset()
    assert b.state is CLOSED
    assert b.metrics().calls == 0
    for _ in range(3):
        outcome(b, False)
    assert b.state is CLOSED


async def test_reset_drops_the_outcomes_of_calls_in_flight(clock: FakeClock) -> None:
    b = small(clock)
    permit = b.acquire()
    assert permit is not None
    b.reset()
    b.record(permit, False)
    assert b.metrics().calls == 0


async def test_outcomes_of_calls_admitted_before_opening_are_dropped(clock: FakeClock) -> None:
    b = small(clock)
    late = b.acquire()
    assert late is not None
    for _ in range(4):
        outcome(b, False)
    assert b.state is OPEN
    clock.advance(10.0)
    assert b.state is HALF_OPEN
    b.record(late, True)  # admitted while closed: says nothing about the probes
    assert b.metrics().probes == 0
    assert b.state is HALF_OPEN


# --- cancellation ----------------------------------------------------------------------------


async def test_cancellation_is_neither_success_nor_failure(clock: FakeClock) -> None:
    b = small(clock)

    with anyio.CancelScope() as scope:

        async def cancelled() -> str:
            scope.cancel()
            await anyio.sleep_forever()
            return "never"

        await b(cancelled)()
    assert scope.cancelled_caught
    assert b.metrics().calls == 0


async def test_a_cancelled_probe_releases_its_permit(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=1)
    open_then_half_open(b, clock)
    async with anyio.create_task_group() as group:

        async def hangs() -> str:
            await anyio.sleep_forever()
            return "never"

        group.start_soon(b(hangs))
        await anyio.wait_all_tasks_blocked()
        assert not b.allows()  # the only probe permit is taken
        group.cancel_scope.cancel()
    assert b.state is HALF_OPEN
    assert b.allows()  # released: another probe may go
    outcome(b, True)
    assert b.state is CLOSED


async def test_a_counts_predicate_that_raises_still_releases_the_permit(clock: FakeClock) -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug in the predicate")

    b = small(clock, half_open_calls=1, counts=broken)
    open_then_half_open(b, clock)
    target = Target(clock)
    target.error = KeyError("x")
    with pytest.raises(RuntimeError, match="bug in the predicate"):
        await b(target)()
    assert b.state is HALF_OPEN
    assert b.allows()


# --- registry --------------------------------------------------------------------------------


async def test_registry_shares_one_breaker_per_key() -> None:
    first = breaker("openai", failure_rate=0.3, open_duration=datetime.timedelta(seconds=30))
    again = breaker("openai", failure_rate=0.3, open_duration=30)
    assert again is first
    assert breaker("anthropic") is not first
    assert dict(breakers()) == {"openai": first, "anthropic": breakers()["anthropic"]}
    with pytest.raises(TypeError):
        breakers()["x"] = first  # type: ignore[index]
    reset_breakers()
    assert len(breakers()) == 0
    assert breaker("openai", failure_rate=0.3) is not first


async def test_registry_refuses_other_options_for_a_key() -> None:
    breaker("openai", failure_rate=0.3)
    with pytest.raises(ValueError, match=r"'openai'.*failure_rate=0\.5 \(registered: 0\.3\)"):
        breaker("openai")
    with pytest.raises(ValueError, match=r"'openai'.*counts"):
        breaker("openai", failure_rate=0.3, counts=KeyError)


async def test_registered_breaker_as_a_decorator(clock: FakeClock) -> None:
    target = Target(clock)
    target.error = unavailable()

    @breaker("provider", minimum_calls=2, window_size=2, clock=clock)
    async def ask() -> str:
        return await target()

    @breaker("provider", minimum_calls=2, window_size=2, clock=clock)
    async def other() -> str:
        return "other"

    for _ in range(2):
        with pytest.raises(lk.ProviderUnavailable):
            await ask()
    with pytest.raises(CircuitOpen):
        await other()  # the same breaker: the key is open for everyone
    assert isinstance(breakers()["provider"], lk.pipeline.Policy)
    assert breakers()["provider"].stage == lk.pipeline.Stage.BREAKER


async def test_breaker_sits_inside_a_fallback(clock: FakeClock) -> None:
    b = small(clock, minimum_calls=1, window_size=1)
    b.isolate()

    @lk.fallback("degraded", on=CircuitOpen)
    @b
    async def ask() -> str:
        return "primary"

    assert await ask() == "degraded"
    pipeline = pipeline_of(ask)
    assert pipeline is not None
    assert [p.stage for p in pipeline.policies] == [
        lk.pipeline.Stage.FALLBACK,
        lk.pipeline.Stage.BREAKER,
    ]


# --- events ----------------------------------------------------------------------------------


async def test_events_on_every_transition_and_rejection(clock: FakeClock) -> None:
    b = small(clock, half_open_calls=1)
    target = Target(clock)
    ask = b(target)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        target.error = unavailable()
        for _ in range(4):
            with pytest.raises(lk.ProviderUnavailable):
                await ask()
        with pytest.raises(CircuitOpen):
            await ask()
        clock.advance(10.0)
        target.error = None
        assert await ask() == "ok"
        b.isolate()
        assert b.acquire() is None
        b.reset()
    changes = [(e.from_state, e.to_state) for e in seen if isinstance(e, BreakerStateChanged)]
    assert changes == [
        (CLOSED, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, CLOSED),
        (CLOSED, FORCED_OPEN),
        (FORCED_OPEN, CLOSED),
    ]
    opened, _, closed, *_ = [e for e in seen if isinstance(e, BreakerStateChanged)]
    assert (opened.key, opened.failure_rate, opened.slow_call_rate, opened.calls) == (
        "t",
        1.0,
        0.0,
        4,
    )
    assert (closed.failure_rate, closed.calls) == (0.0, 1)  # decided on the one probe
    rejected = [e for e in seen if isinstance(e, BreakerRejected)]
    assert [(e.key, e.state) for e in rejected] == [("t", OPEN), ("t", FORCED_OPEN)]
    # Inside a call, events carry the call's id; outside any call (acquire, reset) 0.
    call_ids = {e.call_id for e in seen if isinstance(e, lk.events.CallEnded)}
    assert opened.call_id in call_ids
    assert rejected[0].call_id in call_ids
    assert rejected[1].call_id == 0
    for emitted in (opened, rejected[0]):
        for value in msgspec.structs.astuple(emitted):
            assert isinstance(value, (int, float, str))


async def test_no_events_are_built_without_subscribers(clock: FakeClock) -> None:
    b = small(clock)
    for _ in range(4):
        outcome(b, False)
    assert b.acquire() is None  # nothing to assert but that it works without listeners
    assert b.state is OPEN


# --- one breaker per key --------------------------------------------------------------------


async def test_breakers_of_one_key_share_their_state(clock: FakeClock) -> None:
    one, two = small(clock), small(clock)
    assert one is two  # the process-wide breaker of "t"
    for _ in range(4):
        outcome(one, False)
    assert two.state is OPEN
    assert breakers()["t"] is one
    with pytest.raises(ValueError, match=r"window_type='time' \(registered: 'count'\)"):
        small(clock, window_type="time", window_size=60.0)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"window_type": "sliding"}, "breaker.window_type"),
        ({"window_size": 0}, "breaker.window_size"),
        ({"window_size": 10.5}, "breaker.window_size"),
        ({"window_type": "time", "window_size": -1.0}, "breaker.window_size"),
        ({"window_type": "time", "window_size": math.inf}, "breaker.window_size"),
        ({"minimum_calls": 0}, "breaker.minimum_calls"),
        ({"minimum_calls": True}, "breaker.minimum_calls"),
        ({"window_size": 10, "minimum_calls": 11}, "breaker.minimum_calls"),
        ({"failure_rate": 0}, "breaker.failure_rate"),
        ({"failure_rate": 1.5}, "breaker.failure_rate"),
        ({"failure_rate": math.nan}, "breaker.failure_rate"),
        ({"slow_call_rate": 0.0}, "breaker.slow_call_rate"),
        ({"slow_call_rate": "high"}, "breaker.slow_call_rate"),
        ({"slow_call_duration": 0}, "breaker.slow_call_duration"),
        ({"open_duration": -5}, "breaker.open_duration"),
        ({"open_duration": "30s"}, "breaker.open_duration"),
        ({"max_open_duration": 10.0, "open_duration": 30.0}, "breaker.max_open_duration"),
        ({"max_open_duration": 0}, "breaker.max_open_duration"),
        ({"half_open_calls": 0}, "breaker.half_open_calls"),
        ({"counts": "transient"}, "breaker.counts"),
        ({"shared": {}}, "breaker.shared"),
        ({"clock": 5}, "breaker.clock"),
    ],
)
def test_invalid_options_are_rejected_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field.replace(".", r"\.")):
        Breaker("t", **options)
    with pytest.raises((ValueError, TypeError), match=field.replace(".", r"\.")):
        breaker("t", **options)
    assert "t" not in breakers()


@pytest.mark.parametrize("key", ["", None, 3])
def test_the_key_must_be_a_non_empty_string(key: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=r"breaker\.key"):
        Breaker(key)


def test_defaults() -> None:
    b = Breaker("t")
    assert (b.window_type, b.window_size, b.minimum_calls) == ("count", 100, 20)
    assert (b.failure_rate, b.slow_call_rate, b.slow_call_duration) == (0.5, 1.0, 60.0)
    assert (b.open_duration, b.max_open_duration, b.half_open_calls) == (30.0, None, 3)
    assert b.counts is lk.errors.is_transient
    assert b.shared is None
    assert b.state is CLOSED
    assert "Breaker('t'" in repr(b)
    assert breaker is Breaker  # one spelling


# --- properties ------------------------------------------------------------------------------

OUTCOMES = ("ok", "fail", "slow_ok", "slow_fail", "ignored")
Op = tuple[str, str, float, int]

# Weighted so that runs reach every state: mostly calls (failures often), rare isolate/reset.
KINDS: tuple[str, ...] = (
    ("call",) * 24 + ("start",) * 6 + ("finish",) * 8 + ("advance",) * 10 + ("reset",) * 2
)
KINDS += ("isolate",)
operations = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.sampled_from(("ok", "ok", "ok", "fail", "fail", "slow_ok", "slow_fail", "ignored")),
        st.sampled_from((0.1, 0.5, 1.0, 2.5, 5.0, 12.0)),
        st.integers(0, 7),
    ),
    min_size=30,
    max_size=120,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "count": {"window_type": "count", "window_size": 5, "minimum_calls": 3},
    "time": {"window_type": "time", "window_size": 10.0, "minimum_calls": 3},
}

LEGAL_BY_ANY_OP = {(OPEN, HALF_OPEN)}
LEGAL_ON_RECORD = {(CLOSED, OPEN), (HALF_OPEN, CLOSED), (HALF_OPEN, OPEN)}


def _rates_reached(b: Breaker, failures: int, slow: int, calls: int) -> bool:
    return failures / calls >= b.failure_rate or slow / calls >= b.slow_call_rate


@pytest.mark.parametrize("config", sorted(CONFIGS))
@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_random_runs_keep_the_state_machine_legal(config: str, ops: list[Op]) -> None:
    clock = FakeClock(0.0)
    reset_breakers()  # a new breaker for each example
    b = Breaker(
        "p",
        failure_rate=0.5,
        slow_call_rate=0.6,
        slow_call_duration=1.0,
        open_duration=5.0,
        max_open_duration=15.0,
        half_open_calls=2,
        clock=clock,
        **CONFIGS[config],
    )
    seen: list[lk.events.Event] = []
    state = CLOSED
    epoch = 0  # bumps on every state change or reset: the model of a breaker's period
    # The model of the closed window: (time, failed, slow) of the counted calls.
    window: list[tuple[float, bool, bool]] = []
    opened_at, open_for = 0.0, 5.0
    probes_taken = probes_released = 0
    probe_outcomes: list[tuple[bool, bool]] = []
    in_flight: list[tuple[BreakerPermit, int]] = []
    visited: set[str] = set()  # for --hypothesis-show-statistics

    def model_counts() -> tuple[int, int, int]:
        if b.window_type == "count":
            kept = window[-int(b.window_size) :]
        else:
            width = b.window_size / TIME_BUCKETS
            newest = math.floor(clock() / width)
            kept = [w for w in window if math.floor(w[0] / width) > newest - TIME_BUCKETS]
        return len(kept), sum(w[1] for w in kept), sum(w[2] for w in kept)

    def follow(op: str) -> None:
        """Check the transitions the last operation caused, and update the model."""
        nonlocal state, epoch, opened_at, open_for, probes_taken, probes_released
        changes = [e for e in seen if isinstance(e, BreakerStateChanged)]
        seen.clear()
        for change in changes:
            pair = (change.from_state, change.to_state)
            visited.add(f"{pair[0].value} -> {pair[1].value}")
            assert change.from_state is state, "transitions must chain"
            if change.to_state is FORCED_OPEN:
                assert op == "isolate"
            elif change.to_state is CLOSED and change.from_state is not HALF_OPEN:
                assert op == "reset"
            elif pair in LEGAL_ON_RECORD:
                assert op in ("call", "finish") or (pair == (HALF_OPEN, CLOSED) and op == "reset")
            else:
                assert pair in LEGAL_BY_ANY_OP, pair
            if pair == (OPEN, HALF_OPEN):
                assert clock() >= opened_at + open_for, "half-open too early"
                probes_taken = probes_released = 0
                probe_outcomes.clear()
            if change.to_state is OPEN:
                open_for = min(open_for * 2, 15.0) if change.from_state is HALF_OPEN else 5.0
                opened_at = clock()
            if change.to_state is CLOSED:
                window.clear()
                open_for = 5.0
            state = change.to_state
            epoch += 1

    def finish(permit: BreakerPermit, admitted_in: int, result: str) -> None:
        success = None if result == "ignored" else result in ("ok", "slow_ok")
        slow = result.startswith("slow")
        was = state
        b.record(permit, success, 1.0 if slow else 0.2)
        current = epoch == admitted_in
        follow("finish")
        nonlocal probes_released
        if not current or success is None:
            if current and permit.probe and success is None:
                probes_released += 1
            assert state is was
            return
        if permit.probe:
            probe_outcomes.append((not success, slow))
            failed = sum(f for f, _ in probe_outcomes)
            slowed = sum(s for _, s in probe_outcomes)
            if _rates_reached(b, failed, slowed, b.half_open_calls):
                assert state is OPEN
            elif len(probe_outcomes) == b.half_open_calls:
                assert state is CLOSED
            else:
                assert state is HALF_OPEN
        else:
            assert was is CLOSED
            window.append((clock(), not success, slow))
            calls, failed, slowed = model_counts()
            should_open = calls >= b.minimum_calls and _rates_reached(b, failed, slowed, calls)
            assert state is (OPEN if should_open else CLOSED)

    def admit() -> BreakerPermit | None:
        nonlocal probes_taken
        rejected_before = sum(isinstance(e, BreakerRejected) for e in seen)
        permit = b.acquire()
        rejections = [e for e in seen if isinstance(e, BreakerRejected)]
        follow("call")
        if permit is None:
            assert len(rejections) == rejected_before + 1
            assert rejections[-1].state in (OPEN, FORCED_OPEN, HALF_OPEN)
            visited.add(f"rejected when {rejections[-1].state.value}")
            assert state is not CLOSED
        else:
            assert state in (CLOSED, HALF_OPEN)
            assert permit.probe == (state is HALF_OPEN)
            if permit.probe:
                probes_taken += 1
                assert probes_taken - probes_released <= b.half_open_calls
        return permit

    with lk.subscribe(seen.append):
        for name, arg, seconds, index in ops:
            if name == "advance":
                clock.advance(seconds)
            elif name == "call":
                permit = admit()
                if permit is not None:
                    finish(permit, epoch, arg)
            elif name == "start":
                permit = admit()
                if permit is not None:
                    in_flight.append((permit, epoch))
            elif name == "finish" and in_flight:
                permit, admitted_in = in_flight.pop(index % len(in_flight))
                finish(permit, admitted_in, arg)
            elif name == "isolate":
                b.isolate()
                follow("isolate")
            elif name == "reset":
                b.reset()
                follow("reset")
                epoch += 1
                window.clear()
            # Invariants after every step.
            metrics = b.metrics()
            follow("metrics")
            assert metrics.state is state
            assert 0 <= metrics.failures <= metrics.calls
            assert 0 <= metrics.slow_calls <= metrics.calls
            assert metrics.calls == metrics.successes + metrics.failures
            assert metrics.successes >= 0
            if b.window_type == "count":
                assert metrics.calls <= b.window_size
                assert max(map(max, b._window._buckets)) <= 1  # one call per bucket
            assert [sum(col) for col in zip(*b._window._buckets, strict=True)] == b._window.totals
            if state is CLOSED:
                assert (metrics.calls, metrics.failures, metrics.slow_calls) == model_counts()
            if state is OPEN:  # metrics() half-opens an expired open state
                assert clock() < opened_at + open_for, "half-open too late"
            if state is HALF_OPEN:
                assert 0 <= b._probe_calls <= b._probes <= b.half_open_calls
                assert metrics.probes == b._probes - b._probe_calls
    for what in sorted(visited):
        event(what)
