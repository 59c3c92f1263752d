"""LatencyWindow and RetryBudget: pure logic, on a fake clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

import latencykit as lk


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_quantiles_are_exact_nearest_rank() -> None:
    window = lk.LatencyWindow(clock=Clock())
    rng = random.Random(7)
    values = [rng.uniform(0.01, 5.0) for _ in range(500)]
    for value in values:
        window.record(value)
    ordered = sorted(values)
    assert window.quantile(0.5) == ordered[249]
    assert window.quantile(0.9) == ordered[449]
    assert window.quantile(1.0) == ordered[-1]
    assert len(window) == 500


def test_window_forgets_old_samples() -> None:
    clock = Clock()
    window = lk.LatencyWindow(window=10.0, clock=clock)
    window.record(5.0)
    clock.now += 6
    window.record(1.0)
    assert window.quantile(1.0) == 5.0
    clock.now += 5  # the 5 s sample is now 11 s old
    assert window.quantile(1.0) == 1.0
    assert window.count() == 1
    clock.now += 20
    assert window.quantile(0.5) is None and window.count() == 0


def test_window_keeps_the_newest_max_samples() -> None:
    window = lk.LatencyWindow(max_samples=3, clock=Clock())
    for value in (9.0, 1.0, 2.0, 3.0):
        window.record(value)
    assert window.count() == 3
    assert window.quantile(1.0) == 3.0  # 9.0 was the oldest and went first


def test_window_range_is_fit_for_llm_calls() -> None:
    window = lk.LatencyWindow(clock=Clock())
    window.record(0.0)
    window.record(10_000.0)
    assert window.quantile(0.01) == lk.stats.MIN_SECONDS == 0.001
    assert window.quantile(1.0) == lk.stats.MAX_SECONDS == 600.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window": 0}, r"LatencyWindow\.window"), ({"max_samples": 0}, r"max_samples")],
)
def test_window_options_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lk.LatencyWindow(**kwargs)  # type: ignore[arg-type]


def test_budget_allows_ratio_of_calls() -> None:
    budget = lk.RetryBudget(0.1, clock=Clock())
    assert not budget.try_withdraw()
    for _ in range(30):
        budget.deposit()
    granted = sum(budget.try_withdraw() for _ in range(10))
    assert granted == 3
    assert budget.balance == pytest.approx(0.0)


def test_budget_deposits_expire_after_ttl() -> None:
    clock = Clock()
    budget = lk.RetryBudget(0.5, ttl=10.0, clock=clock)
    for _ in range(10):
        budget.deposit()
    assert budget.balance == pytest.approx(5.0)
    clock.now += 5
    assert budget.balance == pytest.approx(5.0)
    clock.now += 6
    assert budget.balance == pytest.approx(0.0)
    assert not budget.try_withdraw()


def test_budget_withdrawals_expire_too() -> None:
    clock = Clock()
    budget = lk.RetryBudget(1.0, ttl=10.0, clock=clock)
    budget.deposit()
    assert budget.try_withdraw()
    clock.now += 11
    budget.deposit()
    assert budget.try_withdraw()  # the earlier withdrawal no longer counts


def test_budget_reserve_for_quiet_services() -> None:
    budget = lk.RetryBudget(0.0, ttl=10.0, min_per_second=0.2, clock=Clock())
    assert sum(budget.try_withdraw() for _ in range(5)) == 2


def test_budget_over_a_long_random_run_stays_under_the_cap() -> None:
    clock = Clock()
    budget = lk.RetryBudget(0.1, ttl=10.0, clock=clock)
    rng = random.Random(3)
    calls = extra = 0
    for _ in range(20_000):
        clock.now += rng.expovariate(200)  # ~200 calls per second
        budget.deposit()
        calls += 1
        if rng.random() < 0.5 and budget.try_withdraw():
            extra += 1
    assert extra / calls <= 0.1 + 0.005


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ratio": -0.1}, r"RetryBudget\.ratio"),
        ({"ratio": 11}, r"RetryBudget\.ratio"),
        ({"ttl": 0}, r"RetryBudget\.ttl"),
        ({"min_per_second": -1}, r"RetryBudget\.min_per_second"),
    ],
)
def test_budget_options_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lk.RetryBudget(**kwargs)


def test_window_quantiles_at_once_match_one_by_one() -> None:
    window = lk.LatencyWindow(clock=Clock())
    assert window.quantiles(0.5) == ()
    for value in (0.3, 0.1, 0.2, 0.5, 0.4):
        window.record(value)
    assert (
        window.quantiles(0.0, 0.5, 1.0)
        == (
            window.quantile(0.0),
            window.quantile(0.5),
            window.quantile(1.0),
        )
        == (0.1, 0.3, 0.5)
    )
