"""OpenTelemetry export (latencykit.telemetry) through the real SDK's in-memory exporter and
metric reader, with real litellm calls to the fake provider."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import latencykit as lk
from helpers import KEY, make_llm
from latencykit import telemetry
from latencykit.policies.breaker import BreakerState
from latencykit.target import Endpoint
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

PROMPT = "what is the capital of the moon"
MESSAGES = [{"role": "user", "content": PROMPT}]


def attrs(span: ReadableSpan | Any) -> dict[str, Any]:
    """A span's (or a span event's) attributes, as a plain dict."""
    return dict(span.attributes or {})


class Exported:
    """What the SDK received: finished spans and collected metric points."""

    def __init__(self, spans: InMemorySpanExporter, reader: InMemoryMetricReader) -> None:
        self._spans = spans
        self._reader = reader

    def spans(self) -> list[ReadableSpan]:
        return list(self._spans.get_finished_spans())

    def call_span(self) -> ReadableSpan:
        [span] = [s for s in self.spans() if not s.name.startswith("attempt ")]
        return span

    def attempt_spans(self) -> list[ReadableSpan]:
        found = [s for s in self.spans() if s.name.startswith("attempt ")]
        return sorted(found, key=lambda s: int(attrs(s)["latencykit.attempt.number"]))

    def points(self, name: str) -> list[Any]:
        data = self._reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def every_value(self) -> list[str]:
        """Every exported attribute value, span event attribute and metric attribute, as text."""
        values: list[str] = []
        for span in self.spans():
            values += [span.name, *map(str, (span.attributes or {}).values())]
            for event in span.events:
                values += [event.name, *map(str, (event.attributes or {}).values())]
        data = self._reader.get_metrics_data()
        if data is not None:
            for resource in data.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        for point in metric.data.data_points:
                            values += map(str, (point.attributes or {}).values())
        return values


@pytest.fixture
def exported() -> Iterator[Exported]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    with telemetry.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider):
        yield Exported(spans, reader)
    meter_provider.shutdown()


async def drain(stream: lk.Stream[Any]) -> None:
    async for _ in stream:
        pass


def no_secret_or_text(exported: Exported, *texts: str) -> None:
    for value in exported.every_value():
        assert KEY not in value
        for text in texts:
            assert text not in value


async def test_a_plain_call_is_one_client_span_with_genai_attributes(
    fake: FakeProvider, exported: Exported
) -> None:
    fake.script("primary", Behavior(output_tokens=5))
    response = await make_llm(fake).acompletion(messages=MESSAGES, max_tokens=64, temperature=0.2)
    call = exported.call_span()
    assert call.name == "chat primary" and call.kind is SpanKind.CLIENT
    attributes = attrs(call)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "primary"
    assert attributes["gen_ai.request.max_tokens"] == 64
    assert attributes["gen_ai.request.temperature"] == 0.2
    assert attributes["gen_ai.request.stream"] is False
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == fake.port
    assert attributes["gen_ai.response.id"] == response.id
    assert attributes["gen_ai.response.model"] == response.model
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.usage.input_tokens"] == response.usage.prompt_tokens
    assert attributes["latencykit.outcome"] == "ok" and attributes["latencykit.attempts"] == 1
    assert "error.type" not in attributes and call.status.status_code is StatusCode.UNSET
    [attempt] = exported.attempt_spans()
    assert attempt.parent is not None and attempt.parent.span_id == call.context.span_id
    assert attrs(attempt)["latencykit.attempt.reason"] == "primary"
    assert attrs(attempt)["latencykit.attempt.outcome"] == "ok"
    assert attrs(attempt)["latencykit.attempt.loser"] is False

    [duration] = exported.points("gen_ai.client.operation.duration")
    assert duration.count == 1 and duration.attributes["gen_ai.request.model"] == "primary"
    assert duration.attributes["gen_ai.response.model"] == response.model
    assert list(duration.explicit_bounds)[:3] == [0.01, 0.02, 0.04]
    usage = {
        p.attributes["gen_ai.token.type"]: p.sum
        for p in exported.points("gen_ai.client.token.usage")
    }
    assert usage == {"input": response.usage.prompt_tokens, "output": 5}
    [attempts] = exported.points("latencykit.attempts")
    assert attempts.value == 1 and attempts.attributes["latencykit.attempt.outcome"] == "ok"
    assert not exported.points("gen_ai.client.operation.time_to_first_chunk")  # not a stream
    no_secret_or_text(exported, PROMPT, response.choices[0].message.content)


async def test_a_hedged_call_shows_the_race(fake: FakeProvider, exported: Exported) -> None:
    fake.script("tail", [Behavior(ttft=30.0), Behavior(output_tokens=4)])
    llm = make_llm(fake, "tail", deadline=10, hedge=lk.Hedge(0.2, max_extra_load=1.0))
    await llm.acompletion(messages=MESSAGES)
    primary, backup = exported.attempt_spans()
    assert attrs(primary)["latencykit.attempt.reason"] == "primary"
    assert attrs(primary)["latencykit.attempt.outcome"] == "cancelled"
    assert attrs(primary)["latencykit.attempt.loser"] is True
    assert attrs(backup)["latencykit.attempt.reason"] == "hedge"
    assert attrs(backup)["latencykit.attempt.outcome"] == "ok"
    call = exported.call_span()
    names = [event.name for event in call.events]
    assert names == ["latencykit.hedge.fired", "latencykit.hedge.won"]
    hedges = {
        p.attributes["latencykit.hedge.event"]: p.value
        for p in exported.points("latencykit.hedges")
    }
    assert hedges == {"fired": 1, "won": 1}
    no_secret_or_text(exported, PROMPT)


async def test_a_failover_shows_each_target(fake: FakeProvider, exported: Exported) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    fake.script("up", Behavior(output_tokens=3))
    llm = make_llm(
        fake,
        "down",
        failover=[{"model": "openai/up", "api_base": fake.base_url, "api_key": KEY}],
    )
    await llm.acompletion(messages=MESSAGES)
    first, second = exported.attempt_spans()
    assert "gen_ai.request.model" not in attrs(first)  # the call's own: on the call span
    assert attrs(first)["error.type"] == "ProviderUnavailable"
    assert attrs(first)["latencykit.error.kind"] == "server_error"
    assert first.status.status_code is StatusCode.ERROR
    assert attrs(second)["gen_ai.request.model"] == "up"
    assert attrs(second)["latencykit.attempt.reason"] == "failover"
    call = exported.call_span()
    assert attrs(call)["latencykit.answered_by"] == "openai/up"
    assert call.status.status_code is StatusCode.UNSET  # the call succeeded
    [moved] = [e for e in call.events if e.name == "latencykit.failed_over"]
    assert moved.attributes == {
        "latencykit.from_target": "openai/down",
        "latencykit.to_target": "openai/up",
    }
    [failovers] = exported.points("latencykit.failovers")
    assert failovers.value == 1
    outcomes = sorted(
        (p.attributes["latencykit.attempt.outcome"], p.value)
        for p in exported.points("latencykit.attempts")
    )
    assert outcomes == [("error", 1), ("ok", 1)]


@pytest.fixture
def elsewhere() -> Iterator[FakeProvider]:
    """A second fake provider, on another loopback address than ``fake``."""
    with FakeProvider(host="127.0.0.2") as provider:
        yield provider


@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
async def test_a_failover_bills_the_target_that_answered(
    fake: FakeProvider, elsewhere: FakeProvider, exported: Exported, stream: bool
) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    elsewhere.script("backup", Behavior(output_tokens=4))
    backup = {"model": "hosted_vllm/backup", "api_base": elsewhere.base_url, "api_key": KEY}
    llm = make_llm(fake, "primary", failover=[backup])
    if stream:
        async with await llm.acompletion(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        ) as answer:
            await drain(answer)
    else:
        await llm.acompletion(messages=MESSAGES)
    answered = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "hosted_vllm",
        "gen_ai.request.model": "primary",  # what the call asked for
        "server.address": "127.0.0.2",
        "server.port": elsewhere.port,
        "gen_ai.response.model": "backup",
    }
    call = exported.call_span()
    assert call.name == "chat primary"
    assert {name: attrs(call).get(name) for name in answered} == answered
    assert attrs(call)["gen_ai.usage.output_tokens"] == 4
    tokens = exported.points("gen_ai.client.token.usage")
    assert sorted(p.attributes["gen_ai.token.type"] for p in tokens) == ["input", "output"]
    for point in tokens:
        assert dict(point.attributes) == {
            **answered,
            "gen_ai.token.type": point.attributes["gen_ai.token.type"],
        }
    [duration] = exported.points("gen_ai.client.operation.duration")
    assert dict(duration.attributes) == answered
    if stream:
        [first] = exported.points("gen_ai.client.operation.time_to_first_chunk")
        assert dict(first.attributes) == answered
        [per_chunk] = exported.points("gen_ai.client.operation.time_per_output_chunk")
        assert per_chunk.count == 3  # four content chunks, all from the backup
        assert per_chunk.attributes["gen_ai.provider.name"] == "hosted_vllm"
        assert per_chunk.attributes["server.address"] == "127.0.0.2"


async def test_an_answer_from_a_default_endpoint_has_no_server_address(
    fake: FakeProvider, elsewhere: FakeProvider, exported: Exported, monkeypatch: Any
) -> None:
    # The backup has no api_base of its own: litellm sends it to the provider's default,
    # which the environment points at the second fake.
    monkeypatch.setenv("OPENAI_API_BASE", elsewhere.base_url)
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    elsewhere.script("backup", Behavior(output_tokens=2))
    llm = make_llm(fake, "primary", failover=[{"model": "openai/backup", "api_key": KEY}])
    await llm.acompletion(messages=MESSAGES)
    assert [a.model for a in elsewhere.attempts] == ["backup"]
    call = exported.call_span()
    assert attrs(call)["latencykit.answered_by"] == "openai/backup"
    assert "server.address" not in attrs(call) and "server.port" not in attrs(call)
    for point in exported.points("gen_ai.client.token.usage"):
        assert "server.address" not in point.attributes
        assert "server.port" not in point.attributes


async def test_a_failed_call_is_measured_on_its_first_target(
    fake: FakeProvider, elsewhere: FakeProvider, exported: Exported
) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    elsewhere.script("backup", Behavior(fault=Fault.HTTP_503))
    backup = {"model": "hosted_vllm/backup", "api_base": elsewhere.base_url, "api_key": KEY}
    with pytest.raises(lk.ProviderError):
        await make_llm(fake, "primary", failover=[backup]).acompletion(messages=MESSAGES)
    call = exported.call_span()
    assert attrs(call)["gen_ai.provider.name"] == "openai"
    assert attrs(call)["server.address"] == "127.0.0.1"
    assert attrs(call)["server.port"] == fake.port
    [duration] = exported.points("gen_ai.client.operation.duration")
    assert duration.attributes["gen_ai.provider.name"] == "openai"
    assert duration.attributes["server.port"] == fake.port
    assert duration.attributes["error.type"] == attrs(call)["error.type"]
    assert not exported.points("gen_ai.client.token.usage")


async def test_a_degraded_answer_is_marked(fake: FakeProvider, exported: Exported) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("cheap", Behavior(output_tokens=3))
    llm = make_llm(fake, "slow", deadline=5.0, degrade=lk.Degrade(model="openai/cheap", after=0.2))
    await llm.acompletion(messages=MESSAGES)
    call = exported.call_span()
    assert attrs(call)["latencykit.degraded"] is True
    [used] = [e for e in call.events if e.name == "latencykit.fallback"]
    assert attrs(used)["latencykit.fallback.reason"] == "timeout"
    slow, cheap = exported.attempt_spans()
    assert attrs(slow)["latencykit.attempt.outcome"] == "cancelled"
    assert attrs(cheap)["latencykit.attempt.reason"] == "fallback"
    assert [p.value for p in exported.points("latencykit.fallbacks")] == [1]


async def test_a_stream_reports_time_to_first_chunk_and_per_chunk(
    fake: FakeProvider, exported: Exported
) -> None:
    fake.script("streamer", Behavior(output_tokens=6))
    llm = make_llm(fake, "streamer")
    async with await llm.acompletion(
        messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ) as stream:
        chunks = [chunk async for chunk in stream]
    call = exported.call_span()
    attributes = attrs(call)
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.output_tokens"] == 6
    assert attributes["gen_ai.response.id"] == chunks[0].id
    [first] = exported.points("gen_ai.client.operation.time_to_first_chunk")
    assert first.count == 1
    [per_chunk] = exported.points("gen_ai.client.operation.time_per_output_chunk")
    assert per_chunk.count == 5  # six content chunks: five gaps
    [attempt] = exported.attempt_spans()
    assert [e.name for e in attempt.events] == ["latencykit.first_chunk"]
    assert attrs(attempt)["latencykit.attempt.chunks"] == 6


@pytest.mark.filterwarnings("ignore:Items .*ReadOnly:UserWarning")  # litellm's Mistral module
async def test_a_litellm_estimate_is_not_reported_as_usage(
    fake: FakeProvider, exported: Exported
) -> None:
    # litellm does not pass stream_options on to Mistral: the provider sends no usage, and
    # litellm ends the stream with a usage chunk of its own estimate.
    fake.script("quiet", Behavior(output_tokens=6))
    llm = lk.LLM("mistral/quiet", api_base=fake.base_url, api_key=KEY)
    async with await llm.acompletion(
        messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ) as stream:
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage.completion_tokens != 6  # litellm's tokenizer, not the provider
    call = exported.call_span()
    assert attrs(call)["gen_ai.provider.name"] == "mistral_ai"
    assert "gen_ai.usage.output_tokens" not in attrs(call)
    assert "gen_ai.usage.input_tokens" not in attrs(call)
    assert not exported.points("gen_ai.client.token.usage")
    [attempt] = exported.attempt_spans()
    assert "gen_ai.usage.output_tokens" not in attrs(attempt)


async def test_a_broken_stream_is_an_error_span(fake: FakeProvider, exported: Exported) -> None:
    fake.script("breaks", Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8))
    stream = await make_llm(fake, "breaks").acompletion(messages=MESSAGES, stream=True)
    async with stream:
        with pytest.raises(lk.StreamBroken):
            await drain(stream)
    call = exported.call_span()
    assert call.status.status_code is StatusCode.ERROR
    assert attrs(call)["error.type"] == "StreamBroken"
    assert attrs(call)["latencykit.error.kind"] == "stream_broken"
    assert attrs(call)["latencykit.outcome"] == "error"
    [duration] = exported.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "StreamBroken"
    no_secret_or_text(exported, PROMPT, "tok0 tok1")


async def test_content_is_exported_only_when_asked(fake: FakeProvider) -> None:
    fake.script("talker", Behavior(output_tokens=3))
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    with telemetry.instrument(tracer_provider=provider, capture_content=True):
        response = await make_llm(fake, "talker").acompletion(messages=MESSAGES)
    [call] = [s for s in spans.get_finished_spans() if s.name == "chat talker"]
    [sent] = json.loads(attrs(call)["gen_ai.input.messages"])
    assert sent == {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    [answer] = json.loads(attrs(call)["gen_ai.output.messages"])
    assert answer["parts"][0]["content"] == response.choices[0].message.content
    assert answer["finish_reason"] == "stop"
    assert not lk.events.capturing_content()  # closed with its handle


async def test_a_call_inside_a_call_is_parented_to_its_attempt(
    fake: FakeProvider, exported: Exported
) -> None:
    fake.script("inner", Behavior(output_tokens=2))
    llm = make_llm(fake, "inner")

    @lk.deadline(10)
    async def outer() -> str:
        response = await llm.acompletion(messages=MESSAGES)
        return str(response.choices[0].message.content)

    await outer()
    spans = {span.name: span for span in exported.spans()}
    outer_call = spans[outer.__qualname__]
    assert outer_call.kind is SpanKind.INTERNAL and outer_call.parent is None
    outer_attempt = spans[f"attempt {outer.__qualname__}"]
    inner_call = spans["chat inner"]
    assert inner_call.parent is not None
    assert inner_call.parent.span_id == outer_attempt.context.span_id
    # Only the LLM call is a GenAI operation; the function call has latencykit's duration.
    [genai] = exported.points("gen_ai.client.operation.duration")
    assert genai.attributes["gen_ai.request.model"] == "inner"
    [function_call] = exported.points("latencykit.call.duration")
    assert function_call.attributes["latencykit.target"] == outer.__qualname__


async def test_telemetry_off_subscribes_nothing() -> None:
    assert not lk.events.listening()
    handle = telemetry.instrument()  # the API's no-op providers: nothing is exported
    assert lk.events.listening()
    handle.close()
    handle.close()  # idempotent
    assert not lk.events.listening()
    assert lk.telemetry is telemetry  # reachable from the package, imported on first use


def test_each_policy_event_is_a_span_event_and_a_count(exported: Exported) -> None:
    # The policies' decisions, emitted as the policies do, on one call: the table in
    # docs/telemetry.md ("Span events", latencykit's own instruments).
    kind, open_, closed = lk.ErrorKind.TIMEOUT, BreakerState.OPEN, BreakerState.CLOSED
    decisions: list[tuple[lk.events.Event, str, dict[str, Any]]] = [
        (
            lk.events.HedgeFired(7, 2, "t", "delay", 0.5),
            "latencykit.hedge.fired",
            {
                "latencykit.attempt.number": 2,
                "latencykit.target": "t",
                "latencykit.hedge.reason": "delay",
                "latencykit.hedge.delay": 0.5,
            },
        ),
        (
            lk.events.HedgeWon(7, 2, 2),
            "latencykit.hedge.won",
            {"latencykit.attempt.number": 2, "latencykit.attempts": 2},
        ),
        (
            lk.events.HedgeSkipped(7, 3, "budget"),
            "latencykit.hedge.skipped",
            {"latencykit.hedge.reason": "budget"},
        ),
        (
            lk.events.FailedOver(7, "t", "u"),
            "latencykit.failed_over",
            {"latencykit.from_target": "t", "latencykit.to_target": "u"},
        ),
        (
            lk.events.TargetSkipped(7, "u", "breaker_open"),
            "latencykit.target_skipped",
            {"latencykit.target": "u", "latencykit.skip.reason": "breaker_open"},
        ),
        (
            lk.events.FallbackUsed(7, "error", 0.25, None, "Boom", kind),
            "latencykit.fallback",
            {
                "latencykit.fallback.reason": "error",
                "latencykit.fallback.elapsed": 0.25,
                "error.type": "Boom",
            },
        ),
        (
            lk.events.DeadlineExpired(7, 1.0, 1.5, "model"),
            "latencykit.deadline.expired",
            {
                "latencykit.deadline.budget": 1.0,
                "latencykit.deadline.elapsed": 1.5,
                "latencykit.stage.name": "model",
            },
        ),
        (
            lk.events.LimitWaited(7, "t", "tenant-a", "requests", 0.1),
            "latencykit.limit.waited",
            {"latencykit.limit.kind": "requests", "latencykit.limit.waited": 0.1},
        ),
        (
            lk.events.LimitRefused(7, "t", "tenant-a", "tokens", 2.0, 0.2),
            "latencykit.limit.refused",
            {"latencykit.limit.kind": "tokens", "latencykit.limit.waited": 0.2},
        ),
        (
            lk.events.StallDetected(7, 1, "t", 2.0, 5),
            "latencykit.stream.stall",
            {
                "latencykit.target": "t",
                "latencykit.stream.stall_limit": 2.0,
                "latencykit.stream.chunks": 5,
            },
        ),
        (
            lk.events.StreamResumed(7, 2, "u", "prefill", 5),
            "latencykit.stream.resumed",
            {
                "latencykit.target": "u",
                "latencykit.stream.resume_mode": "prefill",
                "latencykit.stream.chunks": 5,
            },
        ),
        (
            lk.events.RetryScheduled(7, 2, 0.3, kind, 1.0),
            "latencykit.retry.scheduled",
            {
                "latencykit.retry.wait": 0.3,
                "latencykit.error.kind": "timeout",
                "latencykit.retry.retry_after": 1.0,
            },
        ),
        (
            lk.events.RetryGaveUp(7, 3, "max_attempts", kind),
            "latencykit.retry.gave_up",
            {"latencykit.retry.reason": "max_attempts", "latencykit.attempts": 3},
        ),
        (
            lk.events.BreakerStateChanged(7, "t", closed, open_, 0.75, 0.0, 4),
            "latencykit.breaker.state_changed",
            {
                "latencykit.target": "t",
                "latencykit.breaker.from": "closed",
                "latencykit.breaker.to": "open",
                "latencykit.breaker.failure_rate": 0.75,
            },
        ),
        (
            lk.events.BreakerRejected(7, "t", open_),
            "latencykit.breaker.rejected",
            {"latencykit.target": "t", "latencykit.breaker.state": "open"},
        ),
    ]
    emit = lk.events.emit
    emit(lk.events.CallStarted(7, "t", Endpoint("m", "openai")))
    emit(lk.events.Routed(7, "t", "default"))
    emit(lk.events.CacheLookup(7, "t", False, 0.0))
    for event, _, _ in decisions:
        emit(event)
    emit(lk.events.StoreUnavailable(0, "RedisStore()", "ConnectionError"))
    emit(lk.events.CallEnded(7, "t", 1.5, "ok", 1, False))
    call = exported.call_span()
    assert [(e.name, attrs(e)) for e in call.events] == [(n, a) for _, n, a in decisions]
    assert attrs(call)["latencykit.route.target"] == "t"
    assert attrs(call)["latencykit.route.reason"] == "default"
    assert attrs(call)["latencykit.cache.hit"] is False

    def counted(name: str) -> list[tuple[dict[str, Any], Any]]:
        return [(dict(p.attributes), getattr(p, "value", None)) for p in exported.points(name)]

    hedges = {
        p.attributes["latencykit.hedge.event"]: p for p in exported.points("latencykit.hedges")
    }
    assert {event: (dict(p.attributes), p.value) for event, p in hedges.items()} == {
        "fired": ({"latencykit.hedge.event": "fired", "latencykit.hedge.reason": "delay"}, 1),
        "won": ({"latencykit.hedge.event": "won"}, 1),
        "skipped": ({"latencykit.hedge.event": "skipped", "latencykit.hedge.reason": "budget"}, 1),
    }
    assert counted("latencykit.failovers") == [
        ({"latencykit.from_target": "t", "latencykit.to_target": "u"}, 1)
    ]
    assert counted("latencykit.targets_skipped") == [
        ({"latencykit.target": "u", "latencykit.skip.reason": "breaker_open"}, 1)
    ]
    assert counted("latencykit.fallbacks") == [({"latencykit.fallback.reason": "error"}, 1)]
    assert counted("latencykit.deadline.expired") == [({}, 1)]
    [overshoot] = exported.points("latencykit.deadline.overshoot")
    assert overshoot.sum == pytest.approx(0.5)
    assert counted("latencykit.retries") == [({"latencykit.error.kind": "timeout"}, 1)]
    assert counted("latencykit.stream.stalls") == [({"latencykit.target": "t"}, 1)]
    assert counted("latencykit.stream.resumes") == [
        ({"latencykit.stream.resume_mode": "prefill"}, 1)
    ]
    assert counted("latencykit.breaker.transitions") == [
        (
            {
                "latencykit.target": "t",
                "latencykit.breaker.from": "closed",
                "latencykit.breaker.to": "open",
            },
            1,
        )
    ]
    assert counted("latencykit.breaker.state") == [({"latencykit.target": "t"}, 2)]
    assert counted("latencykit.breaker.rejections") == [({"latencykit.target": "t"}, 1)]
    assert counted("latencykit.store.unavailable") == [
        ({"latencykit.store.reason": "ConnectionError"}, 1)
    ]
