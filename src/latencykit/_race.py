"""The race behind hedging and ``lk.first``: the next contender starts on a timer, or at once
after a failure; the first acceptable result wins; every loser is cancelled, awaited and
closed. Its users decide the rest (hedge: targets, budget, events; first: stagger, within).

Lazy: contender 0 runs in the caller's task, with a timer armed at the delay, and no task
group is entered; the others run in tasks of their own that the caller cancels and awaits. A
race decided before the timer fires costs the lightest cancel scope the backend has (on
asyncio, an ``Expiry`` with no deadline) and a timer (docs/benchmarks.md, "Hedging against real
tails").
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.lowlevel

from ._cancel import Timer, backend, call_at, spawn

logger = logging.getLogger("latencykit")

_CLOSE_GRACE = 5.0  # seconds closing an unwanted result may take before we move on

Reason = Literal["delay", "failure"]  # why a contender starts: a delay ran out, or one failed


async def close(values: Iterable[object]) -> None:
    """``aclose()`` every closable value (a stream that will not be handed out), shielded from
    cancellation but not for ever; a failure to close is logged, not raised."""
    for value in values:
        aclose = getattr(value, "aclose", None)
        if aclose is None:
            continue
        with anyio.move_on_after(_CLOSE_GRACE, shield=True):
            try:
                await aclose()
            except Exception:
                logger.debug("latencykit: closing an unwanted result failed", exc_info=True)


async def settle() -> None:
    """One more loop turn, shielded: a cancelled HTTP request closes its socket in a loop
    callback (asyncio transports close on the next iteration), so the connections of the
    contenders cut short are closed before the call returns, not just after."""
    with anyio.CancelScope(shield=True):
        await anyio.lowlevel.checkpoint()


# --- the race --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lost:
    """A contender that ended without winning: it raised ``error``, or (``error`` ``None``)
    ``accept`` refused its ``value``, which has been closed. ``elapsed``: seconds it ran."""

    index: int
    elapsed: float
    error: Exception | None
    value: Any = None


class Race(abc.ABC):
    """One race of up to ``limit`` contenders for one result.

    Contender 0 runs in the caller's task (:meth:`run`); contender ``i`` starts ``delay``
    seconds after contender ``i - 1`` (``0``: all at once; ``None``: only after a failure), or
    at once when one fails or is rejected, in a task of its own (an asyncio task, or a trio
    system task) with a copy of the context. :meth:`contender` gives it (``None``: no more).
    Every contender runs in a cancel scope ending at ``deadline`` (default: none).

    The first result ``accept`` takes (default ``None``: any) wins; an error :meth:`handled`
    refuses stops the race. Losers are cancelled and awaited, and a result that does not win is
    closed, before :meth:`run` returns; then :attr:`won` (``-1``: none), :attr:`winner`,
    :attr:`lost` and :attr:`starts` tell how it went. An exception raised by ``accept`` or
    :meth:`contender` stops the race and is raised by :meth:`run`.
    """

    __slots__ = (
        "accept",
        "answered",
        "crashed",
        "deadline",
        "delay",
        "expiry",
        "host",
        "limit",
        "lost",
        "now",
        "running",
        "scope",
        "spawned",
        "starts",
        "stopped",
        "tasks",
        "timer",
        "waiter",
        "winner",
        "won",
    )

    def __init__(
        self,
        delay: float | None,
        *,
        limit: int,
        accept: Callable[[Any], object] | None = None,
        deadline: float = math.inf,
    ) -> None:
        self.delay = delay
        self.limit = limit
        self.accept = accept
        self.deadline = deadline
        loop = backend()
        self.now = loop.now
        self.scope = loop.scope
        self.expiry = loop.expiry
        self.starts: list[float] = []
        self.lost: list[Lost] = []
        self.won = -1
        self.winner: Any = None
        self.crashed: BaseException | None = None
        self.stopped = False  # decided, failed for good, or over: nothing more starts
        self.running = self.answered = 0  # contenders running; that returned or raised
        self.host: Any = None  # contender 0's cancel scope, while it runs in the caller's task
        self.spawned: dict[int, Any] = {}  # index -> cancel scope, of contenders in tasks
        self.tasks: list[Any] = []  # asyncio tasks (the loop keeps only weak references)
        self.timer: Timer | None = None
        self.waiter: anyio.Event | None = None  # made only if the caller has to wait

    @abc.abstractmethod
    def contender(self, index: int, reason: Reason) -> Awaitable[Any] | None:
        """The awaitable of contender ``index``, or ``None``: start no more."""

    def handled(self, error: Exception) -> bool:
        """Whether the race goes on after a contender raised ``error`` (default: always)."""
        return True

    def first_failed(self, started: float, error: Exception) -> None:
        """Contender 0 already ran, from ``started``, and raised ``error``: ``run(None)`` races
        the rest (a hedge runs its primary without a race while no delay is known)."""
        self.starts.append(started)
        self.answered = 1
        self._lose(0, error)

    async def run(self, first: Awaitable[Any] | None, started: float | None = None) -> None:
        """Run ``first`` (contender 0) here and the race around it, until it is decided or
        every contender ended; then cancel, await and close the losers. ``started``: when
        ``first`` started, if the caller read the clock already (default: now)."""
        try:
            if first is not None:  # contender 0, here (inline: a coroutine frame less)
                self.starts.append(self.now() if started is None else started)
                self.running = 1
                while self.delay == 0 and self._launch("delay"):
                    pass  # all at once
                self._arm()
                with self.expiry(self.deadline) as self.host:  # no shield: the lightest scope
                    try:  # _contend's body, inline: no frame of its own
                        result, error = await first, None
                    except Exception as exc:
                        result, error = None, exc
                    if self._ended(0, result, error):
                        await close((result,))
                self.host = None
                self.running -= 1
            while self.running and not self.stopped:
                await self._changed()
            if self.crashed is not None:
                raise self.crashed
        except BaseException:
            if self.won >= 0:
                await close((self.winner,))  # the caller will never get it
            raise
        finally:  # stop the race; cancel and await the contenders still running
            if not self.stopped:
                self._stop(None)
            if self.spawned or self.answered < len(self.starts):  # contenders were cut short
                await self._cut_short()

    async def _cut_short(self) -> None:
        with self.scope(shield=True):
            while self.spawned:
                await self._changed()
        await settle()

    async def _contend(self, index: int, awaitable: Awaitable[Any]) -> None:
        try:
            result, error = await awaitable, None
        except Exception as exc:
            result, error = None, exc
        if self._ended(index, result, error):
            await close((result,))

    def _ended(self, index: int, result: Any, error: Exception | None) -> bool:
        """Contender ``index`` returned ``result`` or raised ``error``; whether ``result``
        must be closed (it does not win)."""
        self.answered += 1
        if index == 0:
            self.host = None  # contender 0 is over: nothing left to cancel in the caller's task
        if error is not None:
            self._lose(index, error)
            return False
        return not self._take(index, result)

    async def _in_task(self, index: int, awaitable: Awaitable[Any], scope: Any) -> None:
        try:
            with scope:
                await self._contend(index, awaitable)
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise  # not ours: the backend is shutting the task down
            self._crash(exc)  # raised by the caller: a trio system task must not raise
        finally:
            self.running -= 1
            del self.spawned[index]
            if self.waiter is not None:
                self.waiter.set()

    def _take(self, index: int, result: Any) -> bool:
        """Whether ``result`` wins (or is the winner's own object); otherwise it is closed."""
        if self.stopped:
            return result is self.winner  # too late: decided already
        accept = self.accept
        if accept is not None:
            try:
                acceptable = accept(result)
            except Exception as exc:  # a bug in the predicate: stop everything, raise it
                self._crash(exc)
                return False
            if not acceptable:
                self._lose(index, None, result)
                return False
        self.won, self.winner = index, result
        self._stop(index)
        return True

    def _lose(self, index: int, error: Exception | None, rejected: Any = None) -> None:
        self.lost.append(Lost(index, self.now() - self.starts[index], error, rejected))
        if self.stopped:
            return
        if error is None or self.handled(error):
            self._launch("failure")  # the next one goes now, not after the delay
        else:
            self._stop(index)  # not worth another contender: stop them all

    def _crash(self, error: BaseException) -> None:
        if self.crashed is None:
            self.crashed = error
        self._stop(None)

    def _stop(self, decided_by: int | None) -> None:
        self.stopped = True
        self._disarm()
        if self.host is not None and decided_by != 0:
            self.host.cancel()  # contender 0, still running in the caller's task
        for index, scope in self.spawned.items():
            if index != decided_by:
                scope.cancel()
        if self.waiter is not None:
            self.waiter.set()

    async def _changed(self) -> None:
        """Wait until a contender ends or the race stops."""
        self.waiter = anyio.Event()
        await self.waiter.wait()

    def _arm(self) -> None:
        if self.timer is not None:
            self._disarm()
        if self.delay and len(self.starts) < self.limit:
            self.timer = call_at(self.starts[-1] + self.delay, self._on_delay)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_delay(self) -> None:
        self.timer = None
        if self.running:  # otherwise the caller is on its way out
            self._launch("delay")

    def _launch(self, reason: Reason) -> bool:
        """Start the next contender if one may start; whether one did."""
        index = len(self.starts)
        if self.stopped or index >= self.limit or (now := self.now()) >= self.deadline:
            return False
        try:
            awaitable = self.contender(index, reason)
            if awaitable is None:
                self.limit = index  # start no more
                return False
            scope = self.scope(deadline=self.deadline)
            spawn(self._in_task, index, awaitable, scope, tasks=self.tasks)
        except BaseException as exc:  # raised by the caller, as if it had launched it
            self._crash(exc)
            return False
        self.starts.append(now)
        self.running += 1
        self.spawned[index] = scope
        self._arm()  # the next delay counts from this start
        return True
