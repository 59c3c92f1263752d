from __future__ import annotations

import datetime
import math

import anyio
import anyio.lowlevel
import pytest

import latencykit as lk

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_time]


async def test_remaining_is_none_outside_any_deadline() -> None:
    assert lk.remaining() is None


async def test_nested_deadlines_take_the_minimum() -> None:
    with lk.deadline(10):
        outer = lk.remaining()
        assert outer is not None and 9 < outer <= 10
        with lk.deadline(100):  # cannot extend the outer budget
            inner = lk.remaining()
            assert inner is not None and inner <= outer
        with lk.deadline(1):  # can shorten it
            inner = lk.remaining()
            assert inner is not None and inner <= 1
        after = lk.remaining()
        assert after is not None and 9 < after <= 10
    assert lk.remaining() is None


async def test_outer_deadline_expiry_names_the_outer_budget() -> None:
    with pytest.raises(lk.DeadlineExceeded) as info, lk.deadline(0.05), lk.deadline(30):
        await anyio.sleep(10)
    assert info.value.budget == pytest.approx(0.05)
    assert info.value.elapsed >= 0.05
    assert isinstance(info.value, TimeoutError)
    assert "deadline of 0.050s exceeded after" in str(info.value)


async def test_inner_deadline_expiry_does_not_consume_the_outer() -> None:
    with lk.deadline(30):
        with pytest.raises(lk.DeadlineExceeded) as info, lk.deadline(0.05):
            await anyio.sleep(10)
        assert info.value.budget == pytest.approx(0.05)
        left = lk.remaining()
        assert left is not None and left > 20


async def test_deadline_decorator_gives_each_call_a_fresh_budget() -> None:
    calls = 0

    @lk.deadline(datetime.timedelta(milliseconds=200))
    async def quick() -> float | None:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.01)
        return lk.remaining()

    for _ in range(3):
        left = await quick()
        assert left is not None and 0 < left <= 0.2
    assert calls == 3


async def test_deadline_decorator_raises_with_attempt_history() -> None:
    @lk.deadline(0.05)
    async def stuck() -> None:
        await anyio.sleep(10)

    with pytest.raises(lk.DeadlineExceeded) as info:
        await stuck()
    [attempt] = info.value.attempts
    assert attempt.outcome == "cancelled"
    assert attempt.target.endswith("stuck")
    assert attempt.duration >= 0.04


async def test_deadline_expired_event() -> None:
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append), pytest.raises(lk.DeadlineExceeded), lk.deadline(0.02):
        await anyio.sleep(5)
    [expired] = [e for e in seen if isinstance(e, lk.events.DeadlineExpired)]
    assert expired.budget == pytest.approx(0.02)
    assert expired.elapsed >= 0.02


async def test_one_deadline_object_guards_concurrent_tasks() -> None:
    guard = lk.deadline(5)
    results: list[float] = []

    async def worker(delay: float) -> None:
        with guard as scope:
            await anyio.sleep(delay)
            results.append(scope.remaining())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, 0.05)
        tg.start_soon(worker, 0.01)
    assert len(results) == 2 and all(0 < r <= 5 for r in results)


async def test_work_finishing_in_time_is_untouched() -> None:
    with lk.deadline(5) as scope:
        await anyio.lowlevel.checkpoint()
    assert scope.budget == 5
    assert scope.deadline < math.inf


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, datetime.timedelta(seconds=-3)])
def test_invalid_budget_is_rejected_naming_the_field(bad: object) -> None:
    with pytest.raises(ValueError, match=r"deadline\.seconds"):
        lk.deadline(bad)  # type: ignore[arg-type]


def test_non_numeric_budget_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"deadline\.seconds"):
        lk.deadline("3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"deadline\.seconds"):
        lk.deadline(True)


async def test_a_shield_inside_a_deadline_holds_its_expiry_back() -> None:
    finished_shielded = False

    async def shielded_then_open() -> None:
        nonlocal finished_shielded
        with anyio.CancelScope(shield=True):
            await anyio.sleep(2)  # the deadline passes in here: held back
            finished_shielded = True
        await anyio.sleep(10)  # cancelled at once

    start = anyio.current_time()
    with pytest.raises(lk.DeadlineExceeded), lk.deadline(1):
        await shielded_then_open()
    assert finished_shielded
    assert 2 <= anyio.current_time() - start < 3


async def test_a_shield_outside_a_deadline_does_not_hold_it_back() -> None:
    start = anyio.current_time()
    with anyio.CancelScope(shield=True):
        with pytest.raises(lk.DeadlineExceeded), lk.deadline(1):
            await anyio.sleep(10)
    assert 1 <= anyio.current_time() - start < 2


@pytest.mark.parametrize("outer_after", [0.5, 1.0])
async def test_an_enclosing_cancellation_at_or_before_the_deadline_is_not_swallowed(
    outer_after: float,
) -> None:
    with anyio.move_on_after(outer_after) as outer, lk.deadline(1):
        await anyio.sleep(10)
    assert outer.cancelled_caught


async def test_a_deadline_inside_a_cancelled_task_group_lets_its_cancellation_through() -> None:
    reached_after = False
    async with anyio.create_task_group() as group:

        async def child() -> None:
            nonlocal reached_after
            with lk.deadline(5):
                await anyio.sleep(10)
            reached_after = True

        group.start_soon(child)
        await anyio.sleep(1)
        group.cancel_scope.cancel()
    assert not reached_after


async def test_cancel_scopes_see_the_deadlines_and_timers_around_them() -> None:
    from latencykit._cancel import backend, effective_deadline, now

    with lk.deadline(10):
        limit = now() + 3
        with backend().expiry(limit):  # a fallback's switch, a failover target's share
            assert effective_deadline() == pytest.approx(limit)
        assert effective_deadline() == pytest.approx(now() + 10, abs=0.01)
    assert effective_deadline() == math.inf
