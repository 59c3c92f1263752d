"""Regressions of the correctness and security review (issue 9), each through real litellm and
the fake provider where it concerns a call."""

from __future__ import annotations

from typing import Any

import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, make_llm, target
from latencykit.errors import scrub
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio


async def test_a_corrupt_200_is_a_transient_provider_fault(fake: FakeProvider) -> None:
    fake.script("corrupt", Behavior(fault=Fault.MALFORMED_CHUNK))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(fake, "corrupt", failover=[target(fake, "good")])
    response = await llm.acompletion(messages=MESSAGES)
    first, answered = lk.report(response).attempts
    assert first.error_kind is lk.ErrorKind.SERVER_ERROR
    assert answered.target == "openai/good" and answered.outcome == "ok"


async def test_a_caller_bug_is_neither_retried_nor_held_against_a_provider(
    fake: FakeProvider,
) -> None:
    llm = make_llm(
        fake,
        "primary",
        failover=[target(fake, "secondary")],
        retry=lk.Retry(max_attempts=3, initial=0.01),
        breaker={"minimum_calls": 1, "window_size": 5},
    )
    for _ in range(3):
        with pytest.raises(lk.ProviderError) as info:
            await llm.acompletion(messages="hi")
        assert lk.errors.classify(info.value) is lk.ErrorKind.UNKNOWN
        assert len(info.value.attempts) == 1  # no retry, no failover
    assert fake.attempts == []  # nothing was ever sent
    for key in ("openai/primary", "openai/secondary"):
        assert lk.policies.breaker.breakers()[key].state is lk.policies.breaker.BreakerState.CLOSED


def test_a_short_key_does_not_mangle_ordinary_text() -> None:
    assert scrub("maximum context length is 4096 tokens", "k") == (
        "maximum context length is 4096 tokens"
    )
    assert scrub("bad key k given", "k") == "bad key *** given"
    assert scrub(f"Incorrect API key provided: {KEY}.", KEY) == "Incorrect API key provided: ***."


def test_a_key_is_never_sent_to_another_host() -> None:
    primary = lk.Target("openai/big", api_base="https://a.example/v1", api_key=KEY)
    assert primary.replace(api_base="https://b.example/v1").api_key is None
    assert primary.replace(model="openai/small").api_key == KEY  # same host: same key
    moved = lk.Degrade(overrides={"api_base": "https://b.example/v1"}).target(primary)
    assert moved.api_base == "https://b.example/v1" and moved.api_key is None
    own = lk.Degrade(overrides={"api_base": "https://b.example/v1", "api_key": "sk-b-999999"})
    assert own.target(primary).api_key == "sk-b-999999"


def test_keys_stay_out_of_reprs() -> None:
    degrade = lk.Degrade(model="openai/small", overrides={"api_key": "sk-secret-degraded-1"})
    llm = lk.LLM(
        "openai/big", api_key=KEY, degrade=degrade, failover=[{"model": "x/y", "api_key": "sk-2"}]
    )
    for text in (repr(llm), repr(degrade), repr(llm.targets)):
        assert KEY not in text and "sk-secret-degraded-1" not in text and "sk-2'" not in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"api_key": 12345}, r"api_key"),
        ({"capabilities": "prefill"}, r"capabilities"),
        ({"failover": 5}, r"LLM\.failover"),
        ({"failover_on": ConnectionError}, r"LLM\.failover_on needs LLM\(failover="),
    ],
)
def test_invalid_targets_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        lk.LLM("openai/x", **options)


async def test_degrade_to_another_endpoint_works_with_failover_targets(
    fake: FakeProvider, fake_provider: FakeProvider
) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("backup", Behavior(ttft=30.0))
    with FakeProvider() as other:
        other.script("cheap", Behavior(output_tokens=3))
        llm = make_llm(
            fake,
            "slow",
            deadline=5.0,
            failover=[target(fake, "backup")],
            degrade=lk.Degrade(
                model="openai/cheap",
                after=0.3,
                overrides={"api_base": other.base_url, "api_key": "sk-other-0000000"},
            ),
        )
        seen: list[lk.events.Event] = []
        with lk.subscribe(seen.append):
            response = await llm.acompletion(messages=MESSAGES)
        assert lk.report(response).degraded
        assert [a.model for a in other.attempts] == ["cheap"]  # the other host answered
    [ended] = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert ended.target == "openai/cheap"  # the target that answered, not the primary


async def test_a_hanging_primary_fails_over_within_the_deadline(fake: FakeProvider) -> None:
    # The README's quickstart shape: a deadline, a failover target, the default 600 s timeout.
    fake.script("hangs", Behavior(fault=Fault.HANG))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(fake, "hangs", deadline=3.0, failover=[target(fake, "good")])
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        response = await llm.acompletion(messages=MESSAGES)
    hung, answered = lk.report(response).attempts
    assert hung.outcome == "cancelled" and 1.3 <= hung.duration <= 1.5 + 0.5  # its share: 3 / 2
    assert answered.target == "openai/good"
    assert any(isinstance(e, lk.events.FailedOver) for e in seen)


async def test_retries_stay_within_their_targets_share(fake: FakeProvider) -> None:
    fake.script("flaky", Behavior(fault=Fault.HTTP_503, ttft=0.2))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(
        fake,
        "flaky",
        deadline=2.0,
        retry=lk.Retry(max_attempts=50, initial=0.01, max_wait=0.02, budget=lk.RetryBudget(10)),
        failover=[target(fake, "good")],
    )
    response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.target == "openai/good"
    flaky = [a for a in report.attempts if a.target == "openai/flaky"]
    assert flaky and sum(a.duration for a in flaky) <= 1.0 + 0.3  # its share of 2 s


async def test_a_half_open_probe_is_one_attempt_never_retried(fake: FakeProvider) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    llm = make_llm(
        fake,
        "down",
        retry=lk.Retry(max_attempts=3, initial=0.001, max_wait=0.002, budget=lk.RetryBudget(10)),
        breaker={"minimum_calls": 2, "window_size": 2, "open_duration": 0.2, "half_open_calls": 1},
    )
    for _ in range(2):  # two calls of 3 attempts each: the breaker sees 2 failed calls, opens
        with pytest.raises(lk.ProviderUnavailable):
            await llm.acompletion(messages=MESSAGES)
    assert len(fake.attempts) == 6
    breaker = lk.policies.breaker.breakers()["openai/down"]
    assert breaker.state is lk.policies.breaker.BreakerState.OPEN
    sent = len(fake.attempts)
    import anyio

    await anyio.sleep(0.3)  # half-open: the next call is a probe
    with pytest.raises(lk.ProviderUnavailable):
        await llm.acompletion(messages=MESSAGES)
    assert len(fake.attempts) == sent + 1  # one probe, not retried
    assert breaker.state is lk.policies.breaker.BreakerState.OPEN


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


def test_invalid_policy_options_fail_at_construction_naming_the_field() -> None:
    def sync_sleep(seconds: float) -> None: ...

    # A sync sleep used to pass and fail at the first retry ("can't be used in 'await'").
    with pytest.raises(TypeError, match=r"retry\.sleep must be an async function"):
        lk.Retry(sleep=sync_sleep)  # type: ignore[arg-type]
    # A tiny window used to overflow the budget's slot arithmetic (OverflowError).
    with pytest.raises(ValueError, match=r"RetryBudget\.ttl must be at least 0\.01"):
        lk.RetryBudget(0.1, ttl=1e-320)
    lk.RetryBudget(0.1, ttl=0.01)  # the smallest window accepted


def test_misspelt_target_fields_are_rejected_and_misspelt_defaults_warned() -> None:
    with pytest.raises(ValueError, match=r"LLM\.failover\[0\].*'contxt_window'.*'context_window'"):
        lk.LLM("openai/x", failover=[{"model": "openai/y", "contxt_window": 5}])
    with pytest.warns(UserWarning, match=r"LLM\.defaults.*'temprature'.*'temperature'"):
        lk.LLM("openai/x", defaults={"temprature": 0})
    # Provider-specific arguments litellm passes through are not typos.
    lk.LLM("openai/x", failover=[{"model": "vertex_ai/y", "vertex_project": "p"}])


_FREEZE_PROBE = """
import gc, os
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import latencykit as lk
before = gc.get_freeze_count()
lk.LLM("openai/x", api_base="http://127.0.0.1:9/v1", api_key="sk-x")
print(before, gc.get_freeze_count())
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", [None, "0"])
def test_the_heap_is_frozen_after_litellm_is_imported_unless_opted_out(
    setting: str | None,
) -> None:
    # A full collection walks litellm's ~1 million objects (a pause of ~150 ms that delays
    # every timer); frozen, they are skipped. Process-wide state: a fresh interpreter each.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LATENCYKIT_GC_FREEZE"}
    if setting is not None:
        env["LATENCYKIT_GC_FREEZE"] = setting
    result = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE], env=env, capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr
    before, after = map(int, result.stdout.split())
    assert before == 0
    if setting is None:
        assert after > 100_000  # litellm's import leaves about a million objects
    else:
        assert after == 0
