"""``deadline``: one total latency budget for everything inside it.

Built on the backend's cancel scopes (``_cancel.Expiry`` on asyncio: an entry on the loop's one
timer, with anyio's semantics), so expiry really cancels the work inside (an in-flight litellm
request closes its connection within milliseconds) and nesting composes: an inner deadline can
only shorten the budget, never extend it.
"""

from __future__ import annotations

import datetime
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from .. import _validation, events
from .._cancel import backend
from .._context import Trace, deadline_var, trace_var
from ..errors import DeadlineExceeded
from ..pipeline import Call, Next, PolicyDecorator, Stage

if TYPE_CHECKING:
    from .._values import Ledger

__all__ = ["Deadline", "DeadlineScope", "PerTask", "deadline"]

S = TypeVar("S")


class PerTask(Generic[S]):
    """The scopes one reusable context manager has entered, per task: one ``lk.deadline(2)``
    object (or stage) may guard several tasks at once, each ``with`` block its own scope.

    Kept in a context variable (each task runs in its own context), which is cheaper than
    looking the task up at every entry and exit.
    """

    __slots__ = ("_current",)

    def __init__(self) -> None:
        # The entered scope, and the token that restores what was entered before it.
        self._current: ContextVar[list[Any] | None] = ContextVar("latencykit.entered", default=None)

    def push(self, scope: S) -> S:
        """Remember ``scope`` as the current task's innermost; returns it."""
        entered: list[Any] = [scope, None]
        entered[1] = self._current.set(entered)
        return scope

    def pop(self) -> S:
        """Forget and return the current task's innermost scope."""
        entered = self._current.get()
        assert entered is not None, "exited a scope that was not entered in this task"
        scope, token = entered
        self._current.reset(token)
        return scope  # type: ignore[no-any-return]


class DeadlineScope:
    """An entered deadline: returned by ``with lk.deadline(s) as scope``.

    Attributes:
        budget: the budget in seconds.
        deadline: the absolute expiry on the event loop's clock, already lowered to any
            enclosing deadline.
        starts_at: when the scope was created, on the event loop's clock.
    """

    __slots__ = (
        "_backend",
        "_cancel_scope",
        "_token",
        "_trace",
        "_trace_token",
        "budget",
        "deadline",
        "stage",
        "starts_at",
    )

    def __init__(
        self,
        budget: float,
        *,
        own_trace: bool = False,
        stage: str | None = None,
    ) -> None:
        self.budget = budget
        self.stage = stage
        self._backend = loop = backend()
        self.starts_at = loop.now()
        expires = self.starts_at + budget
        enclosing = deadline_var.get()
        # No cancel scope (the costliest part) when an enclosing one expires first or at the
        # same time: it cancels the work inside, and raises (naming the stage it ran out in).
        if expires >= enclosing:
            self.deadline, self._cancel_scope = enclosing, None
        else:
            self.deadline, self._cancel_scope = expires, loop.expiry(expires)
        self._trace: Trace | None = Trace(trace_var.get(), self.starts_at) if own_trace else None

    @property
    def ledger(self) -> Ledger | None:
        """The ledger of the turn this scope started, once a stage ran in it (``None``
        otherwise, and for a deadline inside another turn)."""
        return None if self._trace is None else self._trace.ledger

    @property
    def expired(self) -> bool:
        """Whether this scope's own deadline cancelled the work inside it."""
        return self._cancel_scope is not None and bool(self._cancel_scope.cancelled_caught)

    def remaining(self) -> float:
        """Seconds left before this scope's (effective) deadline; never negative."""
        return max(0.0, self.deadline - self._backend.now())

    def __enter__(self) -> DeadlineScope:
        if self._cancel_scope is not None:
            self._cancel_scope.__enter__()
        self._token = deadline_var.set(self.deadline)
        if self._trace is not None:
            self._trace_token = trace_var.set(self._trace)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        """Leave the scope; raises :class:`~latencykit.DeadlineExceeded` when its own deadline
        cancelled the work inside (it never swallows an exception)."""
        if self._trace is not None:
            trace_var.reset(self._trace_token)
        deadline_var.reset(self._token)
        scope = self._cancel_scope
        try:
            if scope is not None:
                scope.__exit__(exc_type, exc, tb)  # swallows only its own cancellation...
                if scope.cancelled_caught:
                    self._expired()  # ...which the deadline turns into DeadlineExceeded
        finally:
            trace = self._trace
            if trace is not None and trace.ledger is not None and events.listening():
                events.emit(events.TurnEnded(trace.call_id, ledger=trace.ledger))
        return False

    def _expired(self) -> None:
        elapsed = self._backend.now() - self.starts_at
        trace = self._trace or trace_var.get()
        stage, ledger = self.stage, None
        if trace is not None:
            ledger = trace.turn().ledger
            if ledger is not None and stage is None:
                stage = ledger.ran_out_in(self.deadline)
        if events.listening():
            call_id = trace.call_id if trace is not None else 0
            events.emit(
                events.DeadlineExpired(call_id, budget=self.budget, elapsed=elapsed, stage=stage)
            )
        queued_for = None if trace is None else trace.queued_for
        error = DeadlineExceeded(self.budget, elapsed, stage=stage, queued_for=queued_for)
        error.ledger = ledger
        if trace is not None:
            error.attempts = tuple(trace.attempts)
        raise error


class Deadline(PolicyDecorator):
    """A total latency budget of ``seconds`` (float or ``timedelta``; no default: required): a
    policy, a decorator and a (sync) context manager (``lk.deadline`` is this class).

    Use it as a decorator (``@lk.deadline(3.0)``), as a context manager
    (``with lk.deadline(3.0):``, inside a task, like ``anyio.fail_after``) or as a policy in
    :func:`~latencykit.compose`. Nested deadlines take the minimum; :func:`~latencykit.remaining`
    tells the seconds left. On expiry everything inside is cancelled (structured cancellation:
    in-flight HTTP requests are closed) and :class:`~latencykit.DeadlineExceeded` (a
    ``TimeoutError``) is raised, naming the budget and the elapsed time and carrying the attempt
    history. Each ``with`` block gets a fresh budget.

    Raises:
        ValueError: ``seconds`` is not positive and finite.
        TypeError: ``seconds`` is not a number or ``timedelta``.
    """

    stage = Stage.DEADLINE
    __slots__ = ("_active", "seconds")

    def __init__(self, seconds: float | datetime.timedelta) -> None:
        self.seconds = _validation.seconds("deadline.seconds", seconds)
        self._active: PerTask[DeadlineScope] = PerTask()

    def __repr__(self) -> str:
        return f"deadline({self.seconds:g})"

    async def handle(self, call: Call, next: Next) -> Any:
        """Run the rest of the pipeline within the budget; raise ``DeadlineExceeded`` on expiry."""
        with DeadlineScope(self.seconds):
            return await next(call)

    def __enter__(self) -> DeadlineScope:
        return self._active.push(DeadlineScope(self.seconds, own_trace=True).__enter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        return self._active.pop().__exit__(exc_type, exc, tb)


deadline = Deadline
"""The same class: ``@lk.deadline(3.0)`` and ``with lk.deadline(3.0):`` read as they act."""
