"""The one clock (``_cancel.now``/``clock``/``loop_clock``): the running loop's own time, read
through a shortcut only on loop classes whose ``time()`` is ``time.monotonic()``."""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

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


needs_expiry = pytest.mark.skipif(
    not hasattr(asyncio.Task, "uncancel"), reason="Expiry needs asyncio 3.11+ (Task.uncancel)"
)


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


# --- the wheel: one loop timer behind every Expiry and call_at of an asyncio loop -------------


class CountingLoop(asyncio.SelectorEventLoop):
    """The stock loop (its clock is ``time.monotonic()``), counting the timers it is asked for."""

    timers = 0

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


def run_counting(main: Callable[[], Coroutine[Any, Any, None]]) -> int:
    loop = CountingLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return loop.timers


@needs_expiry
def test_the_nested_expiries_of_many_calls_arm_a_loop_timer_about_once() -> None:
    async def calls() -> None:
        for _ in range(200):  # a deadline, a fallback's switch and a failover's share, each call
            started = _cancel.now()
            with (
                _cancel.Expiry(started + 30),
                _cancel.Expiry(started + 20),
                _cancel.Expiry(started + 15),
            ):
                await asyncio.sleep(0)

    # Asked one timer per scope, the loop would have armed 600.
    assert run_counting(calls) <= 3


@needs_expiry
def test_an_expiry_fires_on_time_behind_a_later_one_armed_first() -> None:
    async def main() -> None:
        holder_started = asyncio.Event()
        holder_done = asyncio.Event()
        holder: list[_cancel.Expiry] = []

        async def hold() -> None:
            with _cancel.Expiry(_cancel.now() + 30) as late:
                holder.append(late)
                holder_started.set()
                await holder_done.wait()

        task = asyncio.get_running_loop().create_task(hold())
        await holder_started.wait()
        started = time.monotonic()
        with _cancel.Expiry(_cancel.now() + 0.05) as early:
            await asyncio.sleep(10)
        assert early.cancelled_caught
        assert time.monotonic() - started < 5  # generous: a loaded machine
        holder_done.set()
        await task
        assert not holder[0].cancelled_caught

    asyncio.run(main())


@needs_expiry
def test_left_early_expiries_do_not_pile_up_while_another_waits() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with _cancel.Expiry(_cancel.now() + 60):  # live all along: the wheel never empties
            for _ in range(1000):
                with _cancel.Expiry(_cancel.now() + 30):
                    await asyncio.sleep(0)
            assert len(loop._latencykit_wheel.heap) < 200  # type: ignore[attr-defined]

    asyncio.run(main())


@needs_expiry
def test_a_virtual_time_loop_keeps_no_timer_once_no_expiry_waits() -> None:
    from latencykit.lab.virtual import VirtualClockLoop

    loop = VirtualClockLoop()

    async def main() -> None:
        with _cancel.Expiry(_cancel.now() + 30):
            await asyncio.sleep(0)
        # A pending timer would make the loop jump its clock 30 s ahead the next time it idles.
        pending = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert pending == []

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


@needs_expiry
def test_call_at_runs_in_the_callers_context_and_never_once_cancelled() -> None:
    seen: list[str] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> None:
        var.set("caller")
        cancelled = _cancel.call_at(_cancel.now() + 0.01, lambda: seen.append("cancelled"))
        _cancel.call_at(_cancel.now() + 0.02, lambda: seen.append(var.get()))
        var.set("changed later")
        cancelled.cancel()
        await asyncio.sleep(0.2)

    asyncio.run(main())
    assert seen == ["caller"]


@needs_expiry
def test_expiry_cancel_is_taken_back_at_exit_once() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with _cancel.Expiry(math.inf) as scope:
            loop.call_soon(scope.cancel)
            loop.call_soon(scope.cancel)  # twice: still one cancellation, swallowed at exit
            await asyncio.sleep(10)
        assert scope.cancelled_caught
        scope.cancel()  # after exit: nothing
        await asyncio.sleep(0)  # no cancellation left pending on the task
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(main(), 5))


def test_a_loop_that_takes_no_attribute_still_gets_its_wheel() -> None:
    class NoDict:  # as uvloop's loop: no __dict__, but weak references
        __slots__ = ("__weakref__",)

    class Neither:
        __slots__ = ()

    loop = NoDict()
    assert _cancel._wheel_of(loop) is _cancel._wheel_of(loop)  # one per loop
    bare = Neither()
    assert _cancel._wheel_of(bare).loop is bare  # a wheel per scope: right, not shared
