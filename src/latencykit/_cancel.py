"""The event loop's clock and cancel scopes, at the lowest cost each backend allows.

Deadlines are on the hot path of every call, so this module skips anyio's per-call dispatch
where a backend offers the same object natively: on trio, anyio's cancel scope *is* a
``trio.CancelScope`` behind a wrapper, so we create trio's directly (about 5 us less per scope);
on asyncio, the clock is the running loop's ``time()``, exactly what ``anyio.current_time()``
returns, and scopes are anyio's asyncio scope class, constructed directly (the
structured-cancellation machinery, without the per-call backend lookup), or cheaper still,
an :class:`Expiry`: the deadlines and timers of an asyncio loop are entries behind one loop
timer (a :class:`_Wheel`), and a scope left before its deadline, as nearly all are, only marks
its entry dead.

A stream waits for a chunk with a limit (stall, deadline) thousands of times; a cancel scope per
wait costs microseconds, as much as the rest of a chunk's path. A :class:`Watchdog` instead keeps
one timer per stream, re-armed only when it fires early; at expiry it cancels the waiting
task on asyncio (Python 3.11+), and on trio it interrupts the source's read (where the source
can: the fast lane closes its connection); other sources on trio get a scope per wait.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import heapq
import itertools
import logging
import math
import sys
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, Protocol, TypeVar

import anyio
import sniffio

T = TypeVar("T")


class Backend(NamedTuple):
    """Clock and cancel-scope factory of the running backend."""

    now: Callable[[], float]
    """The event loop's clock, the one cancel-scope deadlines are on."""
    scope: Callable[..., Any]
    """``scope(deadline=...)``: a cancel scope (``cancelled_caught`` after exit)."""
    expiry: Callable[[float], Any]
    """``expiry(deadline)``: a cancel scope without a shield (``cancel()``,
    ``cancelled_caught``; ``math.inf``: none): :class:`Expiry` on asyncio 3.11+, the backend's
    own scope elsewhere."""


Interrupt = Callable[[], None]
"""Stops a pending read at once (it raises): what a trio :class:`Watchdog` calls at expiry."""


class Expired(Exception):
    """A wait bounded by a :class:`Watchdog` (or a scope) reached its limit."""


class Watchdog:
    """Bounds many successive waits of one task with a single, lazily re-armed loop timer.

    ``await watchdog.wait(awaitable, limit)`` awaits ``awaitable`` until the absolute ``limit`` on
    the loop's clock, or raises :class:`Expired`. Limits may only grow from one wait to the next
    (a stream's stall limit moves with each chunk; its deadline does not move): the timer stays
    armed at the earliest limit, and when it fires before the current one it is re-armed for it.
    So a wait that ends in time costs a few attribute writes; the timer fires about once per limit.

    At expiry it stops the wait: on asyncio (3.11+) it cancels the waiting task the way
    ``asyncio.timeout`` does (``cancel`` then ``uncancel``), so it composes with anyio's scopes
    and with any other cancellation; on trio, which can cancel only through a scope entered
    around the wait, it calls ``interrupt`` instead (the fast lane closes the connection its
    read waits on), so no scope is entered per wait.
    """

    __slots__ = (
        "_armed",
        "_cancelling",
        "_current_task",
        "_fired",
        "_handle",
        "_interrupt",
        "_limit",
        "_task",
    )

    def __init__(self, interrupt: Interrupt | None = None) -> None:
        self._interrupt = interrupt  # None: cancel the task (asyncio)
        self._current_task: Callable[[], Any] = (
            sys.modules["asyncio"].current_task if interrupt is None else _waiting
        )
        self._handle: Timer | None = None
        self._limit = self._armed = math.inf  # the wait's limit; when the timer fires
        self._task: Any = None
        self._cancelling = 0
        self._fired = False

    async def wait(self, awaitable: Awaitable[T], limit: float) -> T:
        """``await awaitable``, or :class:`Expired` once the loop's clock reaches ``limit``."""
        task = self.arm(limit)
        try:
            result = await awaitable
        except BaseException as exc:
            self.raised(task, exc)
            raise
        self.returned(task)
        return result

    # ``wait`` in three steps, for a caller whose per-item path cannot afford a coroutine frame
    # more (a stream's ``__anext__``): ``task = arm(limit)``, the await, then ``returned(task)``
    # or, when it raised, ``raised(task, error)`` before re-raising.

    def arm(self, limit: float) -> Any:
        """Start a wait of the current task that ends at ``limit`` at the latest; its task."""
        self._limit = limit
        if limit < self._armed:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = call_at(limit, self._expire)
            self._armed = limit
        task = self._current_task()  # Any: cancelling()/uncancel() are 3.11+
        self._task = task
        return task

    def returned(self, task: Any) -> None:
        """The wait ended with a result (raises :class:`Expired` if an interrupt came first:
        the read that brought it has lost its connection)."""
        self._task = None
        if self._fired:
            self._fired = False
            if self._interrupt is not None:
                raise Expired
            task.uncancel()  # the awaitable swallowed our cancellation: take it back

    def raised(self, task: Any, error: BaseException) -> None:
        """The wait ended with ``error``: raises :class:`Expired` instead if the timer (and
        no other cancellation) caused it."""
        self._task = None
        if self._fired:
            self._fired = False
            if self._interrupt is not None:
                raise Expired from None
            import asyncio

            if task.uncancel() <= self._cancelling and isinstance(error, asyncio.CancelledError):
                raise Expired from None  # only we cancelled it

    def _expire(self) -> None:
        self._handle, self._armed = None, math.inf
        task = self._task
        if task is None:
            return  # not waiting: the next wait arms the timer again
        if now() < self._limit:
            self._handle = call_at(self._limit, self._expire)
            self._armed = self._limit
            return
        self._fired = True
        if self._interrupt is not None:
            self._interrupt()
            return
        self._cancelling = task.cancelling()  # others' pending cancellations, not ours
        task.cancel()

    def close(self) -> None:
        """Disarm the timer (the stream ended)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle, self._armed = None, math.inf


_SHIELD_POLL = 0.001  # seconds between looks while a shield holds an expiry back
_expiry_var: contextvars.ContextVar[float] = contextvars.ContextVar(
    "latencykit.expiry", default=math.inf
)


class Expiry:
    """A cancel scope without a shield, for asyncio 3.11+: ``with Expiry(deadline):``.

    At ``deadline`` (``math.inf``: never), or when :meth:`cancel` is called, it cancels the
    task the way ``asyncio.timeout`` does (``cancel`` then, at exit, ``uncancel``), so it
    composes with anyio's scopes and with any other cancellation, for a fraction of an anyio
    scope's Python calls (the deadline, the fallback's switch, a failover target's share and
    a hedge's primary each enter one per call). It arms no loop timer of its own: it joins
    its loop's :class:`_Wheel`, and leaving it early costs a flag. As with an anyio
    scope, an anyio scope shielded inside it holds the cancellation back until it exits (to
    within a millisecond), and ``cancelled_caught`` (after exit) tells whether it expired and
    swallowed the cancellation.
    """

    __slots__ = (
        "_cancelling",
        "_fired",
        "_outer",
        "_task",
        "_token",
        "_wheel",
        "cancelled_caught",
        "deadline",
        "live",
    )

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.cancelled_caught = self._fired = self.live = False
        self._task: Any = None

    def __enter__(self) -> Expiry:
        loop = _asyncio_loop()
        task = self._task = _current_task(loop)
        self._cancelling = task.cancelling()
        state = _task_state(_as_key(task))  # _anyio_scope(task), inline: a call less
        self._outer = None if state is None else state.cancel_scope  # where scopes inside end
        self._token = _expiry_var.set(min(self.deadline, _expiry_var.get()))
        self._wheel = wheel = getattr(loop, "_latencykit_wheel", None) or _wheel_of(loop)
        if self.deadline != math.inf:
            wheel.add(self.deadline, self)
        return self

    def cancel(self) -> None:
        """Cancel the work inside now, as the deadline would (from any task on the loop, or a
        loop callback); nothing once it fired or exited."""
        if self.live:
            self._wheel.drop(self)
        if self._task is not None and not self._fired:
            self.fire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        if self.live:
            self._wheel.drop(self)
        _expiry_var.reset(self._token)
        task, self._task, self._outer = self._task, None, None  # the wheel may keep this object
        # Swallow the cancellation only if it was ours alone (asyncio.timeout's rule).
        if self._fired and task.uncancel() <= self._cancelling and exc_type is not None:
            self.cancelled_caught = issubclass(exc_type, sys.modules["asyncio"].CancelledError)
        return self.cancelled_caught

    def fire(self) -> None:
        """The wheel's call at ``deadline``: cancel the task (unless a shield holds it back)."""
        if _shielded(self._task, self._outer):
            # anyio re-delivers when the shield's scope exits; this scope is not anyio's, so it
            # looks again soon (a shield inside a deadline is brief: cleanup that must finish).
            self._wheel.add(self._wheel.loop.time() + _SHIELD_POLL, self)
            return
        self._fired = True
        self._task.cancel()


class _Alarm:
    """A :func:`call_at` callback on an asyncio loop's :class:`_Wheel`."""

    __slots__ = ("_wheel", "callback", "context", "live")

    def __init__(self, wheel: _Wheel, callback: Callable[[], None]) -> None:
        self._wheel = wheel
        self.callback: Callable[[], None] | None = callback
        self.context = contextvars.copy_context()  # as asyncio's call_at: the caller's context
        self.live = False

    def cancel(self) -> None:
        self.callback = None  # also when it is due in the same turn as the timer cancelling it
        if self.live:
            self._wheel.drop(self)

    def fire(self) -> None:
        if self.callback is None:
            return
        try:
            self.context.run(_as_asyncio, self.callback)
        except Exception:  # a timer must not stop the others due with it
            _logger.exception("latencykit: a timer callback failed")


class _Entry(Protocol):
    live: bool

    def fire(self) -> None: ...


class _Wheel:
    """Every :class:`Expiry` and :func:`call_at` of one asyncio loop behind one loop timer.

    The timer stays armed at the earliest time it was asked for; an entry that leaves early
    (nearly all: a call ends long before its deadline) is only marked dead, and when the timer
    fires with nothing due it is re-armed for the earliest live entry. So while other calls
    are in flight, a call whose deadlines all fall after the armed time creates, cancels and
    reschedules no loop timer at all (asyncio's ``call_at`` and ``cancel`` are several Python
    calls each, and the nested scopes of one call had three or four pending), nor does the
    next call after it on a loop running in real time; on a loop with a clock of its own the
    timer is cancelled once no entry is live (a virtual-time loop jumps to a pending timer).
    Dead entries are swept out once they are the majority, as asyncio's own loop does with
    its cancelled timers.
    """

    __slots__ = ("armed", "dead", "handle", "heap", "loop", "order", "waiting")

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, _Entry]] = []
        self.order = itertools.count()
        self.armed = math.inf  # when the loop timer fires
        self.handle: Any = None
        self.dead = 0  # entries in the heap marked dead
        self.waiting = 0  # live entries

    def add(self, when: float, entry: _Entry) -> None:
        entry.live = True
        self.waiting += 1
        heapq.heappush(self.heap, (when, next(self.order), entry))
        if when < self.armed:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = self.loop.call_at(when, self._ring)
            self.armed = when

    def drop(self, entry: _Entry) -> None:
        entry.live = False
        self.waiting -= 1
        if not self.waiting:  # the heap holds only dead entries
            self.heap.clear()
            self.dead = 0
            # On a real-time loop the timer stays armed (it wakes the loop once, later): the
            # next call's deadlines, later than it, arm none. A loop with a clock of its own
            # (a virtual-time loop jumps to its next timer when idle) is left with none.
            if self.handle is not None and type(self.loop) not in _monotonic_loops:
                self.handle.cancel()
                self.handle, self.armed = None, math.inf
            return
        self.dead += 1
        if self.dead > 64 and self.dead * 2 > len(self.heap):
            self.heap = [item for item in self.heap if item[2].live]
            heapq.heapify(self.heap)
            self.dead = 0

    def _ring(self) -> None:
        self.handle, self.armed = None, math.inf
        heap, now, due = self.heap, self.loop.time(), []
        while heap and (heap[0][0] <= now or not heap[0][2].live):
            entry = heapq.heappop(heap)[2]
            if entry.live:
                entry.live = False
                self.waiting -= 1
                due.append(entry)
            else:
                self.dead -= 1
        if heap:
            self.handle = self.loop.call_at(heap[0][0], self._ring)
            self.armed = heap[0][0]
        for entry in due:
            entry.fire()


def _wheel_of(loop: Any) -> _Wheel:
    """The running asyncio loop's :class:`_Wheel` (made on first use)."""
    wheel: _Wheel | None = getattr(loop, "_latencykit_wheel", None)
    if wheel is not None:
        return wheel
    wheel = _Wheel(loop)
    try:
        loop._latencykit_wheel = wheel
    except AttributeError:  # a loop class without a __dict__ (uvloop's)
        # (nor weak references: a wheel per scope, right but not shared)
        with contextlib.suppress(TypeError):
            wheel = _foreign_wheels.setdefault(loop, wheel)
    return wheel


_foreign_wheels: weakref.WeakKeyDictionary[Any, _Wheel] = weakref.WeakKeyDictionary()


def _anyio_scope(task: Any) -> Any:
    """The innermost anyio cancel scope ``task`` is in (``None``: none)."""
    state = _task_state(_as_key(task))
    return None if state is None else state.cancel_scope


def _find_task_state(key: Any) -> Any:
    # anyio's asyncio backend loads with the first anyio call; until then no task has a state.
    global _task_state
    states = getattr(sys.modules.get("anyio._backends._asyncio"), "_task_states", None)
    if states is None:
        return None
    if isinstance(states, weakref.WeakKeyDictionary):
        # Its get() is Python code around its dict of weak references: that dict's takes its
        # place (the keys are weakref.ref(task), what _as_key gives).
        _task_state = states.data.get  # type: ignore[attr-defined]
    else:

        def _task_state(key: Any) -> Any:
            return states.get(key())

    return _task_state(key)


_task_state: Callable[[Any], Any] = _find_task_state
"""anyio's (asyncio backend's) state of a task, by :data:`_as_key` (``None``: none)."""
_as_key: Callable[[Any], Any] = weakref.ref  # a task as a key of anyio's task states


def _shielded(task: Any, outer: Any) -> bool:
    """Whether an anyio scope entered inside ``outer`` (and still open) shields ``task``."""
    scope = _anyio_scope(task)
    while scope is not None and scope is not outer:
        if scope._shield:
            return True
        scope = scope._parent_scope
    return False


def _reads_shields(scope: type) -> bool:
    """Whether this anyio keeps what :func:`_shielded` reads (anyio 4's private task states and
    scope fields): if a release moved them, deadlines fall back to anyio's own scopes rather
    than miss a shield."""
    probe = scope()
    backend = sys.modules.get("anyio._backends._asyncio")
    return hasattr(backend, "_task_states") and all(
        hasattr(probe, field) for field in ("_shield", "_parent_scope")
    )


def effective_deadline() -> float:
    """The earliest deadline of the cancel scopes the current task is in (anyio's, trio's and
    :class:`Expiry`'s)."""
    return min(anyio.current_effective_deadline(), _expiry_var.get())


def _waiting() -> bool:
    return True  # what a trio watchdog records for a wait (it never needs the task)


def watchdog_for(interrupter: Callable[[], Interrupt | None]) -> Watchdog | None:
    """A :class:`Watchdog` for the waits of a source whose ``interrupter()`` stops its pending
    read, if the running backend can use one (asyncio 3.11+, or trio and an interrupter); else
    ``None``: each wait enters a cancel scope."""
    if _asyncio_loop() is not None:
        return Watchdog() if hasattr(sys.modules["asyncio"].Task, "uncancel") else None
    interrupt = interrupter()
    return None if interrupt is None else Watchdog(interrupt)


def _expiring(scope: Callable[..., Any]) -> Callable[[float], Any]:
    return lambda deadline: scope(deadline=deadline)


_GENERIC = Backend(
    now=anyio.current_time, scope=anyio.CancelScope, expiry=_expiring(anyio.CancelScope)
)
_backends: dict[str, Backend] = {}


def _native(name: str) -> Backend:
    # Imported here: a running backend is already imported, and `import latencykit` stays light.
    if name == "asyncio":
        # anyio.CancelScope(...) looks the backend up (sniffio) and constructs the backend's
        # own scope class on every call; that class, constructed directly, is the same scope.
        scope = type(anyio.CancelScope())
        native = hasattr(sys.modules["asyncio"].Task, "uncancel") and _reads_shields(scope)
        return Backend(now=now, scope=scope, expiry=Expiry if native else _expiring(scope))
    if name == "trio":
        import trio

        return Backend(
            now=trio.current_time, scope=trio.CancelScope, expiry=_expiring(trio.CancelScope)
        )
    return _GENERIC


def _find_running_loop() -> Any:
    # Until asyncio is imported no asyncio loop can run; once it is, its own C function
    # (``asyncio._get_running_loop``) takes this one's place: one builtin call per lookup.
    global _asyncio_loop
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    _asyncio_loop = asyncio._get_running_loop
    return _asyncio_loop()


_asyncio_loop: Callable[[], Any] = _find_running_loop
"""The running asyncio loop, or ``None`` (trio, or no loop at all): asyncio runs here iff
this thread has a running loop. sniffio's lookup costs ~2 us; this one builtin call."""


def _find_current_task(loop: Any) -> Any:
    # Python 3.11's ``asyncio.current_task`` is Python code around a dict's ``get`` (3.12's
    # is C): that ``get`` takes its place, a builtin call per look-up.
    global _current_task
    asyncio = sys.modules["asyncio"]
    found, tasks = asyncio.current_task, getattr(asyncio.tasks, "_current_tasks", None)
    if not isinstance(found, types.BuiltinFunctionType) and isinstance(tasks, dict):
        found = tasks.get
    _current_task = found
    return found(loop)


_current_task: Callable[[Any], Any] = _find_current_task
"""The task running on an asyncio ``loop`` (``asyncio.current_task(loop)``)."""

_monotonic = time.monotonic
_monotonic_loops: set[type] = set()
"""Loop classes whose ``time()`` is the stock ``time.monotonic()`` (uvloop's and virtual-clock
loops keep their own): their clock is read without the method's Python frame."""


def on_asyncio() -> bool:
    """Whether the running task runs on asyncio (else on trio)."""
    return _asyncio_loop() is not None


def running_library() -> str | None:
    """The event loop library running in this thread (``"asyncio"``, ``"trio"``), or ``None``:
    code that would block the thread asks it first."""
    if _asyncio_loop() is not None:
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def backend() -> Backend:
    """The clock and scope factory for the backend running this task."""
    name = "asyncio" if _asyncio_loop() is not None else sniffio.current_async_library()
    found = _backends.get(name)
    if found is None:
        found = _backends[name] = _native(name)
    return found


def now() -> float:
    """The running event loop's clock (``anyio.current_time()``): the one clock of latencykit.

    Every duration, deadline and window is measured on it, so trio's ``MockClock`` and
    autojump tests see consistent time everywhere. On the stock asyncio loop a reading is one
    Python call (it is read about a dozen times per call).
    """
    loop = _asyncio_loop()
    if type(loop) in _monotonic_loops:
        return _monotonic()
    return _loop_time(loop)


def _loop_time(loop: Any) -> float:
    """:func:`now` the slow way (trio, or an asyncio loop class not seen yet)."""
    if loop is None:
        return backend().now()
    if type(loop).time is sys.modules["asyncio"].BaseEventLoop.time:
        _monotonic_loops.add(type(loop))  # its time() *is* time.monotonic()
    return float(loop.time())


def loop_clock() -> Callable[[], float]:
    """:func:`now` for an object that lives on the running loop: the loop's clock function
    itself (no lookup of the loop per reading), the backend's clock elsewhere."""
    loop = _asyncio_loop()
    if loop is None:
        return backend().now
    _loop_time(loop)
    return _monotonic if type(loop) in _monotonic_loops else loop.time


def process_clock() -> float:
    """``time.monotonic()``: the clock of state shared by every event loop and thread of the
    process and paced by the outside world in real time (a provider's rate-limit room,
    :mod:`latencykit.ratelimit`), where one loop's clock (trio's has an offset of its own) would
    not be comparable with another's."""
    return _monotonic()


def clock() -> float:
    """:func:`now` inside an event loop; ``time.monotonic()`` outside one (a ``repr``, a
    garbage-collection finaliser). The default clock of stateful objects (breakers, budgets,
    latency windows), which may be read from either side."""
    loop = _asyncio_loop()
    if type(loop) in _monotonic_loops:
        return _monotonic()
    try:
        return _loop_time(loop)
    except sniffio.AsyncLibraryNotFoundError:
        return _monotonic()


# --- detached tasks: one supervisor ---------------------------------------------------------------
#
# Closing a stream from a finaliser, writing a streamed answer to the cache, the asyncio bridge's
# tasks: work that outlives the call that started it. asyncio keeps only weak references to
# tasks, so a task nothing else holds can be garbage-collected mid-way (running its `finally` on
# the wrong thread); here every such task is held until it ends, and its failure is logged
# (nobody awaits it). On trio they are system tasks, which must not raise either.

_logger = logging.getLogger("latencykit")
_detached: set[Any] = set()
Job = Callable[[], Awaitable[object]]


def keep(task: Any) -> None:
    """Hold an asyncio ``task`` until it ends (see the section's comment)."""
    _detached.add(task)
    task.add_done_callback(_detached.discard)


async def _supervised(job: Job) -> None:
    try:
        await job()
    except Exception:
        _logger.exception("latencykit: a background task failed (%r)", job)


def spawn_detached(job: Job) -> None:
    """Start ``job()`` in a task of its own on the running event loop, from synchronous code
    on it (a callback): held until it ends, its failure logged."""
    loop = _asyncio_loop()
    if loop is not None:
        keep(loop.create_task(_supervised(job)))
        return
    import trio

    trio.lowlevel.spawn_system_task(_supervised, job)


def loop_key() -> object:
    """An object that names the running event loop (its identity, as long as it runs): the
    asyncio loop, or the trio run's token."""
    loop = _asyncio_loop()
    if loop is not None:
        return loop
    import trio

    return trio.lowlevel.current_trio_token()


def threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A function that calls ``fn()`` on *this* event loop soon, from any thread (asyncio's
    ``call_soon_threadsafe``, trio's ``run_sync_soon``). Raises ``RuntimeError`` once the loop
    is closed."""
    loop = _asyncio_loop()
    if loop is not None:
        return loop.call_soon_threadsafe  # type: ignore[no-any-return]
    import trio

    return trio.lowlevel.current_trio_token().run_sync_soon


def run_soon() -> Callable[[Job], None]:
    """A function that starts ``job()`` on *this* event loop soon (:func:`spawn_detached`),
    callable from any thread: a finaliser, another loop's thread. Raises ``RuntimeError`` once
    the loop is closed."""
    call = threadsafe_caller()

    def start(job: Job) -> None:
        call(functools.partial(spawn_detached, job))

    return start


# --- tasks and timers of the library's own (the race engine) ---------------------------------


def spawn(run: Callable[..., Coroutine[Any, Any, None]], *args: Any, tasks: list[Any]) -> None:
    """Start ``run(*args)`` in a task of its own, in a copy of the context: an asyncio task
    appended to ``tasks`` (whoever started it cancels and awaits it), or a trio system task."""
    loop = _asyncio_loop()
    if loop is not None:
        tasks.append(loop.create_task(run(*args)))
        return
    import trio

    context = contextvars.copy_context()
    trio.lowlevel.spawn_system_task(run, *args, name="latencykit race", context=context)


# --- timers (asyncio has call_at; trio one heap, served by a system task per run) -----------


class Timer(Protocol):
    """A pending :func:`call_at` callback."""

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
                    _logger.exception("latencykit: a timer callback failed")


def _as_asyncio(callback: Callable[[], None]) -> None:
    # A loop callback runs outside any task, where sniffio (so anyio, spawning a task) cannot
    # tell which library runs; say it, for the callback only (its context is a copy).
    token = sniffio.current_async_library_cvar.set("asyncio")
    try:
        callback()
    finally:
        sniffio.current_async_library_cvar.reset(token)


_trio_timers: Any = None  # a trio.lowlevel.RunVar, made on first use (trio is imported lazily)


def call_at(when: float, callback: Callable[[], None]) -> Timer:
    """Run ``callback()`` on the event loop at ``when`` (its clock), in the caller's context."""
    loop = _asyncio_loop()
    if loop is not None:
        wheel = getattr(loop, "_latencykit_wheel", None) or _wheel_of(loop)
        alarm = _Alarm(wheel, callback)
        wheel.add(when, alarm)
        return alarm
    global _trio_timers
    import trio

    if _trio_timers is None:
        _trio_timers = trio.lowlevel.RunVar("latencykit_timers")
    try:
        timers: _TrioTimers = _trio_timers.get()
    except LookupError:
        timers = _TrioTimers()
        _trio_timers.set(timers)
        trio.lowlevel.spawn_system_task(timers.serve, name="latencykit timers")
    return timers.call_at(when, callback)
