"""``fallback``: race the primary against a timer, and answer from a cheaper path.

The seeds' Promise.race: if the primary has not answered ``after`` seconds in, or raised an error
the policy handles, the primary is cancelled (really: its HTTP request is closed) and the
alternative answers. Every switch emits :class:`~latencykit.events.FallbackUsed`, the slow-case log.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from .. import _validation, events
from .._cancel import backend, now
from .._context import deadline_var, reason_var, trace_var
from ..errors import ErrorFilter, ErrorKind, FallbackFailed, classify, error_predicate
from ..pipeline import Call, Next, Policy, PolicyDecorator, Stage
from .deadline import Deadline

__all__ = ["Fallback", "FallbackReason", "Reroute", "fallback"]


@dataclass(frozen=True, slots=True)
class FallbackReason:
    """Why the fallback answers; passed as the first argument to a callable alternative.

    Attributes:
        kind: ``"timeout"`` (the primary was still running after ``after`` seconds),
            ``"error"`` (the primary raised an error the policy handles) or ``"predicted"``
            (the time left before the deadline was less than the primary's predicted time to
            answer: the primary was not started).
        elapsed: seconds from the start of the primary to the switch (``0.0`` when
            predicted).
        error: the primary's exception when ``kind == "error"``, else ``None``.
    """

    kind: Literal["timeout", "error", "predicted"]
    elapsed: float
    error: Exception | None = None

    @property
    def error_kind(self) -> ErrorKind | None:
        """The classification of ``error`` (``None`` on timeout)."""
        return None if self.error is None else classify(self.error)


Alternative: TypeAlias = Callable[[FallbackReason, Call, Next], Awaitable[Any]]
_NO_TIMER = contextlib.nullcontext()  # reusable: a switch on errors only


@dataclass(frozen=True, slots=True)
class Reroute:
    """An alternative that goes on through the rest of the pipeline: ``path(reason, call,
    next)`` may call ``next`` with a rewritten call (``LLM``'s degraded path does)."""

    path: Alternative


def _alternative(alternative: object) -> Alternative:
    if isinstance(alternative, Reroute):
        return alternative.path
    if callable(alternative):

        async def call_user(reason: FallbackReason, call: Call, next: Next) -> Any:
            result = alternative(reason, *call.args, **call.kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return call_user

    async def constant(reason: FallbackReason, call: Call, next: Next) -> Any:
        return alternative

    return constant


class Fallback(PolicyDecorator):
    """Answer from ``alternative`` when the primary is too slow or fails: a policy and a decorator
    (``lk.fallback`` is this class; ``lk.Degrade`` in ``LLM`` builds one).

    Args:
        alternative: a callable (sync or async) called as
            ``alternative(reason, *args, **kwargs)``, with the :class:`FallbackReason` first and
            then the primary's own arguments; or any non-callable value, returned as is; or a
            :class:`Reroute`, which goes on through the rest of the pipeline.
        after: seconds (or ``timedelta``) to give the primary before cancelling it and switching
            to the alternative. Default ``None``: no timer, switch on errors only. Must be
            shorter than an enclosing :class:`~latencykit.deadline` of the same pipeline; when
            the budget that encloses a call (any deadline, however set) is shorter than
            ``after``, the primary gets half of what is left and the alternative the rest.
        on: which primary errors switch to the alternative: exception type(s) or a predicate.
            Default ``None``: transient errors (:func:`~latencykit.errors.is_transient`: rate
            limits, 5xx, connection errors, timeouts). Errors not handled propagate unchanged.
        predict: ``predict(call)``, the primary's predicted seconds to answer ``call`` (``None``:
            no prediction). Inside a deadline, when less time is left than that, the
            alternative answers at once (reason ``"predicted"``) instead of starting a
            primary that cannot finish. Default ``None``: never predicted.

    If the alternative raises too, :class:`~latencykit.FallbackFailed` carries both errors.
    Cancellation from outside (an enclosing deadline) is never treated as an error.
    """

    stage = Stage.FALLBACK
    __slots__ = ("_alternative", "_handles", "after", "on", "predict")

    def __init__(
        self,
        alternative: Callable[..., Any] | Reroute | object,
        *,
        after: float | datetime.timedelta | None = None,
        on: ErrorFilter | None = None,
        predict: Callable[[Call], float | None] | None = None,
    ) -> None:
        self.after = _validation.optional_seconds("fallback.after", after)
        self.on = on
        if predict is not None and not callable(predict):
            raise TypeError(f"fallback.predict must be callable, got {predict!r}")
        self.predict = predict
        self._handles = error_predicate(on, "fallback.on")
        self._alternative = _alternative(alternative)

    def __repr__(self) -> str:
        return f"fallback(after={self.after})"

    def check_within(self, outer: tuple[Policy, ...]) -> None:
        """Reject an ``after`` that an enclosing deadline would always cut first."""
        for policy in outer:
            if isinstance(policy, Deadline) and self.after and self.after >= policy.seconds:
                raise ValueError(
                    f"fallback.after ({self.after:g}s) must be shorter than the deadline "
                    f"({policy.seconds:g}s): the deadline would expire before the fallback "
                    "could answer"
                )

    async def handle(self, call: Call, next: Next) -> Any:
        """Run the primary; on timeout or a handled error, cancel it and run the alternative.

        For a streaming call the primary has answered once its first content chunk arrived.
        """
        started = now()
        deadline = deadline_var.get()
        if self.predict is not None and deadline != math.inf:
            predicted = self.predict(call)
            if predicted is not None and predicted > deadline - started:
                return await self._switch(0.0, None, call, next, "predicted")
        timer = _NO_TIMER
        if self.after is not None:
            switch_at = started + self.after
            if deadline < switch_at:
                # An enclosing budget shorter than ``after`` would cancel everything before the
                # switch: the primary gets half of what is left, the alternative the rest.
                switch_at = started + (deadline - started) / 2
            timer = backend().expiry(switch_at)
        error: Exception | None = None  # stays None when the timer cancelled the primary
        with timer:
            try:
                return await next(call)
            except Exception as exc:
                if not self._handles(exc):
                    raise
                error = exc
        return await self._switch(now() - started, error, call, next)

    async def _switch(
        self,
        elapsed: float,
        error: Exception | None,
        call: Call,
        next: Next,
        kind: Literal["timeout", "error", "predicted"] | None = None,
    ) -> Any:
        reason = FallbackReason(
            kind=kind or ("timeout" if error is None else "error"),
            elapsed=elapsed,
            error=error,
        )
        trace = trace_var.get()
        if trace is not None:
            trace.degraded = True
            trace.fallback_reason = reason.kind
        if events.listening():
            events.emit(
                events.FallbackUsed(
                    call_id=0 if trace is None else trace.call_id,
                    reason=reason.kind,
                    elapsed=reason.elapsed,
                    after=self.after,
                    error_type=None if error is None else type(error).__name__,
                    error_kind=reason.error_kind,
                )
            )
        why = reason_var.set("fallback")
        try:
            return await self._alternative(reason, call, next)
        except Exception as exc:
            raise FallbackFailed(reason.kind, error, exc) from exc
        finally:
            reason_var.reset(why)


fallback = Fallback
"""The same class: ``@lk.fallback(cheap, after=2.0)`` reads as the decorator it is."""
