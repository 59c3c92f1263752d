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
    window = lk.stats.LatencyWindow(clock=Clock())
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
    window = lk.stats.LatencyWindow(window=10.0, clock=clock)
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
    window = lk.stats.LatencyWindow(max_samples=3, clock=Clock())
    for value in (9.0, 1.0, 2.0, 3.0):
        window.record(value)
    assert window.count() == 3
    assert window.quantile(1.0) == 3.0  # 9.0 was the oldest and went first


def test_window_range_is_fit_for_llm_calls() -> None:
    window = lk.stats.LatencyWindow(clock=Clock())
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
        lk.stats.LatencyWindow(**kwargs)  # type: ignore[arg-type]


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
    window = lk.stats.LatencyWindow(clock=Clock())
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


# --- censored samples (attempts cancelled before they finished) ------------------------------


def reference_kaplan_meier(done: list[float], censored: list[float], q: float) -> float:
    """The textbook estimator, one sample at a time: a completed latency u ends the walk once
    the survival S(u) <= 1 - q; a censored sample at c is still at risk at c."""
    samples = sorted([(v, 0) for v in done] + [(v, 1) for v in censored])
    survival, at_risk = 1.0, len(samples)
    for value, is_censored in samples:
        if not is_censored:
            survival *= (at_risk - 1) / at_risk
            if survival <= 1 - q + 1e-9:
                return value
        at_risk -= 1
    return max(done)


def test_censored_samples_count_as_slower_than_their_censoring_time() -> None:
    # 80 fast calls, 10 slow ones that completed, and 10 primaries cut off at 0.5 s when
    # their backups answered: those 10 were slower than 0.5 s, so 20 % of calls are slow.
    window = lk.stats.LatencyWindow(clock=Clock())
    for i in range(80):
        window.record(0.1 + i / 1000)
    slow = [2.0 + i / 10 for i in range(10)]
    for value in slow:
        window.record(value)
    for _ in range(10):
        window.record_censored(0.5)
    assert window.count() == 100 and window.censored() == 10
    # As plain samples the cut-off primaries would make the p90 0.5 s, between the groups;
    # their weight goes to the slow calls instead: the p90 is inside the slow group.
    p90 = window.quantile(0.9)
    assert p90 is not None and p90 >= 2.0
    assert p90 == reference_kaplan_meier(
        [0.1 + i / 1000 for i in range(80)] + slow, [0.5] * 10, 0.9
    )
    assert window.quantile(0.5) == pytest.approx(0.1 + 49 / 1000)  # the body is unaffected
    assert window.longest() == 2.9


def test_censoring_above_the_quantile_leaves_it_exact() -> None:
    window = lk.stats.LatencyWindow(clock=Clock())
    values = [0.01 * (i + 1) for i in range(90)]
    for value in values:
        window.record(value)
    for _ in range(10):
        window.record_censored(5.0)  # hedged at the p90 and cut off later
    assert window.quantile(0.9) == values[89]
    assert window.quantile(0.5) == values[49]


def test_quantiles_match_the_textbook_kaplan_meier_estimator() -> None:
    rng = random.Random(11)
    for _ in range(300):
        window = lk.stats.LatencyWindow(clock=Clock())
        done: list[float] = []
        censored: list[float] = []
        share = rng.choice([0.0, 0.1, 0.5, 0.9])
        for _ in range(rng.randint(1, 80)):
            value = round(rng.uniform(0.1, 3.0), rng.choice([1, 2]))  # ties included
            if rng.random() < share:
                window.record_censored(value)
                censored.append(value)
            else:
                window.record(value)
                done.append(value)
        for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
            expected = reference_kaplan_meier(done, censored, q) if done else None
            assert window.quantile(q) == expected


def test_attempts_that_never_finish_cannot_push_the_quantile_past_the_data() -> None:
    # An outage: every attempt hangs until a 30 s deadline cuts it off. The estimate stays at
    # the slowest latency anything completed in, never the censoring times.
    window = lk.stats.LatencyWindow(clock=Clock())
    for i in range(50):
        window.record(0.1 + i / 500)
    for _ in range(500):
        window.record_censored(30.0)
    assert window.quantile(0.9) == window.quantile(1.0) == pytest.approx(0.198)
    assert window.longest() == 30.0


def test_a_window_of_censored_samples_only_has_no_quantile() -> None:
    window = lk.stats.LatencyWindow(clock=Clock())
    window.record_censored(3.0)
    assert window.quantile(0.9) is None and window.quantiles(0.5, 0.9) == ()
    assert window.count() == 1 and window.longest() == 3.0


def test_censored_samples_expire_and_are_evicted_like_the_others() -> None:
    clock = Clock()
    window = lk.stats.LatencyWindow(window=10.0, max_samples=3, clock=clock)
    window.record_censored(9.0)
    window.record(1.0)
    clock.now += 6
    window.record(2.0)
    window.record(3.0)  # the 4th sample: the oldest (censored) one goes
    assert window.censored() == 0 and window.count() == 3
    window.record_censored(0.5)
    clock.now += 5  # 1.0 was recorded 11 s ago... and has been evicted already
    assert window.count() == 3 and window.censored() == 1
    clock.now += 20
    assert window.count() == 0 and window.longest() is None


def test_budget_counts_each_call_once_at_its_start() -> None:
    import time

    from latencykit._context import Trace, trace_var

    def deposit_twice_in(trace: Trace, budget: lk.RetryBudget) -> None:
        token = trace_var.set(trace)
        try:  # a hedge and a retry sharing the budget: the call counts once
            budget.deposit_once()
            budget.deposit_once()
        finally:
            trace_var.reset(token)

    budget = lk.RetryBudget(1.0, ttl=10.0)  # the loop's clock: time.monotonic() outside one
    deposit_twice_in(Trace(started_at=time.monotonic() - 11), budget)
    assert budget.balance == 0.0  # counted when the call started: out of the window by now
    deposit_twice_in(Trace(started_at=time.monotonic()), budget)
    assert budget.balance == pytest.approx(1.0)
    # A budget on a clock of its own reads it: a call's start is on the loop's clock.
    own = lk.RetryBudget(1.0, ttl=10.0, clock=Clock())
    deposit_twice_in(Trace(started_at=time.monotonic() - 11), own)
    assert own.balance == pytest.approx(1.0)
