"""The retry policy: backoff with full jitter, Retry-After, budget, deadline, cancellation.

Waits go through an injected fake sleep that records them and returns at once, so most tests
are instant and deterministic; the deadline tests use real (short) time with wide margins.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit.errors import provider_error
from latencykit.policies.retry import Retry, RetryGaveUp, RetryScheduled, retry
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


class FakeSleep:
    """An injectable sleep: records the waits asked for, returns at once (after a checkpoint)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await anyio.lowlevel.checkpoint()


class Script:
    """Attempt i runs outcomes[i] (the last one repeats): raise it if an exception, else return
    it; ``seconds`` of real time first."""

    def __init__(self, *outcomes: object, seconds: float = 0.0) -> None:
        self.outcomes = outcomes
        self.seconds = seconds
        self.calls = 0

    async def __call__(self) -> object:
        outcome = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        if self.seconds:
            await anyio.sleep(self.seconds)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def wrapped(script: Script, policy: Retry) -> Callable[[], Awaitable[object]]:
    async def call() -> object:
        return await script()

    return policy(call)


def collect() -> tuple[list[lk.events.Event], lk.events.Subscription]:
    seen: list[lk.events.Event] = []
    return seen, lk.subscribe(seen.append)


def scheduled(seen: list[lk.events.Event]) -> list[RetryScheduled]:
    return [e for e in seen if isinstance(e, RetryScheduled)]


def gave_up(seen: list[lk.events.Event]) -> list[RetryGaveUp]:
    return [e for e in seen if isinstance(e, RetryGaveUp)]


def unavailable(n: int = 0) -> lk.ProviderUnavailable:
    return lk.ProviderUnavailable(f"overloaded {n}", target="t", status_code=503)


def roomy() -> lk.RetryBudget:
    """A budget that never runs out in a test (10 retries earned per call)."""
    return lk.RetryBudget(10.0)


# --- retrying, and what is raised -------------------------------------------------------------


async def test_retries_up_to_max_attempts_then_raises_the_last_error_with_the_others() -> None:
    errors = [unavailable(1), lk.ProviderConnectionError("refused", target="t"), unavailable(3)]
    script, sleep = Script(*errors), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.ProviderUnavailable) as caught:
        await wrapped(script, retry(max_attempts=3, sleep=sleep, budget=roomy()))()
    assert caught.value is errors[2]
    assert caught.value.others == (errors[0], errors[1])
    assert script.calls == 3 and len(sleep.waits) == 2
    # every attempt went through the pipeline, so the trace recorded each of them
    assert [a.outcome for a in caught.value.attempts] == ["error"] * 3
    assert [e.attempt for e in scheduled(seen)] == [2, 3]
    assert [e.reason_kind for e in scheduled(seen)] == [
        lk.ErrorKind.SERVER_ERROR,
        lk.ErrorKind.CONNECTION,
    ]
    assert [e.wait for e in scheduled(seen)] == sleep.waits
    [end] = gave_up(seen)
    assert (end.reason, end.attempts, end.error_kind) == (
        "max_attempts",
        3,
        lk.ErrorKind.SERVER_ERROR,
    )
    call_ids = {e.call_id for e in seen}
    assert len(call_ids) == 1 and call_ids != {0}


async def test_answers_from_a_later_attempt() -> None:
    script, sleep = Script(unavailable(), unavailable(), "ok"), FakeSleep()
    seen, subscription = collect()
    with subscription:
        assert await wrapped(script, retry(sleep=sleep, budget=roomy()))() == "ok"
    assert script.calls == 3 and len(sleep.waits) == 2
    assert len(scheduled(seen)) == 2 and gave_up(seen) == []


async def test_a_success_costs_one_attempt_and_no_event() -> None:
    script, sleep = Script("ok"), FakeSleep()
    seen, subscription = collect()
    with subscription:
        assert await wrapped(script, retry(sleep=sleep))() == "ok"
    assert script.calls == 1 and sleep.waits == []
    assert scheduled(seen) == [] and gave_up(seen) == []


async def test_max_attempts_1_never_retries() -> None:
    script, sleep = Script(unavailable()), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.ProviderUnavailable):
        await wrapped(script, retry(max_attempts=1, sleep=sleep))()
    assert script.calls == 1 and sleep.waits == []
    assert [e.reason for e in gave_up(seen)] == ["max_attempts"]


@pytest.mark.parametrize(
    "error",
    [
        lk.BadRequest("x", target="t"),
        lk.ContentPolicyViolation("flagged", target="t"),
        lk.ContextLengthExceeded("too long", target="t"),
        lk.AuthenticationFailed("no key", target="t"),
        KeyError("bug"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_does_not_retry_non_transient_errors(error: Exception) -> None:
    script, sleep = Script(error, "never"), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(type(error)) as caught:
        await wrapped(script, retry(sleep=sleep, budget=roomy()))()
    assert caught.value is error
    assert script.calls == 1 and sleep.waits == []
    assert scheduled(seen) == [] and gave_up(seen) == []  # nothing was retried: nothing to say


async def test_on_selects_what_is_retried_but_never_a_bad_request() -> None:
    sleep = FakeSleep()
    script = Script(KeyError("flaky"), "ok")
    assert await wrapped(script, retry(on=KeyError, sleep=sleep, budget=roomy()))() == "ok"
    assert script.calls == 2

    bad = Script(lk.BadRequest("x", target="t"), "never")
    anything = retry(on=lambda exc: True, sleep=sleep, budget=roomy())
    with pytest.raises(lk.BadRequest):
        await wrapped(bad, anything)()
    assert bad.calls == 1

    transient = Script(unavailable(), "never")
    with pytest.raises(lk.ProviderUnavailable):
        await wrapped(transient, retry(on=KeyError, sleep=sleep, budget=roomy()))()
    assert transient.calls == 1


async def test_a_non_retryable_error_after_retries_carries_the_earlier_ones() -> None:
    first, bad = unavailable(), lk.BadRequest("x", target="t")
    script, sleep = Script(first, bad), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.BadRequest) as caught:
        await wrapped(script, retry(max_attempts=5, sleep=sleep, budget=roomy()))()
    assert caught.value is bad and caught.value.others == (first,)
    assert script.calls == 2
    [end] = gave_up(seen)
    assert (end.reason, end.attempts, end.error_kind) == (
        "not_retryable",
        2,
        lk.ErrorKind.BAD_REQUEST,
    )


async def test_plain_exceptions_get_the_others_as_an_attribute() -> None:
    errors = [ConnectionResetError("a"), ConnectionResetError("b")]
    script, sleep = Script(*errors), FakeSleep()
    with pytest.raises(ConnectionResetError) as caught:
        await wrapped(script, retry(max_attempts=2, sleep=sleep, budget=roomy()))()
    assert caught.value is errors[1]
    assert caught.value.latencykit_others == (errors[0],)  # type: ignore[attr-defined]


# --- backoff ----------------------------------------------------------------------------------


async def test_backoff_is_exponential_with_full_jitter() -> None:
    # ceilings: min(max_wait, initial * multiplier ** (n - 1)) for retries n = 1..5
    ceilings = [0.1, 0.3, 0.9, 1.0, 1.0]
    sleep = FakeSleep()
    policy = retry(
        max_attempts=6,
        initial=0.1,
        multiplier=3.0,
        max_wait=1.0,
        sleep=sleep,
        budget=roomy(),
        rng=random.Random(1234),
    )
    runs = 300
    call = wrapped(Script(unavailable()), policy)
    for _ in range(runs):
        with pytest.raises(lk.ProviderUnavailable):
            await call()
    assert len(sleep.waits) == runs * 5
    by_retry = [sleep.waits[n::5] for n in range(5)]
    for waits, ceiling in zip(by_retry, ceilings, strict=True):
        assert all(0.0 <= w <= ceiling for w in waits)
        # full jitter: spread over the whole [0, ceiling] range, centred on its middle
        assert min(waits) < 0.1 * ceiling and max(waits) > 0.9 * ceiling
        assert abs(sum(waits) / runs - ceiling / 2) < 0.1 * ceiling
    assert max(by_retry[2]) > max(by_retry[0]) * 2  # it grows


async def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    sleep = FakeSleep()
    policy = retry(max_attempts=4, initial=0.2, sleep=sleep, rng=random.Random(7))
    with pytest.raises(lk.ProviderUnavailable):
        await wrapped(Script(unavailable()), policy)()
    expected = random.Random(7)
    assert sleep.waits == [expected.uniform(0.0, c) for c in (0.2, 0.4, 0.8)]


# --- Retry-After --------------------------------------------------------------------------------


async def test_honours_retry_after_of_a_rate_limited_error() -> None:
    limited = lk.RateLimited("slow", target="t", retry_after=2.0)
    script, sleep = Script(limited, "ok"), FakeSleep()
    seen, subscription = collect()
    with subscription:
        assert await wrapped(script, retry(sleep=sleep))() == "ok"
    assert sleep.waits == [2.0]  # max(Retry-After, backoff <= 0.5)
    [event] = scheduled(seen)
    assert (event.retry_after, event.wait, event.reason_kind) == (
        2.0,
        2.0,
        lk.ErrorKind.RATE_LIMITED,
    )


class Throttled(Exception):
    """A raw client exception, as litellm raises them: a status and the response headers."""

    status_code = 429

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("rate limited")
        self.litellm_response_headers = headers


async def test_honours_retry_after_from_raw_response_headers() -> None:
    script, sleep = Script(Throttled({"retry-after": "1.5"}), "ok"), FakeSleep()
    assert await wrapped(script, retry(sleep=sleep, initial=0.1))() == "ok"
    assert sleep.waits == [1.5]


async def test_backoff_wins_when_longer_than_retry_after() -> None:
    limited = lk.RateLimited("slow", target="t", retry_after=0.001)
    sleep = FakeSleep()
    policy = retry(initial=5.0, max_wait=5.0, multiplier=1.0, sleep=sleep, rng=random.Random(3))
    await wrapped(Script(limited, "ok"), policy)()
    assert sleep.waits == [max(0.001, random.Random(3).uniform(0.0, 5.0))]


async def test_retry_after_can_be_ignored() -> None:
    limited = lk.RateLimited("slow", target="t", retry_after=30.0)
    sleep = FakeSleep()
    seen, subscription = collect()
    with subscription:
        policy = retry(honor_retry_after=False, initial=0.1, sleep=sleep)
        assert await wrapped(Script(limited, "ok"), policy)() == "ok"
    assert len(sleep.waits) == 1 and sleep.waits[0] <= 0.1
    assert scheduled(seen)[0].retry_after is None


async def test_a_retry_after_longer_than_max_retry_after_gives_up_at_once() -> None:
    limited = lk.RateLimited("slow", target="t", retry_after=30.0)
    script, sleep = Script(limited, "never"), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.RateLimited) as caught:
        await wrapped(script, retry(max_retry_after=10.0, sleep=sleep))()
    assert caught.value is limited
    assert script.calls == 1 and sleep.waits == []
    [end] = gave_up(seen)
    assert (end.reason, end.attempts, end.wait) == ("retry_after_too_long", 1, 30.0)


# --- budget -------------------------------------------------------------------------------------


async def test_an_empty_budget_stops_retrying_and_says_so() -> None:
    budget = lk.RetryBudget(1.0)  # each call earns exactly one retry
    script, sleep = Script(unavailable()), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.ProviderUnavailable):
        await wrapped(script, retry(max_attempts=5, sleep=sleep, budget=budget))()
    assert script.calls == 2 and len(sleep.waits) == 1
    [end] = gave_up(seen)
    assert (end.reason, end.attempts) == ("budget", 2)
    assert budget.balance == pytest.approx(0.0)


async def test_a_zero_budget_never_retries() -> None:
    script, sleep = Script(unavailable(), "never"), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.ProviderUnavailable):
        await wrapped(script, retry(sleep=sleep, budget=lk.RetryBudget(0.0)))()
    assert script.calls == 1 and sleep.waits == []
    assert [e.reason for e in gave_up(seen)] == ["budget"]


async def test_the_default_budget_lets_a_cold_process_retry() -> None:
    policy = retry(sleep=FakeSleep())
    assert policy.budget.ratio == 0.2 and policy.budget.min_per_second == 1.0
    script = Script(unavailable(), unavailable(), "ok")
    assert await wrapped(script, policy)() == "ok"
    assert script.calls == 3


async def test_a_budget_shared_with_an_enclosing_hedge_counts_each_call_once() -> None:
    shared = lk.RetryBudget(0.5)

    @lk.hedge(30.0, budget=shared)
    @retry(budget=shared, sleep=FakeSleep())
    async def call() -> str:
        return "ok"

    assert await call() == "ok"
    assert shared.balance == pytest.approx(0.5)  # the hedge's deposit only

    alone = lk.RetryBudget(0.5)
    policy = retry(budget=alone, sleep=FakeSleep())
    assert await wrapped(Script("ok"), policy)() == "ok"
    assert alone.balance == pytest.approx(0.5)  # without a hedge the retry deposits


# --- deadline -----------------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_a_retry_after_that_does_not_fit_the_deadline_gives_up_at_once() -> None:
    limited = lk.RateLimited("slow", target="t", retry_after=2.0)
    script = Script(limited, "never")
    seen, subscription = collect()

    @lk.deadline(0.3)
    @retry()  # the real anyio.sleep: sleeping would hit the deadline (DeadlineExceeded)
    async def call() -> object:
        return await script()

    started = anyio.current_time()
    with subscription, pytest.raises(lk.RateLimited) as caught:
        await call()
    assert anyio.current_time() - started < 0.1
    assert caught.value is limited and script.calls == 1
    [end] = gave_up(seen)
    assert (end.reason, end.attempts, end.wait) == ("deadline", 1, 2.0)


@pytest.mark.virtual_time
async def test_retries_while_the_waits_fit_the_deadline() -> None:
    errors = [
        lk.RateLimited("slow", target="t", retry_after=0.05),
        lk.RateLimited("slower", target="t", retry_after=2.0),
    ]
    script, sleep = Script(*errors), FakeSleep()
    seen, subscription = collect()
    policy = retry(max_attempts=5, initial=0.01, sleep=sleep, budget=roomy())
    with subscription, pytest.raises(lk.RateLimited) as caught, lk.deadline(0.3):
        await wrapped(script, policy)()
    assert caught.value is errors[1] and caught.value.others == (errors[0],)
    assert sleep.waits == [0.05] and script.calls == 2
    assert [e.reason for e in gave_up(seen)] == ["deadline"]


@pytest.mark.virtual_time
async def test_no_attempt_starts_that_the_deadline_cannot_fit() -> None:
    # Each attempt fails after 0.2 s. After the first (t=0.2) another fits before the 0.5 s
    # deadline; after the second (t=0.4), one more would need 0.2 s of the 0.1 s left.
    script, sleep = Script(unavailable(), seconds=0.2), FakeSleep()
    seen, subscription = collect()
    policy = retry(max_attempts=10, initial=0.001, sleep=sleep, budget=roomy())
    with subscription, pytest.raises(lk.ProviderUnavailable), lk.deadline(0.5):
        await wrapped(script, policy)()
    assert script.calls == 2 and len(sleep.waits) == 1
    assert [e.reason for e in gave_up(seen)] == ["deadline"]


# --- cancellation -------------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_a_cancelled_attempt_is_not_retried() -> None:
    script, sleep = Script("late", seconds=10.0), FakeSleep()
    seen, subscription = collect()
    with subscription, anyio.move_on_after(0.05) as scope:
        await wrapped(script, retry(sleep=sleep, budget=roomy()))()
    assert scope.cancelled_caught
    assert script.calls == 1 and sleep.waits == []
    assert scheduled(seen) == [] and gave_up(seen) == []


@pytest.mark.virtual_time
async def test_cancellation_during_the_wait_ends_the_call() -> None:
    script = Script(lk.RateLimited("slow", target="t", retry_after=5.0), "never")
    started = anyio.current_time()
    with anyio.move_on_after(0.05) as scope:
        await wrapped(script, retry(budget=roomy()))()  # the real anyio.sleep
    assert scope.cancelled_caught and anyio.current_time() - started < 1.0
    assert script.calls == 1


@pytest.mark.virtual_time
async def test_a_deadline_expiring_during_a_retry_is_not_retried() -> None:
    calls: list[int] = []
    sleep = FakeSleep()

    @lk.deadline(0.1)
    @retry(max_attempts=5, initial=0.001, sleep=sleep, budget=roomy())
    async def call() -> str:
        calls.append(len(calls))
        if len(calls) == 1:
            raise unavailable()
        await anyio.sleep(10.0)  # the retry hangs until the deadline cancels it
        return "late"

    with pytest.raises(lk.DeadlineExceeded) as caught:
        await call()
    assert calls == [0, 1] and len(sleep.waits) == 1
    assert [a.outcome for a in caught.value.attempts] == ["error", "cancelled"]


@pytest.mark.virtual_time
async def test_an_expiring_deadline_is_not_retried() -> None:
    script = Script("late", seconds=10.0)

    @lk.deadline(0.05)
    @retry(sleep=FakeSleep(), budget=roomy())
    async def call() -> object:
        return await script()

    with pytest.raises(lk.DeadlineExceeded):
        await call()
    assert script.calls == 1


# --- slow failures ------------------------------------------------------------------------------


def connection_lost() -> lk.ProviderConnectionError:
    return lk.ProviderConnectionError("Connection error.", target="t")


async def run_on(target: lk.Target, script: Script, policy: Retry) -> object:
    async def next(call: lk.pipeline.Call) -> Any:
        return await call.fn()

    return await policy.handle(lk.pipeline.Call(script, target=target), next)


@pytest.mark.virtual_time
async def test_a_failure_after_slow_failure_seconds_is_not_retried() -> None:
    script, sleep = Script(connection_lost(), "ok", seconds=0.2), FakeSleep()
    seen, subscription = collect()
    with subscription, pytest.raises(lk.ProviderConnectionError):
        await wrapped(script, retry(slow_failure=0.1, sleep=sleep, budget=roomy()))()
    assert script.calls == 1 and sleep.waits == []
    [event] = gave_up(seen)
    assert (event.reason, event.attempts, event.error_kind) == (
        "slow_failure",
        1,
        lk.ErrorKind.CONNECTION,
    )
    assert event.wait is not None and event.wait >= 0.2


@pytest.mark.virtual_time
async def test_a_fast_failure_is_still_retried() -> None:
    script, sleep = Script(connection_lost(), "ok", seconds=0.01), FakeSleep()
    policy = retry(slow_failure=2.0, sleep=sleep, budget=roomy())
    assert await wrapped(script, policy)() == "ok"
    assert script.calls == 2


@pytest.mark.virtual_time
async def test_the_default_threshold_is_half_the_targets_attempt_timeout() -> None:
    slow = Script(connection_lost(), "ok", seconds=0.15)
    with pytest.raises(lk.ProviderConnectionError):
        await run_on(lk.Target("m", timeout=0.2), slow, retry(sleep=FakeSleep(), budget=roomy()))
    assert slow.calls == 1
    # the same failure, against a target with a longer timeout, is retried
    slow = Script(connection_lost(), "ok", seconds=0.15)
    policy = retry(sleep=FakeSleep(), budget=roomy())
    assert await run_on(lk.Target("m", timeout=2.0), slow, policy) == "ok"
    assert slow.calls == 2
    # a target without a timeout (a decorated function) has no threshold by default
    slow = Script(connection_lost(), "ok", seconds=0.15)
    assert await run_on(lk.Target("m"), slow, retry(sleep=FakeSleep(), budget=roomy())) == "ok"
    # and math.inf turns the rule off
    slow = Script(connection_lost(), "ok", seconds=0.15)
    policy = retry(slow_failure=math.inf, sleep=FakeSleep(), budget=roomy())
    assert await run_on(lk.Target("m", timeout=0.2), slow, policy) == "ok"


@pytest.mark.virtual_time
async def test_timeouts_follow_on_not_the_slow_failure_rule() -> None:
    timeout = lk.AttemptTimeout("no answer", target="t")
    script = Script(timeout, "ok", seconds=0.15)
    policy = retry(on=lk.errors.is_transient, slow_failure=0.1, sleep=FakeSleep(), budget=roomy())
    assert await wrapped(script, policy)() == "ok"
    assert script.calls == 2


# --- options and plumbing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "retry.max_attempts"),
        ({"max_attempts": 2.0}, "retry.max_attempts"),
        ({"max_attempts": True}, "retry.max_attempts"),
        ({"initial": -0.1}, "retry.initial"),
        ({"initial": math.inf, "max_wait": math.inf}, "retry.initial"),
        ({"max_wait": -1.0}, "retry.max_wait"),
        ({"initial": 2.0, "max_wait": 1.0}, "retry.max_wait"),
        ({"multiplier": 0.5}, "retry.multiplier"),
        ({"multiplier": math.nan}, "retry.multiplier"),
        ({"max_retry_after": -1.0}, "retry.max_retry_after"),
        ({"slow_failure": -1.0}, "retry.slow_failure"),
        ({"slow_failure": math.nan}, "retry.slow_failure"),
    ],
)
def test_invalid_options_are_rejected_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        retry(**options)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"initial": "1"}, "retry.initial"),
        ({"budget": 0.2}, "retry.budget"),
        ({"on": 42}, "retry.on"),
        ({"honor_retry_after": "yes"}, "retry.honor_retry_after"),
        ({"sleep": None}, "retry.sleep"),
        ({"rng": 42}, "retry.rng"),
    ],
)
def test_options_of_the_wrong_type_are_rejected_naming_the_field(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(TypeError, match=field):
        retry(**options)


def test_options_accept_timedeltas_and_have_documented_defaults() -> None:
    import datetime

    policy = Retry()
    assert (policy.max_attempts, policy.initial, policy.max_wait, policy.multiplier) == (
        3,
        0.5,
        8.0,
        2.0,
    )
    assert policy.honor_retry_after and policy.max_retry_after is None and policy.on is None
    policy = retry(
        initial=datetime.timedelta(milliseconds=100),
        max_retry_after=datetime.timedelta(seconds=5),
    )
    assert policy.initial == pytest.approx(0.1) and policy.max_retry_after == 5.0
    assert Retry().slow_failure is None
    assert retry(slow_failure=datetime.timedelta(seconds=2)).slow_failure == 2.0
    assert retry(slow_failure=math.inf).slow_failure == math.inf


def test_it_is_a_policy_in_the_retry_stage() -> None:
    policy = retry()
    assert isinstance(policy, lk.pipeline.Policy) and policy.stage == lk.pipeline.Stage.RETRY
    pipeline = lk.pipeline.compose(policy, lk.deadline(1.0), lk.hedge(1.0))
    assert [type(p) for p in pipeline.policies] == [lk.policies.deadline.Deadline, lk.Hedge, Retry]
    assert "max_attempts=3" in repr(policy)


async def test_the_decorator_keeps_the_function_and_its_arguments() -> None:
    seen: list[tuple[int, str]] = []

    @retry(sleep=FakeSleep())
    async def add(a: int, *, b: str) -> str:
        seen.append((a, b))
        if len(seen) == 1:
            raise unavailable()
        return f"{a}{b}"

    assert add.__name__ == "add"
    assert await add(1, b="x") == "1x"
    assert seen == [(1, "x"), (1, "x")]


async def test_events_outside_a_pipeline_have_call_id_0() -> None:
    script, sleep = Script(unavailable(), "ok"), FakeSleep()
    seen, subscription = collect()

    async def next(call: lk.pipeline.Call) -> Any:
        return await call.fn()

    with subscription:
        assert await retry(sleep=sleep).handle(lk.pipeline.Call(script), next) == "ok"
    assert [e.call_id for e in scheduled(seen)] == [0]


# --- through real litellm -----------------------------------------------------------------------


@asyncio_only
async def test_retries_a_500_from_a_provider_through_litellm(fake_provider: FakeProvider) -> None:
    import litellm

    fake_provider.script("m", [Behavior(fault=Fault.HTTP_500), Behavior()])
    sleep = FakeSleep()

    @retry(sleep=sleep)
    async def ask(question: str) -> Any:
        try:
            return await litellm.acompletion(
                model="openai/m",
                api_base=fake_provider.base_url,
                api_key="k",
                max_retries=0,
                messages=[{"role": "user", "content": question}],
            )
        except Exception as exc:
            raise provider_error(exc, target="openai/m") from exc

    seen, subscription = collect()
    with subscription:
        response = await ask("Why is my p99 so bad?")
    assert response.choices[0].message.content
    assert [a.status for a in fake_provider.attempts] == [500, 200]
    assert len(sleep.waits) == 1
    [event] = scheduled(seen)
    assert (event.attempt, event.reason_kind) == (2, lk.ErrorKind.SERVER_ERROR)


def test_invalid_policy_options_fail_at_construction_naming_the_field() -> None:
    def sync_sleep(seconds: float) -> None: ...

    # A sync sleep used to pass and fail at the first retry ("can't be used in 'await'").
    with pytest.raises(TypeError, match=r"retry\.sleep must be an async function"):
        lk.Retry(sleep=sync_sleep)  # type: ignore[arg-type]
    # A tiny window used to overflow the budget's slot arithmetic (OverflowError).
    with pytest.raises(ValueError, match=r"RetryBudget\.ttl must be at least 0\.01"):
        lk.RetryBudget(0.1, ttl=1e-320)
    lk.RetryBudget(0.1, ttl=0.01)  # the smallest window accepted
