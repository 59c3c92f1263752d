"""Fan-out inside the budget: :func:`gather` (all, or enough, of several calls) and
:func:`first` (the first acceptable answer of several sources).

``gather`` runs its awaitables concurrently in one anyio task group, each in a copy of the
caller's context; ``first`` is a race (:mod:`latencykit._race`, hedging's): its first source
runs in the caller's task, the others in tasks of their own with a copy of its context. So the
branches see the enclosing deadline (``lk.remaining()``, the budget policies read) and record
their attempts in the enclosing trace. ``within=`` bounds the fan-out itself, never
beyond the enclosing deadline: the branches see the earlier of the two as their deadline.

Nothing is silently dropped. ``gather`` returns one slot per awaitable, in input order: the
value, or a :class:`Missing` marker saying what happened instead (:class:`Failed`,
:class:`TimedOut`, :class:`NotNeeded`). ``first`` raises :class:`NoAcceptableResult` with the
outcome of every source when none answered acceptably.

Cancelled branches are awaited before the call returns (structured: their HTTP requests are
closed). A result that is not handed to the caller (a stream that answered after the race was
decided, a rejected stream, the values gathered before an enclosing deadline struck) is closed
(``aclose()``), as a hedge closes its losers; a coroutine that never started is closed too, so
no "coroutine was never awaited" warning is left behind.
"""

from __future__ import annotations

import datetime
import inspect
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import anyio

from . import _validation, events
from ._cancel import backend
from ._context import deadline_var, trace_var
from ._race import Race, Reason, close, settle
from .errors import GatherIncomplete as GatherIncomplete
from .errors import NoAcceptableResult as NoAcceptableResult
from .errors import _describe

__all__ = [
    "Failed",
    "GatherIncomplete",
    "Gathered",
    "Missing",
    "NoAcceptableResult",
    "NotNeeded",
    "Rejected",
    "TimedOut",
    "first",
    "gather",
]

T = TypeVar("T")

_PENDING: Any = object()
"""A slot whose awaitable has not answered (yet)."""


# --- markers ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Missing:
    """Stands in a result's place when an awaitable gave no value: the base of :class:`Failed`,
    :class:`TimedOut`, :class:`NotNeeded` and :class:`Rejected`.

    Markers are plain frozen objects, never values in disguise: test them with ``isinstance(x,
    lk.fanout.Missing)`` (or use :attr:`Gathered.values` / :attr:`Gathered.missing`).

    Attributes:
        elapsed: seconds the awaitable ran before it failed, answered unacceptably or was given
            up (``0.0``: it never started).
    """

    elapsed: float
    _what: ClassVar[str] = "missing"

    def __str__(self) -> str:
        return f"{self._what} after {self.elapsed:.3f}s"


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(Missing):
    """The awaitable raised ``error`` (an ``Exception``; other ``BaseException`` s propagate)."""

    error: Exception
    _what: ClassVar[str] = "failed"

    def __str__(self) -> str:
        return f"failed after {self.elapsed:.3f}s: {_describe(self.error)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOut(Missing):
    """The budget (``within``) ran out before the awaitable answered; it was cancelled."""

    _what: ClassVar[str] = "timed out"


@dataclass(frozen=True, slots=True, kw_only=True)
class NotNeeded(Missing):
    """Cancelled because the call was decided without it: ``min_results`` values had arrived
    (or, with ``return_partial=False``, too many had failed for them ever to arrive)."""

    _what: ClassVar[str] = "cancelled (not needed)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected(Missing):
    """:func:`first` only: the awaitable answered ``value``, which ``accept`` refused (a
    closable value, such as a stream, has been closed)."""

    value: Any = field(repr=False)
    _what: ClassVar[str] = "rejected"


class Gathered(list[T | Missing], Generic[T]):
    """What :func:`gather` returns: a list with one slot per awaitable, in input order, holding
    its value or a :class:`Missing` marker.

    Unpack it (``a, b, c = await lk.gather(x, y, z)``), or split it with :attr:`values` and
    :attr:`missing`.
    """

    __slots__ = ()

    @property
    def values(self) -> list[T]:
        """The values that arrived, in input order (markers left out)."""
        return [slot for slot in self if not isinstance(slot, Missing)]

    @property
    def missing(self) -> dict[int, Missing]:
        """The markers, by the index of their awaitable (empty when every value arrived)."""
        return {i: slot for i, slot in enumerate(self) if isinstance(slot, Missing)}


# --- shared plumbing -------------------------------------------------------------------------


@contextmanager
def _owning(name: str, awaitables: tuple[object, ...], within: object) -> Iterator[float | None]:
    """Check the awaitables and give ``within`` in seconds (``None``: none); on the way out,
    whatever happened, close the coroutines that never started (no "never awaited" warning)."""
    try:
        for i, awaitable in enumerate(awaitables):
            if not inspect.isawaitable(awaitable):
                hint = " (a function: call it)" if callable(awaitable) else ""
                raise TypeError(
                    f"{name}.awaitables[{i}] must be awaitable{hint}, got {awaitable!r}"
                )
        yield None if within is None else _validation.seconds(f"{name}.within", within)
    finally:
        for awaitable in awaitables:
            if inspect.iscoroutine(awaitable) and (
                inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED
            ):
                awaitable.close()


@contextmanager
def _within(limit: float | None, start: float) -> Iterator[float]:
    """The fan-out's own deadline (``inf``: none); inside, the earlier of it and the enclosing
    one is the deadline the branches see (``lk.remaining()``) in the context they copy."""
    expires = math.inf if limit is None else start + limit
    token = deadline_var.set(min(expires, deadline_var.get()))
    try:
        yield expires
    finally:
        deadline_var.reset(token)


# --- gather ----------------------------------------------------------------------------------


class _Gather:
    """The state of one :func:`gather`: slots, counts, and whether it is decided."""

    __slots__ = ("cancel", "fail_fast", "failed", "late", "needed", "now", "ok", "slots", "start")

    def __init__(self, count: int, needed: int, fail_fast: bool) -> None:
        self.slots: list[Any] = [_PENDING] * count
        self.needed = needed
        self.fail_fast = fail_fast
        self.ok = self.failed = 0
        self.late: list[Any] | None = None  # values that arrived after the decision
        self.now = backend().now
        self.start = self.now()
        self.cancel: Callable[[], None] = lambda: None

    def _decide(self) -> None:
        """Enough is known: cancel the branches still running (they become ``NotNeeded``)."""
        if self.late is None:
            self.late = []
            self.cancel()

    async def branch(self, index: int, awaitable: Awaitable[Any]) -> None:
        try:
            value = await awaitable
        except Exception as exc:  # a failure is an outcome: the other branches go on
            self.slots[index] = Failed(error=exc, elapsed=self.now() - self.start)
            self.failed += 1
            if self.fail_fast and self.failed > len(self.slots) - self.needed:
                self._decide()  # the needed values can no longer all arrive
            return
        if self.late is not None:
            self.late.append(value)  # decided without it: closed, not returned
            return
        self.slots[index] = value
        self.ok += 1
        if self.ok == self.needed < len(self.slots):
            self._decide()

    async def run(self, awaitables: tuple[Awaitable[Any], ...], limit: float | None) -> None:
        """Run every awaitable in its slot; the slots cut short get their marker."""
        try:
            async with anyio.create_task_group() as group:
                self.cancel = group.cancel_scope.cancel
                with _within(limit, self.start) as group.cancel_scope.deadline:
                    for index, awaitable in enumerate(awaitables):
                        group.start_soon(self.branch, index, awaitable, name="latencykit.gather")
        except BaseException:
            # Cancelled from outside (the enclosing deadline) or interrupted: nothing is
            # returned, so every value we hold is unwanted.
            await close([*filter(_is_value, self.slots), *(self.late or ())])
            raise
        if self.ok + self.failed < len(self.slots):  # some branches were cut short
            marker = NotNeeded if self.late is not None else TimedOut
            cut = marker(elapsed=self.now() - self.start)
            self.slots = [cut if slot is _PENDING else slot for slot in self.slots]
            await close(self.late or ())
            await settle()


def _needed(min_results: object, count: int) -> int:
    needed = _validation.count("gather.min_results", min_results)
    if needed > count:
        raise ValueError(
            f"gather.min_results must be between 1 and the number of awaitables ({count}), "
            f"got {min_results!r}"
        )
    return needed


def _is_value(slot: object) -> bool:
    return slot is not _PENDING and not isinstance(slot, Missing)


async def gather(
    *awaitables: Awaitable[T],
    within: float | datetime.timedelta | None = None,
    min_results: int | None = None,
    return_partial: bool = True,
) -> Gathered[T]:
    """Run ``awaitables`` concurrently inside the enclosing budget; their results in input
    order, with a typed marker for each one that gave no value.

    Args:
        *awaitables: coroutines (``llm.acompletion(...)``, calls of your own async functions)
            or any other awaitables. Each runs in its own task, in a copy of the caller's
            context (it sees the enclosing deadline and trace).
        within: seconds (or ``timedelta``) for the whole fan-out (default ``None``: only the
            enclosing deadline bounds it). The branches see the earlier of the two as their
            deadline (``lk.remaining()``). When ``within`` runs out, the branches still running
            are cancelled and become :class:`TimedOut`. When the *enclosing* deadline runs out
            first, its :class:`~latencykit.DeadlineExceeded` propagates as usual and nothing
            is returned: pass a ``within`` shorter than the budget to keep time for what follows.
        min_results: return as soon as this many values arrived, cancelling the rest (they
            become :class:`NotNeeded`); ``1 <= min_results <= len(awaitables)`` (default
            ``None``: wait for all). At most ``min_results`` values are returned: one that
            arrives after the decision is dropped and, if closable (a stream), closed.
        return_partial: with ``True`` (default), return whatever arrived. With ``False``, raise
            :class:`GatherIncomplete` (carrying the full results) when fewer than
            ``min_results`` (default: all) values arrived; the gather then fails fast: once
            failures make that certain, the branches still running are cancelled.

    Returns:
        A :class:`Gathered` list: one slot per awaitable, its value or a :class:`Failed`,
        :class:`TimedOut` or :class:`NotNeeded` marker. ``.values`` and ``.missing`` split it.

    An ``Exception`` in one branch does not cancel the others: it becomes a :class:`Failed`
    marker. Other ``BaseException`` s (cancellation from outside, ``KeyboardInterrupt``)
    propagate, after every branch has been cancelled and awaited and the values gathered so far
    have been closed if closable (one raised inside a branch comes wrapped in a
    ``BaseExceptionGroup``, as from any anyio task group).

    Raises:
        GatherIncomplete: ``return_partial=False`` and fewer values than needed arrived.
        TypeError: an argument is not awaitable, or an option has the wrong type.
        ValueError: ``within`` is not positive and finite, or ``min_results`` is not an int in
            range.
    """
    count = len(awaitables)
    with _owning("gather", awaitables, within) as limit:
        needed = count if min_results is None else _needed(min_results, count)
        _validation.instance("gather.return_partial", return_partial, bool, "a bool")
        state = _Gather(count, needed, fail_fast=not return_partial)
        await state.run(awaitables, limit)
    results: Gathered[T] = Gathered(state.slots)
    if events.listening():
        _ended("gather", state.now() - state.start, results)
    if state.ok < needed and not return_partial:
        raise GatherIncomplete(results, needed)
    return results


# --- first -----------------------------------------------------------------------------------


class _Sources(Race):
    """The race of one :func:`first`: source ``i`` is contender ``i``."""

    __slots__ = ("awaitables",)
    awaitables: tuple[Awaitable[Any], ...]

    def contender(self, index: int, reason: Reason) -> Awaitable[Any]:
        return self.awaitables[index]

    def outcomes(self) -> list[Any]:
        """Each source's outcome: the winner's value, or its marker (a source cut short is
        ``NotNeeded`` once the race is won, else ``TimedOut``: ``within`` ran out)."""
        ended, starts = self.now(), self.starts
        cut = NotNeeded if self.won >= 0 else TimedOut
        outcomes: list[Any] = [
            cut(elapsed=ended - starts[i] if i < len(starts) else 0.0)
            for i in range(len(self.awaitables))
        ]
        for lost in self.lost:
            outcomes[lost.index] = (
                Rejected(value=lost.value, elapsed=lost.elapsed)
                if lost.error is None
                else Failed(error=lost.error, elapsed=lost.elapsed)
            )
        if self.won >= 0:
            outcomes[self.won] = self.winner
        return outcomes


async def first(
    *awaitables: Awaitable[T],
    accept: Callable[[T], object] | None = None,
    within: float | datetime.timedelta | None = None,
    stagger: float | datetime.timedelta | None = None,
) -> T:
    """The first acceptable answer of several sources; the others are cancelled and closed.

    Args:
        *awaitables: the sources, e.g. calls to different providers or models (at least one):
            the first runs in the caller's task, the others each in a task of their own, in a
            copy of the caller's context.
        accept: ``accept(result)`` tells whether a result is good enough to win (default
            ``None``: any result that did not raise). A rejected result is closed if closable
            (a stream) and the race goes on. An exception raised by ``accept`` stops the race
            and is raised.
        within: seconds (or ``timedelta``) for the race (default ``None``: only the enclosing
            deadline). The sources see the earlier of the two as their deadline. An enclosing
            deadline that runs out first raises its :class:`~latencykit.DeadlineExceeded`.
        stagger: seconds (or ``timedelta``) between starts (default ``None``, or ``0``: start
            all at once). Source ``i`` starts ``stagger`` seconds after source ``i - 1``, or at
            once when a started source fails or is rejected: the extra load stays bounded, as
            with a hedge.

    Losers are cancelled and awaited before the call returns; a result that arrives after the
    winner (or was rejected) is closed if closable, and sources never started are closed.

    Raises:
        NoAcceptableResult: every source failed or was rejected, or ``within`` ran out first;
            it carries each source's outcome, and the first failure as its ``__cause__``.
        TypeError: an argument is not awaitable, ``accept`` is not callable, or an option has
            the wrong type.
        ValueError: no awaitables, or ``within``/``stagger`` is out of range.
    """
    with _owning("first", awaitables, within) as limit:
        if not awaitables:
            raise ValueError("first needs at least one awaitable")
        _validation.function("first.accept", accept)
        delay = 0.0 if stagger is None else _validation.wait("first.stagger", stagger)
        race = _Sources(delay, limit=len(awaitables), accept=accept)
        race.awaitables = awaitables
        with _within(limit, race.now()) as race.deadline:
            await race.run(awaitables[0])
    if events.listening():
        _ended("first", race.now() - race.starts[0], race.outcomes())
    if race.won >= 0:
        return race.winner  # type: ignore[no-any-return]
    raise NoAcceptableResult(race.outcomes())


def _ended(kind: Literal["gather", "first"], elapsed: float, slots: Sequence[object]) -> None:
    count = Counter(type(slot) for slot in slots)
    trace = trace_var.get()
    events.emit(
        events.FanOutEnded(
            trace.call_id if trace is not None else 0,
            kind=kind,
            awaitables=len(slots),
            ok=sum(not isinstance(slot, Missing) for slot in slots),
            failed=count[Failed],
            timed_out=count[TimedOut],
            not_needed=count[NotNeeded],
            rejected=count[Rejected],
            elapsed=elapsed,
        )
    )
