"""Policies, their composition into a pipeline, and the decorator plumbing.

A **policy** is one async middleware: ``handle(call, next)`` gets the call to make and the rest
of the pipeline as ``next``; it may call ``next`` once (deadline), race it against a timer
(fallback), call it several times concurrently (hedge), or with a rewritten call (failover,
degrade). The innermost ``next`` runs one **attempt**: it invokes the wrapped callable and
records the attempt in the call's trace.

Policies run in a fixed order, outermost first, whatever order they are given in::

    DEADLINE  ->  CACHE  ->  ROUTER  ->  FALLBACK  ->  HEDGE  ->  FAILOVER  ->  BREAKER
              ->  LIMITER  ->  RETRY  ->  ATTEMPT (timeout / stream guard)  ->  the call

The order matters (a deadline must bound everything, a fallback must race the hedged and
failed-over primary, a breaker must see each target's attempts) so it is enforced, not left to
the order of decorators (a cache inside the deadline bounds a slow shared store's lookup, and
outside the fallback it sees whether the answer was degraded; a router inside the deadline
knows the budget left, and outside the fallback it never reroutes the degraded call).
Policies of the same stage keep the order given.

A streaming call (``Call.stream`` set) returns a :class:`~latencykit.Stream` once its first
content chunk arrived: to every policy, that is when the attempt "returns". What must happen
when the stream ends is registered on it with ``on_close`` (see :mod:`latencykit.stream`).
"""

from __future__ import annotations

import enum
import functools
import inspect
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from types import MappingProxyType
from typing import (
    Any,
    NamedTuple,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    overload,
    runtime_checkable,
)

from . import _response, events
from ._cancel import clock, now
from ._context import (
    Attempt,
    AttemptReason,
    Outcome,
    Trace,
    attempt_var,
    current_attempt,
    deadline_var,
    operation_var,
    queued_var,
    reason_var,
    trace_var,
)
from .errors import LatencykitError, classify, request_id_of
from .stream import ChunkSource, LazyStream, Resume, Stream
from .target import Target

__all__ = [
    "Attempt",
    "AttemptReason",
    "AttemptRecorder",
    "Call",
    "Next",
    "Outcome",
    "Pipeline",
    "Policy",
    "Stage",
    "StreamLimits",
    "Trace",
    "compose",
    "current_attempt",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_EMPTY: Mapping[str, Any] = MappingProxyType({})
UNNAMED = Target(name="<unnamed>")
"""The target of a :class:`Call` built without one; a pipeline run names it after ``fn``."""


class Stage(enum.IntEnum):
    """Where a policy sits in the pipeline; lower runs further out."""

    DEADLINE = 10
    CACHE = 15
    ROUTER = 18
    FALLBACK = 20
    HEDGE = 30
    FAILOVER = 40
    BREAKER = 50
    LIMITER = 60
    RETRY = 70
    CONCURRENCY = 77  # per attempt, inside the governor's pacing (RETRY + 5)
    ATTEMPT = 80


class AttemptRecorder(Protocol):
    """Receives the attempts of the calls that carry it (``Call.recorder``)."""

    def first_chunk(self, target: str, ttft: float) -> None:
        """A stream attempt to ``target`` got its first content chunk after ``ttft`` s."""
        ...

    def record(self, attempt: Attempt, *, stream: bool = False) -> None:
        """An attempt ended (``stream``: of a streaming call)."""
        ...


class StreamLimits(Protocol):
    """The limits on a streaming call's attempts (``Call.stream``): a
    :class:`~latencykit.StreamGuard` (a policy, above the pipeline, which only needs this)."""

    raise_truncated: bool
    """Whether an answer cut at its output cap raises after its last chunk."""

    def limits(self, target: Target) -> tuple[float | None, float | None]:
        """``(first_token, stall)`` in seconds for an attempt on ``target`` (``None``: none)."""
        ...

    def resumer(self, call: Call, trace: Trace) -> Resume | None:
        """What continues a broken stream of ``call`` (``None``: it is not continued)."""
        ...


class _Unguarded:
    """A stream no guard bounds: its target's attempt timeout, as ``StreamGuard()`` gives
    until it has learned limits."""

    raise_truncated = False

    @staticmethod
    def limits(target: Target) -> tuple[float | None, float | None]:
        return target.timeout, target.timeout

    @staticmethod
    def resumer(call: Call, trace: Trace) -> None:
        return None


_UNGUARDED = _Unguarded()


class Call(NamedTuple):
    """One call to make: a callable, its arguments, the target it goes to, and whether it streams.

    Immutable (a named tuple, cheap to build on the hot path). Policies that rewrite the call
    (failover, degrade, a stream guard) hand ``next`` a modified copy: :meth:`with_kwargs`, or
    ``_replace()``.

    Attributes:
        fn: the callable an attempt invokes as ``fn(*args, **kwargs)``: an async function, or for
            a streaming call anything returning an async iterator (or an awaitable of one).
        args: positional arguments (default ``()``).
        kwargs: keyword arguments (default empty).
        target: the :class:`~latencykit.Target` attempts are recorded under and policies key
            their state by (default: named after ``fn`` when the pipeline runs).
        stream: the :class:`StreamLimits` of a streaming call, its
            :class:`~latencykit.StreamGuard` (default ``None``: not a streaming call).
        recorder: what each attempt of the call is reported to when it ends (and a stream's
            first content chunk when it arrives), e.g. the LLM's
            :class:`~latencykit.stats.Recorder` (default ``None``: nothing).
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = _EMPTY
    target: Target = UNNAMED
    stream: StreamLimits | None = None
    recorder: AttemptRecorder | None = None

    def with_kwargs(self, **changes: Any) -> Call:
        """A copy with ``changes`` merged into ``kwargs``."""
        return self._replace(kwargs={**self.kwargs, **changes})


Next: TypeAlias = Callable[[Call], Awaitable[Any]]
"""The rest of the pipeline, as seen by a policy."""


@runtime_checkable
class Policy(Protocol):
    """The protocol every policy implements (built-in or your own).

    Attributes:
        stage: where the policy sits in the pipeline (a :class:`Stage`, or any int).

    A policy may also define ``check_within(outer: tuple[Policy, ...])``, called when a pipeline
    is composed with the policies outside it, to reject a combination that cannot work (raise
    ``ValueError`` naming the field). A policy whose ``next`` returns a
    :class:`~latencykit.Stream` and that must act when it ends registers ``on_close``.

    ``handle`` is usually an ``async def``; a policy that only rewrites the call may be a plain
    ``def`` returning ``next(call)`` (no coroutine frame of its own on every call).
    """

    @property
    def stage(self) -> int: ...

    def handle(self, call: Call, next: Next) -> Awaitable[Any]:
        """Run ``call`` through this policy; call ``next`` (zero or more times) to go on."""
        ...


class PolicyDecorator:
    """Mixin: a policy object is also a decorator (``@lk.deadline(3.0)``)."""

    __slots__ = ()

    def _pipeline(self) -> Pipeline:
        return Pipeline((self,))  # type: ignore[arg-type]  # the classes it is mixed into

    @overload
    def __call__(self, fn: Callable[P, AsyncIterator[T]]) -> Callable[P, LazyStream[T]]: ...
    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        """Decorate an async callable (or an async-generator function, whose calls then stream)
        with this policy (pipeline); the wrapper keeps its name, docstring, signature and type
        hints."""
        return decorate(self._pipeline(), fn)


class Pipeline(PolicyDecorator):
    """An ordered, immutable stack of policies around the attempt runner.

    Build one with :func:`compose`; use it as a decorator, or call :meth:`run`.
    Composition validates the policies against each other (for instance a fallback's ``after``
    must fit inside the deadline) and raises ``ValueError`` naming the offending field.
    """

    __slots__ = ("_entry", "policies")

    def __init__(self, policies: Iterable[Policy] = ()) -> None:
        policies = tuple(policies)
        for policy in policies:
            if not isinstance(policy, Policy):
                raise TypeError(f"not a latencykit policy (needs .stage and .handle): {policy!r}")
        ordered = sorted(policies, key=lambda p: int(p.stage))
        for index, policy in enumerate(ordered):
            check = getattr(policy, "check_within", None)
            if check is not None:
                check(tuple(ordered[:index]))
        self.policies: tuple[Policy, ...] = tuple(ordered)
        entry: Next = run_attempt
        for policy in reversed(self.policies):
            entry = functools.partial(policy.handle, next=entry)
        self._entry = entry

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(map(repr, self.policies))})"

    def adding(self, *policies: Policy) -> Pipeline:
        """A new pipeline with ``policies`` added (re-sorted and re-validated)."""
        return Pipeline((*self.policies, *policies))

    async def run(self, call: Call) -> Any:
        """Run ``call`` through the policies in a fresh trace and return its result."""
        result, _ = await self.run_traced(call)
        return result

    async def run_traced(
        self, call: Call, *, reason: AttemptReason = "primary"
    ) -> tuple[Any, Trace]:
        """Like :meth:`run`, also returning the call's :class:`~latencykit.pipeline.Trace`.

        For a stream, the trace goes on filling until the stream ends; ``CallEnded`` is emitted
        then. ``reason``: why the call's first attempt is made (default ``"primary"``; an
        enclosing call's reason never carries over).
        """
        if call.target is UNNAMED:
            call = call._replace(target=function_target(call.fn))
        trace = Trace(parent=trace_var.get())
        if events.subscribers:
            _call_started(trace, call)
        try:
            # run_within's body, inline: one coroutine frame less on every call
            token, reason_token = trace_var.set(trace), reason_var.set(reason)
            try:
                result = await self._entry(call)
            finally:
                reason_var.reset(reason_token)
                trace_var.reset(token)
        except Exception as exc:
            _call_ended(trace, call, None, "error", exc)
            raise
        except BaseException:
            _call_ended(trace, call, None, "cancelled", None)
            raise
        if isinstance(result, Stream):
            result.on_close(functools.partial(_call_ended, trace, call))
        else:
            _call_ended(trace, call, result, "ok", None)
        return result, trace

    async def run_within(self, call: Call, trace: Trace, *, reason: AttemptReason) -> Any:
        """Run ``call`` through the policies as part of an enclosing call's ``trace`` (its
        attempts join that call's history, made for ``reason``): what continues a broken
        stream. No call events of its own are emitted."""
        token = trace_var.set(trace)
        reason_token = reason_var.set(reason)
        try:
            return await self._entry(call)
        finally:
            reason_var.reset(reason_token)
            trace_var.reset(token)

    def _pipeline(self) -> Pipeline:
        return self


def compose(*policies: Policy) -> Pipeline:
    """Build a :class:`Pipeline` from policies, in the fixed stage order (see module docs)."""
    return Pipeline(policies)


def function_target(fn: Callable[..., Any]) -> Target:
    """The target of a plain callable: named by its qualified name."""
    fn = _unwrapped(fn)
    return Target(name=getattr(fn, "__qualname__", None) or repr(fn))


def _call_started(trace: Trace, call: Call) -> None:
    parent = trace.parent
    events.emit(
        events.CallStarted(
            call_id=trace.call_id,
            target=call.target.key,
            endpoint=call.target.endpoint,
            stream=call.stream is not None,
            parameters=_response.parameters(call.kwargs) if call.target.model else {},
            parent_id=None if parent is None else parent.call_id,
            parent_attempt=current_attempt(),
            input_messages=call.kwargs.get("messages") if events.capturing_content() else None,
            operation=operation_var.get(),
        )
    )


def _call_ended(
    trace: Trace, call: Call, result: Any, outcome: str, error: BaseException | None
) -> None:
    """The call ended (a stream's: ``result`` is the stream, called back when it ends)."""
    trace.ended_at = clock()
    if isinstance(error, LatencykitError) and not error.attempts:
        error.attempts = tuple(trace.attempts)
    ended: Outcome = _ATTEMPT_OUTCOME[outcome]
    if events.subscribers:
        # only a failed call carries its error (not a stream closed after one)
        _emit_call_ended(trace, call, result, ended, error if ended == "error" else None)


def _emit_call_ended(
    trace: Trace, call: Call, result: Any, outcome: Outcome, error: BaseException | None
) -> None:
    assert trace.ended_at is not None
    if trace.ledger is not None:  # a decorated call in which stages ran: its turn ended
        events.emit(events.TurnEnded(trace.call_id, ledger=trace.ledger))
    answered = trace.answered
    capture = events.capturing_content()
    if isinstance(result, Stream):
        summary = result.summary()
        ttft = None if result.ttft is None else result.started_at + result.ttft - trace.started_at
        text = result.partial_text if capture else None
    else:
        summary = _response.summary(result)
        ttft = None
        text = _response.message_text(result) if capture else None
    events.emit(
        events.CallEnded(
            call_id=trace.call_id,
            target=call.target.key if answered is None else answered[1],
            duration=trace.ended_at - trace.started_at,
            outcome=outcome,
            attempts=len(trace.attempts),
            degraded=trace.degraded,
            error_type=None if error is None else type(error).__name__,
            error_kind=None if error is None else classify(error),
            timeline=tuple(trace.attempts),
            stream=call.stream is not None,
            ttft=ttft,
            response_model=summary.model,
            response_id=summary.id,
            finish_reasons=summary.finish_reasons,
            input_tokens=summary.input_tokens,
            output_tokens=summary.output_tokens,
            output_text=text,
        )
    )


async def run_attempt(call: Call) -> Any:
    """The innermost ``next``: make one attempt and record it in the trace.

    A streaming call's attempt returns once the stream is committed (its first content chunk
    arrived); the attempt is recorded when the stream ends.
    """
    trace = trace_var.get()
    if trace is None:  # a policy's handle() called directly, outside Pipeline.run
        trace = Trace()
    number = trace.next_attempt_number()
    target = call.target.key
    reason = reason_var.get()
    queued = queued_var.get()
    if events.subscribers:
        events.emit(
            events.AttemptStarted(
                call_id=trace.call_id,
                attempt=number,
                target=target,
                reason=reason,
                endpoint=call.target.endpoint,
                queued=queued,
            )
        )
    token = attempt_var.set(number)
    started = now()
    try:
        result = call.fn(*call.args, **call.kwargs)
        if call.stream is None:
            result = await result
        else:
            result = await _open_stream(result, call, trace, number, started)
    except Exception as exc:
        _record(call, trace, number, reason, queued, started, None, "error", exc)
        raise
    except BaseException:
        _record(call, trace, number, reason, queued, started, None, "cancelled", None)
        raise
    finally:
        attempt_var.reset(token)
    trace.answered = (number, target)
    if call.stream is None:
        _record(call, trace, number, reason, queued, started, None, "ok", None, result)
    else:
        if call.recorder is not None and result.ttft is not None:
            call.recorder.first_chunk(target, result.ttft)
        result.on_close(
            functools.partial(_record, call, trace, number, reason, queued, started), attempt=True
        )
    return result


async def _open_stream(
    opened: Any, call: Call, trace: Trace, number: int, started: float
) -> Stream[Any]:
    guard = call.stream
    assert guard is not None
    source = await opened if inspect.isawaitable(opened) else opened
    if not hasattr(source, "__anext__"):
        raise TypeError(
            f"a streaming call must produce an async iterator; {call.target.key} gave {source!r}"
        )
    first_token, stall = guard.limits(call.target)
    # A source that did set-up of its own before its request (LLM's: litellm's first call of a
    # model, the loop's first HTTP client) says when it was ready (``ready_at``): the client's
    # set-up is not the provider's first-token time. The attempt's own start stays where it was.
    ready_at = source.ready_at if isinstance(source, ChunkSource) else None
    stream: Stream[Any] = Stream(
        source,
        first_token=first_token,
        stall=stall,
        deadline=deadline_var.get(),
        started=started if ready_at is None else ready_at,
        target=call.target.key,
        trace=trace,
        attempt=number,
        resume=guard.resumer(call, trace),
        raise_truncated=guard.raise_truncated,
    )
    await stream.commit()
    return stream


_ATTEMPT_OUTCOME: dict[str, Any] = {
    "ok": "ok",
    "error": "error",
    "closed": "cancelled",
    "cancelled": "cancelled",
    "abandoned": "cancelled",
}


_new_tuple = tuple.__new__
_TIMING = ("ttft", "chunks", "gap_p50", "gap_max", "output_tokens")
"""A stream attempt's fields of an :class:`Attempt` (``Stream.timing()``), in field order."""
_NO_TIMING = tuple(Attempt._field_defaults[name] for name in _TIMING)
_timing = operator.itemgetter(*_TIMING)
assert Attempt._fields[7:12] == _TIMING


def _record(
    call: Call,
    trace: Trace,
    number: int,
    reason: AttemptReason,
    queued: float,
    started: float,
    stream: Stream[Any] | None,
    outcome: str,
    error: BaseException | None,
    answer: object = None,
) -> None:
    """Record the attempt that ended (a stream's: called back when it ends) with its
    provider's request id: the stream's, the error's, or the ``answer``'s."""
    ended: Outcome = _ATTEMPT_OUTCOME[outcome]
    if ended != "error":
        error = None
    if stream is not None:
        request_id = stream.request_id
    else:
        request_id = request_id_of(answer if error is None else error)
    # The tuple built at once, in field order: a named tuple's keyword __new__ is Python code.
    attempt: Attempt = _new_tuple(
        Attempt,
        (
            number,
            call.target.key if stream is None else stream.target,
            started - trace.origin,
            clock() - started,
            ended,
            None if error is None else type(error).__name__,
            None if error is None else classify(error),
            *(_NO_TIMING if stream is None else _timing(stream.timing())),
            reason,
            queued,
            request_id,
        ),
    )
    trace.record(attempt)
    if call.recorder is not None:
        call.recorder.record(attempt, stream=call.stream is not None)
    if events.subscribers:
        events.emit(
            events.AttemptEnded(
                call_id=trace.call_id,
                record=attempt,
                gaps=() if stream is None else stream.gaps,
            )
        )


# --- decorators -----------------------------------------------------------------------------

_PIPELINE_ATTR = "__latencykit_pipeline__"


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine (an async function, a ``partial`` of one, or an
    object with an async ``__call__``)."""
    fn = _unwrapped(fn)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - objects with an async __call__
    )


def _unwrapped(fn: Any) -> Any:
    """The function a ``functools.partial`` (of a partial...) calls, or ``fn``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def decorate(pipeline: Pipeline, fn: Callable[P, Any]) -> Callable[P, Any]:
    """Wrap ``fn`` in ``pipeline``. Stacked latencykit decorators merge into one pipeline.

    An async-generator function becomes a function returning a :class:`LazyStream`: its calls
    are streaming calls (first content item = commit), started on the first ``__anext__``.
    """
    inner: Pipeline | None = getattr(fn, _PIPELINE_ATTR, None)
    if inner is not None:
        raw: Callable[P, Any] = fn.__wrapped__  # type: ignore[attr-defined]
        pipeline = inner.adding(*pipeline.policies)
    else:
        raw = fn
        if not (is_async_callable(fn) or inspect.isasyncgenfunction(_unwrapped(fn))):
            raise TypeError(
                f"latencykit policies wrap async callables and async-generator functions; "
                f"{fn!r} is neither"
            )
    target = function_target(raw)
    run = pipeline.run_traced

    @functools.wraps(raw)
    def streaming(*args: P.args, **kwargs: P.kwargs) -> LazyStream[Any]:
        return LazyStream(
            functools.partial(pipeline.run, Call(raw, args, kwargs, target, _UNGUARDED))
        )

    @functools.wraps(raw)
    async def calling(*args: P.args, **kwargs: P.kwargs) -> Any:
        return (await run(Call(raw, args, kwargs, target)))[0]

    wrapper = streaming if inspect.isasyncgenfunction(_unwrapped(raw)) else calling
    setattr(wrapper, _PIPELINE_ATTR, pipeline)
    return wrapper


def pipeline_of(fn: Callable[..., Any]) -> Pipeline | None:
    """The pipeline a latencykit-decorated callable runs through, or ``None``."""
    return getattr(fn, _PIPELINE_ATTR, None)
