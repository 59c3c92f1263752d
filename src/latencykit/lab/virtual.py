"""An asyncio event loop on virtual time: an hour of timers runs in seconds.

latencykit reads one clock, the event loop's (``loop.time()``, through anyio), so on this loop
every deadline, hedge delay, breaker window and sleep runs on virtual time. When no callback is
ready, the loop does not wait for its next timer: it jumps the clock to it. Real I/O still
works (the selector is polled without blocking), but a replay makes none: its provider is
simulated in-process.

Scheduling is asyncio's, first in first out, so the same program with the same seed runs the
same way every time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls real I/O without blocking; where the loop would wait for a timer, moves the
    virtual clock to it instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0 or self.loop is None:
            if not ready and timeout is None:
                return super().select(None)  # nothing scheduled: only another thread can wake us
            return ready
        self.loop.advance(timeout)
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual, starting at 0 and jumping to the next
    timer whenever nothing is ready."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0

    def time(self) -> float:
        """The virtual time, in seconds since the loop was made."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead."""
        self._now += seconds


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh :class:`VirtualClockLoop`."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
