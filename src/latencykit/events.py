"""Typed events that policies emit, and the one public way to receive them.

Every policy reports what it did as a frozen ``msgspec.Struct``. Subscribers are plain
callables; they run synchronously, in the task that emitted the event, so keep them cheap
(append to a list, bump a counter, hand off to a queue). OpenTelemetry support subscribes here
like any user hook.

When nobody subscribes, policies skip building events entirely, so an idle event bus costs one
truth test per would-be event.

Events never carry API keys or exception messages, and carry prompt or response text only when
content capture is switched on (:func:`capture_content`, which telemetry's ``capture_content=``
sets); even then the text is kept out of the events' ``repr``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import msgspec

from ._handle import Handle

if TYPE_CHECKING:
    from ._context import Attempt, AttemptReason
    from ._values import BreakerState, ErrorKind, Ledger, StageRecord
    from .target import Endpoint

__all__ = [
    "AttemptEnded",
    "AttemptStarted",
    "AutopilotChanged",
    "BreakerRejected",
    "BreakerStateChanged",
    "CacheLookup",
    "CacheStored",
    "CallEnded",
    "CallStarted",
    "DeadlineExpired",
    "Event",
    "EventHandler",
    "FailedOver",
    "FallbackUsed",
    "FanOutEnded",
    "FirstToken",
    "FirstTokenMissed",
    "GiveUpReason",
    "HedgeFired",
    "HedgeSkipped",
    "HedgeWon",
    "LimitKind",
    "LimitLearned",
    "LimitRefused",
    "LimitWaited",
    "RetryGaveUp",
    "RetryScheduled",
    "Routed",
    "SkipReason",
    "StageEnded",
    "StageStarted",
    "StallDetected",
    "StoreRecovered",
    "StoreUnavailable",
    "StreamResumed",
    "Subscription",
    "TargetSkipped",
    "TurnEnded",
    "capture_content",
    "capturing_content",
    "subscribe",
]

logger = logging.getLogger("latencykit")


class Event(msgspec.Struct, frozen=True):
    """Base of every latencykit event: a frozen ``msgspec.Struct`` (fields by position or
    keyword, equality, hashing, a ``repr``; ``msgspec.structs.asdict`` gives its fields),
    cheaper to define and to build than a dataclass.

    Attributes:
        call_id: identifies the pipeline run (one user-level call) the event belongs to; all
            events of one call share it.
    """

    call_id: int

    def __repr__(self) -> str:
        # Captured prompt and answer text never reach logs through a repr.
        shown = (
            f"{name}={getattr(self, name)!r}"
            for name in self.__struct_fields__
            if name not in _CONTENT
        )
        return f"{type(self).__name__}({', '.join(shown)})"


_CONTENT = frozenset({"input_messages", "output_text"})


_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


class CallStarted(Event, frozen=True):
    """A pipeline run (one user-level call: an ``LLM.acompletion``, a decorated function's
    call) is starting.

    Attributes:
        target: the key of the call's first target.
        endpoint: where that target's requests go (model, provider, host, port; an empty model
            for a function target).
        stream: whether the call streams.
        parameters: the call's model parameters that telemetry may show (``max_tokens``,
            ``temperature``, ``top_p``, ``top_k``, ``frequency_penalty``,
            ``presence_penalty``, ``seed``, ``n``, when given); empty for a function target.
        parent_id: the ``call_id`` of the latencykit call this one runs inside (a decorated
            function calling ``lk.LLM``), else ``None``.
        parent_attempt: the number of that call's attempt it runs in (``0``: none).
        input_messages: the prompt's messages, only while content capture is on (else
            ``None``); not in the ``repr``.
        operation: the GenAI operation: ``"chat"`` (default), ``"embeddings"``
            (``LLM.aembedding``).
    """

    target: str
    endpoint: Endpoint
    stream: bool = False
    parameters: Mapping[str, Any] = _NO_PARAMETERS
    parent_id: int | None = None
    parent_attempt: int = 0
    input_messages: Any = None
    operation: str = "chat"


class AttemptStarted(Event, frozen=True):
    """An attempt (one execution of the wrapped call) is starting.

    Attributes:
        attempt: its number in the call (1, 2, ...).
        target: its target's key.
        reason: why it is made: ``"primary"``, ``"retry"``, ``"hedge"``, ``"failover"``,
            ``"fallback"`` or ``"resume"`` (default ``"primary"``).
        endpoint: where it goes (default ``None``: not known).
        queued: seconds it waited for a connection slot before starting (default ``0.0``:
            none; see :attr:`~latencykit.Attempt.queued`).
    """

    attempt: int
    target: str
    reason: AttemptReason = "primary"
    endpoint: Endpoint | None = None
    queued: float = 0.0


class AttemptEnded(Event, frozen=True):
    """An attempt ended; ``record`` tells how (see :class:`~latencykit.Attempt`).

    Attributes:
        record: the attempt's record.
        gaps: for a stream, every gap between consecutive content chunks, in seconds (empty
            otherwise): what ``gen_ai.client.operation.time_per_output_chunk`` records.
    """

    record: Attempt
    gaps: tuple[float, ...] = ()


class FallbackUsed(Event, frozen=True):
    """The primary path was abandoned and the fallback (degraded) path is answering.

    This is the "slow-case log": subscribe to it to see which calls degraded, why, and when.

    Attributes:
        reason: ``"timeout"`` (the primary was still running ``after`` seconds in),
            ``"error"`` (the primary raised an error the fallback handles) or ``"predicted"``
            (less time was left than the primary's predicted time to answer: it was not
            started).
        elapsed: seconds from the start of the fallback policy to the switch.
        after: the configured ``after`` (``None`` when the fallback only handles errors).
        error_type: the primary's exception class name when ``reason == "error"``.
        error_kind: its classification, when ``reason == "error"``.
    """

    reason: Literal["timeout", "error", "predicted"]
    elapsed: float
    after: float | None
    error_type: str | None = None
    error_kind: ErrorKind | None = None


class HedgeFired(Event, frozen=True):
    """A hedging policy started an extra attempt.

    Attributes:
        attempt: the attempt's number in the hedged call (2 for the first hedge).
        target: where it goes (model string or function name).
        reason: ``"delay"`` (the earlier attempts were slower than the delay) or ``"failure"``
            (an attempt failed with a handled error, so the next one went at once).
        delay: the hedging delay in force (``None`` while warming up).
    """

    attempt: int
    target: str
    reason: Literal["delay", "failure"]
    delay: float | None


class HedgeWon(Event, frozen=True):
    """A hedge (not the primary) produced the answer.

    Attributes:
        attempt: the winning attempt's number in the hedged call (2 or more).
        attempts: how many attempts the hedged call started.
    """

    attempt: int
    attempts: int


class HedgeSkipped(Event, frozen=True):
    """A hedge was due but not sent.

    Attributes:
        attempt: the number it would have had.
        reason: ``"budget"`` (the extra-load budget is empty) or ``"deadline"`` (the budget
            left would not cover the target's typical latency).
    """

    attempt: int
    reason: Literal["budget", "deadline"]


class FailedOver(Event, frozen=True):
    """A failover moved from a target that failed to the next one.

    Attributes:
        from_target: the target that failed.
        to_target: the target tried next.
    """

    from_target: str
    to_target: str


class TargetSkipped(Event, frozen=True):
    """A failover skipped a target without sending it anything.

    Attributes:
        target: the target skipped.
        reason: ``"breaker_open"`` (its circuit breaker refuses calls) or ``"context_window"``
            (the prompt did not fit a previous target and this one is not known to be larger).
    """

    target: str
    reason: Literal["breaker_open", "context_window"]


class DeadlineExpired(Event, frozen=True):
    """A deadline's budget ran out; the work inside was cancelled.

    Attributes:
        budget: the deadline's budget in seconds.
        elapsed: seconds from entering it to its expiry.
        stage: the stage that overran (its own budget, or the turn's deadline running out
            inside it), else ``None``.
    """

    budget: float
    elapsed: float
    stage: str | None = None


class FanOutEnded(Event, frozen=True):
    """A ``lk.gather`` or ``lk.first`` ended (returned, or raised ``GatherIncomplete`` /
    ``NoAcceptableResult``; not emitted when cancelled from outside: ``DeadlineExpired``
    covers that).

    Attributes:
        kind: ``"gather"`` or ``"first"``.
        awaitables: how many it was given.
        ok: values returned (``first``: 1 with a winner, else 0).
        failed: awaitables that raised an ``Exception``.
        timed_out: cut off by ``within`` (``first``: sources never started included).
        not_needed: cancelled once decided (``min_results`` reached, a failing
            ``return_partial=False`` gather; ``first``: losers and sources never started).
        rejected: answers ``accept`` refused (``first`` only; ``0`` for ``gather``).
        elapsed: seconds from the start to the decision.
    """

    kind: Literal["gather", "first"]
    awaitables: int
    ok: int
    failed: int
    timed_out: int
    not_needed: int
    rejected: int
    elapsed: float


class Routed(Event, frozen=True):
    """A router picked the call's target (``LLM(router=...)``).

    Attributes:
        target: the chosen target's key.
        reason: why (``"rule 1: task=['classify']"``, ``"default"``, ``"budget: ..."``).
        task: the call's task tag, if any.
    """

    target: str
    reason: str
    task: str | None = None


class StageStarted(Event, frozen=True):
    """A stage of a turn (:func:`~latencykit.stage`) started; ``call_id`` is the stage's own.

    Attributes:
        name: the stage's name.
        budget: the budget it asked for (``None``: none).
        allowed: the seconds it was given, cut to what remained of the turn (``None``:
            unbounded).
        parent_id: the ``call_id`` of the scope it runs in (the turn, an enclosing stage, a
            decorated call), else ``None``.
        parent_attempt: the number of that call's attempt it runs in (``0``: none).
    """

    name: str
    budget: float | None
    allowed: float | None
    parent_id: int | None = None
    parent_attempt: int = 0


class StageEnded(Event, frozen=True):
    """A stage ended; ``record`` is its entry in the turn's ledger (budget, allowed, spent,
    outcome, attempts)."""

    record: StageRecord


class TurnEnded(Event, frozen=True):
    """A turn in which stages ran ended (its deadline's block, or its decorated call); the
    ``ledger`` holds every stage."""

    ledger: Ledger


class FirstToken(Event, frozen=True):
    """A stream attempt received its first content chunk: it is committed.

    Attributes:
        attempt: the attempt's number.
        target: the target's key.
        ttft: seconds from the attempt's start to the chunk (time to first token).
    """

    attempt: int
    target: str
    ttft: float


class FirstTokenMissed(Event, frozen=True):
    """A stream attempt sent no content chunk within its first-token limit: it is abandoned
    (:class:`~latencykit.FirstTokenTimeout`).

    Attributes:
        attempt: the attempt's number.
        target: the target's key.
        first_token: the limit in seconds.
        source: where the limit came from: ``"configured"`` (``StreamGuard(first_token=...)``),
            ``"learned"`` (from the target's recent times to first chunk), ``"slo"`` (set by the
            SLO autopilot) or ``"timeout"`` (the target's attempt timeout) (default
            ``"configured"``).
    """

    attempt: int
    target: str
    first_token: float
    source: Literal["configured", "learned", "timeout", "slo"] = "configured"


class StallDetected(Event, frozen=True):
    """A committed stream sent no content chunk for longer than its stall limit.

    Attributes:
        attempt: the attempt's number.
        target: the target's key.
        stall: the limit in seconds.
        chunks: content chunks received before the stall.
        source: where the limit came from, as in :class:`FirstTokenMissed` (default
            ``"configured"``).
    """

    attempt: int
    target: str
    stall: float
    chunks: int
    source: Literal["configured", "learned", "timeout", "slo"] = "configured"


class StreamResumed(Event, frozen=True):
    """A broken stream goes on from another attempt (``StreamGuard(on_break="continue")``).

    Attributes:
        attempt: the number of the attempt that continues it.
        target: that attempt's target.
        mode: ``"prefill"`` (the target continued the delivered text given as an assistant
            prefill) or ``"regenerate"`` (it answered again; the delivered text is checked and
            skipped).
        chunks: content chunks the consumer had received before the break.
    """

    attempt: int
    target: str
    mode: Literal["prefill", "regenerate"]
    chunks: int


class CallEnded(Event, frozen=True):
    """A pipeline run (one user-level call) finished.

    Attributes:
        target: the key of the target that answered (or of the call's first target when
            none did).
        duration: seconds from the start of the call to its end (for a stream, to the end
            of the stream).
        outcome: ``"ok"``, ``"error"`` or ``"cancelled"``.
        attempts: how many attempts were started.
        degraded: whether the answer (or error) came from a fallback path.
        error_type: exception class name when the call failed.
        error_kind: its :class:`~latencykit.ErrorKind`, when the call failed.
        timeline: the attempts' records, in the order they ended.
        stream: whether the call streamed.
        ttft: for a stream, seconds from the start of the call to its first content chunk.
        response_model: the model the provider says answered (when the result tells).
        response_id: the provider's id of the response (when the result tells).
        finish_reasons: the provider's finish reasons, one per choice.
        input_tokens: prompt tokens the provider reported.
        output_tokens: completion tokens the provider reported.
        output_text: the answer's text, only while content capture is on (else ``None``); not
            in the ``repr``.
    """

    target: str
    duration: float
    outcome: Literal["ok", "error", "cancelled"]
    attempts: int
    degraded: bool
    error_type: str | None = None
    error_kind: ErrorKind | None = None
    timeline: tuple[Attempt, ...] = ()
    stream: bool = False
    ttft: float | None = None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None
    output_text: str | None = None


# --- the policies' own events (breaker, limiter, retry, cache), the fleet store's -------------


class BreakerStateChanged(Event, frozen=True):
    """A breaker changed state.

    Attributes:
        key: the breaker's key (a target name).
        from_state: the state left.
        to_state: the state entered.
        failure_rate: the failure rate the transition was decided on, in ``[0, 1]``: the
            probes' when leaving ``HALF_OPEN``, else the window's (``0.0`` with no calls).
        slow_call_rate: the slow-call rate, likewise.
        calls: the number of calls those rates are computed over.
    """

    key: str
    from_state: BreakerState
    to_state: BreakerState
    failure_rate: float
    slow_call_rate: float
    calls: int


class BreakerRejected(Event, frozen=True):
    """A breaker refused a call (:meth:`Breaker.acquire` or the policy).

    Attributes:
        key: the breaker's key.
        state: its state: ``OPEN``, ``FORCED_OPEN``, or ``HALF_OPEN`` with every probe permit
            taken.
    """

    key: str
    state: BreakerState


LimitKind: TypeAlias = Literal["concurrency", "tenant_concurrency", "requests", "tokens"]
"""Which limit a call waited for or was refused by: the target's concurrency limit, the
tenant's concurrency cap, or the tenant's request or token rate."""


class LimitWaited(Event, frozen=True):
    """A call waited for a limit, then went on.

    Attributes:
        target: the key of the target the call is for.
        tenant: the call's tenant.
        limit: which limit it waited for (:data:`LimitKind`).
        waited: seconds it waited for it.
    """

    target: str
    tenant: str
    limit: LimitKind
    waited: float


class LimitLearned(Event, frozen=True):
    """A provider's answer told a rate limit for the first time, or a new value
    (:class:`~latencykit.policies.governor.Governor`); or a target's adaptive concurrency
    limit moved by 10 % or more since last told
    (:class:`~latencykit.policies.concurrency.AdaptiveConcurrency`).

    Attributes:
        target: the key of the target that told it.
        limit: ``"requests"`` or ``"tokens"`` (per minute), or ``"concurrency"`` (attempts in
            flight).
        value: the limit now.
        previous: the limit before (``None``: first told; a concurrency limit: its initial
            value).
    """

    target: str
    limit: LimitKind
    value: int
    previous: int | None


class LimitRefused(Event, frozen=True):
    """A limiter refused a call (:class:`~latencykit.errors.LimitExceeded` is raised).

    Attributes:
        target: the key of the target the call was for.
        tenant: the call's tenant.
        limit: the limit that refused it (:data:`LimitKind`).
        wait: seconds the call would have had to wait for a rate quota (``None`` for a
            concurrency slot: not known in advance).
        waited: seconds it had waited in the limiter before the refusal.
    """

    target: str
    tenant: str
    limit: LimitKind
    wait: float | None
    waited: float


GiveUpReason: TypeAlias = Literal[
    "max_attempts", "budget", "deadline", "retry_after_too_long", "slow_failure", "not_retryable"
]
"""Why a retry policy stopped retrying (see :class:`RetryGaveUp`)."""


class RetryScheduled(Event, frozen=True):
    """A retry policy will make another attempt after ``wait`` seconds.

    Attributes:
        attempt: the number, within this retry policy, of the attempt about to start (2 for the
            first retry).
        wait: seconds it waits first (backoff with jitter, at least ``retry_after`` when honoured).
        reason_kind: the :class:`~latencykit.ErrorKind` of the error that is being retried.
        retry_after: the provider's ``Retry-After`` in seconds, if the error carried one and the
            policy reads it (``honor_retry_after`` or ``max_retry_after``), else ``None``.
    """

    attempt: int
    wait: float
    reason_kind: ErrorKind
    retry_after: float | None


class RetryGaveUp(Event, frozen=True):
    """A retry policy raised the last error instead of retrying.

    Attributes:
        attempts: attempts this policy made for the call.
        reason: ``"max_attempts"`` (no attempt left), ``"budget"`` (the retry budget is empty),
            ``"deadline"`` (the wait plus another attempt would not fit before the deadline),
            ``"retry_after_too_long"`` (the provider asked to wait more than
            ``max_retry_after``), ``"slow_failure"`` (the attempt failed only after
            ``slow_failure`` seconds: not retried on the same target, like a timeout), or
            ``"not_retryable"`` (after at least one retry, an error the policy does not retry).
        error_kind: the :class:`~latencykit.ErrorKind` of the error raised.
        wait: for ``"deadline"`` and ``"retry_after_too_long"``, the wait that did not fit
            (seconds); for ``"slow_failure"``, how long the failed attempt ran; else ``None``.
    """

    attempts: int
    reason: GiveUpReason
    error_kind: ErrorKind
    wait: float | None = None


SkipReason = Literal["degraded", "truncated", "incomplete", "tool_calls", "store_error"]
"""Why an answer was not stored (see :class:`CacheStored`)."""


class CacheLookup(Event, frozen=True):
    """A response cache was asked for a call's answer.

    Attributes:
        target: the key of the call's target.
        hit: whether the cache answered (no attempt is made then).
        hit_rate: the cache's hit rate after this lookup (hits / lookups).
    """

    target: str
    hit: bool
    hit_rate: float


class CacheStored(Event, frozen=True):
    """A response cache stored a call's answer, or decided not to.

    Attributes:
        target: the key of the target that answered.
        stored: whether the answer went into the store.
        reason: why not, when it did not: ``"degraded"``, ``"truncated"``, ``"incomplete"``
            (no finish reason, or a stream that did not end complete), ``"tool_calls"`` (a
            streamed answer that may call tools) or ``"store_error"``; else ``None``.
    """

    target: str
    stored: bool
    reason: SkipReason | None = None


class StoreUnavailable(Event, frozen=True):
    """A shared store stopped answering; policies use process-local state until it returns.

    Emitted once per outage (from the store's background thread), and logged once as a warning
    on the ``latencykit`` logger.

    Attributes:
        store: the store's ``repr`` (its address without credentials).
        reason: what went wrong: the exception's type name (never its message, which may
            hold an address with credentials).
    """

    store: str
    reason: str


class StoreRecovered(Event, frozen=True):
    """A shared store answers again; its state is in force again from now on.

    Attributes:
        store: the store's ``repr``.
        down_for: seconds it was unavailable.
    """

    store: str
    down_for: float


class AutopilotChanged(Event, frozen=True):
    """The SLO autopilot stepped a setting of a target (:mod:`latencykit.autopilot`), or the
    replay check refused the step (``applied=False``); ``call_id`` is ``0`` (no call).

    Attributes:
        target: the target's key.
        setting: ``"hedge_quantile"``, ``"first_token"``, ``"stall"`` or
            ``"slow_call_duration"``.
        old: its value before (``None``: off, or no limit).
        new: the value proposed (``None``: off).
        reason: why, in words (and why it was refused).
        applied: whether it was applied.
        measurements: the figures behind it: the window's p99s, the replay's predictions for
            the old (``before_*``) and the new (``after_*``) value.
    """

    target: str
    setting: str
    old: float | None
    new: float | None
    reason: str
    applied: bool
    measurements: dict[str, float]


EventHandler: TypeAlias = Callable[[Event], object]
"""A subscriber: called with every event, synchronously; its return value is ignored."""

subscribers: tuple[EventHandler, ...] = ()
"""The subscribed handlers, in order (read-only: change it with :func:`subscribe`); empty
(false) while nobody listens. A hot path reads it instead of calling :func:`listening`."""
# Set where events must not reach the application: the autopilot's replays (a simulation).
_muted: ContextVar[bool] = ContextVar("latencykit_muted", default=False)


_capture = 0


def listening() -> bool:
    """Whether anybody subscribed; policies build events only when this is true."""
    return bool(subscribers)


def capturing_content() -> bool:
    """Whether events carry prompt and answer text (``CallStarted.input_messages``,
    ``CallEnded.output_text``): only while some :func:`capture_content` is active."""
    return _capture > 0


def capture_content() -> Subscription:
    """Let events carry prompt and answer text until the returned handle is closed (default:
    off). Text in events reaches every subscriber; telemetry turns it on only when asked
    (``lk.telemetry.instrument(capture_content=True)``)."""
    global _capture
    _capture += 1

    def stop() -> None:
        global _capture
        _capture -= 1

    return Subscription(stop)


def emit(event: Event) -> None:
    """Deliver ``event`` to every subscriber.

    A subscriber that raises does not break the call it observes: the exception is logged on
    the ``latencykit`` logger with its traceback, and delivery goes on.
    """
    if _muted.get():
        return
    for handler in subscribers:
        try:
            handler(event)
        except Exception:
            logger.exception("latencykit event handler %r failed on %s", handler, type(event))


class Subscription(Handle):
    """Handle returned by :func:`subscribe` (and :func:`capture_content`); ``close()`` it (or
    use ``with``) to stop."""

    __slots__ = ("_stop",)

    def __init__(self, stop: Callable[[], object]) -> None:
        self._stop: Callable[[], object] | None = stop

    def close(self) -> None:
        """Stop delivering events to the handler (or capturing content). Idempotent."""
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()


def subscribe(handler: EventHandler) -> Subscription:
    """Deliver every latencykit event, process-wide, to ``handler`` until unsubscribed.

    Example::

        seen: list[lk.events.Event] = []
        with lk.subscribe(seen.append):
            await ask("...")
        slow_cases = [e for e in seen if isinstance(e, lk.events.FallbackUsed)]
    """
    global subscribers
    if not callable(handler):
        raise TypeError(f"subscribe(handler): handler must be callable, got {handler!r}")
    subscribers = (*subscribers, handler)

    def stop() -> None:
        global subscribers
        subscribers = tuple(h for h in subscribers if h is not handler)

    return Subscription(stop)
