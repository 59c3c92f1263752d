"""The one clock (``_cancel.now``/``clock``/``loop_clock``): the running loop's own time, read
through a shortcut only on loop classes whose ``time()`` is ``time.monotonic()``."""

from __future__ import annotations

import asyncio
import time

import pytest
import trio
import trio.lowlevel
import trio.testing

from latencykit import _cancel


class ShiftedLoop(asyncio.SelectorEventLoop):
    """A loop with a clock of its own (as the lab's virtual-clock loop has)."""

    def time(self) -> float:
        return super().time() + 1_000.0


async def readings() -> tuple[float, float, float, float]:
    return _cancel.now(), _cancel.clock(), _cancel.loop_clock()(), time.monotonic()


def run_on(loop: asyncio.AbstractEventLoop) -> tuple[float, float, float, float]:
    try:
        return loop.run_until_complete(readings())
    finally:
        loop.close()


def test_a_loop_with_its_own_clock_is_read_through_it_even_after_the_stock_loop() -> None:
    for _ in range(2):  # the stock loop's shortcut, once learnt, must not apply to a subclass
        stock = run_on(asyncio.new_event_loop())
        assert all(abs(reading - stock[3]) < 1.0 for reading in stock[:3])
        shifted = run_on(ShiftedLoop())
        assert all(abs(reading - shifted[3] - 1_000.0) < 1.0 for reading in shifted[:3])


def test_trio_and_no_loop() -> None:
    assert abs(_cancel.clock() - time.monotonic()) < 1.0  # outside any loop: monotonic
    with pytest.raises(Exception, match=r"unknown async library|no running event loop"):
        _cancel.now()  # the loop's clock: there is none

    async def main() -> tuple[float, float, float]:
        await trio.lowlevel.checkpoint()
        return _cancel.now(), _cancel.clock(), trio.current_time()

    now, clock, expected = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert now == clock == expected


def test_asyncio_deadlines_expire_through_one_timer_while_anyio_keeps_what_shields_need() -> None:
    # Expiry reads anyio's private task states to honour shields; when an anyio release moves
    # them, deadlines fall back to anyio's scopes (slower, still right) and this test says so.
    async def expiry() -> object:
        return _cancel.backend().expiry

    found = asyncio.run(expiry())
    if hasattr(asyncio.Task, "uncancel"):
        assert found is _cancel.Expiry
    else:
        assert found is not _cancel.Expiry
