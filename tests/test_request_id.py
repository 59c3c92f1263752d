"""The provider's request id (``x-request-id``, Anthropic's ``request-id``, Azure's
``apim-request-id``...) of every attempt's answer, success or failure, on both lanes: on the
typed error (``ProviderError.request_id`` and ``str()``), on each attempt of ``lk.report`` and
of ``error.attempts``, on a stream's break, and on the attempt's span. The fake provider names
each answer ``req_fake_<attempt index>``; raw-socket servers (tests/wire.py) send the other
providers' header names."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import latencykit as lk
from helpers import KEY, MESSAGES, make_llm, read_all, target
from latencykit import telemetry
from latencykit.errors import REQUEST_ID_HEADERS, request_id
from latencykit.testing import Behavior, FakeProvider, Fault
from wire import chunk, http, raw_server, sse

LANES = ("litellm", "openai")
SSE = "text/event-stream"


def sent(fake: FakeProvider) -> list[str]:
    """The request ids the fake provider sent, in the order its attempts arrived."""
    return [f"req_fake_{attempt.index}" for attempt in fake.attempts]


# --- the one reader of the headers --------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-request-id": "req_1"}, "req_1"),
        ({"request-id": "req_anthropic"}, "req_anthropic"),
        ({"apim-request-id": "apim-1", "x-ms-region": "East US"}, "apim-1"),
        ({"x-ms-request-id": "ms-1"}, "ms-1"),
        ({"x-amzn-requestid": "amzn-1"}, "amzn-1"),
        ({"x-goog-request-id": "goog-1"}, "goog-1"),
        # the first of REQUEST_ID_HEADERS wins, whatever the order sent
        ({"apim-request-id": "apim-2", "x-request-id": "req_2"}, "req_2"),
        # litellm's copies of the provider's headers
        ({"llm_provider-request-id": "req_3", "content-type": "x"}, "req_3"),
        ({}, None),
        ({"x-request-id": ""}, None),
        ({"x-request-id": "  "}, None),
        ({"content-type": "application/json"}, None),
    ],
)
def test_the_request_id_is_read_from_the_headers(
    headers: dict[str, str], expected: str | None
) -> None:
    assert request_id(headers) == expected
    if not any(name.startswith("llm_provider-") for name in headers):
        # httpx's headers (the fast lane's), case-insensitive, give the same
        as_sent = httpx.Headers({name.upper(): value for name, value in headers.items()})
        assert request_id(as_sent) == expected


def test_a_request_id_is_cut_and_none_is_none() -> None:
    assert request_id(None) is None
    assert request_id({"x-request-id": "r" * 1000}) == "r" * 200
    assert REQUEST_ID_HEADERS[0] == "x-request-id"


# --- both lanes, against the fake provider ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
async def test_a_success_records_its_request_id(
    fake: FakeProvider, transport: str, stream: bool
) -> None:
    fake.script("primary", Behavior(text="one two three"))
    llm = make_llm(fake, transport=transport)
    answer: Any = await llm.acompletion(messages=MESSAGES, stream=stream)
    if stream:
        await read_all(answer)
    [attempt] = lk.report(answer).attempts
    assert attempt.request_id == sent(fake)[0]
    assert f"(request id {attempt.request_id})" in str(attempt)
    await llm.aclose()


ERRORS = {
    "429": (Behavior(fault=Fault.HTTP_429, retry_after=1), lk.RateLimited),
    "500": (Behavior(fault=Fault.HTTP_500), lk.ProviderUnavailable),
    "401": (Behavior(fault=Fault.HTTP_ERROR, status=401), lk.AuthenticationFailed),
}


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
@pytest.mark.parametrize("status", ERRORS)
async def test_an_error_answer_carries_its_request_id(
    fake: FakeProvider, transport: str, stream: bool, status: str
) -> None:
    behavior, error_type = ERRORS[status]
    fake.script("primary", behavior)
    llm = make_llm(fake, transport=transport)
    with pytest.raises(error_type) as caught:
        await llm.acompletion(messages=MESSAGES, stream=stream)
    error = caught.value
    [expected] = sent(fake)
    assert error.request_id == expected
    assert f"\nrequest id: {expected}\n" in str(error)
    assert [attempt.request_id for attempt in error.attempts] == [expected]
    await llm.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
async def test_a_stream_cut_midway_carries_its_request_id(
    fake: FakeProvider, transport: str
) -> None:
    fake.script("primary", Behavior(text="a b c d e f g", fault=Fault.CUT, stall_after=3))
    llm = make_llm(fake, transport=transport)
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as caught:
        await read_all(stream)
    error = caught.value
    [expected] = sent(fake)
    assert error.reason == "cut" and error.chunks > 0
    assert error.request_id == expected == stream.request_id
    assert f"\nrequest id: {expected}\n" in str(error)
    assert [attempt.request_id for attempt in error.attempts] == [expected]
    await llm.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
async def test_each_attempt_has_its_own_request_id(fake: FakeProvider, transport: str) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_500))
    fake.script("backup", Behavior(text="fine"))
    llm = make_llm(fake, transport=transport, failover=[target(fake, "backup")])
    response = await llm.acompletion(messages=MESSAGES)
    ids = [attempt.request_id for attempt in lk.report(response).attempts]
    assert ids == sent(fake) and len(set(ids)) == 2
    await llm.aclose()


@pytest.mark.anyio
async def test_anthropic_names_it_request_id(fake: FakeProvider) -> None:
    fake.script("claude", Behavior(fault=Fault.HTTP_429, retry_after=1))
    llm = lk.LLM("anthropic/claude", api_base=fake.anthropic_base_url, api_key=KEY)
    with pytest.raises(lk.RateLimited) as caught:
        await llm.acompletion(messages=MESSAGES)
    assert caught.value.request_id == sent(fake)[0]


@pytest.mark.anyio
async def test_the_attempt_span_has_the_request_id(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_500))
    fake.script("backup", Behavior(text="fine"))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    llm = make_llm(fake, failover=[target(fake, "backup")])
    with telemetry.instrument(tracer_provider=tracer_provider):
        await llm.acompletion(messages=MESSAGES)
    found = {
        (span.attributes or {}).get("latencykit.attempt.number"): (span.attributes or {}).get(
            "latencykit.provider.request_id"
        )
        for span in spans.get_finished_spans()
        if span.name.startswith("attempt ")
    }
    assert [found[1], found[2]] == sent(fake)


# --- the same bytes, the same id on both lanes (raw servers) -------------------------------------

ANSWER = (
    b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", '
    b'"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, '
    b'"finish_reason": "stop"}]}'
)
# what Anthropic, Azure (API Management, and both ids at once) name their request ids
HEADERS = {
    "anthropic": ([("request-id", "req_011CAnthropic")], "req_011CAnthropic"),
    "azure": ([("apim-request-id", "0b1c-apim"), ("x-ms-region", "East US")], "0b1c-apim"),
    "azure, both": ([("apim-request-id", "0b1c-apim"), ("x-request-id", "a2d4")], "a2d4"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
@pytest.mark.parametrize("provider", HEADERS)
async def test_the_same_headers_give_the_same_id_on_both_lanes(
    transport: str, provider: str
) -> None:
    headers, expected = HEADERS[provider]

    def llm_of(base: str) -> lk.LLM:
        return lk.LLM("openai/m", api_base=base, api_key="sk-request-id-0000", transport=transport)

    async with raw_server(http(200, ANSWER, headers=headers)) as base:
        llm = llm_of(base)
        response = await llm.acompletion(messages=MESSAGES)
        assert lk.report(response).attempts[0].request_id == expected
        await llm.aclose()
    error_body = b'{"error": {"message": "slow down", "type": "rate_limit_exceeded"}}'
    async with raw_server(http(429, error_body, headers=headers)) as base:
        llm = llm_of(base)
        with pytest.raises(lk.RateLimited) as caught:
            await llm.acompletion(messages=MESSAGES)
        assert caught.value.request_id == expected
        await llm.aclose()
    error_event = b'data: {"error": {"message": "boom", "type": "server_error", "code": 500}}'
    cut = http(200, sse(chunk("Hel"), error_event), content_type=SSE, headers=headers)
    async with raw_server(cut) as base:
        llm = llm_of(base)
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        with pytest.raises(lk.StreamBroken) as broken:
            await read_all(stream)
        assert broken.value.request_id == expected
        assert broken.value.attempts[0].request_id == expected
        await llm.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("transport", LANES)
async def test_a_key_echoed_in_the_request_id_is_scrubbed(transport: str) -> None:
    body = b'{"error": {"message": "bad key", "type": "invalid_request_error"}}'
    async with raw_server(http(401, body, headers=[("x-request-id", KEY)])) as base:
        llm = lk.LLM("openai/m", api_base=base, api_key=KEY, transport=transport)
        with pytest.raises(lk.AuthenticationFailed) as caught:
            await llm.acompletion(messages=MESSAGES)
        await llm.aclose()
    error = caught.value
    assert error.request_id == "***"
    assert KEY not in str(error) and KEY not in repr(error.attempts)
