"""Sync calls: an owner's async calls run on one long-lived event loop in a thread of its own.

``LLM.completion(...)`` is ``LLM.acompletion(...)`` run on a :class:`LoopThread`: one asyncio
loop in a daemon thread, started by the first sync call and kept, so that the HTTP clients and
keep-alive connections that live on a loop (the fast lane's pool, litellm's clients) serve
every later sync call. The pipeline, its deadlines and cancel scopes run there as they run in
async code: a deadline still closes the HTTP request. A daemon thread, so that a process never
waits for it at exit; a loop left running is stopped at exit all the same (its connections
closed) within a bounded time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._cancel import running_library
from .stream import Stream

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

__all__ = ["LoopThread", "SyncStream"]

T = TypeVar("T")
_STOP_WITHIN = 5.0  # seconds a stop waits for the loop: never a hang at exit


class LoopThread:
    """One event loop (asyncio) in a daemon thread, started on first use, that runs the
    coroutine functions handed to :meth:`run` from any number of threads at once.

    ``on_stop``: awaited on the loop whenever it stops (:meth:`stop`, the ``LoopThread``
    collected, interpreter exit), after the calls still running were cancelled, within a few
    seconds: what closes what lives on the loop (connections). It must not hold the
    ``LoopThread``'s owner (or the owner is never collected). Default none. ``name``: the
    thread's (default ``"latencykit-sync"``)."""

    __slots__ = ("__weakref__", "_lock", "_name", "_on_stop", "_portal", "_stopper")

    def __init__(
        self,
        on_stop: Callable[[], Awaitable[object]] | None = None,
        name: str = "latencykit-sync",
    ) -> None:
        self._on_stop = on_stop
        self._name = name
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._stopper: weakref.finalize[Any, LoopThread] | None = None

    @property
    def running(self) -> bool:
        """Whether the loop is started (and not stopped since)."""
        return self._portal is not None

    def run(self, function: Callable[[], Awaitable[T]], what: str) -> T:
        """``await function()`` on the loop, from a thread that runs no event loop; its result
        or error. ``what``: the method called, for the error raised from an event loop's
        thread (a ``RuntimeError`` naming the async method to await instead: blocking there
        would stop that loop, or deadlock it). A ``KeyboardInterrupt`` while waiting cancels
        the call on the loop (its HTTP request closed)."""
        _refuse_in_event_loop(what)
        return _call(self.portal(), function)

    def portal(self) -> BlockingPortal:
        """The running loop's portal (the loop started first if it is not)."""
        portal = self._portal
        if portal is None:
            with self._lock:
                portal = self._portal
                if portal is None:
                    portal = self._portal = self._start()
        return portal

    def _start(self) -> BlockingPortal:
        import concurrent.futures

        import anyio
        from anyio.from_thread import BlockingPortal

        ready: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()
        on_stop = self._on_stop  # not self: the finaliser must let it be collected

        async def serve() -> None:
            try:
                async with BlockingPortal() as portal:
                    ready.set_result(portal)
                    await portal.sleep_until_stopped()
            finally:
                if on_stop is not None:
                    with anyio.move_on_after(_STOP_WITHIN, shield=True):
                        await on_stop()

        def main() -> None:
            try:
                anyio.run(serve, backend="asyncio")
            except BaseException as exc:  # the loop did not start: the caller is told
                if not ready.done():
                    ready.set_exception(exc)
                raise

        thread = threading.Thread(target=main, name=self._name, daemon=True)
        thread.start()
        portal = ready.result()
        # Stopped when its owner is collected, or at interpreter exit (atexit): bounded.
        self._stopper = weakref.finalize(self, _stop, portal, thread)
        return portal

    def stop(self) -> None:
        """Stop the loop (calls still running are cancelled, then ``on_stop`` awaited) and
        wait for its thread, at most a few seconds each. Idempotent; a later :meth:`run`
        starts a new loop."""
        with self._lock:
            self._portal = None
            stopper, self._stopper = self._stopper, None
        if stopper is not None:
            stopper()


def _stop(portal: BlockingPortal, thread: threading.Thread) -> None:
    """Stop ``portal``'s loop and wait for ``thread``, each at most ``_STOP_WITHIN``."""
    if thread is threading.current_thread():  # collected on its own loop: stop it from outside
        threading.Thread(target=_stop, args=(portal, thread), daemon=True).start()
        return
    import concurrent.futures
    import contextlib

    # RuntimeError: already stopped, or its loop is gone: nothing left to wait for.
    done = (RuntimeError, concurrent.futures.CancelledError, concurrent.futures.TimeoutError)
    with contextlib.suppress(*done):
        portal.start_task_soon(portal.stop, True).result(_STOP_WITHIN)
    thread.join(_STOP_WITHIN)


def _call(portal: BlockingPortal, function: Callable[[], Awaitable[T]]) -> T:
    """``await function()`` on ``portal``'s loop; a ``KeyboardInterrupt`` (or any exception)
    while waiting cancels it there. ``RuntimeError`` if that loop was stopped."""
    try:
        future = portal.start_task_soon(function)
    except RuntimeError:  # anyio: "This portal is not running"
        raise RuntimeError(
            "the LLM's sync loop was closed (LLM.close()): what was opened on it went with it"
        ) from None
    try:
        return future.result()
    except BaseException:
        future.cancel()  # no-op once done; else the call is cancelled on the loop
        raise


def _refuse_in_event_loop(what: str) -> None:
    if (library := running_library()) is not None:
        raise RuntimeError(
            f"LLM.{what}() was called from a running {library} event loop, which it would "
            f"block: use `await llm.a{what}(...)` there"
        )


class SyncStream(Generic[T]):
    """A :class:`~latencykit.Stream` read from sync code (``LLM.completion(stream=True)``):
    iterate it (``for chunk in stream``), and :meth:`close` it (or use ``with``), which closes
    the HTTP response. Each chunk is read from :attr:`stream` on the loop thread it was opened
    on (``portal``'s); :func:`latencykit.report` reads it as it reads the stream. Once that
    loop is closed (``LLM.close()``), reading raises ``RuntimeError`` and closing does
    nothing (the response went with the loop)."""

    __slots__ = ("_portal", "stream")

    def __init__(self, stream: Stream[T], portal: BlockingPortal) -> None:
        self.stream = stream
        self._portal = portal

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        _refuse_in_event_loop("completion")
        try:
            return _call(self._portal, self.stream.__anext__)
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Close the stream and its HTTP response (idempotent)."""
        _refuse_in_event_loop("completion")
        try:
            future = self._portal.start_task_soon(self.stream.aclose)
        except RuntimeError:  # its loop was closed: the response went with it
            return
        future.result()

    def __enter__(self) -> SyncStream[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncStream({self.stream!r})"
