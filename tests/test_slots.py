"""Connection slots (``latencykit._slots``): attempts beyond a host's pool wait in latencykit's
queue, where ``stats()`` and telemetry see them, and the wait is not the provider's latency.

Through real litellm and the fast lane against the fake provider, on asyncio and trio; the pool
is made small (2 or 1 slots) so that a few calls queue. Bounds, never exact times.
"""

from __future__ import annotations

import gc
import math
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import latencykit as lk
from helpers import KEY, MESSAGES, until
from latencykit import _slots, telemetry
from latencykit.testing import Behavior, FakeProvider

SLOW = 0.4  # the provider's answer time, seconds
WAIT = "latencykit.connection.wait"


def make_llm(fake: FakeProvider, lane: str, **options: Any) -> lk.LLM:
    return lk.LLM("openai/slow", api_base=fake.base_url, api_key=KEY, transport=lane, **options)


def one_slot_llm(
    fake: FakeProvider, lane: str, slots: Any, behavior: Behavior, **options: Any
) -> lk.LLM:
    """An ``LLM`` whose host has one connection slot, on a fake answering with ``behavior``."""
    slots(1)
    fake.script("slow", behavior)
    return make_llm(fake, lane, **options)


@pytest.fixture(params=["litellm", "openai"])
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def slots(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``slots(n)``: the gates built from now on have ``n`` slots per host on either lane (the
    fast lane reads the environment; the litellm lane what litellm read at its import)."""
    import litellm.constants

    def set_to(n: int) -> None:
        monkeypatch.setenv(_slots.PER_HOST_VARIABLE, str(n))
        monkeypatch.setattr(litellm.constants, "AIOHTTP_CONNECTOR_LIMIT_PER_HOST", n)

    return set_to


def max_in_flight(fake: FakeProvider) -> int:
    """The most requests the provider was serving at once."""
    edges = sorted(
        [(a.arrived_at, 1) for a in fake.attempts]
        + [(a.ended_at or a.disconnected_at or math.inf, -1) for a in fake.attempts]
    )
    found = level = 0
    for _, step in edges:
        level += step
        found = max(found, level)
    return found


@pytest.mark.anyio
async def test_attempts_beyond_the_pool_wait_visibly_and_their_latency_leaves_the_wait_out(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    slots(2)
    fake.script("slow", Behavior(ttft=SLOW))
    llm = make_llm(fake, lane)
    await llm.warm()  # litellm's first-call set-up, before the clock matters
    responses: list[Any] = []

    async def call() -> None:
        responses.append(await llm.acompletion(messages=MESSAGES))

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(call)
        # Two calls hold the pool's two slots; two wait for one, and stats() says so.
        await until(lambda: llm.stats()["openai/slow"].waiting == 2)
    assert llm.stats()["openai/slow"].waiting == 0
    assert max_in_flight(fake) == 2 and len(fake.attempts) == 4

    stats = llm.stats()["openai/slow"]
    assert stats.connection_wait.samples == 2 and stats.connection_wait.censored == 0
    assert stats.connection_wait.p50 is not None and stats.connection_wait.p50 > SLOW / 2
    assert "wait95" in str(llm.stats())  # a column once a target waited
    # A call that waited ran twice as long as its attempt: the wait is not the provider's.
    waited = [r for r in responses if lk.report(r).attempts[0].start > SLOW / 2]
    assert len(waited) == 2
    for response in waited:
        report = lk.report(response)
        assert report.duration - report.attempts[0].duration > SLOW / 2
        # The record says where the time went: the wait, apart from the attempt.
        [attempt] = report.attempts
        assert attempt.queued > SLOW / 2 and "waiting for a connection" in str(attempt)
    assert sum(lk.report(r).attempts[0].queued == 0 for r in responses) == 2
    # Nor is it in the latency window the hedge reads: every sample is one answer's time.
    assert stats.latency.p99 is not None
    assert stats.latency.p99 < min(lk.report(r).duration for r in waited)


@pytest.mark.anyio
async def test_a_stream_holds_its_slot_until_it_is_closed(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=0.0, itl=0.05, output_tokens=400))
    await llm.warm()
    first = await llm.acompletion(messages=MESSAGES, stream=True)
    second: list[lk.Stream[Any]] = []

    async def open_second() -> None:
        second.append(await llm.acompletion(messages=MESSAGES, stream=True))

    async with anyio.create_task_group() as group:
        group.start_soon(open_second)
        await until(lambda: llm.stats()["openai/slow"].waiting == 1)
        assert len(fake.attempts) == 1  # the second request is not sent while the first reads
        await first.aclose()
    async with second[0] as stream:
        assert stream.ttft is not None and stream.ttft < 1.0  # its wait is not its first token
    assert len(fake.attempts) == 2
    assert llm.stats()["openai/slow"].connection_wait.samples == 1


@pytest.mark.anyio
async def test_a_deadline_ends_a_wait_for_a_slot(fake: FakeProvider, lane: str, slots: Any) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=30.0))
    await llm.warm()
    hung = make_llm(fake, lane, deadline=0.3)  # another LLM to the same host shares the pool
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
        await until(lambda: len(fake.attempts) == 1)
        with pytest.raises(lk.DeadlineExceeded) as caught:
            await hung.acompletion(messages=MESSAGES)
        group.cancel_scope.cancel()
    assert caught.value.attempts == ()  # no request was made: it waited for a connection
    # ...and the error says so: which host it waited for, how long, and that nothing was sent.
    error = caught.value
    assert error.queued_for is not None and error.queued_for.startswith("127.0.0.1:")
    assert error.queued_for.endswith(f"({lane} lane)") and error.queued > 0.2
    assert f"for a connection to {error.queued_for} (no request sent)" in str(error)
    assert len(fake.attempts) == 1
    stats = hung.stats()["openai/slow"]
    assert stats.connection_wait.censored == 1 and stats.waiting == 0
    assert stats.latency.samples == 0  # a wait says nothing of the provider


@pytest.mark.anyio
async def test_telemetry_shows_the_wait_on_the_attempt_and_in_metrics(
    fake: FakeProvider, slots: Any
) -> None:
    llm = one_slot_llm(fake, "openai", slots, Behavior(ttft=SLOW))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    with telemetry.instrument(tracer_provider=tracer_provider, meter_provider=meters):
        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
            await until(lambda: sum(_slots.waiting().values()) == 1)
            waiting = _points(reader, "latencykit.connection.waiting")
            assert [p.value for p in waiting if p.value] == [1]
    attempts = [s for s in spans.get_finished_spans() if s.name.startswith("attempt ")]
    waits = sorted(
        float(wait) if isinstance(wait := (s.attributes or {}).get(WAIT), float) else 0.0
        for s in attempts
    )
    assert len(waits) == 2 and waits[0] == 0 and waits[1] > SLOW / 2
    [histogram] = _points(reader, "latencykit.connection.wait")
    assert histogram.count == 1 and histogram.sum == waits[1]
    meters.shutdown()


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    return [
        point
        for resource in (data.resource_metrics if data else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def test_the_size_follows_litellms_limit_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm.constants

    monkeypatch.delenv(_slots.PER_HOST_VARIABLE, raising=False)
    assert _slots.per_host("openai") == 500  # litellm's default, without importing it
    monkeypatch.setenv(_slots.PER_HOST_VARIABLE, "0")
    assert _slots.per_host("openai") is None  # 0: no limit, as for litellm
    monkeypatch.setattr(litellm.constants, "AIOHTTP_CONNECTOR_LIMIT_PER_HOST", 0)
    monkeypatch.setattr(litellm.constants, "AIOHTTP_CONNECTOR_LIMIT", 300)
    assert _slots.per_host("litellm") == 300  # then litellm's total bounds a host
    monkeypatch.setattr(litellm.constants, "AIOHTTP_CONNECTOR_LIMIT", 0)
    assert _slots.per_host("litellm") is None


@pytest.mark.anyio
async def test_without_a_limit_nothing_waits(fake: FakeProvider, lane: str, slots: Any) -> None:
    slots(0)
    fake.script("slow", Behavior(ttft=0.1))
    llm = make_llm(fake, lane)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
    assert llm.stats()["openai/slow"].connection_wait.samples == 0
    assert max_in_flight(fake) == 3


def test_a_host_is_named_without_credentials_and_without_litellm() -> None:
    def host(model: str, api_base: str | None = None, lane: str = "litellm") -> tuple[str, str]:
        return _slots.host_of(lk.Target(model, api_base=api_base, transport=lane))

    assert host("openai/x", "https://user:sk-secret@api.example.com/v1") == (
        "litellm",
        "api.example.com:443",
    )
    assert host("openai/x", "http://127.0.0.1:8000/v1", "openai") == ("openai", "127.0.0.1:8000")
    assert host("anthropic/claude") == ("litellm", "anthropic")  # the provider's own host
    assert host("no-such-provider-model") == ("litellm", "default")  # no lookup, no banner


@pytest.mark.anyio
async def test_a_stream_collected_unclosed_gives_its_slot_back(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=0.0, itl=0.05, output_tokens=400))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del stream
        gc.collect()  # the finaliser gives the slot back through the event loop
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    with anyio.fail_after(10):
        async with await llm.acompletion(messages=MESSAGES, stream=True):
            pass
    assert len(fake.attempts) == 2


@pytest.mark.anyio
async def test_a_deadline_block_around_a_call_says_it_ended_a_wait(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=30.0))
    await llm.warm()
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
        await until(lambda: len(fake.attempts) == 1)
        # The deadline outside the call's pipeline:
        with pytest.raises(lk.DeadlineExceeded) as caught, lk.deadline(0.3):
            await llm.acompletion(messages=MESSAGES)
        group.cancel_scope.cancel()
    assert caught.value.queued_for is not None and caught.value.queued > 0.2
    assert "no request sent" in str(caught.value)


@pytest.mark.anyio
async def test_a_deadline_that_ends_a_request_does_not_blame_a_wait(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=30.0), deadline=0.3)
    await llm.warm()
    with pytest.raises(lk.DeadlineExceeded) as caught:
        await llm.acompletion(messages=MESSAGES)
    assert caught.value.queued_for is None and caught.value.queued == 0.0
    assert "connection" not in str(caught.value)


@pytest.mark.anyio
async def test_the_wait_is_in_the_attempt_event(fake: FakeProvider, lane: str, slots: Any) -> None:
    llm = one_slot_llm(fake, lane, slots, Behavior(ttft=SLOW))
    await llm.warm()
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
    started = sorted(e.queued for e in seen if isinstance(e, lk.events.AttemptStarted))
    ended = sorted(e.record.queued for e in seen if isinstance(e, lk.events.AttemptEnded))
    assert started == ended  # one value: the event, the record (and telemetry) read the same
    assert started[0] == 0 and started[1] > SLOW / 2


@pytest.mark.anyio
async def test_the_breaker_judges_the_provider_without_the_wait(
    fake: FakeProvider, lane: str, slots: Any
) -> None:
    slots(1)
    fake.script("slow", Behavior(ttft=SLOW))
    # Four calls through one slot: the last waits 3 answers, so with the wait it would take
    # 4 x SLOW; alone, each answer takes SLOW, far from slow_call_duration.
    breaker = {"slow_call_duration": SLOW * 2.5, "slow_call_rate": 0.5, "minimum_calls": 2}
    llm = make_llm(fake, lane, breaker=breaker)
    await llm.warm()
    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(lambda: llm.acompletion(messages=MESSAGES))
    breaker_of_target = lk.policies.breaker.breakers()["openai/slow"]
    metrics = breaker_of_target.metrics()
    assert metrics.calls == 4 and metrics.slow_calls == 0
    assert breaker_of_target.state is lk.policies.breaker.BreakerState.CLOSED
