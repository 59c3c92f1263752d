"""The asyncio watchdog that bounds a stream's waits without a cancel scope per chunk."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import pytest

from latencykit._cancel import Expired, Watchdog

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.uncancel() is 3.11+"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the watchdog is asyncio's; trio uses a native cancel scope per wait


async def test_a_wait_that_ends_in_time_returns_and_leaves_no_cancellation() -> None:
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    for _ in range(100):
        assert await watchdog.wait(asyncio.sleep(0, "x"), loop.time() + 5) == "x"
    assert _cancelling() == 0
    watchdog.close()


async def test_a_wait_past_its_limit_expires() -> None:
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    started = loop.time()
    with pytest.raises(Expired):
        await watchdog.wait(asyncio.sleep(10), started + 0.05)
    assert 0.05 <= loop.time() - started < 1.0
    assert _cancelling() == 0


async def test_a_limit_that_moved_later_is_honoured() -> None:
    # The timer armed for the first limit fires early for the second: it re-arms, not expires.
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    start = loop.time()
    await watchdog.wait(asyncio.sleep(0), start + 0.05)
    assert await watchdog.wait(asyncio.sleep(0.1, "late"), start + 5) == "late"
    with pytest.raises(Expired):
        await watchdog.wait(asyncio.sleep(10), loop.time() + 0.05)


async def test_an_outer_cancellation_is_never_taken_for_an_expiry() -> None:
    loop = asyncio.get_running_loop()
    watchdog = Watchdog()
    with anyio.move_on_after(0.05) as outer:
        await watchdog.wait(asyncio.sleep(10), loop.time() + 5)
    assert outer.cancelled_caught
    assert _cancelling() == 0


def _cancelling() -> int:
    task: Any = asyncio.current_task()  # Any: Task.cancelling() is 3.11+
    return int(task.cancelling())
