"""The fast lane (transport="openai"): what is particular to it. Every policy's behaviour on it
is tested by the fault matrix (tests/test_faults.py, tests/test_stream.py run on both lanes)."""

from __future__ import annotations

from typing import Any

import litellm
import pytest

import latencykit as lk
from latencykit._openai import Node
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
SECRET = "sk-fast-lane-secret-0123456789"


@pytest.fixture
def fake(fake_provider: FakeProvider) -> FakeProvider:
    return fake_provider


def fast(fake: FakeProvider, model: str = "primary", **options: Any) -> lk.LLM:
    return lk.LLM(
        f"openai/{model}", api_base=fake.base_url, api_key=SECRET, transport="openai", **options
    )


def bodies(fake: FakeProvider, model: str, behavior: Behavior) -> list[RequestInfo]:
    received: list[RequestInfo] = []

    def script(request: RequestInfo) -> Behavior:
        received.append(request)
        return behavior

    fake.script(model, script)
    return received


async def test_a_response_is_litellms_model_response(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(text="Paris is the capital."))
    response = await fast(fake).acompletion(messages=MESSAGES, temperature=0)
    assert type(response).__name__ == "ModelResponse"
    [choice] = response.choices
    assert choice.message.content == "Paris is the capital."
    assert choice.finish_reason == "stop"
    assert response.usage.completion_tokens > 0
    report = lk.report(response)
    assert report.target == "openai/primary" and report.answered_by == 1


async def test_chunks_read_like_litellms_and_build_a_response(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(text="one two three"))
    stream = await fast(fake).acompletion(
        messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    first = chunks[0]
    assert isinstance(first, Node) and first.choices[0].delta.content == "one"
    assert first.id and first.model == "primary"
    assert chunks[-1].usage.completion_tokens == 3
    assert first.choices[0].delta.tool_calls is None  # an absent field reads as None
    built = litellm.stream_chunk_builder(chunks)
    assert built is not None
    assert built.choices[0].message.content == "one two three"  # type: ignore[union-attr]
    assert stream.output_tokens == 3 and stream.skipped == 0


async def test_the_request_carries_the_key_headers_and_body_as_given(fake: FakeProvider) -> None:
    received = bodies(fake, "primary", Behavior())
    await fast(fake).acompletion(
        messages=MESSAGES,
        temperature=0.5,
        extra_headers={"X-Team": "search"},
        extra_body={"top_k": 5},
    )
    [request] = received
    assert request.body["model"] == "primary"  # the provider's name, without litellm's prefix
    assert request.body["temperature"] == 0.5 and request.body["top_k"] == 5
    assert "extra_headers" not in request.body and "extra_body" not in request.body
    assert request.headers["x-team"] == "search"
    assert request.headers["authorization"] == "***"  # the fake redacts what it records


async def test_errors_are_typed_and_never_show_the_key(fake: FakeProvider) -> None:
    fake.script(
        "primary",
        Behavior(fault=Fault.HTTP_ERROR, status=401, error_message=f"invalid key {SECRET}"),
    )
    with pytest.raises(lk.AuthenticationFailed) as info:
        await fast(fake).acompletion(messages=MESSAGES)
    assert info.value.status_code == 401
    cause = info.value.__cause__
    assert SECRET not in str(info.value) and SECRET not in repr(cause)
    assert SECRET not in repr(getattr(cause, "body", None))


async def test_connections_are_kept_alive_for_responses_and_streams(fake: FakeProvider) -> None:
    llm = fast(fake)
    for _ in range(10):
        await llm.acompletion(messages=MESSAGES)
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for _chunk in stream:
                pass
    assert len(fake.attempts) == 20
    assert fake.connections_opened == 1  # a stream read to [DONE] gives its connection back


async def test_a_failover_target_may_take_the_fast_lane(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    llm = lk.LLM(
        "openai/primary",
        api_base=fake.base_url,
        api_key=SECRET,
        failover=[
            {
                "model": "openai/backup",
                "api_base": fake.base_url,
                "api_key": SECRET,
                "transport": "openai",
            }
        ],
    )
    response = await llm.acompletion(messages=MESSAGES)
    assert lk.report(response).target == "openai/backup"
    assert [t.transport for t in llm.targets] == ["litellm", "openai"]


async def test_a_bad_transport_fails_at_construction_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"target\.transport"):
        lk.Target("openai/x", transport="grpc")
    with pytest.raises(ValueError, match=r"target\.transport"):
        lk.LLM("openai/x", transport="grpc")
    with pytest.raises(ValueError, match=r"LLM\.failover\[0\].*transport"):
        lk.LLM("openai/x", failover=[{"model": "openai/y", "transport": "grpc"}])
