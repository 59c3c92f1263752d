"""OpenAI's Responses API: the fake provider's ``/v1/responses`` and latencykit's reading of it
through litellm (complete only on the terminal event; the other endings typed)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import latencykit as lk
from helpers import KEY
from latencykit import _responses
from latencykit.errors import OutputTruncated
from latencykit.target import Target
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

# litellm streams natively only for models it knows; for others it replays a whole answer.
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
