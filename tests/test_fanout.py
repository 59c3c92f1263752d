"""lk.gather and lk.first: fan-out inside the budget, on asyncio and trio.

Calls go through lk.LLM and real litellm to the fake provider on 127.0.0.1, which records every
request and when the client went away: a branch cut short must have closed its connection. The
pure-logic cases (markers, closing, validation, never-awaited coroutines) use plain coroutines.
"""

from __future__ import annotations

import datetime
import gc
import time
import warnings
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit.fanout import (
    Failed,
    Gathered,
    GatherIncomplete,
    Missing,
    NoAcceptableResult,
    NotNeeded,
    Rejected,
    TimedOut,
    first,
    gather,
)
from latencykit.testing import Behavior, FakeProvider, Fault, RecordedAttempt

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "sk-fanout-test-0123456789"
CLOSE_BOUND = 0.05  # the server sees the client go within this of the close
UNTYPED_GATHER: Any = gather  # for calls with the wrong types on purpose
UNTYPED_FIRST: Any = first


@pytest.fixture
async def fake(fake_provider: FakeProvider) -> FakeProvider:
    # litellm's first request on a loop initialises its HTTP stack (up to seconds, blocking the
    # loop): do it here, not inside a test that times a budget.
    await make_llm(fake_provider, "warm-up").acompletion(messages=MESSAGES)
    fake_provider.reset()
    return fake_provider


def make_llm(fake: FakeProvider, model: str) -> lk.LLM:
    return lk.LLM(f"openai/{model}", api_base=fake.base_url, api_key=KEY)


def ask(fake: FakeProvider, model: str, **kwargs: Any) -> Awaitable[Any]:
    return make_llm(fake, model).acompletion(messages=MESSAGES, **kwargs)


def text(response: Any) -> str:
    return str(response.choices[0].message.content)


async def disconnected(fake: FakeProvider, model: str) -> RecordedAttempt:
    """The request to ``model``, once the fake provider saw the client go away."""
    attempts = await fake.wait_for_async(
        lambda seen: any(a.model == model and a.disconnected for a in seen), 5.0
    )
    return next(a for a in attempts if a.model == model)


@contextmanager
def no_unawaited_coroutines() -> Iterator[None]:
    """Fail if a coroutine was garbage-collected without ever being awaited."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert not [w for w in caught if "was never awaited" in str(w.message)]


# --- gather against the fake provider --------------------------------------------------------


async def test_within_cuts_the_slow_call_and_closes_its_connection(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    started = time.monotonic()
    results = await gather(ask(fake, "fast"), ask(fake, "slow"), ask(fake, "fast"), within=1.0)
    returned_at = time.monotonic()
    assert 0.9 <= returned_at - started < 10.0
    assert isinstance(results, Gathered) and len(results) == 3
    fast, slow, also_fast = results
    assert text(fast).startswith("tok0") and text(also_fast).startswith("tok0")
    assert isinstance(slow, TimedOut) and 0.9 <= slow.elapsed < 10.0
    assert results.values == [fast, also_fast]
    assert results.missing == {1: slow}
    cut = await disconnected(fake, "slow")
    assert cut.tokens_sent == 0 and cut.status is None


async def test_min_results_cancels_the_straggler(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("quick", Behavior(ttft=0.3))  # not before the slow request reached the server
    started = time.monotonic()
    results = await gather(ask(fake, "slow"), ask(fake, "quick"), ask(fake, "quick"), min_results=2)
    assert time.monotonic() - started < 10.0
    assert isinstance(results[0], NotNeeded)
    assert [text(r) for r in results.values] == [text(results[1])] * 2
    assert list(results.missing) == [0]
    await disconnected(fake, "slow")


async def test_a_failing_branch_becomes_failed_without_cancelling_the_others(
    fake: FakeProvider,
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    fake.script("later", Behavior(ttft=0.3))
    down, later = await gather(ask(fake, "down"), ask(fake, "later"))
    assert isinstance(down, Failed)
    assert isinstance(down.error, lk.ProviderUnavailable)
    assert down.error.kind is lk.ErrorKind.SERVER_ERROR
    assert down.elapsed < 5.0
    assert text(later).startswith("tok0")  # the failure cancelled nothing
    assert {a.model: a.completed for a in fake.attempts} == {"down": True, "later": True}


async def test_return_partial_false_raises_with_the_results_and_fails_fast(
    fake: FakeProvider,
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503, ttft=0.5))  # after "fast" answered
    fake.script("slow", Behavior(ttft=30.0))
    started = time.monotonic()
    with pytest.raises(GatherIncomplete) as info:
        await gather(ask(fake, "fast"), ask(fake, "down"), ask(fake, "slow"), return_partial=False)
    assert time.monotonic() - started < 10.0  # did not wait for the slow one
    error = info.value
    assert isinstance(error, lk.LatencykitError)
    fast, down, slow = error.results
    assert text(fast).startswith("tok0")
    assert isinstance(down, Failed) and isinstance(down.error, lk.ProviderUnavailable)
    assert isinstance(slow, NotNeeded)
    assert error.needed == 3 and list(error.missing) == [1, 2]
    assert error.__cause__ is down.error
    assert "[1] failed" in str(error) and "[2] cancelled" in str(error)
    await disconnected(fake, "slow")


async def test_an_expiring_enclosing_deadline_propagates_and_closes_what_arrived(
    fake: FakeProvider,
) -> None:
    fake.script("long", Behavior(output_tokens=400, itl=0.05))  # a 20 s stream
    fake.script("slow", Behavior(ttft=30.0))
    with pytest.raises(lk.DeadlineExceeded), lk.deadline(1.0):
        await gather(ask(fake, "long", stream=True), ask(fake, "slow"))
    # The stream that had arrived is not returned: it was closed, and so was the slow request.
    long = await disconnected(fake, "long")
    assert long.tokens_sent < 400
    await disconnected(fake, "slow")


# --- first against the fake provider ---------------------------------------------------------


async def test_first_skips_a_rejected_answer(fake: FakeProvider) -> None:
    fake.script("hasty", Behavior(text="I am not sure."))
    fake.script("careful", Behavior(text="Paris is the capital.", ttft=0.3))
    answer = await first(
        ask(fake, "hasty"),
        ask(fake, "careful"),
        accept=lambda response: "not sure" not in text(response),
    )
    assert text(answer) == "Paris is the capital."
    hasty, careful = sorted(fake.attempts, key=lambda a: a.ended_at or 0.0)
    assert hasty.model == "hasty" and careful.model == "careful"  # rejected first, then won


async def test_first_closes_a_rejected_stream(fake: FakeProvider) -> None:
    fake.script("rambling", Behavior(output_tokens=400, itl=0.05))  # a 20 s stream
    fake.script("good", Behavior(ttft=0.3, output_tokens=4))
    stream = await first(
        ask(fake, "rambling", stream=True),
        ask(fake, "good", stream=True),
        accept=lambda s: s.target == "openai/good",
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok0 tok1 tok2 tok3"
    rambling = await disconnected(fake, "rambling")
    assert rambling.tokens_sent < 400


async def test_first_closes_the_losing_stream_before_returning(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0, output_tokens=4))
    # Not before the slow request reached the server (on trio it goes through a bridge thread).
    fake.script("fast", Behavior(ttft=0.3, output_tokens=4))
    stream = await first(ask(fake, "slow", stream=True), ask(fake, "fast", stream=True))
    returned_at = time.monotonic()
    async with stream:
        assert stream.target == "openai/fast"
        assert len([chunk async for chunk in stream]) >= 4
    loser = await disconnected(fake, "slow")
    assert loser.tokens_sent == 0
    # Closed before the winner was handed over, as a hedge's loser (tests/test_stream.py).
    assert loser.disconnected_at is not None and loser.disconnected_at - returned_at <= CLOSE_BOUND


async def test_stagger_starts_the_next_source_only_later(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    started = time.monotonic()  # the fake provider's clock
    answer = await first(ask(fake, "slow"), ask(fake, "fast"), stagger=0.5)
    assert text(answer).startswith("tok0")
    slow, fast = sorted(fake.attempts, key=lambda a: a.arrived_at)
    assert (slow.model, fast.model) == ("slow", "fast")
    # A lower bound that load cannot break: the second source is sent 0.5 s after the race
    # starts (the first one's arrival may lag its sending under load; the timer never fires
    # early).
    assert fast.arrived_at - started >= 0.49
    await disconnected(fake, "slow")


async def test_stagger_starts_the_next_source_at_once_after_a_failure(
    fake: FakeProvider,
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    started = time.monotonic()
    answer = await first(ask(fake, "down"), ask(fake, "fast"), ask(fake, "fast"), stagger=30.0)
    assert time.monotonic() - started < 10.0  # not 30 s: the failure started the next at once
    assert text(answer).startswith("tok0")
    assert [a.model for a in fake.attempts] == ["down", "fast"]  # the third never started


async def test_first_raises_with_every_outcome_when_none_is_acceptable(
    fake: FakeProvider,
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    fake.script("bad", Behavior(fault=Fault.CONTENT_POLICY))
    fake.script("slow", Behavior(ttft=30.0))
    with pytest.raises(NoAcceptableResult) as info:
        await first(
            ask(fake, "down"),
            ask(fake, "bad"),
            ask(fake, "fast"),
            ask(fake, "slow"),
            accept=lambda response: False,
            within=1.5,
        )
    down, bad, fast, slow = info.value.outcomes
    assert isinstance(down, Failed) and isinstance(down.error, lk.ProviderUnavailable)
    assert isinstance(bad, Failed) and isinstance(bad.error, lk.ContentPolicyViolation)
    assert isinstance(fast, Rejected) and text(fast.value).startswith("tok0")
    assert isinstance(slow, TimedOut) and slow.elapsed >= 1.4
    assert info.value.__cause__ is down.error
    assert info.value.others == (bad.error,)
    await disconnected(fake, "slow")


# --- pure logic ------------------------------------------------------------------------------


async def value(result: Any, delay: float = 0.0) -> Any:
    await anyio.sleep(delay)
    return result


async def boom(delay: float = 0.0) -> Any:
    await anyio.sleep(delay)
    raise KeyError("boom")


class Closable:
    """A result with a lifetime, like a stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


async def make(items: list[Closable], name: str) -> Closable:
    # Answers without suspending: several finish in the same loop turn.
    item = Closable(name)
    items.append(item)
    return item


async def test_gather_keeps_input_order_and_types() -> None:
    results = await gather(value("a", 0.2), value(1), value(None, 0.1))
    assert results == ["a", 1, None]
    assert results.values == ["a", 1, None] and results.missing == {}
    assert await gather() == []


async def test_within_bounds_the_branches_deadline() -> None:
    seen: list[float | None] = []

    async def remaining() -> None:
        seen.append(lk.remaining())

    assert lk.remaining() is None
    with lk.deadline(30.0):
        await gather(remaining(), within=datetime.timedelta(seconds=2))
        await gather(remaining(), within=60.0)  # never beyond the enclosing deadline
    [short, long] = seen
    assert short is not None and 1.0 < short <= 2.0
    assert long is not None and 20.0 < long <= 30.0
    assert lk.remaining() is None


async def test_min_results_returns_exactly_that_many_and_closes_late_ones() -> None:
    items: list[Closable] = []
    results = await gather(*[make(items, str(i)) for i in range(4)], min_results=2)
    assert len(results.values) == 2
    assert all(isinstance(m, NotNeeded) for m in results.missing.values())
    returned = {id(item) for item in results.values}
    # The values handed out stay open; any that arrived after the decision were closed.
    assert all(item.closed != (id(item) in returned) for item in items)


async def test_first_closes_results_that_arrive_after_the_winner() -> None:
    items: list[Closable] = []
    winner = await first(*[make(items, str(i)) for i in range(3)])
    assert not winner.closed
    assert all(item.closed for item in items if item is not winner)


async def test_a_rejected_result_is_closed_and_the_race_goes_on() -> None:
    items: list[Closable] = []

    async def later() -> Closable:
        await anyio.sleep(0.05)
        return await make(items, "later")

    winner = await first(make(items, "first"), later(), accept=lambda c: c.name == "later")
    assert winner.name == "later" and not winner.closed
    assert [item.closed for item in items] == [True, False]


async def test_an_exception_in_accept_is_raised_and_stops_the_race() -> None:
    items: list[Closable] = []

    def accept(item: Closable) -> bool:
        raise ZeroDivisionError

    started = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        await first(make(items, "a"), value(None, 30.0), accept=accept)
    assert time.monotonic() - started < 10.0
    assert [item.closed for item in items] == [True]


async def test_cancellation_from_outside_propagates_and_closes_held_values() -> None:
    items: list[Closable] = []
    with anyio.move_on_after(0.3) as scope:
        await gather(make(items, "held"), value(None, 30.0))
    assert scope.cancelled_caught
    assert [item.closed for item in items] == [True]


async def test_first_within_times_out_sources_never_started() -> None:
    with pytest.raises(NoAcceptableResult) as info:
        await first(value(1, 30.0), value(2), within=0.3, stagger=10.0)
    running, never = info.value.outcomes
    assert isinstance(running, TimedOut) and running.elapsed >= 0.25
    assert never == TimedOut(elapsed=0.0)
    assert info.value.__cause__ is None
    assert "[1] timed out after 0.000s" in str(info.value)


async def test_markers_are_typed_values_not_disguises() -> None:
    [failed] = (await gather(boom())).missing.values()
    assert isinstance(failed, Failed) and isinstance(failed, Missing)
    assert isinstance(failed.error, KeyError)
    assert failed  # no falsy magic: test markers with isinstance
    with pytest.raises(AttributeError):
        failed.elapsed = 1.0  # type: ignore[misc]
    assert str(failed).startswith("failed after ") and "KeyError" in str(failed)


async def test_nothing_is_left_unawaited() -> None:
    with no_unawaited_coroutines():
        # Sources a stagger never started, a gather cut short, invalid calls.
        assert await first(value(1), value(2), value(3), stagger=10.0) == 1
        await gather(value(1), value(2, 30.0), value(3, 30.0), min_results=1)
        await gather(value(1), value(2, 30.0), within=0.1)
        with pytest.raises(ValueError, match=r"gather\.min_results"):
            await gather(value(1), value(2), min_results=3)
        with pytest.raises(TypeError, match=r"first\.accept"):
            await UNTYPED_FIRST(value(1), accept=42)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: gather(value(1), within=0), ValueError, r"gather\.within must be a positive"),
        (
            lambda: UNTYPED_GATHER(value(1), within="1"),
            TypeError,
            r"gather\.within must be a number",
        ),
        (lambda: gather(value(1), min_results=0), ValueError, r"gather\.min_results must be"),
        (
            lambda: UNTYPED_GATHER(value(1), min_results=1.0),
            ValueError,
            r"gather\.min_results must be a positive int",
        ),
        (
            lambda: UNTYPED_GATHER(value(1), return_partial=None),
            TypeError,
            r"gather\.return_partial must be a bool",
        ),
        (
            lambda: UNTYPED_GATHER(value(1), value),
            TypeError,
            r"gather\.awaitables\[1\] must be awaitable \(a function: call it\)",
        ),
        (lambda: first(), ValueError, r"first needs at least one awaitable"),
        (
            lambda: first(value(1), stagger=-1),
            ValueError,
            r"first\.stagger must be a number of seconds >= 0",
        ),
        (lambda: first(value(1), within=float("inf")), ValueError, r"first\.within must be"),
        (
            lambda: UNTYPED_FIRST(42),
            TypeError,
            r"first\.awaitables\[0\] must be awaitable, got 42",
        ),
        (lambda: UNTYPED_FIRST(value(1), accept=42), TypeError, r"first\.accept must be"),
    ],
)
async def test_invalid_arguments_name_the_field(
    call: Any, error: type[Exception], message: str
) -> None:
    with no_unawaited_coroutines(), pytest.raises(error, match=message):
        await call()


async def test_a_fan_out_reports_how_it_ended() -> None:
    seen: list[lk.events.Event] = []

    async def fail() -> int:
        raise ValueError("no")

    with lk.subscribe(seen.append):
        await lk.gather(_after(0.0, 1), fail(), _after(30, 3), within=0.2)
        await lk.first(_after(0.0, "a"), _after(30, "b"))
    gathered, raced = [e for e in seen if isinstance(e, lk.events.FanOutEnded)]
    assert (gathered.kind, gathered.awaitables, gathered.ok) == ("gather", 3, 1)
    assert (gathered.failed, gathered.timed_out, gathered.not_needed) == (1, 1, 0)
    assert 0.2 <= gathered.elapsed < 5
    assert (raced.kind, raced.ok, raced.not_needed, raced.rejected) == ("first", 1, 1, 0)


async def _after(seconds: float, value: Any) -> Any:
    await anyio.sleep(seconds)
    return value
