"""The event loop's clock and cancel scopes, at the lowest cost each backend allows.

Deadlines are on the hot path of every call, so this module skips anyio's per-call dispatch
where a backend offers the same object natively: on trio, anyio's cancel scope *is* a
``trio.CancelScope`` behind a wrapper, so we create trio's directly (about 5 us less per scope);
on asyncio, the clock is the running loop's ``time()``, exactly what ``anyio.current_time()``
returns. Scopes on asyncio are anyio's (the structured-cancellation machinery).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import anyio
import sniffio

__all__ = ["Backend", "backend", "clock", "now"]


class Backend(NamedTuple):
    """Clock and cancel-scope factory of the running backend."""

    now: Callable[[], float]
    """The event loop's clock, the one cancel-scope deadlines are on."""
    scope: Callable[..., Any]
    """``scope(deadline=...)``: a cancel scope (``cancelled_caught`` after exit)."""


_GENERIC = Backend(now=anyio.current_time, scope=anyio.CancelScope)
_backends: dict[str, Backend] = {}


def _native(name: str) -> Backend:
    # Imported here: a running backend is already imported, and `import latencykit` stays light.
    if name == "asyncio":
        from asyncio import get_running_loop

        def loop_time() -> float:
            return get_running_loop().time()

        return Backend(now=loop_time, scope=anyio.CancelScope)
    if name == "trio":
        import trio

        return Backend(now=trio.current_time, scope=trio.CancelScope)
    return _GENERIC


def backend() -> Backend:
    """The clock and scope factory for the backend running this task."""
    name = sniffio.current_async_library()
    found = _backends.get(name)
    if found is None:
        found = _backends[name] = _native(name)
    return found


def now() -> float:
    """The running event loop's clock (``anyio.current_time()``): the one clock of latencykit.

    Every duration, deadline and window is measured on it, so trio's ``MockClock`` and
    autojump tests see consistent time everywhere.
    """
    return backend().now()


def clock() -> float:
    """:func:`now` inside an event loop; ``time.monotonic()`` outside one (a ``repr``, a
    garbage-collection finaliser). The default clock of stateful objects (breakers, budgets,
    latency windows), which may be read from either side."""
    try:
        name = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return time.monotonic()
    found = _backends.get(name)
    if found is None:
        found = _backends[name] = _native(name)
    return found.now()
