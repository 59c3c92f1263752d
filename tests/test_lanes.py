"""The same bytes, the same answer on both lanes: litellm and the fast lane (``transport="openai"``)
raise the same error type, kind and reason for each fault a server may send, and agree on what
is an answer at all. The servers here are raw sockets writing exact bytes (tests/wire.py), not
the project's fake provider: they send what no script of ours would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit.errors import ErrorKind
from wire import chunk, http, raw_server, sse

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]
SSE = "text/event-stream"
LANES = ("litellm", "openai")
VLLM_ERROR_EVENT = (
    b'data: {"error": {"object": "error", "type": "InternalServerError", '
    b'"message": "boom", "code": 500}}'
)
FILTER_EVENT = (
    b'data: {"error": {"message": "flagged", "type": "invalid_request_error", '
    b'"code": "content_filter"}}'
)

# name: (answer bytes, error type, kind, stream break reason or None)
STREAM_FAULTS: dict[str, tuple[Any, type[Exception], ErrorKind, str | None]] = {
    "cut in a chunked body": (
        http(200, sse(chunk("Hel"), chunk("lo")), content_type=SSE, chunked=True, cut=True),
        lk.StreamBroken,
        ErrorKind.STREAM_BROKEN,
        "cut",
    ),
    "body ends without a finish": (
        http(200, sse(chunk("Hel"), chunk("lo")), content_type=SSE),
        lk.StreamBroken,
        ErrorKind.STREAM_BROKEN,
        "cut",
    ),
    "error event before content": (
        http(200, sse(chunk(role="assistant", content=""), VLLM_ERROR_EVENT), content_type=SSE),
        lk.StreamBroken,
        ErrorKind.STREAM_BROKEN,
        "error",
    ),
    "error event after content": (
        http(200, sse(chunk("Hel"), VLLM_ERROR_EVENT), content_type=SSE),
        lk.StreamBroken,
        ErrorKind.STREAM_BROKEN,
        "error",
    ),
    "content filter event after content": (
        http(200, sse(chunk("Hel"), FILTER_EVENT), content_type=SSE),
        lk.ContentPolicyViolation,
        ErrorKind.CONTENT_POLICY,
        None,
    ),
    "an HTML page": (
        http(200, b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        lk.ProviderUnavailable,
        ErrorKind.SERVER_ERROR,
        None,
    ),
    "events that are not JSON": (
        http(200, sse(b"data: {not json", b"data: {nope"), content_type=SSE),
        lk.StreamBroken,
        ErrorKind.STREAM_BROKEN,
        "error",
    ),
    "429 with Retry-After": (
        http(
            429,
            b'{"error": {"message": "slow down", "type": "rate_limit_exceeded"}}',
            headers=[("retry-after", "7")],
        ),
        lk.RateLimited,
        ErrorKind.RATE_LIMITED,
        None,
    ),
    "529 overloaded": (
        http(529, b'{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'),
        lk.ProviderUnavailable,
        ErrorKind.SERVER_ERROR,
        None,
    ),
    "context length": (
        http(
            400,
            b'{"error": {"message": "maximum context length is 10 tokens", '
            b'"type": "invalid_request_error", "code": "context_length_exceeded"}}',
        ),
        lk.ContextLengthExceeded,
        ErrorKind.CONTEXT_LENGTH,
        None,
    ),
}


def llm(base: str, transport: str) -> lk.LLM:
    return lk.LLM("openai/m", api_base=base, api_key="sk-lanes-0000", transport=transport)


async def read_all(stream: Any) -> str:
    async with stream:
        async for _ in stream:
            pass
    return str(stream.partial_text)


@pytest.mark.parametrize("fault", STREAM_FAULTS)
async def test_a_stream_fault_is_the_same_error_on_both_lanes(fault: str) -> None:
    answer, error_type, kind, reason = STREAM_FAULTS[fault]
    seen = []
    for transport in LANES:
        async with raw_server(answer) as base:
            with pytest.raises(lk.ProviderError) as caught:
                await read_all(
                    await llm(base, transport).acompletion(messages=MESSAGES, stream=True)
                )
        error = caught.value
        seen.append((transport, type(error), error.kind, getattr(error, "reason", None)))
        assert type(error) is error_type, (transport, error)
        assert error.kind is kind and lk.errors.classify(error) is kind
        assert getattr(error, "reason", None) == reason, (transport, error)
        if isinstance(error, lk.StreamBroken):
            assert error.status_code is None and "HTTP 500" not in str(error)
        if error_type is lk.RateLimited:
            assert error.retry_after == 7.0
    assert seen[0][1:] == seen[1][1:]


MALFORMED_ANSWERS = {
    "an empty object": b"{}",
    "an error object": b'{"error": {"message": "upstream failed"}}',
    "a list": b"[]",
    "a string": b'"ok"',
    "null": b"null",
    "no choices": b'{"id": "x", "object": "chat.completion", "created": 1, "model": "m", '
    b'"choices": []}',
    "an HTML page": b"<html>hi</html>",
}


@pytest.mark.parametrize("body", MALFORMED_ANSWERS)
async def test_a_200_that_is_not_an_answer_is_a_transient_error_on_both_lanes(body: str) -> None:
    """Never a made-up success: each is a transient error (retried, failed over, counted by
    the breaker), the same on both lanes."""
    for transport in LANES:
        async with raw_server(http(200, MALFORMED_ANSWERS[body])) as base:
            with pytest.raises(lk.ProviderUnavailable) as caught:
                await llm(base, transport).acompletion(messages=MESSAGES)
        assert caught.value.kind is ErrorKind.SERVER_ERROR, transport
        assert lk.errors.is_transient(caught.value)


async def test_an_error_object_in_a_200_is_read_for_what_it_says() -> None:
    body = b'{"error": {"message": "too long", "code": "context_length_exceeded"}}'
    for transport in LANES:
        async with raw_server(http(200, body)) as base:
            with pytest.raises(lk.ContextLengthExceeded):
                await llm(base, transport).acompletion(messages=MESSAGES)


async def test_a_malformed_answer_fails_over() -> None:
    """The first target answers ``{}`` with a 200; the call is answered by the second, and the
    first's breaker counts a failure."""
    good = http(
        200,
        b'{"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": '
        b'[{"index": 0, "message": {"role": "assistant", "content": "fine"}, '
        b'"finish_reason": "stop"}]}',
    )
    for transport in LANES:
        async with raw_server(http(200, b"{}")) as bad, raw_server(good) as fine:
            front = lk.LLM(
                "openai/bad",
                api_base=bad,
                api_key="k",
                transport=transport,
                failover=[
                    {"model": "openai/m", "api_base": fine, "api_key": "k", "transport": transport}
                ],
            )
            response = await front.acompletion(messages=MESSAGES)
            assert response.choices[0].message.content == "fine"
            assert lk.report(response).target == "openai/m"
            assert front.stats()["openai/bad"].errors >= 1


async def test_reasoning_is_content_on_both_lanes() -> None:
    """One content rule: a reasoning delta (``reasoning``, vLLM; ``reasoning_content``,
    DeepSeek) commits a stream and counts as its first token, on either lane, and a role-only
    chunk does not."""
    answer = http(
        200,
        sse(
            chunk(role="assistant", content=""),
            chunk(reasoning="think"),
            chunk(reasoning_content="more"),
            chunk("Hi"),
            chunk(None, "stop"),
            b"data: [DONE]",
        ),
        content_type=SSE,
    )
    for transport in LANES:
        async with raw_server(answer) as base:
            stream = await llm(base, transport).acompletion(messages=MESSAGES, stream=True)
            assert await read_all(stream) == "Hi"
        assert stream.chunks == 3, transport  # two reasoning deltas and the text


def role_only_chunks() -> list[Any]:
    """A role-only first chunk, as each kind of object a decorated generator may yield."""
    from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

    role = {"role": "assistant", "content": ""}
    return [
        {"choices": [{"index": 0, "delta": role, "finish_reason": None}]},
        ModelResponseStream(choices=[StreamingChoices(delta=Delta(role="assistant", content=""))]),
        "",
    ]


@pytest.mark.parametrize("kind", ["dict", "litellm", "str"])
async def test_the_decorator_forms_take_the_same_content_rule(kind: str) -> None:
    """A role-only chunk (or an empty string) is not the first token for ``guard_stream`` and
    ``@lk.stream_guard`` either: a slow start is a FirstTokenTimeout, not a stall."""
    first = role_only_chunks()[["dict", "litellm", "str"].index(kind)]

    async def slow_start() -> AsyncIterator[Any]:
        yield first
        await anyio.sleep(30)
        yield "late"

    async def read(stream: Any) -> None:
        async with stream:
            async for _ in stream:
                pass

    with pytest.raises(lk.FirstTokenTimeout):
        await read(lk.guard_stream(slow_start(), first_token=0.2, stall=0.1))
    decorated = lk.stream_guard(first_token=0.2, stall=0.1)(slow_start)
    with pytest.raises(lk.FirstTokenTimeout):
        await read(decorated())
