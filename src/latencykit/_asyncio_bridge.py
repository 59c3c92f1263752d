"""Run asyncio-only coroutines and streams (litellm) from any anyio backend.

litellm (through aiohttp/httpx and the OpenAI SDK) only runs on asyncio. On asyncio we await it
directly. On trio we run it on one shared asyncio event loop in a daemon thread and wait for it
without blocking trio; cancelling the trio side cancels the asyncio task, and we wait (shielded)
until that task has really finished, so its HTTP connection is closed before the cancellation
propagates, just as on asyncio; but only briefly (``_CANCEL_WAIT``): a task busy parsing a large
body, or a loop busy with other streams, cannot stop at once, and the caller's deadline does not
wait for it (the task ends, and closes its connection, on its own).

A stream crosses over as a :class:`BridgedStream`: a pump task on the asyncio loop reads it into
a buffer the trio side takes from without a thread hop while chunks are waiting; closing either
side closes the other, and the HTTP response with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio

from ._cancel import keep, on_asyncio
from .stream import NOTHING, ChunkSource

__all__ = ["BridgedStream", "run_on_asyncio", "run_on_shared_loop", "shared_loop"]

T = TypeVar("T")

# Seconds a cancelled call waits for its asyncio task to finish cancelling. A task awaiting I/O
# closes its connection within a millisecond or two; one busy in synchronous work (litellm
# parsing a multi-megabyte body) cannot be interrupted before it finishes, and the caller's
# deadline must not wait for that: the task is left to end (cancelled) on its own.
_CANCEL_WAIT = 0.02
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def shared_loop() -> asyncio.AbstractEventLoop:
    """The library's own asyncio loop, in a daemon thread (started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="latencykit-asyncio", daemon=True
            ).start()
            _loop = loop
        return _loop


async def run_on_asyncio(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on asyncio, whatever backend the caller runs on."""
    if on_asyncio():
        return await coro
    return await _from_trio(coro)


async def run_on_shared_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the library's own asyncio loop (:func:`shared_loop`), whatever backend
    the caller runs on; cancelling the caller cancels it."""
    if on_asyncio():
        future = asyncio.run_coroutine_threadsafe(coro, shared_loop())
        return await asyncio.wrap_future(future)  # cancelling the wrapper cancels the task
    return await _from_trio(coro)


async def _from_trio(coro: Coroutine[Any, Any, T]) -> T:
    import trio

    token = trio.lowlevel.current_trio_token()
    loop = shared_loop()
    done = anyio.Event()
    tasks: list[asyncio.Task[T]] = []

    def wake(_: object = None) -> None:
        _call_trio(token, done.set)

    def start() -> None:  # on the asyncio thread
        task = loop.create_task(coro)
        tasks.append(task)
        keep(task)
        task.add_done_callback(wake)

    def cancel() -> None:  # on the asyncio thread
        if tasks:
            tasks[0].cancel()
        else:  # cancelled before it started
            coro.close()
            wake()

    # A fresh context: the caller's would tell sniffio (and so httpx/anyio inside litellm) that
    # the asyncio task runs on trio.
    loop.call_soon_threadsafe(start, context=contextvars.Context())
    try:
        await done.wait()
    except BaseException:
        loop.call_soon_threadsafe(cancel, context=contextvars.Context())
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_WAIT):
            await done.wait()
        raise
    return tasks[0].result()


def _call_trio(token: Any, fn: Callable[[], object]) -> None:
    """Run ``fn`` in the trio run of ``token`` (from the asyncio thread)."""
    import trio

    with contextlib.suppress(trio.RunFinishedError):  # the trio run ended meanwhile
        token.run_sync_soon(fn)


_END = object()  # the pump's last item: the source ended
_HIGH_WATER = 64  # the pump waits while this many chunks are unread...
_LOW_WATER = 16  # ...until the reader brings them down to this many


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class BridgedStream(ChunkSource):
    """The trio side of an async iterator that runs on the shared asyncio loop.

    Construct it on trio; a pump task starts at once on the asyncio loop and reads ``source``
    (opening it, for a lazily opened source) into a buffer. :meth:`buffered` takes a buffered
    item without waiting; :meth:`pull` waits for one. ``aclose()`` cancels the pump, which
    closes the source, and waits (shielded, bounded) until it has. Its items are read, and its
    end judged, as the source's.
    """

    buffered_with_read = False  # each item crossed over on its own

    __slots__ = (
        "_blocked",
        "_closed",
        "_items",
        "_loop",
        "_pumped",
        "_source",
        "_space",
        "_task",
        "_token",
        "_wakeup",
        "_woken",
        "chunk_reader",
        "ready_at",
    )

    def __init__(self, source: ChunkSource) -> None:
        import trio

        self._source = source
        self.chunk_reader = source.chunk_reader
        self.ready_at = source.ready_at
        self._token = trio.lowlevel.current_trio_token()
        self._loop = loop = shared_loop()
        self._items: deque[Any] = deque()
        self._wakeup: Callable[[], object] | None = None  # set by a waiting reader
        self._woken: Callable[[], object] | None = None  # the last wakeup sent (pump side)
        self._pumped = trio.Event()  # the pump task finished (the source is closed)
        self._closed = False
        self._blocked = False  # the pump waits for the reader to catch up
        self._space: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        loop.call_soon_threadsafe(self._start, source, context=contextvars.Context())

    # --- the asyncio side ------------------------------------------------------------------------

    def _start(self, source: ChunkSource) -> None:
        self._space = asyncio.Event()
        self._task = task = self._loop.create_task(self._pump(source))
        # asyncio keeps only weak references to tasks: a pump waiting for its reader (on
        # ``_space``) is otherwise reachable from nothing but this object, and a garbage
        # collection in the reader's thread could destroy it, running its ``finally`` (litellm's
        # close) on the wrong thread.
        keep(task)
        task.add_done_callback(self._finished)

    async def _pump(self, source: ChunkSource) -> None:
        try:
            while True:
                try:
                    item = await source.__anext__()
                except StopAsyncIteration:
                    self._push(_END)
                    return
                except Exception as exc:
                    self._push(_Raised(exc))
                    return
                self._push(item)
                if len(self._items) >= _HIGH_WATER:
                    assert self._space is not None
                    self._space.clear()
                    self._blocked = True
                    await self._space.wait()
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()

    def _push(self, item: Any) -> None:
        self._items.append(item)
        # Only the reader writes _wakeup: a read-then-clear here could erase the reader's next
        # wakeup between the two steps (a lost wakeup). An extra wakeup is harmless.
        wakeup = self._wakeup
        if wakeup is not None and wakeup is not self._woken:
            self._woken = wakeup  # once per wait: a burst of chunks costs one thread hop
            _call_trio(self._token, wakeup)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() and not self._items:
            self._items.append(_END)
        _call_trio(self._token, self._pumped.set)

    def _cancel(self) -> None:  # on the asyncio thread
        if self._task is not None:
            self._task.cancel()

    # --- the trio side ---------------------------------------------------------------------------

    def end_error(self) -> Exception | None:
        """The source's (asked once the stream ended: the pump is done with the source)."""
        return self._source.end_error()

    @property
    def request_id(self) -> str | None:
        """The source's (its answer's headers, set once, read from this thread)."""
        return self._source.request_id

    def buffered(self) -> Any:
        """The next buffered item, read: ``(item, text, finish_reason)``; or
        :data:`~latencykit.stream.NOTHING` when none is waiting.

        Raises ``StopAsyncIteration`` at the end and the source's error where it failed.
        """
        item = self._take()
        return item if item is NOTHING else (item, *self.chunk_reader.read(item))

    def _take(self) -> Any:
        items = self._items
        if not items:
            return NOTHING
        item = items.popleft()
        if self._blocked and len(items) <= _LOW_WATER:
            self._blocked = False
            assert self._space is not None
            self._loop.call_soon_threadsafe(self._space.set)
        if item is _END:
            items.appendleft(_END)  # stays ended
            raise StopAsyncIteration
        if type(item) is _Raised:
            items.appendleft(_END)
            raise item.error
        return item

    async def pull(self) -> Any:
        """The next item, once the pump has brought it."""
        import trio

        while True:
            item = self._take()
            if item is not NOTHING:
                return item
            if self._closed:
                raise StopAsyncIteration
            arrived = trio.Event()
            self._wakeup = arrived.set  # before looking again: a push after the look wakes us
            if not self._items:
                try:
                    await arrived.wait()
                finally:
                    self._wakeup = None
            else:
                self._wakeup = None

    async def aclose(self) -> None:
        """Stop the pump and close the source; wait (shielded) until it is closed, but only
        briefly (``_CANCEL_WAIT``): on an idle loop the close takes a millisecond or two, and
        on a busy one (litellm parsing other streams' chunks) the caller, whose deadline may be
        what closes the stream, must not wait for the loop's backlog. The pump closes the
        source (and its HTTP response) on its own as soon as the loop gets to it."""
        self.close_nowait()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_WAIT):
            await self._pumped.wait()

    def close_nowait(self) -> None:
        """Stop the pump and close the source, without waiting (from a finaliser)."""
        if not self._closed:
            self._closed = True
            self._loop.call_soon_threadsafe(self._cancel)
