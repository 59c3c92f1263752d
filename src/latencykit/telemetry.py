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

import enum
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import events, ratelimit
from ._cancel import process_clock
from ._context import PRIORITIES, Attempt
from ._handle import Handle
from ._slots import waiting
from ._version import __version__
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
# The provider's request id of an attempt's answer (x-request-id...): the conventions name
# none (gen_ai.response.id is the completion's id, another thing).
_PROVIDER_REQUEST_ID = "latencykit.provider.request_id"
# What the call span tells of the target that answered, set when the call ends.
_ANSWERED_BY = (_PROVIDER, _SERVER_ADDRESS, _SERVER_PORT, _RESPONSE_MODEL)
# The call's parameters are gen_ai.request.{name}, but for these.
_REQUEST_PARAMETERS = {
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "n": "gen_ai.request.choice.count",
}
# litellm's provider names -> the convention's well-known values (others pass through as is:
# openai, anthropic, cohere, deepseek, groq, perplexity are the same in both).
_PROVIDERS = {
    "text-completion-openai": "openai",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "cohere_chat": "cohere",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "watsonx": "ibm.watsonx.ai",
    "mistral": "mistral_ai",
    "moonshot": "moonshot_ai",
    "xai": "x_ai",
}
# The convention's recommended bucket boundaries.
_SECONDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_TOKENS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
_OVERSHOOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

# --- latencykit's own names -----------------------------------------------------------------------

_TARGET = "latencykit.target"
_LANE = "latencykit.lane"
_ATTEMPT = "latencykit.attempt.number"
_ATTEMPTS = "latencykit.attempts"
_ERROR_KIND = "latencykit.error.kind"
_HEDGE_EVENT = "latencykit.hedge.event"
_HEDGE_REASON = "latencykit.hedge.reason"
_CHUNKS = "latencykit.stream.chunks"
_SKIP_REASON = "latencykit.skip.reason"
_FALLBACK_REASON = "latencykit.fallback.reason"
_RESUME_MODE = "latencykit.stream.resume_mode"
_STORE_REASON = "latencykit.store.reason"
_FROM, _TO = "latencykit.from_target", "latencykit.to_target"
_BREAKER_FROM, _BREAKER_TO = "latencykit.breaker.from", "latencykit.breaker.to"
_LIMIT = {"latencykit.limit.kind": "limit", "latencykit.limit.waited": "waited"}
# What latencykit.attempts counts attempts by.
_ATTEMPT_COUNTED = (_TARGET, "latencykit.attempt.outcome", "latencykit.attempt.reason", _ERROR_TYPE)
_BREAKER_STATE = {"closed": 0, "half_open": 1, "open": 2, "forced_open": 3}

# The histograms: name -> (unit, bucket boundaries, description).
_HISTOGRAMS = {
    "gen_ai.client.operation.duration": ("s", _SECONDS, "GenAI operation duration."),
    "gen_ai.client.token.usage": ("{token}", _TOKENS, "Number of input and output tokens used."),
    "gen_ai.client.operation.time_to_first_chunk": (
        "s",
        _SECONDS,
        "Time from the start of a streaming call to its first content chunk.",
    ),
    "gen_ai.client.operation.time_per_output_chunk": (
        "s",
        _SECONDS,
        "Time between consecutive content chunks of a stream.",
    ),
    "latencykit.call.duration": (
        "s",
        _SECONDS,
        "Duration of a call of a decorated function (LLM calls have the GenAI operation duration).",
    ),
    "latencykit.deadline.overshoot": (
        "s",
        _OVERSHOOT,
        "How late a deadline's expiry was delivered (elapsed - budget).",
    ),
    "latencykit.connection.wait": (
        "s",
        _SECONDS,
        "Time an attempt that had to wait waited for a connection slot, before its request.",
    ),
}
# The counters, but the attempts': name -> (unit, description).
_COUNTERS = {
    "latencykit.hedges": ("{hedge}", "Hedges fired, won, and skipped (budget or deadline)."),
    "latencykit.hedge.wasted_output_tokens": (
        "{token}",
        "Output tokens (or content chunks) received by attempts that lost.",
    ),
    "latencykit.failovers": ("{failover}", "Moves to the next target."),
    "latencykit.targets_skipped": ("{target}", "Targets skipped by failover without a request."),
    "latencykit.fallbacks": (
        "{call}",
        "Calls answered (or failed) by the fallback's degraded path.",
    ),
    "latencykit.deadline.expired": ("{call}", "Deadlines that expired."),
    "latencykit.retries": ("{retry}", "Retries scheduled."),
    "latencykit.stream.stalls": ("{stall}", "Streams that stalled."),
    "latencykit.stream.resumes": ("{resume}", "Broken streams continued from another attempt."),
    "latencykit.breaker.transitions": ("{transition}", "Circuit breaker state changes."),
    "latencykit.breaker.rejections": ("{call}", "Calls a circuit breaker refused."),
    "latencykit.store.unavailable": (
        "{outage}",
        "Times a shared store stopped answering (policies went process-local).",
    ),
}

# The observed instruments (read when metrics are collected): name -> (unit, description).
_OBSERVED = {
    "latencykit.attempts": ("{attempt}", "Attempts, by target, outcome, reason and error type."),
    "latencykit.connection.waiting": (
        "{attempt}",
        "Attempts waiting for a connection slot now, by lane and host.",
    ),
    "latencykit.room.left": (
        "1",
        "Room left in a provider's rate limits (requests or tokens), by target and API key hash, "
        "as the governor sees it now.",
    ),
    "latencykit.room.waits": (
        "{attempt}",
        "Attempts that waited for room in a provider's rate limits, by lane.",
    ),
    "latencykit.room.shed": (
        "{attempt}",
        "Attempts refused for want of room (LimitExceeded), by lane.",
    ),
}


class _Report(NamedTuple):
    """How a policy's decision is exported: a span event on its call's span, and a count."""

    name: str | None  # the span event's (None: counted only, or with `annotates`)
    attributes: Mapping[str, str]  # attribute -> the event's field (None values are left out)
    counter: tuple[str, ...] = ()  # the counter it adds one to, then the attributes it keeps
    tag: Mapping[str, str] = {}  # constant attributes of the counter
    annotates: bool = False  # the attributes are set on the call's span (no span event)


_REPORTS: dict[type[events.Event], _Report] = {
    events.HedgeFired: _Report(
        "latencykit.hedge.fired",
        {
            _ATTEMPT: "attempt",
            _TARGET: "target",
            _HEDGE_REASON: "reason",
            "latencykit.hedge.delay": "delay",
        },
        ("latencykit.hedges", _HEDGE_REASON),
        {_HEDGE_EVENT: "fired"},
    ),
    events.HedgeWon: _Report(
        "latencykit.hedge.won",
        {_ATTEMPT: "attempt", _ATTEMPTS: "attempts"},
        ("latencykit.hedges",),
        {_HEDGE_EVENT: "won"},
    ),
    events.HedgeSkipped: _Report(
        "latencykit.hedge.skipped",
        {_HEDGE_REASON: "reason"},
        ("latencykit.hedges", _HEDGE_REASON),
        {_HEDGE_EVENT: "skipped"},
    ),
    events.FailedOver: _Report(
        "latencykit.failed_over",
        {_FROM: "from_target", _TO: "to_target"},
        ("latencykit.failovers", _FROM, _TO),
    ),
    events.TargetSkipped: _Report(
        "latencykit.target_skipped",
        {_TARGET: "target", _SKIP_REASON: "reason"},
        ("latencykit.targets_skipped", _TARGET, _SKIP_REASON),
    ),
    events.FallbackUsed: _Report(
        "latencykit.fallback",
        {
            _FALLBACK_REASON: "reason",
            "latencykit.fallback.elapsed": "elapsed",
            _ERROR_TYPE: "error_type",
        },
        ("latencykit.fallbacks", _FALLBACK_REASON),
    ),
    events.DeadlineExpired: _Report(
        "latencykit.deadline.expired",
        {
            "latencykit.deadline.budget": "budget",
            "latencykit.deadline.elapsed": "elapsed",
            "latencykit.stage.name": "stage",
        },
        ("latencykit.deadline.expired",),
    ),
    # No tenant: it may be an end user's id (the call's ``user``).
    events.LimitWaited: _Report("latencykit.limit.waited", _LIMIT),
    events.LimitRefused: _Report("latencykit.limit.refused", _LIMIT),
    events.StallDetected: _Report(
        "latencykit.stream.stall",
        {_TARGET: "target", "latencykit.stream.stall_limit": "stall", _CHUNKS: "chunks"},
        ("latencykit.stream.stalls", _TARGET),
    ),
    events.StreamResumed: _Report(
        "latencykit.stream.resumed",
        {_TARGET: "target", _RESUME_MODE: "mode", _CHUNKS: "chunks"},
        ("latencykit.stream.resumes", _RESUME_MODE),
    ),
    events.RetryScheduled: _Report(
        "latencykit.retry.scheduled",
        {
            "latencykit.retry.wait": "wait",
            _ERROR_KIND: "reason_kind",
            "latencykit.retry.retry_after": "retry_after",
        },
        ("latencykit.retries", _ERROR_KIND),
    ),
    events.RetryGaveUp: _Report(
        "latencykit.retry.gave_up", {"latencykit.retry.reason": "reason", _ATTEMPTS: "attempts"}
    ),
    events.BreakerStateChanged: _Report(
        "latencykit.breaker.state_changed",
        {
            _TARGET: "key",
            _BREAKER_FROM: "from_state",
            _BREAKER_TO: "to_state",
            "latencykit.breaker.failure_rate": "failure_rate",
        },
        ("latencykit.breaker.transitions", _TARGET, _BREAKER_FROM, _BREAKER_TO),
    ),
    events.BreakerRejected: _Report(
        "latencykit.breaker.rejected",
        {_TARGET: "key", "latencykit.breaker.state": "state"},
        ("latencykit.breaker.rejections", _TARGET),
    ),
    events.StoreUnavailable: _Report(
        None, {_STORE_REASON: "reason"}, ("latencykit.store.unavailable", _STORE_REASON)
    ),
    events.Routed: _Report(
        None,
        {"latencykit.route.target": "target", "latencykit.route.reason": "reason"},
        annotates=True,
    ),
    events.CacheLookup: _Report(None, {"latencykit.cache.hit": "hit"}, annotates=True),
}


def _present(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes that have a value, enums as their values."""
    return {
        name: value.value if isinstance(value, enum.Enum) else value
        for name, value in attributes.items()
        if value is not None
    }


def _content_from_environment() -> bool:
    value = os.environ.get(CAPTURE_CONTENT_VARIABLE, "").strip().lower()
    return value in ("true", "1", "yes", "span_only", "span_and_event")


@functools.lru_cache(maxsize=1024)
def _endpoint_attributes(endpoint: Endpoint) -> Mapping[str, Any]:
    """The GenAI attributes of a target: what it is asked for and where it is."""
    return _present(
        {
            _OPERATION: "chat",
            _PROVIDER: _PROVIDERS.get(endpoint.provider or "", endpoint.provider or "unknown"),
            _REQUEST_MODEL: endpoint.model,
            _SERVER_ADDRESS: endpoint.address,
            _SERVER_PORT: None if endpoint.address is None else endpoint.port,
        }
    )


def _text(content: Any) -> dict[str, Any]:
    return {"type": "text", "content": content}


def _parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as the convention's parts (text only; other parts by type)."""
    if isinstance(content, str):
        return [_text(content)]
    if not isinstance(content, Sequence):
        return []
    return [
        _text(part.get("text", ""))
        if part.get("type") == "text"
        else {"type": str(part.get("type", "unknown"))}
        for part in content
        if isinstance(part, Mapping)
    ]


def _messages(messages: Any) -> str | None:
    """Chat messages in the convention's ``gen_ai.input.messages`` shape, as JSON."""
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        return None
    shaped = [
        {"role": str(message.get("role", "user")), "parts": _parts(message.get("content"))}
        for message in messages
        if isinstance(message, Mapping)
    ]
    return json.dumps(shaped, ensure_ascii=False)


def _answer(event: events.CallEnded) -> str | None:
    """The answer in the convention's ``gen_ai.output.messages`` shape, as JSON."""
    if event.output_text is None:
        return None
    message: dict[str, Any] = {"role": "assistant", "parts": [_text(event.output_text)]}
    if event.finish_reasons:
        message["finish_reason"] = event.finish_reasons[0]
    return json.dumps([message], ensure_ascii=False)


@dataclass(slots=True)
class _Call:
    """What telemetry keeps of a call in flight."""

    span: trace.Span
    attributes: Mapping[str, Any]  # the metric attributes of the call, as made to its first target
    genai: bool
    endpoint: Endpoint  # the call's first target's
    attempts: dict[int, trace.Span] = field(default_factory=dict)
    answered: bool = False  # an attempt succeeded: attempts cancelled after it lost a race
    # Where the attempts to other targets went (failover, degrade, hedge, resume), by target
    # key: what the answer is attributed to when one of them answers.
    elsewhere: dict[str, Endpoint] = field(default_factory=dict)

    def measured(self, target: str) -> Mapping[str, Any]:
        """The metric attributes of what ``target`` (a key) answered for the call: that
        target's provider and host, the model the call asked for."""
        answering = self.elsewhere.get(target)
        if answering is None:
            return self.attributes
        return {
            **_endpoint_attributes(answering),
            _OPERATION: self.attributes[_OPERATION],  # the call's, whoever answered
            _REQUEST_MODEL: self.endpoint.model,
        }

    def end(self, attributes: Mapping[str, Any] = {}, failed: bool = False) -> None:
        for span in self.attempts.values():  # attempts that never reported their end
            span.end()
        _end(self.span, attributes, failed)


def _end(span: trace.Span, attributes: Mapping[str, Any], failed: bool) -> None:
    """End ``span`` with the ``attributes`` that have a value, its status an error if
    ``failed``."""
    if failed:
        span.set_status(Status(StatusCode.ERROR))
    span.set_attributes(_present(attributes))
    span.end()


def _end_attempt(span: trace.Span, record: Attempt, loser: bool) -> None:
    attributes = {
        "latencykit.attempt.outcome": record.outcome,
        "latencykit.attempt.loser": loser,
        _TIME_TO_FIRST_CHUNK: record.ttft,
        "latencykit.attempt.chunks": None if record.ttft is None else record.chunks,
        _OUTPUT_TOKENS: record.output_tokens,
        _ERROR_TYPE: record.error_type,
        _ERROR_KIND: None if record.error_type is None else record.error_kind,
        _PROVIDER_REQUEST_ID: record.request_id,
    }
    _end(span, attributes, record.error_type is not None)


_NO_ENDPOINT = Endpoint("")


def _observe_waiting(options: metrics.CallbackOptions) -> list[metrics.Observation]:
    return [
        metrics.Observation(count, {"latencykit.transport": lane, "latencykit.host": host})
        for (lane, host), count in waiting().items()
    ]


_ROOM_KEY = "latencykit.api_key.hash"  # a short hash naming the key, never the key


def _observe_room_left(options: metrics.CallbackOptions) -> list[metrics.Observation]:
    now = process_clock()
    found = []
    for (target, key), room in list(ratelimit._rooms.items()):
        for limit, left in zip(("requests", "tokens"), room.left(now), strict=True):
            if left is not None:
                attributes = {_TARGET: target, _ROOM_KEY: key, "latencykit.limit.kind": limit}
                found.append(metrics.Observation(left, attributes))
    return found


def _observe_lanes(counts: str) -> Callable[[metrics.CallbackOptions], list[metrics.Observation]]:
    """A callback observing each room's ``counts`` (``"waits"`` or ``"shed"``) by lane."""

    def observe(options: metrics.CallbackOptions) -> list[metrics.Observation]:
        return [
            metrics.Observation(count, {_TARGET: target, _ROOM_KEY: key, _LANE: lane})
            for (target, key), room in list(ratelimit._rooms.items())
            for lane, count in zip(PRIORITIES, getattr(room, counts), strict=True)
        ]

    return observe


class Instrumentation(Handle):
    """Export latencykit's calls as OpenTelemetry spans and metrics until closed (``close()``,
    or the end of its ``with`` block); ``instrument`` is this class.

    Args:
        tracer_provider: where spans go (default ``None``: the global provider, as set by
            ``opentelemetry.trace.set_tracer_provider`` or the SDK's auto-configuration).
        meter_provider: where metrics go (default ``None``: the global provider).
        capture_content: export prompt and answer text as ``gen_ai.input.messages`` and
            ``gen_ai.output.messages`` (default ``None``: only if the environment variable
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``; off otherwise).

    Calling it twice exports everything twice: keep one handle per process (close it at
    shutdown, or use it as a ``with`` block in tests).

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
        self._histograms = {
            name: meter.create_histogram(
                name, unit=unit, description=text, explicit_bucket_boundaries_advisory=buckets
            )
            for name, (unit, buckets, text) in _HISTOGRAMS.items()
        }
        self._counters = {
            name: meter.create_counter(name, unit=unit, description=text)
            for name, (unit, text) in _COUNTERS.items()
        }
        # Every attempt is counted: in a dict on the hot path, reported when metrics are
        # collected (an observable counter), not through a synchronous instrument per attempt.
        self._attempt_counts: dict[tuple[str, str, str, str | None], int] = {}
        self._breaker_state = meter.create_gauge(
            "latencykit.breaker.state",
            unit="1",
            description="Circuit breaker state: 0 closed, 1 half-open, 2 open, 3 forced open.",
        )
        # The gauges and counters read when metrics are collected (the governor's rooms:
        # ``LLM(governor=True)``).
        for create, name, callback in (
            (meter.create_observable_counter, "latencykit.attempts", self._observe_attempts),
            (meter.create_observable_gauge, "latencykit.connection.waiting", _observe_waiting),
            (meter.create_observable_gauge, "latencykit.room.left", _observe_room_left),
            (meter.create_observable_counter, "latencykit.room.waits", _observe_lanes("waits")),
            (meter.create_observable_counter, "latencykit.room.shed", _observe_lanes("shed")),
        ):
            unit, text = _OBSERVED[name]
            create(name, callbacks=[callback], unit=unit, description=text)
        self._calls: dict[int, _Call] = {}
        self._handlers: dict[type[events.Event], Callable[[Any], None]] = {
            events.CallStarted: self._call_started,
            events.AttemptStarted: self._attempt_started,
            events.AttemptEnded: self._attempt_ended,
            events.CallEnded: self._call_ended,
            events.FirstToken: self._first_token,
            events.StageStarted: self._stage_started,
            events.StageEnded: self._stage_ended,
            events.AutopilotChanged: self._autopilot_changed,
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
            call.end()

    def _observe_attempts(self, options: metrics.CallbackOptions) -> list[metrics.Observation]:
        return [
            metrics.Observation(count, _present(dict(zip(_ATTEMPT_COUNTED, key, strict=True))))
            for key, count in list(self._attempt_counts.items())
        ]

    # --- events -----------------------------------------------------------------------------

    def _on_event(self, event: events.Event) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)
        elif (report := _REPORTS.get(type(event))) is not None:
            self._report(event, report)

    def _report(self, event: events.Event, report: _Report) -> None:
        attributes = _present({name: getattr(event, f) for name, f in report.attributes.items()})
        if report.counter:
            counter, *kept = report.counter
            counted = {name: attributes[name] for name in kept if name in attributes}
            self._counters[counter].add(1, {**report.tag, **counted})
        if isinstance(event, events.DeadlineExpired):
            overshoot = max(0.0, event.elapsed - event.budget)
            self._histograms["latencykit.deadline.overshoot"].record(overshoot)
        elif isinstance(event, events.BreakerStateChanged):
            self._breaker_state.set(_BREAKER_STATE[event.to_state], {_TARGET: event.key})
        call = self._calls.get(event.call_id)
        if call is None:
            return
        if report.annotates:
            call.span.set_attributes(attributes)
        elif report.name is not None:
            call.span.add_event(report.name, attributes)

    def _autopilot_changed(self, event: events.AutopilotChanged) -> None:
        """A span of its own (no call made the change), with the step as its span event."""
        attributes = _present(
            {
                _TARGET: event.target,
                "latencykit.autopilot.setting": event.setting,
                "latencykit.autopilot.old": event.old,
                "latencykit.autopilot.new": event.new,
                "latencykit.autopilot.reason": event.reason,
                "latencykit.autopilot.applied": event.applied,
                **{f"latencykit.autopilot.{k}": v for k, v in event.measurements.items()},
            }
        )
        span = self._tracer.start_span("latencykit autopilot", kind=SpanKind.INTERNAL)
        span.add_event("latencykit.autopilot.changed", attributes)
        span.end()

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
        metric_attributes: Mapping[str, Any] = {_TARGET: event.target}
        attributes = dict(metric_attributes)
        name, kind = event.target, SpanKind.INTERNAL
        if genai:
            metric_attributes = _endpoint_attributes(endpoint)
            if event.operation != "chat":
                metric_attributes = {**metric_attributes, _OPERATION: event.operation}
            # The answering target's host is set when the call ends (a span attribute cannot
            # be taken back, should another target without an api_base of its own answer).
            attributes = {
                **{k: v for k, v in metric_attributes.items() if not k.startswith("server.")},
                **attributes,
                _STREAM: event.stream,
            }
            for asked, value in event.parameters.items():
                attributes[_REQUEST_PARAMETERS.get(asked, f"gen_ai.request.{asked}")] = value
            if event.input_messages is not None:
                attributes[_INPUT_MESSAGES] = _messages(event.input_messages)
            name, kind = f"{event.operation} {endpoint.model}", SpanKind.CLIENT
        span = self._tracer.start_span(
            name, context=context, kind=kind, attributes=_present(attributes)
        )
        self._calls[event.call_id] = _Call(span, metric_attributes, genai, endpoint)

    def _attempt_started(self, event: events.AttemptStarted) -> None:
        waited = event.queued
        if waited:
            self._histograms["latencykit.connection.wait"].record(waited, {_TARGET: event.target})
        call = self._calls.get(event.call_id)
        if call is None:
            return
        attributes: dict[str, Any] = {
            _ATTEMPT: event.attempt,
            "latencykit.attempt.reason": event.reason,
            _TARGET: event.target,
        }
        if waited:
            attributes["latencykit.connection.wait"] = waited
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
        record = event.record
        call = self._calls.get(event.call_id)
        key = (record.target, record.outcome, record.reason, record.error_type)
        self._attempt_counts[key] = self._attempt_counts.get(key, 0) + 1
        if call is None:
            return
        loser = record.outcome == "cancelled" and call.answered
        call.answered = call.answered or record.outcome == "ok"
        wasted = record.output_tokens if record.output_tokens is not None else record.chunks
        if loser and wasted:
            wasted_tokens = self._counters["latencykit.hedge.wasted_output_tokens"]
            wasted_tokens.add(wasted, {_TARGET: record.target})
        if call.genai:
            measured = call.measured(record.target)  # the chunks of the attempt's target
            per_chunk = self._histograms["gen_ai.client.operation.time_per_output_chunk"]
            for gap in event.gaps:
                per_chunk.record(gap, measured)
        span = call.attempts.pop(record.number, None)
        if span is not None:
            _end_attempt(span, record, loser)

    def _call_ended(self, event: events.CallEnded) -> None:
        call = self._calls.pop(event.call_id, None)
        if call is None:
            return
        # The answer's provider and host (the first target's when none answered); the model
        # asked for stays the call's.
        error = "cancelled" if event.outcome == "cancelled" else event.error_type
        measured = _present({**call.measured(event.target), _ERROR_TYPE: error})
        shown: dict[str, Any] = {
            "latencykit.outcome": event.outcome,
            _ATTEMPTS: event.attempts,
            "latencykit.degraded": event.degraded,
            "latencykit.answered_by": event.target,
            _ERROR_TYPE: error,
            _ERROR_KIND: None if error is None else event.error_kind,
        }
        if call.genai:
            if event.response_model is not None:
                measured[_RESPONSE_MODEL] = event.response_model
            shown |= {name: measured.get(name) for name in _ANSWERED_BY}
            shown |= {
                _RESPONSE_ID: event.response_id,
                _FINISH_REASONS: event.finish_reasons or None,
                _TIME_TO_FIRST_CHUNK: event.ttft,
                _INPUT_TOKENS: event.input_tokens,
                _OUTPUT_TOKENS: event.output_tokens,
                _OUTPUT_MESSAGES: _answer(event),
            }
            self._measure_answer(event, measured)
        call.end(shown, event.outcome == "error")
        duration = "gen_ai.client.operation.duration" if call.genai else "latencykit.call.duration"
        self._histograms[duration].record(event.duration, measured)

    def _measure_answer(self, event: events.CallEnded, measured: Mapping[str, Any]) -> None:
        if event.ttft is not None:
            first_chunk = self._histograms["gen_ai.client.operation.time_to_first_chunk"]
            first_chunk.record(event.ttft, measured)
        for kind, count in (("input", event.input_tokens), ("output", event.output_tokens)):
            if count is not None:
                tokens = self._histograms["gen_ai.client.token.usage"]
                tokens.record(count, {**measured, _TOKEN_TYPE: kind})

    def _first_token(self, event: events.FirstToken) -> None:
        call = self._calls.get(event.call_id)
        span = None if call is None else call.attempts.get(event.attempt)
        if span is not None:
            span.add_event("latencykit.first_chunk", {_TIME_TO_FIRST_CHUNK: event.ttft})

    def _stage_started(self, event: events.StageStarted) -> None:
        attributes = {
            "latencykit.stage.name": event.name,
            "latencykit.stage.budget": event.budget,
            "latencykit.stage.allowed": event.allowed,
        }
        span = self._tracer.start_span(
            f"stage {event.name}",
            context=self._parent_context(event.parent_id, event.parent_attempt),
            kind=SpanKind.INTERNAL,
            attributes=_present(attributes),
        )
        self._calls[event.call_id] = _Call(span, {}, False, _NO_ENDPOINT)

    def _stage_ended(self, event: events.StageEnded) -> None:
        call = self._calls.pop(event.call_id, None)
        if call is None:
            return
        record = event.record
        attributes = {
            "latencykit.stage.spent": record.spent,
            "latencykit.stage.outcome": record.outcome,
            "latencykit.stage.overran": record.overran,
            "latencykit.stage.attempts": record.attempts,
        }
        call.end(attributes, record.outcome in ("error", "overran"))


instrument = Instrumentation
"""The same class as :class:`Instrumentation` (``lk.telemetry.instrument()``)."""
