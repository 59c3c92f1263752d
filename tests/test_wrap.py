"""latencykit.wrap: litellm's call functions as latencykit attempts, under the decorators."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, read_all, text_of
from latencykit.testing import Behavior, FakeProvider, Fault
from latencykit.wrap import acompletion

pytestmark = pytest.mark.anyio


def ask_on(fake: FakeProvider, model: str, **options: Any) -> Callable[..., Awaitable[Any]]:
    async def ask(**kwargs: Any) -> Any:
        return await acompletion(
            model=f"openai/{model}", api_base=fake.base_url, api_key=KEY, **options, **kwargs
        )

    return ask


async def test_a_decorated_retry_is_the_only_one_and_sees_typed_errors(
    fake: FakeProvider,
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    ask = lk.retry(max_attempts=2, initial=0.01, max_wait=0.01)(ask_on(fake, "down"))
    with pytest.raises(lk.ProviderUnavailable) as info:
        await ask(messages=MESSAGES)
    assert len(fake.attempts) == 2  # litellm's own retries would have made 6
    assert type(info.value.__cause__).__module__.startswith("litellm")
    assert info.value.attempts and info.value.attempts[-1].target == "openai/down"
    assert KEY not in repr(info.value) and KEY not in str(info.value)


async def test_rate_limits_and_answers_read_as_an_llm_s(fake: FakeProvider) -> None:
    fake.script("busy", Behavior(fault=Fault.HTTP_429, retry_after=7))
    with pytest.raises(lk.RateLimited):
        await ask_on(fake, "busy")(messages=MESSAGES)
    response = await ask_on(fake, "ok")(messages=MESSAGES)
    assert response.choices[0].message.content
    report = lk.report(response)
    assert report.target == "openai/ok" and len(report.attempts) == 1


async def test_litellm_retries_are_refused_by_name(fake: FakeProvider) -> None:
    for name in ("num_retries", "max_retries"):
        with pytest.raises(ValueError, match=name):
            await ask_on(fake, "ok")(messages=MESSAGES, **{name: 3})
    assert fake.attempts == []


async def test_streams_follow_the_content_rule(fake: FakeProvider) -> None:
    fake.script("cut", Behavior(fault=Fault.CUT, stall_after=3))
    stream = await ask_on(fake, "cut")(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.reason == "cut" and info.value.partial_text
    whole = await read_all(await ask_on(fake, "ok")(messages=MESSAGES, stream=True))
    assert text_of(whole)


async def test_the_enclosing_deadline_closes_the_request(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    ask = lk.deadline(0.3)(ask_on(fake, "slow"))
    with pytest.raises(lk.DeadlineExceeded):
        await ask(messages=MESSAGES)
    raised_at = time.monotonic()
    [attempt] = await fake.wait_for_async(lambda a: len(a) == 1 and a[0].disconnected, 2.0)
    assert attempt.disconnected_at is not None and attempt.disconnected_at - raised_at <= 0.5


async def test_embeddings_and_responses_are_wrapped_too(fake: FakeProvider) -> None:
    from latencykit.wrap import aembedding, aresponses

    vectors = await aembedding(
        model="openai/text-embedding-3-small", api_base=fake.base_url, api_key=KEY, input="hi"
    )
    assert vectors.data and lk.report(vectors).attempts
    fake.script("gpt-4o-mini", Behavior(fault=Fault.HTTP_429))
    with pytest.raises(lk.RateLimited):
        await aresponses(model="openai/gpt-4o-mini", api_base=fake.base_url, api_key=KEY, input="x")
