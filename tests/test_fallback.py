from __future__ import annotations

import anyio
import pytest

import latencykit as lk

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_time]


async def test_fallback_after_timeout_cancels_the_primary() -> None:
    primary_cancelled = False
    seen: list[lk.events.Event] = []

    async def cheap(reason: lk.policies.fallback.FallbackReason, question: str) -> str:
        assert reason.kind == "timeout" and reason.error is None
        return f"cheap answer to {question}"

    @lk.fallback(cheap, after=0.05)
    async def ask(question: str) -> str:
        nonlocal primary_cancelled
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            primary_cancelled = True
            raise
        return "slow answer"

    with lk.subscribe(seen.append):
        assert await ask("why") == "cheap answer to why"
    assert primary_cancelled
    [used] = [e for e in seen if isinstance(e, lk.events.FallbackUsed)]
    assert used.reason == "timeout"
    assert used.after == pytest.approx(0.05)
    assert used.elapsed >= 0.05
    [ended] = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert ended.degraded and ended.outcome == "ok" and ended.attempts == 1


async def test_fast_primary_is_not_degraded() -> None:
    @lk.fallback("never", after=5)
    async def ask() -> str:
        return "primary"

    assert await ask() == "primary"


async def test_fallback_after_a_transient_error() -> None:
    seen: list[lk.events.Event] = []

    @lk.fallback(lambda reason: f"degraded after {reason.kind}: {type(reason.error).__name__}")
    async def ask() -> str:
        raise ConnectionResetError("provider hung up")

    with lk.subscribe(seen.append):
        assert await ask() == "degraded after error: ConnectionResetError"
    [used] = [e for e in seen if isinstance(e, lk.events.FallbackUsed)]
    assert used.reason == "error"
    assert used.error_type == "ConnectionResetError"
    assert used.error_kind is lk.ErrorKind.CONNECTION


async def test_errors_the_fallback_does_not_handle_propagate_unchanged() -> None:
    @lk.fallback("degraded")
    async def ask() -> str:
        raise KeyError("a bug, not a provider problem")

    with pytest.raises(KeyError):
        await ask()


async def test_on_selects_the_handled_errors() -> None:
    @lk.fallback("degraded", on=KeyError)
    async def by_type() -> str:
        raise KeyError("x")

    @lk.fallback("degraded", on=lambda exc: "retryable" in str(exc))
    async def by_predicate() -> str:
        raise RuntimeError("retryable")

    assert await by_type() == "degraded"
    assert await by_predicate() == "degraded"


async def test_failing_fallback_surfaces_both_errors() -> None:
    async def broken_fallback(reason: lk.policies.fallback.FallbackReason) -> str:
        raise LookupError("cache miss")

    @lk.fallback(broken_fallback)
    async def ask() -> str:
        raise TimeoutError("primary too slow")

    with pytest.raises(lk.FallbackFailed) as info:
        await ask()
    error = info.value
    assert isinstance(error.primary_error, TimeoutError)
    assert isinstance(error.fallback_error, LookupError)
    assert error.__cause__ is error.fallback_error
    assert "TimeoutError" in str(error) and "LookupError" in str(error)
    assert [a.outcome for a in error.attempts] == ["error"]


async def test_failing_fallback_after_timeout() -> None:
    async def broken_fallback(reason: lk.policies.fallback.FallbackReason) -> str:
        raise LookupError("cache miss")

    @lk.fallback(broken_fallback, after=0.02)
    async def ask() -> str:
        await anyio.sleep(10)
        return "never"

    with pytest.raises(lk.FallbackFailed) as info:
        await ask()
    assert info.value.reason == "timeout"
    assert info.value.primary_error is None
    assert "timed out" in str(info.value)


async def test_deadline_bounds_the_fallback_too() -> None:
    async def slow_fallback(reason: lk.policies.fallback.FallbackReason) -> str:
        await anyio.sleep(10)
        return "never"

    @lk.deadline(0.2)
    @lk.fallback(slow_fallback, after=0.05)
    async def ask() -> str:
        await anyio.sleep(10)
        return "never"

    with pytest.raises(lk.DeadlineExceeded) as info:
        await ask()
    assert info.value.budget == pytest.approx(0.2)
    assert [a.outcome for a in info.value.attempts] == ["cancelled"]


async def test_outer_cancellation_is_not_an_error_for_the_fallback() -> None:
    used = False

    def note(reason: lk.policies.fallback.FallbackReason) -> str:
        nonlocal used
        used = True
        return "degraded"

    @lk.fallback(note, on=BaseException)
    async def ask() -> str:
        await anyio.sleep(10)
        return "never"

    with anyio.move_on_after(0.02):
        await ask()
    assert not used


def test_after_beyond_the_deadline_is_rejected_at_construction() -> None:
    async def ask() -> str:
        return "x"

    with pytest.raises(
        ValueError, match=r"fallback\.after \(5s\) must be shorter than the deadline"
    ):
        lk.deadline(3)(lk.fallback("x", after=5)(ask))
    with pytest.raises(ValueError, match=r"fallback\.after"):
        lk.pipeline.compose(lk.fallback("x", after=3), lk.deadline(3))


@pytest.mark.parametrize("bad", [-1, 0, float("nan")])
def test_invalid_after_is_rejected_naming_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match=r"fallback\.after"):
        lk.fallback("x", after=bad)


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(TypeError, match="aftr"):
        lk.fallback("x", aftr=1)  # type: ignore[call-arg]


def test_invalid_error_filter_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"fallback\.on"):
        lk.fallback("x", on=42)  # type: ignore[arg-type]


@pytest.mark.parametrize("after", [None, 1.0])
async def test_inside_a_deadline_the_primary_sees_the_deadline_budget(after: float | None) -> None:
    # With `after`, deadline and fallback run fused (one timer); behaviour must not change.
    seen: list[float | None] = []

    async def alternative(reason: lk.policies.fallback.FallbackReason) -> str:
        seen.append(lk.remaining())
        raise LookupError("no cache")

    @lk.deadline(5)
    @lk.fallback(alternative, after=after)
    async def ask() -> str:
        seen.append(lk.remaining())
        raise ConnectionError("down")

    with pytest.raises(lk.FallbackFailed) as info:
        await ask()
    assert isinstance(info.value.primary_error, ConnectionError)
    assert isinstance(info.value.fallback_error, LookupError)
    assert len(seen) == 2 and all(s is not None and 4 < s <= 5 for s in seen)
    assert lk.remaining() is None


@pytest.mark.parametrize("after", [None, 0.05])
async def test_deadline_expiring_during_the_alternative(after: float | None) -> None:
    async def slow_alternative(reason: lk.policies.fallback.FallbackReason) -> str:
        await anyio.sleep(10)
        return "never"

    @lk.deadline(0.3)
    @lk.fallback(slow_alternative, after=after)
    async def ask() -> str:
        if after is None:
            raise ConnectionError("down")
        await anyio.sleep(10)
        return "never"

    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append), pytest.raises(lk.DeadlineExceeded) as info:
        await ask()
    assert info.value.budget == pytest.approx(0.3)
    assert info.value.elapsed >= 0.3
    assert len([e for e in seen if isinstance(e, lk.events.DeadlineExpired)]) == 1


async def test_fallback_after_is_capped_by_an_enclosing_budget() -> None:
    import anyio

    @lk.fallback("cached", after=5.0)
    async def ask() -> str:
        await anyio.sleep(30)
        return "fresh"

    loop_started = anyio.current_time()
    with lk.deadline(1.0):  # a separate scope, not in the fallback's pipeline
        assert await ask() == "cached"
    assert 0.4 <= anyio.current_time() - loop_started < 0.5 + 0.4
