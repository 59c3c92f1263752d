"""OpenAI's Responses API: the fake provider's ``/v1/responses`` and latencykit's reading of it
through litellm (complete only on the terminal event; the other endings typed)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import latencykit as lk
from helpers import KEY, read_all
from latencykit import _responses
from latencykit.errors import OutputTruncated
from latencykit.target import Target
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

# A model litellm knows (the others are registered as streaming natively on their first stream).
MODEL = "gpt-4o-mini"


def events_of(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def post(fake: FakeProvider, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{fake.base_url}/responses", json={"model": MODEL, "input": "hello", **body}, timeout=10
    )


def test_the_fake_answers_a_response_object(fake: FakeProvider) -> None:
    answer = post(fake).json()
    assert answer["object"] == "response" and answer["status"] == "completed"
    [message] = answer["output"]
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["text"]
    assert answer["usage"]["output_tokens"] == 16
    capped = post(fake, max_output_tokens=5).json()
    assert capped["status"] == "incomplete"
    assert capped["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_fake_streams_typed_events_to_one_terminal_event(fake: FakeProvider) -> None:
    fake.script(MODEL, Behavior(reasoning="thinking first"))
    events = events_of(post(fake, stream=True).text)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed" and types.count("response.completed") == 1
    assert "response.reasoning_summary_text.delta" in types
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == events[-1]["response"]["output"][-1]["content"][0]["text"]
    fake.script(MODEL, Behavior(fault=Fault.CUT_WITH_DONE))
    assert "response.completed" not in {e["type"] for e in events_of(post(fake, stream=True).text)}


def target_on(fake: FakeProvider) -> Target:
    return Target(f"openai/{MODEL}", api_base=fake.base_url, api_key=KEY)


async def read(fake: FakeProvider, **arguments: Any) -> tuple[str, str | None]:
    source = _responses.open_events(target_on(fake), {"input": "hello", **arguments}, (KEY,))
    text, finish = "", None
    try:
        async for event in source:
            content, ended = _responses.RESPONSE_EVENTS.read(event)
            text += content or ""
            finish = ended or finish
    finally:
        await source.aclose()
    return text, finish


async def test_a_complete_answer_and_stream(fake: FakeProvider) -> None:
    response = await _responses.respond(target_on(fake), {"input": "hello"}, (KEY,))
    assert response.status == "completed" and response.output_text
    fake.script(MODEL, Behavior(reasoning="not content"))
    text, finish = await read(fake)
    assert finish == "stop" and text == response.output_text  # reasoning is not content


@pytest.mark.parametrize(
    ("behavior", "error", "reason"),
    [
        (Behavior(fault=Fault.CUT, stall_after=3), lk.StreamBroken, "cut"),
        (Behavior(fault=Fault.CUT_WITH_DONE, stall_after=3), lk.StreamBroken, "cut"),
        (Behavior(fault=Fault.MISSING_DONE), lk.StreamBroken, "cut"),
        (Behavior(fault=Fault.ERROR_EVENT, stall_after=3), lk.StreamBroken, "error"),
        (Behavior(fault=Fault.HTTP_429, retry_after=3), lk.RateLimited, None),
        (Behavior(fault=Fault.CONTENT_POLICY), lk.ContentPolicyViolation, None),
    ],
)
async def test_a_stream_that_did_not_finish_raises_its_typed_error(
    fake: FakeProvider, behavior: Behavior, error: type[Exception], reason: str | None
) -> None:
    fake.script(MODEL, behavior)
    with pytest.raises(error) as info:
        await read(fake)
    assert getattr(info.value, "reason", None) == reason
    assert KEY not in str(info.value)


async def test_an_answer_stopped_at_its_cap_is_truncated_with_its_text(
    fake: FakeProvider,
) -> None:
    fake.script(MODEL, Behavior(output_tokens=40))
    with pytest.raises(OutputTruncated) as answered:
        await _responses.respond(target_on(fake), {"input": "hi", "max_output_tokens": 16}, ())
    with pytest.raises(OutputTruncated) as streamed:
        await read(fake, max_output_tokens=16)
    assert answered.value.partial_text == streamed.value.partial_text
    assert streamed.value.partial_text.split() == [f"tok{i}" for i in range(16)]


def llm_on(fake: FakeProvider, **options: Any) -> lk.LLM:
    return lk.LLM(f"openai/{MODEL}", api_base=fake.base_url, api_key=KEY, **options)


async def test_llm_answers_and_reports(fake: FakeProvider) -> None:
    response = await llm_on(fake).aresponses(input="hello", priority="interactive")
    assert response.status == "completed" and response.output_text
    report = lk.report(response)
    assert report.target == f"openai/{MODEL}" and len(report.attempts) == 1


async def test_llm_streams_events_committed_on_the_first_output_text(
    fake: FakeProvider,
) -> None:
    fake.script(MODEL, Behavior(reasoning="thinking", ttft=0.05))
    async with await llm_on(fake, deadline=10).aresponses(input="hello", stream=True) as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == stream.partial_text and stream.outcome == "ok"
    assert lk.report(stream).ttft is not None


async def test_llm_fails_over_a_failing_or_cut_target(fake: FakeProvider) -> None:
    backup = {"model": "openai/gpt-4o", "api_base": fake.base_url, "api_key": KEY}
    llm = llm_on(fake, failover=[backup])
    fake.script(MODEL, Behavior(fault=Fault.HTTP_503))
    response = await llm.aresponses(input="hello")
    assert lk.report(response).target == "openai/gpt-4o"
    fake.script(MODEL, Behavior(fault=Fault.CUT_WITH_DONE, stall_after=0))
    async with await llm.aresponses(input="hello", stream=True) as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.completed" and lk.report(stream).target == "openai/gpt-4o"


async def test_llm_raises_a_cut_after_the_first_text_with_the_partial_text(
    fake: FakeProvider,
) -> None:
    fake.script(MODEL, Behavior(fault=Fault.MISSING_DONE))
    stream = await llm_on(fake).aresponses(input="hello", stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.reason == "cut" and info.value.partial_text
    assert [a.outcome for a in info.value.attempts] == ["error"]


async def test_llm_truncation_and_the_deadline(fake: FakeProvider) -> None:
    fake.script(MODEL, Behavior(output_tokens=40))
    with pytest.raises(OutputTruncated):
        await llm_on(fake).aresponses(input="hello", max_output_tokens=16)
    fake.script(MODEL, Behavior(ttft=30.0))
    with pytest.raises(lk.DeadlineExceeded):
        await llm_on(fake, deadline=0.3).aresponses(input="hello")
    await fake.wait_for_async(lambda a: a[-1].disconnected, 2.0)


def test_what_aresponses_refuses(fake: FakeProvider) -> None:
    fast = lk.LLM(f"openai/{MODEL}", api_base=fake.base_url, api_key=KEY, transport="openai")
    degraded = llm_on(fake, degrade=lk.Degrade(model="openai/gpt-4o"))
    with pytest.raises(ValueError, match="transport='openai'"):
        fast.responses(input="hello")
    with pytest.raises(ValueError, match="degrade"):
        degraded.responses(input="hello")
    with pytest.raises(ValueError, match="max_retries"):
        llm_on(fake).responses(input="hello", max_retries=2)
    assert fake.attempts == []


def test_sync_responses(fake: FakeProvider) -> None:
    llm = llm_on(fake)
    try:
        assert llm.responses(input="hello").output_text
        with llm.responses(input="hello", stream=True) as stream:
            types = [event.type for event in stream]
        assert types[-1] == "response.completed"
    finally:
        llm.close()


async def test_the_response_cache_lets_responses_calls_by(fake: FakeProvider) -> None:
    from latencykit.cache import ResponseCache

    llm = llm_on(fake, cache=ResponseCache())
    first = await llm.aresponses(input="hello")
    second = await llm.aresponses(input="hello")
    assert first.output_text == second.output_text and len(fake.attempts) == 2
    assert lk.report(second).cache is None


async def test_a_model_of_ones_own_streams_natively(fake: FakeProvider) -> None:
    llm = lk.LLM("openai/my-own-model", api_base=fake.base_url, api_key=KEY)
    fake.script("my-own-model", Behavior(ttft=0.05, itl=0.05))
    async with await llm.aresponses(input="hello", stream=True) as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    assert [a.stream for a in fake.attempts] == [True]  # not a whole answer replayed
