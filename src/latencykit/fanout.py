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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import anyio

from . import _validation, events
from ._cancel import backend
from ._context import deadline_var, trace_var
from ._race import Race, Reason, close, settle
from .errors import LatencykitError, _describe

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


class _Pending:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<pending>"


_PENDING: Any = _Pending()
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


# --- results and errors ----------------------------------------------------------------------


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


def _failures(markers: Iterable[Missing]) -> list[Exception]:
    return [marker.error for marker in markers if isinstance(marker, Failed)]


def _listing(markers: Iterable[tuple[int, Missing]]) -> str:
    return "; ".join(f"[{i}] {marker}" for i, marker in markers)


class GatherIncomplete(LatencykitError):
    """:func:`gather` with ``return_partial=False`` got fewer values than it needed.

    Its ``__cause__`` is the error of the first awaitable (in input order) that failed, if any
    did; the other failures are in ``others``.

    Attributes:
        results: the full :class:`Gathered` list, markers included.
        needed: the values that were needed (``min_results``, or all of them).
    """

    def __init__(self, results: Gathered[Any], needed: int) -> None:
        missing = results.missing
        got = len(results) - len(missing)
        super().__init__(
            f"gather got {got} of the {needed} results it needed from {len(results)} "
            f"awaitables: {_listing(missing.items())}"
        )
        self.results = results
        self.needed = needed
        self.others = tuple(_failures(missing.values())[1:])

    @property
    def missing(self) -> dict[int, Missing]:
        """The markers of :attr:`results`, by index (as :attr:`Gathered.missing`)."""
        return self.results.missing


class NoAcceptableResult(LatencykitError):
    """:func:`first` got no acceptable result: every source failed or was rejected, or
    ``within`` ran out first.

    Its ``__cause__`` is the error of the first source (in input order) that failed, if any
    did; the other failures are in ``others``.

    Attributes:
        outcomes: one marker per source, in input order: :class:`Failed`, :class:`Rejected`,
            or :class:`TimedOut` (``elapsed`` ``0.0`` for a source that never started).
    """

    def __init__(self, outcomes: Sequence[Missing]) -> None:
        super().__init__(
            f"no acceptable result from {len(outcomes)} source(s): {_listing(enumerate(outcomes))}"
        )
        self.outcomes = tuple(outcomes)
        self.others = tuple(_failures(outcomes)[1:])


# --- shared plumbing -------------------------------------------------------------------------


def _close_unstarted(awaitables: Iterable[object]) -> None:
    """Close the coroutines that never started (no "never awaited" warning)."""
    for awaitable in awaitables:
        if inspect.iscoroutine(awaitable) and (
            inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED
        ):
            awaitable.close()


def _checked(name: str, awaitables: tuple[object, ...], within: object) -> float | None:
    """Validate the awaitables and ``within``; on a mistake, close the coroutines and raise."""
    try:
        for i, awaitable in enumerate(awaitables):
            if not inspect.isawaitable(awaitable):
                hint = " (a function: call it)" if callable(awaitable) else ""
                raise TypeError(
                    f"{name}.awaitables[{i}] must be awaitable{hint}, got {awaitable!r}"
                )
        return None if within is None else _validation.seconds(f"{name}.within", within)
    except BaseException:
        _close_unstarted(awaitables)
        raise


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
        self.cancel: Callable[[], None] | None = None

    def _decide(self) -> None:
        """Enough is known: cancel the branches still running (they become ``NotNeeded``)."""
        self.late = []
        assert self.cancel is not None
        self.cancel()

    async def branch(self, index: int, awaitable: Awaitable[Any]) -> None:
        try:
            value = await awaitable
        except Exception as exc:  # a failure is an outcome: the other branches go on
            self.slots[index] = Failed(error=exc, elapsed=self.now() - self.start)
            self.failed += 1
            if self.fail_fast and self.late is None and self.failed > len(self.slots) - self.needed:
                self._decide()  # the needed values can no longer all arrive
            return
        if self.late is not None:
            self.late.append(value)  # decided without it: closed, not returned
            return
        self.slots[index] = value
        self.ok += 1
        if self.ok == self.needed and self.needed < len(self.slots):
            self._decide()


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
        ValueError: ``within`` is not positive and finite, or ``min_results`` is out of range.
    """
    count = len(awaitables)
    limit = _checked("gather", awaitables, within)
    needed = count
    try:
        if min_results is not None:
            if isinstance(min_results, bool) or not isinstance(min_results, int):
                raise TypeError(f"gather.min_results must be an int or None, got {min_results!r}")
            if not 1 <= min_results <= count:
                raise ValueError(
                    f"gather.min_results must be between 1 and the number of awaitables "
                    f"({count}), got {min_results!r}"
                )
            needed = min_results
        if not isinstance(return_partial, bool):
            raise TypeError(f"gather.return_partial must be a bool, got {return_partial!r}")
    except BaseException:
        _close_unstarted(awaitables)
        raise
    state = _Gather(count, needed, fail_fast=not return_partial)
    try:
        async with anyio.create_task_group() as group:
            state.cancel = group.cancel_scope.cancel
            token = None
            if limit is not None:
                expires = group.cancel_scope.deadline = state.start + limit
                token = deadline_var.set(min(expires, deadline_var.get()))  # the branches' copy
            try:
                for index, awaitable in enumerate(awaitables):
                    group.start_soon(state.branch, index, awaitable, name="latencykit.gather")
            finally:
                if token is not None:
                    deadline_var.reset(token)
    except BaseException:
        # Cancelled from outside (the enclosing deadline) or interrupted: nothing is returned,
        # so every value we hold is unwanted.
        _close_unstarted(awaitables)
        await close([*filter(_is_value, state.slots), *(state.late or ())])
        raise
    slots = state.slots
    if state.ok + state.failed < count:  # some branches were cut short
        _close_unstarted(awaitables)
        marker = NotNeeded if state.late is not None else TimedOut
        elapsed = state.now() - state.start
        for index, slot in enumerate(slots):
            if slot is _PENDING:
                slots[index] = marker(elapsed=elapsed)
        if state.late:
            await close(state.late)
        await settle()
    results: Gathered[T] = Gathered(slots)
    if events.listening():
        _ended("gather", state.now() - state.start, results)
    if state.ok < needed and not return_partial:
        error = GatherIncomplete(results, needed)
        failures = _failures(results.missing.values())
        raise error from (failures[0] if failures else None)
    return results


def _is_value(slot: object) -> bool:
    return slot is not _PENDING and not isinstance(slot, Missing)


# --- first -----------------------------------------------------------------------------------


class _Sources(Race):
    """The race of one :func:`first`: source ``i`` is contender ``i``."""

    __slots__ = ("awaitables",)
    awaitables: tuple[Awaitable[Any], ...]

    def contender(self, index: int, reason: Reason) -> Awaitable[Any]:
        return self.awaitables[index]


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
    limit = _checked("first", awaitables, within)
    delay = 0.0  # all at once
    try:
        if not awaitables:
            raise ValueError("first needs at least one awaitable")
        if accept is not None and not callable(accept):
            raise TypeError(f"first.accept must be callable or None, got {accept!r}")
        if stagger is not None and not (
            isinstance(stagger, (int, float)) and not isinstance(stagger, bool) and stagger == 0
        ):
            delay = _validation.seconds("first.stagger", stagger)
    except BaseException:
        _close_unstarted(awaitables)
        raise
    race = _Sources(delay, limit=len(awaitables), accept=accept)
    race.awaitables = awaitables
    token = None
    if limit is not None:
        race.deadline = race.now() + limit
        token = deadline_var.set(min(race.deadline, deadline_var.get()))  # the sources' too
    try:
        await race.run(awaitables[0])
    except BaseException:
        _close_unstarted(awaitables)
        raise
    finally:
        if token is not None:
            deadline_var.reset(token)
    started = len(race.starts)
    if started < len(awaitables):  # a stagger, or ``within``, left sources unstarted
        _close_unstarted(awaitables)
    if race.won >= 0 and not events.listening():
        return race.winner  # type: ignore[no-any-return]
    ended = race.now()
    outcomes: list[Any] = [_PENDING] * len(awaitables)
    for lost in race.lost:
        outcomes[lost.index] = (
            Rejected(value=lost.value, elapsed=lost.elapsed)
            if lost.error is None
            else Failed(error=lost.error, elapsed=lost.elapsed)
        )
    if race.won >= 0:
        outcomes[race.won] = race.winner
        _ended("first", ended - race.starts[0], outcomes)
        return race.winner  # type: ignore[no-any-return]
    # No winner: every source failed or was rejected, or ``within`` ran out.
    outcomes = [
        TimedOut(elapsed=ended - race.starts[i] if i < started else 0.0)
        if outcome is _PENDING
        else outcome
        for i, outcome in enumerate(outcomes)
    ]
    if events.listening():
        _ended("first", ended - race.starts[0], outcomes)
    failures = _failures(outcomes)
    raise NoAcceptableResult(outcomes) from (failures[0] if failures else None)


def _ended(kind: Literal["gather", "first"], elapsed: float, slots: Sequence[object]) -> None:
    missing = [slot for slot in slots if slot is _PENDING or isinstance(slot, Missing)]
    trace = trace_var.get()
    events.emit(
        events.FanOutEnded(
            trace.call_id if trace is not None else 0,
            kind=kind,
            awaitables=len(slots),
            ok=len(slots) - len(missing),
            failed=sum(isinstance(m, Failed) for m in missing),
            timed_out=sum(isinstance(m, TimedOut) for m in missing),
            not_needed=sum(m is _PENDING or isinstance(m, NotNeeded) for m in missing),
            rejected=sum(isinstance(m, Rejected) for m in missing),
            elapsed=elapsed,
        )
    )
