"""Run asyncio-only coroutines (litellm) from any anyio backend.

litellm (through aiohttp/httpx and the OpenAI SDK) only runs on asyncio. On asyncio we await it
directly. On trio we run it on one shared asyncio event loop in a daemon thread and wait for it
without blocking trio; cancelling the trio side cancels the asyncio task, and we wait (shielded,
bounded) until that task has really finished, so its HTTP connection is closed before the
cancellation propagates, just as on asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio
import sniffio

__all__ = ["run_on_asyncio"]

T = TypeVar("T")

_CANCEL_GRACE = 5.0  # seconds to wait for the asyncio side to finish cancelling
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _shared_loop() -> asyncio.AbstractEventLoop:
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
    if sniffio.current_async_library() == "asyncio":
        return await coro
    import trio

    token = trio.lowlevel.current_trio_token()
    loop = _shared_loop()
    done = anyio.Event()
    tasks: list[asyncio.Task[T]] = []

    def wake(_: object = None) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the trio run ended meanwhile
            token.run_sync_soon(done.set)

    def start() -> None:  # on the asyncio thread
        task = loop.create_task(coro)
        tasks.append(task)
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
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_GRACE):
            await done.wait()
        raise
    return tasks[0].result()
