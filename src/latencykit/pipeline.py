"""Policies, their composition into a pipeline, and the decorator plumbing.

A **policy** is one async middleware: ``handle(call, next)`` gets the call to make and the rest
of the pipeline as ``next``; it may call ``next`` once (deadline), race it against a timer
(fallback), call it several times concurrently (hedge), or with a rewritten call (failover,
degrade). The innermost ``next`` runs one **attempt**: it invokes the wrapped callable and
records the attempt in the call's trace.

Policies run in a fixed order, outermost first, whatever order they are given in::

    DEADLINE  ->  FALLBACK  ->  HEDGE  ->  FAILOVER  ->  BREAKER  ->  LIMITER  ->  RETRY
              ->  ATTEMPT (timeout / stream guard)  ->  the call

The order matters (a deadline must bound everything, a fallback must race the hedged and
failed-over primary, a breaker must see each target's attempts) so it is enforced, not left to
the order of decorators. Policies of the same stage keep the order given.
"""

from __future__ import annotations

import enum
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, ParamSpec, Protocol, TypeAlias, TypeVar, runtime_checkable

from . import events
from ._context import Attempt, Trace, attempt_var, trace_var
from .errors import LatencykitError, classify

__all__ = ["Call", "Next", "Pipeline", "Policy", "Stage", "compose"]

P = ParamSpec("P")
R = TypeVar("R")

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Stage(enum.IntEnum):
    """Where a policy sits in the pipeline; lower runs further out."""

    DEADLINE = 10
    FALLBACK = 20
    HEDGE = 30
    FAILOVER = 40
    BREAKER = 50
    LIMITER = 60
    RETRY = 70
    ATTEMPT = 80


class Call(NamedTuple):
    """One call to make: a callable, its arguments, and the target it is addressed to.

    Immutable (a named tuple, cheap to build on the hot path). Policies that rewrite the call
    (failover, degrade) hand ``next`` a modified copy: :meth:`with_kwargs`, or ``_replace()``.

    Attributes:
        fn: the async callable an attempt invokes as ``await fn(*args, **kwargs)``.
        args: positional arguments (default ``()``).
        kwargs: keyword arguments (default empty).
        target: the name attempts are recorded under: a model string or a function name
            (default ``""``, read as ``fn``'s qualified name).
    """

    fn: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = _EMPTY
    target: str = ""

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
    """

    @property
    def stage(self) -> int: ...

    async def handle(self, call: Call, next: Next) -> Any:
        """Run ``call`` through this policy; call ``next`` (zero or more times) to go on."""
        ...


class Pipeline:
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
        self._entry = _chain(self.policies)

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(map(repr, self.policies))})"

    def adding(self, *policies: Policy) -> Pipeline:
        """A new pipeline with ``policies`` added (re-sorted and re-validated)."""
        return Pipeline((*self.policies, *policies))

    async def run(self, call: Call) -> Any:
        """Run ``call`` through the policies in a fresh trace and return its result."""
        result, _ = await self.run_traced(call)
        return result

    async def run_traced(self, call: Call) -> tuple[Any, Trace]:
        """Like :meth:`run`, also returning the call's :class:`~latencykit.Trace`."""
        trace = Trace(parent=trace_var.get())
        token = trace_var.set(trace)
        outcome = "cancelled"
        error: BaseException | None = None
        try:
            result = await self._entry(call)
            outcome = "ok"
            return result, trace
        except LatencykitError as exc:
            outcome, error = "error", exc
            if not exc.attempts:
                exc.attempts = tuple(trace.attempts)
            raise
        except Exception as exc:
            outcome, error = "error", exc
            raise
        finally:
            trace_var.reset(token)
            trace.ended_at = time.monotonic()
            if events.listening():
                events.emit(
                    events.CallEnded(
                        call_id=trace.call_id,
                        target=_target_of(call),
                        duration=trace.ended_at - trace.started_at,
                        outcome=outcome,  # type: ignore[arg-type]
                        attempts=len(trace.attempts),
                        degraded=trace.degraded,
                        error_type=None if error is None else type(error).__name__,
                    )
                )

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async callable; the wrapper keeps its name, docstring and signature."""
        return decorate(self, fn)


def _chain(policies: Sequence[Policy]) -> Next:
    """Bind each policy to the rest of the pipeline, innermost first.

    A policy may offer ``fuse(inner, inner_next)`` to replace itself and the policy just inside
    it with one equivalent, cheaper step (the deadline does, with a timed fallback).
    """
    entries: list[Next] = [run_attempt]  # entries[k]: the pipeline from policy -k-1 inwards
    fused_away = False
    for index in reversed(range(len(policies))):
        policy, after = policies[index], entries[-1]
        fuse = getattr(policy, "fuse", None)
        inner_next = entries[-2] if len(entries) > 1 else None
        step = None
        if fuse is not None and inner_next is not None and not fused_away:
            step = fuse(policies[index + 1], inner_next)
        fused_away = step is not None
        entries.append(step if step is not None else functools.partial(policy.handle, next=after))
    return entries[-1]


def compose(*policies: Policy) -> Pipeline:
    """Build a :class:`Pipeline` from policies, in the fixed stage order (see module docs)."""
    return Pipeline(policies)


def _target_of(call: Call) -> str:
    return call.target or getattr(call.fn, "__qualname__", None) or repr(call.fn)


async def run_attempt(call: Call) -> Any:
    """The innermost ``next``: make one attempt and record it in the trace."""
    trace = trace_var.get()
    if trace is None:  # a policy's handle() called directly, outside Pipeline.run
        trace = Trace()
    number = trace.next_attempt_number()
    target = _target_of(call)
    if events.listening():
        events.emit(events.AttemptStarted(call_id=trace.call_id, attempt=number, target=target))
    token = attempt_var.set(number)
    started = time.monotonic()
    try:
        result = await call.fn(*call.args, **call.kwargs)
    except Exception as exc:
        _record(trace, number, target, started, "error", exc)
        raise
    except BaseException:
        _record(trace, number, target, started, "cancelled", None)
        raise
    finally:
        attempt_var.reset(token)
    _record(trace, number, target, started, "ok", None)
    return result


def _record(
    trace: Trace,
    number: int,
    target: str,
    started: float,
    outcome: Any,
    error: BaseException | None,
) -> None:
    attempt = Attempt(
        number=number,
        target=target,
        start=started - trace.origin,
        duration=time.monotonic() - started,
        outcome=outcome,
        error_type=None if error is None else type(error).__name__,
        error_kind=None if error is None else classify(error),
    )
    trace.record(attempt)
    if events.listening():
        events.emit(events.AttemptEnded(call_id=trace.call_id, record=attempt))


# --- decorators -----------------------------------------------------------------------------

_PIPELINE_ATTR = "__latencykit_pipeline__"


def _is_async_callable(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - objects with an async __call__
    )


def decorate(
    pipeline: Pipeline, fn: Callable[P, Awaitable[R]]
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Wrap ``fn`` in ``pipeline``. Stacked latencykit decorators merge into one pipeline."""
    inner: Pipeline | None = getattr(fn, _PIPELINE_ATTR, None)
    if inner is not None:
        raw: Callable[P, Awaitable[R]] = fn.__wrapped__  # type: ignore[attr-defined]
        pipeline = inner.adding(*pipeline.policies)
    else:
        if not _is_async_callable(fn):
            raise TypeError(
                f"latencykit policies wrap async callables; {fn!r} is not a coroutine function"
            )
        raw = fn
    target = getattr(raw, "__qualname__", None) or repr(raw)
    run = pipeline.run_traced

    @functools.wraps(raw)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        result: R = (await run(Call(raw, args, kwargs, target)))[0]
        return result

    setattr(wrapper, _PIPELINE_ATTR, pipeline)
    return wrapper


def pipeline_of(fn: Callable[..., Any]) -> Pipeline | None:
    """The pipeline a latencykit-decorated callable runs through, or ``None``."""
    return getattr(fn, _PIPELINE_ATTR, None)


class PolicyDecorator:
    """Mixin: a policy object is also a decorator (``@lk.deadline(3.0)``)."""

    __slots__ = ()

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async callable with this policy; signature and type hints are kept."""
        return decorate(Pipeline((self,)), fn)  # type: ignore[arg-type]
