"""OpenTelemetry traces and metrics for latencykit calls, after the GenAI semantic conventions.

``latencykit.telemetry.instrument()`` subscribes to latencykit's events and turns them into
spans and metrics through ``opentelemetry-api`` alone: whatever SDK and exporters the
application configured receive them; without an SDK, the API's no-op providers drop them.
Nothing is subscribed until ``instrument()`` is called, so telemetry that is off costs nothing
(no event is even built).

Spans: one per call (an ``lk.LLM.acompletion``: kind CLIENT, named ``chat {model}``; a
decorated function: kind INTERNAL, named after the function), with one child span per attempt
(which target, why it was made, how it ended, whether it lost a hedge race), and the resilience
decisions as span events. Metrics: the GenAI client instruments and latencykit's own (the table
is in docs/telemetry.md). Prompt and answer text are exported only when asked for
(``capture_content=True``, or the convention's environment variable); keys never are: events
carry none.

The span of a call is not made the current span (it is built from events, after the fact),
so spans the application opens inside a decorated function are siblings of latencykit's, not
children; a latencykit call made inside another one is parented to the attempt it runs in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import events
from ._context import Attempt
from ._handle import Handle
from ._values import BreakerState
from ._version import __version__
from .events import (
    BreakerRejected,
    BreakerStateChanged,
    CacheLookup,
    LimitRefused,
    LimitWaited,
    RetryGaveUp,
    RetryScheduled,
    StoreUnavailable,
)
from .target import Endpoint

__all__ = ["CAPTURE_CONTENT_VARIABLE", "SEMCONV_VERSION", "Instrumentation", "instrument"]

# --- the conventions, in one place ----------------------------------------------------------------

SEMCONV_VERSION = "1.38.0"
"""The OpenTelemetry GenAI semantic conventions followed: their latest experimental names
(``gen_ai.provider.name``, ``gen_ai.input.messages``, ...), which is what
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` asks instrumentations for; the
conventions are still in development, and renames land here."""

CAPTURE_CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The convention's switch for exporting prompt and answer text (default off)."""

_OPERATION = "gen_ai.operation.name"
_PROVIDER = "gen_ai.provider.name"
_REQUEST_MODEL = "gen_ai.request.model"
_RESPONSE_MODEL = "gen_ai.response.model"
_RESPONSE_ID = "gen_ai.response.id"
_FINISH_REASONS = "gen_ai.response.finish_reasons"
_INPUT_TOKENS = "gen_ai.usage.input_tokens"
_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
_TOKEN_TYPE = "gen_ai.token.type"
_STREAM = "gen_ai.request.stream"
_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
_INPUT_MESSAGES = "gen_ai.input.messages"
_OUTPUT_MESSAGES = "gen_ai.output.messages"
_SERVER_ADDRESS = "server.address"
_SERVER_PORT = "server.port"
_ERROR_TYPE = "error.type"
_REQUEST_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
    "n": "gen_ai.request.choice.count",
}
# litellm's provider names -> the convention's well-known values (others pass through as is).
_PROVIDERS = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "cohere": "cohere",
    "cohere_chat": "cohere",
    "deepseek": "deepseek",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "groq": "groq",
    "watsonx": "ibm.watsonx.ai",
    "mistral": "mistral_ai",
    "moonshot": "moonshot_ai",
    "perplexity": "perplexity",
    "xai": "x_ai",
}
# The convention's recommended bucket boundaries.
_SECONDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_TOKENS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
_OVERSHOOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_BREAKER_STATE = {
    BreakerState.CLOSED: 0,
    BreakerState.HALF_OPEN: 1,
    BreakerState.OPEN: 2,
    BreakerState.FORCED_OPEN: 3,
}


def _content_from_environment() -> bool:
    value = os.environ.get(CAPTURE_CONTENT_VARIABLE, "").strip().lower()
    return value in ("true", "1", "yes", "span_only", "span_and_event")


_by_endpoint: dict[Endpoint, dict[str, Any]] = {}


def _endpoint_attributes(endpoint: Endpoint) -> dict[str, Any]:
    """The GenAI attributes of a target: what it is asked for and where it is (computed once
    per endpoint; callers copy before changing)."""
    found = _by_endpoint.get(endpoint)
    if found is None:
        found = _by_endpoint[endpoint] = _describe(endpoint)
    return found


def _describe(endpoint: Endpoint) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        _OPERATION: "chat",
        _PROVIDER: _PROVIDERS.get(endpoint.provider or "", endpoint.provider or "unknown"),
        _REQUEST_MODEL: endpoint.model,
    }
    if endpoint.address is not None:
        attributes[_SERVER_ADDRESS] = endpoint.address
        if endpoint.port is not None:
            attributes[_SERVER_PORT] = endpoint.port
    return attributes


def _messages(messages: Any) -> str | None:
    """Chat messages in the convention's ``gen_ai.input.messages`` shape, as JSON."""
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return None
    shaped = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            parts.append({"type": "text", "content": content})
        elif isinstance(content, Sequence):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    parts.append({"type": "text", "content": part.get("text", "")})
                elif isinstance(part, Mapping):
                    parts.append({"type": str(part.get("type", "unknown"))})
        shaped.append({"role": str(message.get("role", "user")), "parts": parts})
    return json.dumps(shaped, ensure_ascii=False)


@dataclass(slots=True)
class _Call:
    """What telemetry keeps of a call in flight."""

    span: trace.Span
    attributes: dict[str, Any]  # the metric attributes of the call, as made to its first target
    genai: bool
    endpoint: Endpoint  # the call's first target's
    attempts: dict[int, trace.Span] = field(default_factory=dict)
    answered: bool = False  # an attempt succeeded: attempts cancelled after it lost a race
    # Where the attempts to other targets went (failover, degrade, hedge, resume), by target
    # key: what the answer is attributed to when one of them answers.
    elsewhere: dict[str, Endpoint] = field(default_factory=dict)

    def measured(self, target: str) -> dict[str, Any]:
        """The metric attributes of what ``target`` (a key) answered for the call: that
        target's provider and host, the model the call asked for."""
        answering = self.elsewhere.get(target)
        if answering is None:
            return self.attributes
        return {**_endpoint_attributes(answering), _REQUEST_MODEL: self.endpoint.model}


_NO_ENDPOINT = Endpoint("")


class Instrumentation(Handle):
    """The handle :func:`instrument` returns: ``close()`` (or leave its ``with`` block) to stop.

    Attributes:
        capture_content: whether prompt and answer text are exported.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
    ) -> None:
        self.capture_content = (
            _content_from_environment() if capture_content is None else bool(capture_content)
        )
        self._tracer = trace.get_tracer("latencykit", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("latencykit", __version__, meter_provider=meter_provider)
        histogram = meter.create_histogram
        counter = meter.create_counter
        self._duration = histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._tokens = histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKENS,
        )
        self._first_chunk = histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from the start of a streaming call to its first content chunk.",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._per_chunk = histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            unit="s",
            description="Time between consecutive content chunks of a stream.",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._call_duration = histogram(
            "latencykit.call.duration",
            unit="s",
            description="Duration of a call of a decorated function (LLM calls have the GenAI "
            "operation duration).",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        # Every attempt is counted: in a dict on the hot path, reported when metrics are
        # collected (an observable counter), not through a synchronous instrument per attempt.
        self._attempt_counts: dict[tuple[str, str, str, str | None], int] = {}
        meter.create_observable_counter(
            "latencykit.attempts",
            callbacks=[self._observe_attempts],
            unit="{attempt}",
            description="Attempts, by target, outcome, reason and error type.",
        )
        self._hedges = counter(
            "latencykit.hedges",
            unit="{hedge}",
            description="Hedges fired, won, and skipped (budget or deadline).",
        )
        self._wasted = counter(
            "latencykit.hedge.wasted_output_tokens",
            unit="{token}",
            description="Output tokens (or content chunks) received by attempts that lost.",
        )
        self._failovers = counter(
            "latencykit.failovers", unit="{failover}", description="Moves to the next target."
        )
        self._skipped = counter(
            "latencykit.targets_skipped",
            unit="{target}",
            description="Targets skipped by failover without a request.",
        )
        self._fallbacks = counter(
            "latencykit.fallbacks",
            unit="{call}",
            description="Calls answered (or failed) by the fallback's degraded path.",
        )
        self._expired = counter(
            "latencykit.deadline.expired", unit="{call}", description="Deadlines that expired."
        )
        self._overshoot = histogram(
            "latencykit.deadline.overshoot",
            unit="s",
            description="How late a deadline's expiry was delivered (elapsed - budget).",
            explicit_bucket_boundaries_advisory=_OVERSHOOT,
        )
        self._retries = counter(
            "latencykit.retries", unit="{retry}", description="Retries scheduled."
        )
        self._stalls = counter(
            "latencykit.stream.stalls", unit="{stall}", description="Streams that stalled."
        )
        self._resumes = counter(
            "latencykit.stream.resumes",
            unit="{resume}",
            description="Broken streams continued from another attempt.",
        )
        self._transitions = counter(
            "latencykit.breaker.transitions",
            unit="{transition}",
            description="Circuit breaker state changes.",
        )
        self._rejections = counter(
            "latencykit.breaker.rejections",
            unit="{call}",
            description="Calls a circuit breaker refused.",
        )
        self._store_outages = counter(
            "latencykit.store.unavailable",
            unit="{outage}",
            description="Times a shared store stopped answering (policies went process-local).",
        )
        self._breaker_state = meter.create_gauge(
            "latencykit.breaker.state",
            unit="1",
            description="Circuit breaker state: 0 closed, 1 half-open, 2 open, 3 forced open.",
        )
        self._calls: dict[int, _Call] = {}
        self._handlers: dict[type[events.Event], Callable[[Any], None]] = {
            events.CallStarted: self._call_started,
            events.AttemptStarted: self._attempt_started,
            events.AttemptEnded: self._attempt_ended,
            events.CallEnded: self._call_ended,
            events.HedgeFired: self._hedge_fired,
            events.HedgeWon: self._hedge_won,
            events.HedgeSkipped: self._hedge_skipped,
            events.FailedOver: self._failed_over,
            events.TargetSkipped: self._target_skipped,
            events.FallbackUsed: self._fallback_used,
            events.DeadlineExpired: self._deadline_expired,
            events.FirstToken: self._first_token,
            events.StallDetected: self._stall_detected,
            events.StreamResumed: self._stream_resumed,
            events.Routed: self._routed,
            CacheLookup: self._cache_lookup,
            LimitWaited: self._limit_waited,
            LimitRefused: self._limit_refused,
            events.StageStarted: self._stage_started,
            events.StageEnded: self._stage_ended,
            RetryScheduled: self._retry_scheduled,
            RetryGaveUp: self._retry_gave_up,
            BreakerStateChanged: self._breaker_changed,
            BreakerRejected: self._breaker_rejected,
            StoreUnavailable: self._store_unavailable,
        }
        self._capture = events.capture_content() if self.capture_content else None
        self._subscription: events.Subscription | None = events.subscribe(self._on_event)

    def __repr__(self) -> str:
        state = "closed" if self._subscription is None else f"{len(self._calls)} calls in flight"
        return f"<latencykit.telemetry.Instrumentation {state}>"

    def close(self) -> None:
        """Stop: unsubscribe and end the spans of calls still in flight. Idempotent."""
        if self._subscription is None:
            return
        self._subscription.close()
        self._subscription = None
        if self._capture is not None:
            self._capture.close()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            for span in call.attempts.values():
                span.end()
            call.span.end()

    def _observe_attempts(self, options: metrics.CallbackOptions) -> list[metrics.Observation]:
        observed = []
        for (target, outcome, reason, error), count in list(self._attempt_counts.items()):
            attributes = {
                "latencykit.target": target,
                "latencykit.attempt.outcome": outcome,
                "latencykit.attempt.reason": reason,
            }
            if error is not None:
                attributes[_ERROR_TYPE] = error
            observed.append(metrics.Observation(count, attributes))
        return observed

    # --- events -----------------------------------------------------------------------------

    def _on_event(self, event: events.Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _span_event(self, call_id: int, name: str, attributes: Mapping[str, Any]) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.span.add_event(name, attributes)

    def _parent_context(self, parent_id: int | None, attempt: int) -> Context | None:
        """The span context a call or stage inside ``parent_id`` starts in: the parent's
        attempt it runs in, else the parent itself (a stage), else the ambient context."""
        parent = self._calls.get(parent_id) if parent_id is not None else None
        if parent is None:
            return None
        return trace.set_span_in_context(parent.attempts.get(attempt) or parent.span)

    def _call_started(self, event: events.CallStarted) -> None:
        context = self._parent_context(event.parent_id, event.parent_attempt)
        endpoint = event.endpoint
        genai = bool(endpoint.model)
        if genai:
            metric_attributes = _endpoint_attributes(endpoint)
            attributes = {**metric_attributes, "latencykit.target": event.target}
            # The answering target's host: set when the call ends (a span attribute cannot be
            # taken back, should another target without an api_base of its own answer).
            attributes.pop(_SERVER_ADDRESS, None)
            attributes.pop(_SERVER_PORT, None)
            attributes[_STREAM] = event.stream
            for name, value in event.parameters.items():
                attributes[_REQUEST_PARAMETERS.get(name, f"gen_ai.request.{name}")] = value
            if event.input_messages is not None:
                text = _messages(event.input_messages)
                if text is not None:
                    attributes[_INPUT_MESSAGES] = text
            name = f"chat {endpoint.model}"
            kind = SpanKind.CLIENT
        else:
            metric_attributes = attributes = {"latencykit.target": event.target}
            name, kind = event.target, SpanKind.INTERNAL
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        self._calls[event.call_id] = _Call(span, metric_attributes, genai, endpoint)

    def _attempt_started(self, event: events.AttemptStarted) -> None:
        call = self._calls.get(event.call_id)
        if call is None:
            return
        attributes: dict[str, Any] = {
            "latencykit.attempt.number": event.attempt,
            "latencykit.attempt.reason": event.reason,
            "latencykit.target": event.target,
        }
        endpoint = event.endpoint
        if call.genai and endpoint is not None and endpoint.model and endpoint != call.endpoint:
            attributes.update(_endpoint_attributes(endpoint))  # another model or host
            del attributes[_OPERATION]
            call.elsewhere[event.target] = endpoint
        call.attempts[event.attempt] = self._tracer.start_span(
            f"attempt {event.target}",
            context=trace.set_span_in_context(call.span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )

    def _attempt_ended(self, event: events.AttemptEnded) -> None:
        record: Attempt = event.record
        call = self._calls.get(event.call_id)
        loser = record.outcome == "cancelled" and call is not None and call.answered
        if call is not None and record.outcome == "ok":
            call.answered = True
        key = (record.target, record.outcome, record.reason, record.error_type)
        counts = self._attempt_counts
        counts[key] = counts.get(key, 0) + 1
        if loser:
            wasted = record.output_tokens if record.output_tokens is not None else record.chunks
            if wasted:
                self._wasted.add(wasted, {"latencykit.target": record.target})
        if call is None:
            return
        if event.gaps and call.genai:
            record_gap = self._per_chunk.record
            measured = call.measured(record.target)  # the chunks of the attempt's target
            for gap in event.gaps:
                record_gap(gap, measured)
        span = call.attempts.pop(record.number, None)
        if span is None:
            return
        attributes: dict[str, Any] = {
            "latencykit.attempt.outcome": record.outcome,
            "latencykit.attempt.loser": loser,
        }
        if record.ttft is not None:
            attributes[_TIME_TO_FIRST_CHUNK] = record.ttft
            attributes["latencykit.attempt.chunks"] = record.chunks
        if record.output_tokens is not None:
            attributes[_OUTPUT_TOKENS] = record.output_tokens
        if record.error_type is not None:
            attributes[_ERROR_TYPE] = record.error_type
            if record.error_kind is not None:
                attributes["latencykit.error.kind"] = record.error_kind.value
            span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(attributes)
        span.end()

    def _call_ended(self, event: events.CallEnded) -> None:
        call = self._calls.pop(event.call_id, None)
        if call is None:
            return
        for span in call.attempts.values():  # attempts that never reported their end
            span.end()
        span = call.span
        # The answer's provider and host (the first target's when none answered); the model
        # asked for stays the call's.
        measured = call.measured(event.target)  # the metrics' attributes
        error = "cancelled" if event.outcome == "cancelled" else event.error_type
        shown: dict[str, Any] = {  # the span's
            "latencykit.outcome": event.outcome,
            "latencykit.attempts": event.attempts,
            "latencykit.degraded": event.degraded,
            "latencykit.answered_by": event.target,
        }
        if error is not None:
            measured = {**measured, _ERROR_TYPE: error}
            shown[_ERROR_TYPE] = error
            if event.error_kind is not None:
                shown["latencykit.error.kind"] = event.error_kind.value
            if event.outcome == "error":
                span.set_status(Status(StatusCode.ERROR))
        if not call.genai:
            span.set_attributes(shown)
            span.end()
            self._call_duration.record(event.duration, measured)
            return
        for name in (_PROVIDER, _SERVER_ADDRESS, _SERVER_PORT):
            if name in measured:
                shown[name] = measured[name]
        if event.response_model is not None:
            measured = {**measured, _RESPONSE_MODEL: event.response_model}
            shown[_RESPONSE_MODEL] = event.response_model
        if event.response_id is not None:
            shown[_RESPONSE_ID] = event.response_id
        if event.finish_reasons:
            shown[_FINISH_REASONS] = event.finish_reasons
        if event.ttft is not None:
            shown[_TIME_TO_FIRST_CHUNK] = event.ttft
            self._first_chunk.record(event.ttft, measured)
        for name, count, kind in (
            (_INPUT_TOKENS, event.input_tokens, "input"),
            (_OUTPUT_TOKENS, event.output_tokens, "output"),
        ):
            if count is not None:
                shown[name] = count
                self._tokens.record(count, {**measured, _TOKEN_TYPE: kind})
        if event.output_text is not None:
            message: dict[str, Any] = {
                "role": "assistant",
                "parts": [{"type": "text", "content": event.output_text}],
            }
            if event.finish_reasons:
                message["finish_reason"] = event.finish_reasons[0]
            shown[_OUTPUT_MESSAGES] = json.dumps([message], ensure_ascii=False)
        span.set_attributes(shown)
        span.end()
        self._duration.record(event.duration, measured)

    def _hedge_fired(self, event: events.HedgeFired) -> None:
        self._hedges.add(
            1, {"latencykit.hedge.event": "fired", "latencykit.hedge.reason": event.reason}
        )
        attributes: dict[str, Any] = {
            "latencykit.attempt.number": event.attempt,
            "latencykit.target": event.target,
            "latencykit.hedge.reason": event.reason,
        }
        if event.delay is not None:
            attributes["latencykit.hedge.delay"] = event.delay
        self._span_event(event.call_id, "latencykit.hedge.fired", attributes)

    def _hedge_won(self, event: events.HedgeWon) -> None:
        self._hedges.add(1, {"latencykit.hedge.event": "won"})
        self._span_event(
            event.call_id,
            "latencykit.hedge.won",
            {"latencykit.attempt.number": event.attempt, "latencykit.attempts": event.attempts},
        )

    def _hedge_skipped(self, event: events.HedgeSkipped) -> None:
        self._hedges.add(
            1, {"latencykit.hedge.event": "skipped", "latencykit.hedge.reason": event.reason}
        )
        self._span_event(
            event.call_id, "latencykit.hedge.skipped", {"latencykit.hedge.reason": event.reason}
        )

    def _failed_over(self, event: events.FailedOver) -> None:
        attributes = {
            "latencykit.from_target": event.from_target,
            "latencykit.to_target": event.to_target,
        }
        self._failovers.add(1, attributes)
        self._span_event(event.call_id, "latencykit.failed_over", attributes)

    def _target_skipped(self, event: events.TargetSkipped) -> None:
        attributes = {"latencykit.target": event.target, "latencykit.skip.reason": event.reason}
        self._skipped.add(1, attributes)
        self._span_event(event.call_id, "latencykit.target_skipped", attributes)

    def _fallback_used(self, event: events.FallbackUsed) -> None:
        self._fallbacks.add(1, {"latencykit.fallback.reason": event.reason})
        attributes: dict[str, Any] = {
            "latencykit.fallback.reason": event.reason,
            "latencykit.fallback.elapsed": event.elapsed,
        }
        if event.error_type is not None:
            attributes[_ERROR_TYPE] = event.error_type
        self._span_event(event.call_id, "latencykit.fallback", attributes)

    def _deadline_expired(self, event: events.DeadlineExpired) -> None:
        self._expired.add(1)
        self._overshoot.record(max(0.0, event.elapsed - event.budget))
        attributes: dict[str, Any] = {
            "latencykit.deadline.budget": event.budget,
            "latencykit.deadline.elapsed": event.elapsed,
        }
        if event.stage is not None:
            attributes["latencykit.stage.name"] = event.stage
        self._span_event(event.call_id, "latencykit.deadline.expired", attributes)

    def _routed(self, event: events.Routed) -> None:
        call = self._calls.get(event.call_id)
        if call is not None:
            call.span.set_attributes(
                {"latencykit.route.target": event.target, "latencykit.route.reason": event.reason}
            )

    def _cache_lookup(self, event: CacheLookup) -> None:
        call = self._calls.get(event.call_id)
        if call is not None:
            call.span.set_attribute("latencykit.cache.hit", event.hit)

    def _limit_waited(self, event: LimitWaited) -> None:
        # No tenant: it may be an end user's id (the call's ``user``).
        self._span_event(
            event.call_id,
            "latencykit.limit.waited",
            {"latencykit.limit.kind": event.limit, "latencykit.limit.waited": event.waited},
        )

    def _limit_refused(self, event: LimitRefused) -> None:
        self._span_event(
            event.call_id,
            "latencykit.limit.refused",
            {"latencykit.limit.kind": event.limit, "latencykit.limit.waited": event.waited},
        )

    def _stage_started(self, event: events.StageStarted) -> None:
        attributes: dict[str, Any] = {"latencykit.stage.name": event.name}
        if event.budget is not None:
            attributes["latencykit.stage.budget"] = event.budget
        if event.allowed is not None:
            attributes["latencykit.stage.allowed"] = event.allowed
        span = self._tracer.start_span(
            f"stage {event.name}",
            context=self._parent_context(event.parent_id, event.parent_attempt),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._calls[event.call_id] = _Call(span, {}, False, _NO_ENDPOINT)

    def _stage_ended(self, event: events.StageEnded) -> None:
        call = self._calls.pop(event.call_id, None)
        if call is None:
            return
        record = event.record
        call.span.set_attributes(
            {
                "latencykit.stage.spent": record.spent,
                "latencykit.stage.outcome": record.outcome,
                "latencykit.stage.overran": record.overran,
                "latencykit.stage.attempts": record.attempts,
            }
        )
        if record.outcome in ("error", "overran"):
            call.span.set_status(Status(StatusCode.ERROR))
        call.span.end()

    def _first_token(self, event: events.FirstToken) -> None:
        call = self._calls.get(event.call_id)
        span = None if call is None else call.attempts.get(event.attempt)
        if span is not None:
            span.add_event("latencykit.first_chunk", {_TIME_TO_FIRST_CHUNK: event.ttft})

    def _stall_detected(self, event: events.StallDetected) -> None:
        self._stalls.add(1, {"latencykit.target": event.target})
        self._span_event(
            event.call_id,
            "latencykit.stream.stall",
            {
                "latencykit.target": event.target,
                "latencykit.stream.stall_limit": event.stall,
                "latencykit.stream.chunks": event.chunks,
            },
        )

    def _stream_resumed(self, event: events.StreamResumed) -> None:
        self._resumes.add(1, {"latencykit.stream.resume_mode": event.mode})
        self._span_event(
            event.call_id,
            "latencykit.stream.resumed",
            {
                "latencykit.target": event.target,
                "latencykit.stream.resume_mode": event.mode,
                "latencykit.stream.chunks": event.chunks,
            },
        )

    def _retry_scheduled(self, event: RetryScheduled) -> None:
        self._retries.add(1, {"latencykit.error.kind": event.reason_kind.value})
        attributes: dict[str, Any] = {
            "latencykit.retry.wait": event.wait,
            "latencykit.error.kind": event.reason_kind.value,
        }
        if event.retry_after is not None:
            attributes["latencykit.retry.retry_after"] = event.retry_after
        self._span_event(event.call_id, "latencykit.retry.scheduled", attributes)

    def _retry_gave_up(self, event: RetryGaveUp) -> None:
        self._span_event(
            event.call_id,
            "latencykit.retry.gave_up",
            {"latencykit.retry.reason": event.reason, "latencykit.attempts": event.attempts},
        )

    def _breaker_changed(self, event: BreakerStateChanged) -> None:
        self._transitions.add(
            1,
            {
                "latencykit.target": event.key,
                "latencykit.breaker.from": event.from_state.value,
                "latencykit.breaker.to": event.to_state.value,
            },
        )
        self._breaker_state.set(_BREAKER_STATE[event.to_state], {"latencykit.target": event.key})
        self._span_event(
            event.call_id,
            "latencykit.breaker.state_changed",
            {
                "latencykit.target": event.key,
                "latencykit.breaker.from": event.from_state.value,
                "latencykit.breaker.to": event.to_state.value,
                "latencykit.breaker.failure_rate": event.failure_rate,
            },
        )

    def _breaker_rejected(self, event: BreakerRejected) -> None:
        self._rejections.add(1, {"latencykit.target": event.key})
        self._span_event(
            event.call_id,
            "latencykit.breaker.rejected",
            {"latencykit.target": event.key, "latencykit.breaker.state": event.state.value},
        )

    def _store_unavailable(self, event: StoreUnavailable) -> None:
        self._store_outages.add(1, {"latencykit.store.reason": event.reason})


def instrument(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    capture_content: bool | None = None,
) -> Instrumentation:
    """Export latencykit's calls as OpenTelemetry spans and metrics until the returned handle is
    closed.

    Args:
        tracer_provider: where spans go (default ``None``: the global provider, as set by
            ``opentelemetry.trace.set_tracer_provider`` or the SDK's auto-configuration).
        meter_provider: where metrics go (default ``None``: the global provider).
        capture_content: export prompt and answer text as ``gen_ai.input.messages`` and
            ``gen_ai.output.messages`` (default ``None``: only if the environment variable
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``; off otherwise).

    Calling it twice exports everything twice: keep one handle per process (close it at
    shutdown, or use it as a ``with`` block in tests).
    """
    return Instrumentation(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        capture_content=capture_content,
    )
