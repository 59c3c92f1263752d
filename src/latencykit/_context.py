"""Per-call state shared by the policies of one pipeline run, kept in contextvars.

Two things travel with a call:

* the **deadline**: an absolute time on the event loop's clock (``anyio.current_time()``);
  nested deadlines keep the minimum, so :func:`remaining` is right at any depth;
* the **trace**: the history of attempts made inside a latencykit scope (a pipeline run or a
  ``with lk.deadline(...)`` block). Traces nest; an attempt is recorded in its own trace and in
  every enclosing one, so an error raised at any level can carry the whole history.

Child tasks (hedges, races) copy the context, so they see the same deadline and trace.
"""

from __future__ import annotations

import itertools
import math
from contextvars import ContextVar
from typing import TYPE_CHECKING, Literal, NamedTuple

from ._cancel import backend, now

if TYPE_CHECKING:
    from ._values import ErrorKind, Ledger, RouteDecision


Outcome = Literal["ok", "error", "cancelled"]
"""How an attempt ended: it returned, it raised, or it was cancelled (lost a race, timed out)."""

AttemptReason = Literal["primary", "retry", "hedge", "failover", "fallback", "resume"]
"""Why an attempt was made: the call's first, or which policy added it (a retry, a hedge, the
next failover target, the fallback's degraded path, the continuation of a broken stream)."""

_call_ids = itertools.count(1)

deadline_var: ContextVar[float] = ContextVar("latencykit.deadline", default=math.inf)
trace_var: ContextVar[Trace | None] = ContextVar("latencykit.trace", default=None)
attempt_var: ContextVar[int] = ContextVar("latencykit.attempt", default=0)
reason_var: ContextVar[AttemptReason] = ContextVar("latencykit.reason", default="primary")
"""Why the next attempt in this task is made; set by the policy that adds it."""
order_var: ContextVar[tuple[str, ...] | None] = ContextVar("latencykit.route_order", default=None)
"""The targets a routed call may go to, in order (the chosen first); failover follows it."""
task_var: ContextVar[str | None] = ContextVar("latencykit.task", default=None)
"""The task tag of the call being made (``LLM.acompletion(task=...)``), for its router."""
operation_var: ContextVar[str] = ContextVar("latencykit.operation", default="chat")
"""The GenAI operation of the call being made: ``"chat"`` (default), ``"embeddings"``."""

Priority = Literal["interactive", "default", "batch"]
"""A call's lane (``LLM.acompletion(priority=...)``), highest first: under a tight quota or
concurrency limit, lower lanes wait or are shed first."""
PRIORITIES: tuple[Priority, ...] = ("interactive", "default", "batch")
"""The lanes, highest first: a lane's index in this tuple is its rank (0 is served first)."""
priority_var: ContextVar[Priority] = ContextVar("latencykit.priority", default="default")
"""The lane of the call being made (default ``"default"``)."""
probe_var: ContextVar[bool] = ContextVar("latencykit.probe", default=False)
"""Set while a half-open breaker's probe runs: a probe is one attempt, never retried."""
queued_var: ContextVar[float] = ContextVar("latencykit.queued", default=0.0)
"""Seconds the attempt starting in this task waited for its connection slot (``0.0``: none);
set around it by the ``LLM``'s connection slots (:mod:`latencykit._slots`)."""
queued_total_var: ContextVar[float] = ContextVar("latencykit.queued_total", default=0.0)
"""Seconds this task's attempts waited for connection slots or a rate limit's room, all
together (it only grows): a breaker leaves the waits inside it out of the time it judges the
provider by, and retry out of its estimate of an attempt's duration."""


class Attempt(NamedTuple):
    """One execution of the wrapped call (one HTTP request, for :class:`~latencykit.LLM`).

    An immutable record (a named tuple: built on the hot path, where it is ~3x cheaper than a
    frozen dataclass).

    Attributes:
        number: 1 for the first attempt of a call, then 2, 3, ... in start order.
        target: what was called: the model string for ``LLM``, the function's qualified name for a
            decorated function.
        start: seconds from the start of the outermost latencykit scope to the attempt's start.
        duration: seconds the attempt ran.
        outcome: ``"ok"``, ``"error"`` or ``"cancelled"``.
        error_type: the exception's class name when the outcome is ``"error"`` (never its message:
            provider messages may echo prompt text), else ``None``.
        error_kind: the :class:`~latencykit.ErrorKind` of that exception, else ``None``.
        ttft: for a stream, seconds from the attempt's start to its first content chunk
            (``None``: not a stream, or no content arrived).
        chunks: for a stream, content chunks received (``0`` otherwise).
        gap_p50: for a stream, the median gap between content chunks, in seconds (``None``
            with fewer than two chunks).
        gap_max: for a stream, the longest gap between content chunks (``None`` likewise).
        output_tokens: output tokens the provider reported for the attempt (``None``: not
            reported).
        reason: why the attempt was made (:data:`~latencykit.pipeline.AttemptReason`):
            ``"primary"``, ``"retry"``, ``"hedge"``, ``"failover"``, ``"fallback"`` or
            ``"resume"`` (default ``"primary"``).
        queued: seconds the attempt waited for a connection slot before its request (default
            ``0.0``: none): latencykit's queue, not the provider's latency, so it is not in
            ``duration`` (the attempt starts once it has its slot).
        request_id: the request id of the provider's answer to the attempt, success or
            failure (its ``x-request-id`` header, or another of
            :data:`~latencykit.errors.REQUEST_ID_HEADERS`): what the provider's support asks
            for (default ``None``: no answer came, or it carried none).

    A stream's attempt is recorded when the stream ends (finished, broken or closed), so its
    ``duration`` runs to the last chunk.
    """

    number: int
    target: str
    start: float
    duration: float
    outcome: Outcome
    error_type: str | None = None
    error_kind: ErrorKind | None = None
    ttft: float | None = None
    chunks: int = 0
    gap_p50: float | None = None
    gap_max: float | None = None
    output_tokens: int | None = None
    reason: AttemptReason = "primary"
    queued: float = 0.0
    request_id: str | None = None

    @property
    def time_per_output_token(self) -> float | None:
        """For a stream, seconds per output token after the first content chunk: ``(duration -
        ttft) / (tokens - 1)``, with the provider's ``output_tokens`` or else the content chunks
        (``None`` for a response, or with fewer than two)."""
        tokens = self.output_tokens if self.output_tokens is not None else self.chunks
        if self.ttft is None or tokens < 2:
            return None
        return max(0.0, self.duration - self.ttft) / (tokens - 1)

    def __str__(self) -> str:
        what = self.outcome if self.error_type is None else f"{self.error_type}"
        if self.error_kind is not None:
            what += f" [{self.error_kind.value}]"
        if self.ttft is not None:
            what += f", first chunk at {self.ttft:.3f}s, {self.chunks} chunks"
        why = "" if self.reason == "primary" else f" ({self.reason})"
        if self.queued:
            why += f" after {self.queued:.3f}s waiting for a connection"
        if self.request_id is not None:
            what += f" (request id {self.request_id})"
        return (
            f"#{self.number}{why} {self.target} at +{self.start:.3f}s for {self.duration:.3f}s: "
            f"{what}"
        )


class Trace:
    """The attempts made inside one latencykit scope, plus what the policies decided.

    Attributes:
        parent: the enclosing scope's trace, or ``None``.
        started_at: when the scope started, on the event loop's clock.
        ended_at: when its pipeline run ended, on the same clock (``None`` until then; for a
            stream, when the stream ended).
        origin: ``started_at`` of the outermost enclosing scope (attempt starts count from it).
        call_id: identifies the scope in events.
        attempts: every attempt made inside the scope (nested scopes included), in end order.
        degraded: whether a fallback (degraded) path took over.
        fallback_reason: ``"timeout"``, ``"error"`` or ``"predicted"`` when degraded, else
            ``None``.
        answered: ``(number, target)`` of the attempt that produced the result, once one did.
        cache: what a response cache did for the call: ``"hit"`` (answered from the cache, no
            attempt made), ``"miss"``, or ``None`` (no cache).
        route: the :class:`~latencykit.routing.RouteDecision` of a routed call (else
            ``None``).
        ledger: on the outermost trace of a turn, the turn's
            :class:`~latencykit.turn.Ledger` once a stage ran in it (else ``None``).
        queued_for: ``(host, seconds)`` when the deadline ended an attempt's wait for a
            connection slot: the host it waited for (``"host:port (lane)"``) and how long (else
            ``None``): what :class:`~latencykit.DeadlineExceeded` tells.
    """

    # A plain slotted class, not a dataclass: one is built per call, on the hot path.
    __slots__ = (
        "_started_attempts",
        "answered",
        "attempts",
        "cache",
        "call_id",
        "degraded",
        "ended_at",
        "fallback_reason",
        "ledger",
        "origin",
        "paid_budgets",
        "parent",
        "queued_for",
        "route",
        "started_at",
    )

    def __init__(self, parent: Trace | None = None, started_at: float | None = None) -> None:
        self.parent = parent
        self.started_at = now() if started_at is None else started_at
        self.ended_at: float | None = None
        self.origin: float = self.started_at if parent is None else parent.origin
        self.call_id = next(_call_ids)
        self.attempts: list[Attempt] = []
        self.degraded = False
        self.fallback_reason: str | None = None
        self._started_attempts = 0
        self.paid_budgets: set[int] | None = None  # RetryBudgets this call deposited into
        self.answered: tuple[int, str] | None = None  # (number, target) of the last answer
        self.cache: str | None = None
        self.ledger: Ledger | None = None
        self.route: RouteDecision | None = None
        self.queued_for: tuple[str, float] | None = None

    def turn(self) -> Trace:
        """The outermost enclosing trace (this one when it has no parent): the turn's."""
        trace = self
        while trace.parent is not None:
            trace = trace.parent
        return trace

    def next_attempt_number(self) -> int:
        """Number the next attempt of this scope (1, 2, ...)."""
        self._started_attempts += 1
        return self._started_attempts

    def record(self, attempt: Attempt) -> None:
        """Add ``attempt`` to this trace and every enclosing one."""
        trace: Trace | None = self
        while trace is not None:
            trace.attempts.append(attempt)
            trace = trace.parent


def current_call_id() -> int:
    """The ``call_id`` of the latencykit scope running in this task (0 outside one)."""
    trace = trace_var.get()
    return 0 if trace is None else trace.call_id


def current_attempt() -> int:
    """The number of the attempt running in this task (0 outside an attempt)."""
    return attempt_var.get()


def remaining() -> float | None:
    """Seconds left before the innermost deadline, or ``None`` outside any deadline.

    Never negative: an expired deadline gives ``0.0``. Must be called from inside an event loop
    when a deadline is active (the deadline lives on the loop's clock).
    """
    deadline = deadline_var.get()
    if deadline == math.inf:
        return None
    return max(0.0, deadline - backend().now())
