"""The fault matrix: lk.LLM with retry, breaker and failover against the fake provider, through
every entry point (acompletion, aembedding, aresponses, and the sync forms called from a worker
thread of the test's event loop) on both lanes (aresponses: litellm's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]


LANE = "litellm"  # the transport of every target these tests make (see the way fixture)
ENTRY = "acompletion"  # the entry point every call goes through (see ask)
DIMENSIONS = 8  # what every target declares (the fake provider's vectors' length)
SYNC = ("completion", "embedding")
_made: list[lk.LLM] = []  # the LLMs of the test: their sync loop threads are closed after it

# Both async entry points on both lanes; the sync ones (the same pipeline on the LLM's own
# loop thread: only that layer is new) one lane each.
WAYS = [
    ("acompletion", "litellm"),
    ("acompletion", "openai"),
    ("aembedding", "litellm"),
    ("aembedding", "openai"),
    ("aresponses", "litellm"),
    ("completion", "litellm"),
    ("embedding", "openai"),
]


@pytest.fixture(autouse=True, params=WAYS, ids=["-".join(way) for way in WAYS])
def way(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """Every test runs through each entry point, on a lane: through litellm, or the fast lane."""
    global ENTRY, LANE
    ENTRY, LANE = request.param
    yield request.param
    ENTRY, LANE = "acompletion", "litellm"
    while _made:
        _made.pop().close()


def embeds() -> bool:
    return ENTRY in ("aembedding", "embedding")


async def ask(llm: lk.LLM, messages: list[dict[str, Any]] = MESSAGES, **kwargs: Any) -> Any:
    """One call of ``llm`` through the entry point under test: a chat of ``messages``, or an
    embedding of their text; a sync one from a worker thread. A stream is read to its end."""
    if embeds():
        if kwargs.get("stream"):
            pytest.skip("embeddings do not stream")
        kwargs["input"] = messages[-1]["content"]
    elif ENTRY == "aresponses":
        kwargs["input"] = messages
    else:
        kwargs["messages"] = messages
    method = getattr(llm, ENTRY)
    if ENTRY not in SYNC:
        result = await method(**kwargs)
        if kwargs.get("stream"):
            async with result:
                async for _ in result:
                    pass
        return result
    _made.append(llm)

    def call() -> Any:
        result = method(**kwargs)
        if kwargs.get("stream"):
            with result:
                for _ in result:
                    pass
        return result

    return await anyio.to_thread.run_sync(call)


def target(fake: FakeProvider, model: str, **extra: Any) -> dict[str, Any]:
    extra.setdefault("transport", LANE)
    extra.setdefault("dimensions", DIMENSIONS)
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": "sk-fake", **extra}


def llm_on(fake: FakeProvider, **options: Any) -> lk.LLM:
    """``openai/primary`` on the fake provider, on the lane under test."""
    options.setdefault("transport", LANE)
    options.setdefault("dimensions", DIMENSIONS)
    return lk.LLM("openai/primary", api_base=fake.base_url, api_key="sk-fake", **options)


def resilient(fake: FakeProvider, **options: Any) -> lk.LLM:
    options.setdefault("retry", lk.Retry(max_attempts=3, initial=0.5))
    options.setdefault("failover", [target(fake, "secondary")])
    return llm_on(fake, **options)


def models(fake: FakeProvider) -> list[str]:
    return [a.model for a in fake.attempts]


async def test_429_with_retry_after_is_retried_after_the_wait(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", [Behavior(fault=Fault.HTTP_429, retry_after=2), Behavior()])
    llm = resilient(fake, deadline=10)
    started = time.monotonic()
    response = await ask(llm)
    assert lk.report(response).target == "openai/primary"
    first, second = fake.attempts
    assert second.arrived_at - first.arrived_at >= 1.8
    assert time.monotonic() - started < 5


async def test_429_whose_wait_does_not_fit_fails_over_at_once(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HTTP_429, retry_after=2))
    llm = resilient(fake, deadline=1.0)
    started = time.monotonic()
    response = await ask(llm)
    assert lk.report(response).target == "openai/secondary"
    assert models(fake) == ["primary", "secondary"]
    assert time.monotonic() - started < 0.9


async def test_persistent_429_backs_off_then_fails_over(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HTTP_429))
    llm = resilient(fake, deadline=10)
    response = await ask(llm)
    assert lk.report(response).target == "openai/secondary"
    primary = [a for a in fake.attempts if a.model == "primary"]
    assert 2 <= len(primary) <= 4  # no tight loop: backoff between attempts, then failover
    assert primary[-1].arrived_at - primary[0].arrived_at < 3.0


async def test_500_once_is_retried_on_the_same_target(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", [Behavior(fault=Fault.HTTP_500), Behavior()])
    response = await ask(resilient(fake))
    report = lk.report(response)
    assert report.target == "openai/primary" and report.answering_attempt == 2
    assert str(report).startswith("openai/primary answered after 2 attempts (retried), total ")
    assert models(fake) == ["primary", "primary"]


async def test_persistent_503_fails_over_within_the_budget(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    response = await ask(resilient(fake, deadline=10))
    assert lk.report(response).target == "openai/secondary"
    assert models(fake).count("primary") <= 3


async def test_reset_before_headers_is_survived(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.RESET_BEFORE_HEADERS))
    response = await ask(resilient(fake, deadline=10))
    report = lk.report(response)
    assert report.target == "openai/secondary"
    assert {a.error_kind for a in report.attempts if a.outcome == "error"} == {
        lk.ErrorKind.CONNECTION
    }


async def test_a_silent_target_times_out_fails_over_and_is_not_retried(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HANG))
    llm = llm_on(
        fake,
        timeout=0.5,
        deadline=3.0,
        retry=lk.Retry(max_attempts=3),
        failover=[target(fake, "secondary", timeout=5)],
    )
    started = time.monotonic()
    response = await ask(llm)
    assert time.monotonic() - started < 3.0
    assert lk.report(response).target == "openai/secondary"
    assert models(fake) == ["primary", "secondary"]
    [silent] = [a for a in lk.report(response).attempts if a.target == "openai/primary"]
    assert silent.error_kind is lk.ErrorKind.TIMEOUT


async def test_context_length_goes_only_to_a_larger_model(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(context_window=50))
    fake.script("secondary", Behavior(context_window=50))
    llm = llm_on(
        fake,
        context_window=50,
        retry=lk.Retry(),
        failover=[
            target(fake, "secondary", context_window=50),
            target(fake, "large", context_window=100_000),
        ],
    )
    long_prompt = [{"role": "user", "content": "word " * 400}]
    response = await ask(llm, long_prompt)
    assert lk.report(response).target == "openai/large"
    assert models(fake) == ["primary", "large"]  # exactly one primary attempt, no smaller model


async def test_context_length_without_a_larger_model_is_a_clear_error(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(context_window=50))
    llm = resilient(fake, context_window=50)
    with pytest.raises(lk.ContextLengthExceeded) as info:
        await ask(llm, [{"role": "user", "content": "word " * 400}])
    assert "maximum context length" in info.value.provider_message
    assert models(fake) == ["primary"]


async def test_content_filter_is_raised_after_exactly_one_attempt(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.CONTENT_POLICY))
    with pytest.raises(lk.ContentPolicyViolation) as info:
        await ask(resilient(fake))
    assert "flagged: violence" in str(info.value)
    assert models(fake) == ["primary"]
    assert len(info.value.attempts) == 1


async def test_accounting_names_the_answering_target_and_its_usage(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    fake.script("secondary", Behavior(output_tokens=7))
    response = await ask(resilient(fake, retry=None))
    report = lk.report(response)
    assert report.target == "openai/secondary" and report.model == "secondary"
    if embeds():  # "hello": one input token, and no output
        assert (response.usage.prompt_tokens, response.usage.total_tokens) == (1, 1)
    elif ENTRY == "aresponses":  # the Responses API's words
        assert response.usage.output_tokens == 7
    else:
        assert response.usage.completion_tokens == 7
    assert [(a.target, a.outcome) for a in report.attempts] == [
        ("openai/primary", "error"),
        ("openai/secondary", "ok"),
    ]


async def test_all_targets_failing_raise_the_primary_error_with_the_others(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    fake.script("secondary", Behavior(fault=Fault.HTTP_500))
    with pytest.raises(lk.ProviderUnavailable) as info:
        await ask(resilient(fake, retry=None))
    assert info.value.target == "openai/primary"
    assert [type(e).__name__ for e in info.value.others] == ["ProviderUnavailable"]
    assert [a.target for a in info.value.attempts] == ["openai/primary", "openai/secondary"]


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_flapping_primary_opens_probes_and_closes_the_breaker(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    outage_ends = time.monotonic() + 6.0

    def flapping(request: RequestInfo) -> Behavior:
        return Behavior(fault=Fault.HTTP_503) if request.arrived_at < outage_ends else Behavior()

    fake.script("primary", flapping)
    open_duration, interval = 3.0, 1.2
    llm = resilient(
        fake,
        retry=None,
        breaker={
            "minimum_calls": 2,
            "window_size": 4,
            "failure_rate": 0.5,
            "open_duration": open_duration,
            "half_open_calls": 1,
        },
    )
    seen: list[lk.events.Event] = []
    answered_by: list[tuple[float, str]] = []
    with lk.subscribe(seen.append):
        for _ in range(10):
            response = await ask(llm)  # every call is answered
            answered_by.append((time.monotonic(), lk.report(response).target))
            await anyio.sleep(interval)
    changes = [
        (e.from_state.value, e.to_state.value)
        for e in seen
        if isinstance(e, lk.policies.breaker.BreakerStateChanged) and e.key == "openai/primary"
    ]
    assert ("closed", "open") in changes
    assert ("open", "half_open") in changes
    assert changes[-1] == ("half_open", "closed")
    assert any(isinstance(e, lk.events.TargetSkipped) and e.reason == "breaker_open" for e in seen)
    back = [at for at, who in answered_by if who == "openai/primary" and at >= outage_ends]
    assert back and back[0] - outage_ends <= open_duration + interval + 0.5
    assert answered_by[-1][1] == "openai/primary"


async def test_failover_on_opts_in_to_more_errors(fake_provider: FakeProvider) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.CONTENT_POLICY))
    llm = resilient(fake, failover_on=lambda exc: True)  # e.g. a less strict second provider
    response = await ask(llm)
    assert lk.report(response).target == "openai/secondary"
    assert models(fake) == ["primary", "secondary"]


# --- a silent close after a long silence (issue 9, item 12) --------------------------------------


def silent_close_llm(fake: FakeProvider, **options: Any) -> lk.LLM:
    # timeout 1.0: a failure after 0.5 s or more is a slow one (half the attempt timeout).
    options.setdefault("retry", lk.Retry(max_attempts=3, initial=0.05, max_wait=0.05))
    return llm_on(fake, timeout=1.0, **options)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_silent_close_after_a_long_silence_fails_over_without_a_retry(
    fake_provider: FakeProvider, stream: bool
) -> None:
    fake = fake_provider
    fake.script("primary", Behavior(fault=Fault.CLOSE_BEFORE_HEADERS, ttft=0.7))
    llm = silent_close_llm(fake, failover=[target(fake, "secondary")])
    seen: list[lk.events.Event] = []
    started = time.monotonic()
    with lk.subscribe(seen.append):
        response = await ask(llm, stream=stream)
    assert time.monotonic() - started < 3.0
    assert lk.report(response).target == "openai/secondary"
    assert models(fake) == ["primary", "secondary"]  # the silent target was not asked again
    [closed] = [a for a in lk.report(response).attempts if a.target == "openai/primary"]
    assert closed.error_kind is lk.ErrorKind.CONNECTION and closed.duration >= 0.6
    assert [e.reason for e in seen if isinstance(e, lk.policies.retry.RetryGaveUp)] == [
        "slow_failure"
    ]


async def test_a_quick_close_is_retried_a_slow_one_is_raised(
    fake_provider: FakeProvider,
) -> None:
    fake = fake_provider
    fake.script(
        "primary",
        [
            Behavior(fault=Fault.CLOSE_BEFORE_HEADERS),  # at once: worth another attempt
            Behavior(fault=Fault.CLOSE_BEFORE_HEADERS, ttft=0.7),  # after a long silence
            Behavior(),
        ],
    )
    started = time.monotonic()
    with pytest.raises(lk.ProviderConnectionError) as info:
        await ask(silent_close_llm(fake))
    assert time.monotonic() - started < 1.6  # one long silence, not two
    assert models(fake) == ["primary", "primary"]
    assert [a.error_kind for a in info.value.attempts] == [lk.ErrorKind.CONNECTION] * 2
