"""The race behind hedging and ``lk.first``: the next contender starts on a timer, or at once
after a failure; the first acceptable result wins; every loser is cancelled, awaited and
closed. Its users decide the rest (hedge: targets, budget, events; first: stagger, within).

Lazy: contender 0 runs in the caller's task, with a loop timer armed at the delay, and no task
group is entered; the others run in tasks of their own that the caller cancels and awaits. A
race decided before the timer fires costs a cancel scope and a timer (docs/benchmarks.md,
"Hedging against real tails").
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
import anyio.lowlevel
import sniffio

from ._cancel import backend

__all__ = ["Lost", "Race", "close", "settle"]

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
        loop = backend()
        with loop.scope(shield=True, deadline=loop.now() + _CLOSE_GRACE):
            try:
                await aclose()
            except Exception:
                logger.debug("latencykit: closing an unwanted result failed", exc_info=True)


async def settle() -> None:
    """One more loop turn, shielded: a cancelled HTTP request closes its socket in a loop
    callback (asyncio transports close on the next iteration), so the connections of the
    contenders cut short are closed before the call returns, not just after."""
    with backend().scope(shield=True):
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


class Race:
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
        self.timer: _Timer | None = None
        self.waiter: anyio.Event | None = None  # made only if the caller has to wait

    def contender(self, index: int, reason: Reason) -> Awaitable[Any] | None:
        """The awaitable of contender ``index``, or ``None``: start no more."""
        raise NotImplementedError

    def handled(self, error: Exception) -> bool:
        """Whether the race goes on after a contender raised ``error`` (default: always)."""
        return True

    def first_failed(self, started: float, error: Exception) -> None:
        """Contender 0 already ran, from ``started``, and raised ``error``: ``run(None)`` races
        the rest (a hedge runs its primary without a race while no delay is known)."""
        self.starts.append(started)
        self.answered = 1
        self._lose(0, error)

    async def run(self, first: Awaitable[Any] | None) -> None:
        """Run ``first`` (contender 0) here and the race around it, until it is decided or
        every contender ended; then cancel, await and close the losers."""
        try:
            if first is not None:
                self.starts.append(self.now())
                self.running = 1
                while self.delay == 0 and self._launch("delay"):
                    pass  # all at once
                self._arm()
                with self.scope(deadline=self.deadline) as self.host:
                    await self._contend(0, first)
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
        finally:
            if not self.stopped:
                self._stop(None)
            if self.spawned or self.answered < len(self.starts):  # contenders were cut short
                with self.scope(shield=True):
                    while self.spawned:
                        await self._changed()
                await settle()

    async def _contend(self, index: int, awaitable: Awaitable[Any]) -> None:
        error: Exception | None = None
        try:
            result = await awaitable
        except Exception as exc:
            result, error = None, exc
        self.answered += 1
        if index == 0:
            self.host = None  # contender 0 is over: nothing left to cancel in the caller's task
        if error is not None:
            self._lose(index, error)
        elif not self._take(index, result):
            await close((result,))

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
            self._wake()

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
        self._wake()

    async def _changed(self) -> None:
        """Wait until a contender ends or the race stops."""
        self.waiter = anyio.Event()
        await self.waiter.wait()

    def _wake(self) -> None:
        if self.waiter is not None:
            self.waiter.set()

    def _arm(self) -> None:
        self._disarm()
        if self.delay and len(self.starts) < self.limit:
            self.timer = _call_at(self.starts[-1] + self.delay, self._on_delay)

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
            _spawn(self._in_task, index, awaitable, scope, tasks=self.tasks)
        except BaseException as exc:  # raised by the caller, as if it had launched it
            self._crash(exc)
            return False
        self.starts.append(now)
        self.running += 1
        self.spawned[index] = scope
        self._arm()  # the next delay counts from this start
        return True


def _spawn(run: Callable[..., Coroutine[Any, Any, None]], *args: Any, tasks: list[Any]) -> None:
    """Start ``run(*args)`` in a task of its own, in a copy of the context."""
    asyncio = sys.modules.get("asyncio")
    loop = None if asyncio is None else asyncio._get_running_loop()
    if loop is not None:
        tasks.append(loop.create_task(run(*args)))
        return
    import trio

    context = contextvars.copy_context()
    trio.lowlevel.spawn_system_task(run, *args, name="latencykit race", context=context)


# --- timers ---------------------------------------------------------------------------------


class _Timer(Protocol):
    def cancel(self) -> None: ...


class _TrioTimer:
    __slots__ = ("callback", "context", "owner")

    def __init__(self, callback: Callable[[], None], owner: _TrioTimers) -> None:
        self.callback: Callable[[], None] | None = callback
        self.context = contextvars.copy_context()  # as asyncio's call_at: the caller's context
        self.owner = owner

    def cancel(self) -> None:
        if self.callback is not None:
            self.callback = None
            self.owner.cancelled += 1


class _TrioTimers:
    """``call_at`` for trio, which has none: a heap of callbacks served by one system task per
    run, sleeping in a cancel scope whose deadline is the earliest callback (moving a deadline
    is cheap; spawning a task per timer, and reaping it, is not). Cancelled timers stay in the
    heap until due, as in asyncio's loop, and are swept when they are the majority."""

    __slots__ = ("cancelled", "heap", "order", "scope")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, _TrioTimer]] = []
        self.order = itertools.count()
        self.scope: Any = None
        self.cancelled = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> _TrioTimer:
        timer = _TrioTimer(callback, self)
        heapq.heappush(self.heap, (when, next(self.order), timer))
        if self.scope is not None and when < self.scope.deadline:
            self.scope.deadline = when
        if self.cancelled > 64 and self.cancelled * 2 > len(self.heap):
            self.heap = [entry for entry in self.heap if entry[2].callback is not None]
            heapq.heapify(self.heap)
            self.cancelled = 0
        return timer

    async def serve(self) -> None:
        import trio

        while True:
            heap = self.heap
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self.scope:
                await trio.sleep_forever()
            self.scope = None
            now = trio.current_time()
            while self.heap and self.heap[0][0] <= now:
                timer = heapq.heappop(self.heap)[2]
                callback = timer.callback
                if callback is None:
                    self.cancelled -= 1
                    continue
                timer.callback = None
                try:
                    timer.context.run(callback)
                except Exception:  # a timer must not take the run down with it
                    logger.exception("latencykit race timer callback failed")


def _as_asyncio(callback: Callable[[], None]) -> None:
    # A loop callback runs outside any task, where sniffio (so anyio, spawning a task) cannot
    # tell which library runs; say it, for the callback only (its context is a copy).
    token = sniffio.current_async_library_cvar.set("asyncio")
    try:
        callback()
    finally:
        sniffio.current_async_library_cvar.reset(token)


_trio_timers: Any = None  # a trio.lowlevel.RunVar, made on first use (trio is imported lazily)


def _call_at(when: float, callback: Callable[[], None]) -> _Timer:
    """Run ``callback()`` on the event loop at ``when`` (its clock), in the caller's context."""
    asyncio = sys.modules.get("asyncio")
    loop = None if asyncio is None else asyncio._get_running_loop()
    if loop is not None:
        handle: _Timer = loop.call_at(when, _as_asyncio, callback)
        return handle
    global _trio_timers
    import trio

    if _trio_timers is None:
        _trio_timers = trio.lowlevel.RunVar("latencykit_race_timers")
    try:
        timers: _TrioTimers = _trio_timers.get()
    except LookupError:
        timers = _TrioTimers()
        _trio_timers.set(timers)
        trio.lowlevel.spawn_system_task(timers.serve, name="latencykit race timers")
    return timers.call_at(when, callback)
