"""Stages of a turn: budgets carved out of the enclosing deadline, and the turn's ledger.

A **turn** is everything done for one user request (retrieval, reranking, a guardrail, the model,
tools, post-processing) within one total budget: a deadline (``with lk.deadline(2.0):``, or a
function decorated with one). A **stage** runs one part of the turn with its own budget::

    with lk.deadline(2.0):
        async with lk.stage("retrieval", budget=0.3):
            docs = await retrieve(question)
        async with lk.stage("model"):          # whatever the turn has left
            answer = await llm.acompletion(messages=prompt(docs, question))

A stage never gets more than what remains of the turn, and the time it does not use stays with
the turn for the stages after it (it is lent back: the turn's deadline is absolute). Each stage
that ends is written in the turn's :class:`Ledger`: its budget, the time it was given, the time
it spent, how it ended. A stage that overruns raises :class:`~latencykit.DeadlineExceeded`
naming the stage and carrying the ledger; so does the turn's deadline when it expires inside a
stage. ``lk.ledger()`` reads the ledger of the current turn; events
(:class:`~latencykit.events.StageStarted`, :class:`~latencykit.events.StageEnded`) and, with
telemetry, one span per stage report it.
"""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Literal, ParamSpec, TypeVar

from . import _validation, events
from ._context import Trace, current_attempt, deadline_var, trace_var
from ._values import Ledger, StageOutcome, StageRecord  # the base layer's: errors carry it
from .policies.deadline import DeadlineScope, PerTask

__all__ = ["Ledger", "StageBudget", "StageOutcome", "StageRecord", "StageScope", "ledger", "stage"]

P = ParamSpec("P")
R = TypeVar("R")


def ledger() -> Ledger | None:
    """The :class:`Ledger` of the current turn, or ``None`` when no stage ran in it yet (or
    outside any latencykit scope)."""
    trace = trace_var.get()
    return None if trace is None else trace.turn().ledger


class _AlsoAsync:
    """``async with`` for a synchronous context manager (a stage's scope needs no await)."""

    __slots__ = ()

    async def __aenter__(self) -> StageScope:
        return self.__enter__()  # type: ignore[attr-defined, no-any-return]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)  # type: ignore[attr-defined]


class StageScope(DeadlineScope, _AlsoAsync):
    """An entered stage: returned by ``with lk.stage(...) as scope`` (and ``async with``). A
    :class:`~latencykit.policies.deadline.DeadlineScope` with a name and a ledger entry.

    Attributes:
        name: the stage's name.
        budget: the budget it asked for in seconds (``math.inf``: none).
        deadline: its absolute deadline on the event loop's clock: the earlier of its budget's
            end and the enclosing deadline (``math.inf``: none).
        ledger: the turn's ledger it is written in.
        record: its :class:`StageRecord`, once it ended (``None`` before).
    """

    __slots__ = ("_parent", "ledger", "record")

    def __init__(self, name: str, budget: float | None) -> None:
        super().__init__(math.inf if budget is None else budget, own_trace=True, stage=name)
        trace = self._trace
        assert trace is not None
        turn = trace.turn()  # a stage outside any turn is a turn of its own
        if turn.ledger is None:
            outer = self.deadline if turn is trace else deadline_var.get()
            turn.ledger = Ledger(turn.started_at, outer)
        self.ledger: Ledger = turn.ledger
        self._parent: str | None = None
        self.record: StageRecord | None = None

    @property
    def name(self) -> str:
        """The stage's name."""
        return self.stage  # type: ignore[return-value]  # a stage's scope always has one

    @property
    def _asked(self) -> float | None:
        """The budget the stage asked for in seconds (``None``: none)."""
        return None if self.budget == math.inf else self.budget

    @property
    def allowed(self) -> float | None:
        """The seconds the stage was given (``None``: unbounded)."""
        return None if self.deadline == math.inf else self.deadline - self.starts_at

    def __enter__(self) -> StageScope:
        ledger = self.ledger
        opened = ledger._open
        self._parent = opened[-1] if opened else None
        DeadlineScope.__enter__(self)
        opened.append(self.stage)  # type: ignore[arg-type]
        if events.listening():
            trace = self._trace
            assert trace is not None
            parent = trace.parent
            events.emit(
                events.StageStarted(
                    trace.call_id,
                    name=self.name,
                    budget=self._asked,
                    allowed=self.allowed,
                    parent_id=None if parent is None else parent.call_id,
                    parent_attempt=current_attempt(),
                )
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        # Written before the scope exits (which raises when the stage's own time ran out), so
        # that the ledger is complete in every event and error.
        now = self._backend.now()
        if exc is None:
            outcome: StageOutcome = "ok"
        elif isinstance(exc, Exception):
            outcome = "error"
        elif now >= self.deadline:
            outcome = "overran"  # cancelled by its own budget or by the turn's deadline
        else:
            outcome = "cancelled"
        trace: Trace = self._trace  # type: ignore[assignment]  # a stage has its own
        ledger = self.ledger
        opened = ledger._open
        if opened[-1] == self.name:
            opened.pop()
        else:  # stages of concurrent tasks ended out of order
            opened.remove(self.name)
        started = self.starts_at
        record = self.record = StageRecord(  # positional: the cheapest on this path
            self.name,
            self._asked,
            self.allowed,
            started - ledger.started_at,
            now - started,
            outcome,
            self._parent,
            len(trace.attempts),
        )
        ledger._records.append(record)
        if events.listening():
            events.emit(events.StageEnded(trace.call_id, record=record))
        return DeadlineScope.__exit__(self, exc_type, exc, tb)  # raises when its time ran out


class StageBudget(_AlsoAsync):
    """A named stage with a budget: a context manager (``with`` and ``async with``) and a
    decorator; ``lk.stage`` is this class. Each ``with`` block (or decorated call) is one stage
    of the turn it runs in, with a fresh budget.

    Args:
        name: the stage's name (required, non-empty).
        budget: seconds (float or ``timedelta``) for the stage (default ``None``: no budget of
            its own, whatever the turn has left).

    Use it as ``async with lk.stage("retrieval", budget=0.3):`` (or plain ``with``), or as a
    decorator ``@lk.stage("rerank", budget=0.1)`` on an async function. The stage gets its
    budget, never more than what remains of the enclosing deadline; what it does not use stays
    with the turn. When its time runs out, everything inside is cancelled and
    :class:`~latencykit.DeadlineExceeded` is raised with ``stage`` (its name) and ``ledger``
    (the turn's :class:`Ledger`) set. Stages nest; stages of one turn (one deadline, or one
    decorated call) share its ledger, which ``lk.ledger()`` returns. A stage outside any deadline
    is a turn of its own.

    Raises:
        ValueError: ``name`` is empty, or ``budget`` is not positive and finite.
        TypeError: ``name`` is not a string, or ``budget`` is not a number or ``timedelta``.
    """

    __slots__ = ("_active", "budget", "name")

    def __init__(self, name: str, budget: float | datetime.timedelta | None = None) -> None:
        self.name = _validation.text("stage.name", name)
        self.budget = None if budget is None else _validation.seconds("stage.budget", budget)
        self._active: PerTask[StageScope] = PerTask()

    def __repr__(self) -> str:
        return f"stage({self.name!r}, budget={self.budget!r})"

    def __enter__(self) -> StageScope:
        return self._active.push(StageScope(self.name, self.budget).__enter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        return self._active.pop().__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        """Decorate an async function: each call runs as one stage."""

        @functools.wraps(fn)
        async def staged(*args: P.args, **kwargs: P.kwargs) -> R:
            with StageScope(self.name, self.budget):
                return await fn(*args, **kwargs)

        return staged


stage = StageBudget
"""The same class as :class:`StageBudget` (``lk.stage("retrieval", budget=0.3)``)."""
