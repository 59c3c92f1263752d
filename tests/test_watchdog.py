"""The watchdog that bounds a stream's waits without a cancel scope per wait: on asyncio it
cancels the waiting task, on trio it interrupts the read (the fast lane closes its connection).
On virtual time: every limit is exact."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import pytest

from latencykit._cancel import Expired, Watchdog, on_asyncio

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.virtual_time,
    pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.uncancel() is 3.11+"),
]


class Read:
    """A read that returns ``value`` after ``seconds``, or raises at once when interrupted (as
    the fast lane's read does when its connection is closed)."""

    def __init__(self) -> None:
        self.closed = anyio.Event()
        self.interrupts = 0

    def interrupt(self) -> None:
        self.interrupts += 1
        self.closed.set()

    async def __call__(self, seconds: float, value: Any = None) -> Any:
        with anyio.move_on_after(seconds):
            await self.closed.wait()
            raise ConnectionError("the connection was closed")
        return value

    def watchdog(self) -> Watchdog:
        return Watchdog() if on_asyncio() else Watchdog(self.interrupt)


async def test_a_wait_that_ends_in_time_returns_and_leaves_no_cancellation() -> None:
    read = Read()
    watchdog = read.watchdog()
    for _ in range(100):
        assert await watchdog.wait(read(0, "x"), anyio.current_time() + 5) == "x"
    assert _cancelling() == 0 and read.interrupts == 0
    watchdog.close()


async def test_a_wait_past_its_limit_expires_at_its_limit() -> None:
    read = Read()
    watchdog = read.watchdog()
    started = anyio.current_time()
    with pytest.raises(Expired):
        await watchdog.wait(read(10), started + 0.05)
    assert anyio.current_time() - started == pytest.approx(0.05)
    assert _cancelling() == 0
    assert read.interrupts == (0 if on_asyncio() else 1)


async def test_a_limit_that_moved_later_is_honoured() -> None:
    # The timer armed for the first limit fires early for the second: it re-arms, not expires.
    read = Read()
    watchdog = read.watchdog()
    start = anyio.current_time()
    await watchdog.wait(read(0), start + 0.05)
    assert await watchdog.wait(read(0.1, "late"), start + 5) == "late"
    with pytest.raises(Expired):
        await watchdog.wait(read(10), anyio.current_time() + 0.05)


async def test_a_read_that_ignores_the_interrupt_is_still_expired() -> None:
    """On trio a read whose source does not stop when interrupted returns late: what it
    returns came after the limit, and the watchdog says so."""
    watchdog = Read().watchdog()
    started = anyio.current_time()
    with pytest.raises(Expired):
        await watchdog.wait(anyio.sleep(0.1), started + 0.05)
    assert _cancelling() == 0


async def test_an_outer_cancellation_is_never_taken_for_an_expiry() -> None:
    read = Read()
    watchdog = read.watchdog()
    with anyio.move_on_after(0.05) as outer:
        await watchdog.wait(read(10), anyio.current_time() + 5)
    assert outer.cancelled_caught
    assert _cancelling() == 0 and read.interrupts == 0


def _cancelling() -> int:
    if not on_asyncio():
        return 0
    task: Any = asyncio.current_task()  # Any: Task.cancelling() is 3.11+
    return int(task.cancelling())
