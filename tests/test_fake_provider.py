"""latencykit.testing: the fake OpenAI-compatible provider, over real HTTP.

Tests about what a client sees go through real litellm; low-level faults also use raw
httpx or sockets. litellm's ``acompletion`` only runs on asyncio (it calls
``loop.run_in_executor`` and uses an aiohttp transport), so litellm tests pin
``anyio_backend`` to asyncio; the others run on every backend of the conftest.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import socket
import threading
import time
from typing import Any

import anyio
import httpx
import litellm
import pytest
from litellm import exceptions as llm_errors

from latencykit.testing import (
    Behavior,
    FakeProvider,
    Fault,
    Latency,
    LlmperfProfile,
    RecordedAttempt,
    RequestInfo,
)

pytestmark = pytest.mark.anyio

# litellm.acompletion is asyncio-only: pin the backend for tests that go through it.
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

# litellm 1.110 (with openai 3) changed three mappings this file documents: a content-policy
# refusal is a plain BadRequestError (its subclass ContentPolicyViolationError before), a
# stream that stalls or stays silent raises Timeout (MidStreamFallbackError before), and a
# stream that ends without a finish_reason raises instead of getting a made-up "stop".
LITELLM_1_110 = tuple(
    int(part) for part in importlib.metadata.version("litellm").split(".")[:2]
) >= (
    1,
    110,
)
CONTENT_POLICY_ERROR = (
    llm_errors.BadRequestError if LITELLM_1_110 else llm_errors.ContentPolicyViolationError
)
STREAM_TIMEOUT_ERROR = llm_errors.Timeout if LITELLM_1_110 else llm_errors.MidStreamFallbackError

MESSAGES = [{"role": "user", "content": "Say something about latency, please."}]


async def complete(fake: FakeProvider, model: str, **kwargs: Any) -> Any:
    """One litellm call to the fake provider (no retries)."""
    kwargs.setdefault("messages", MESSAGES)
    return await litellm.acompletion(
        model=f"openai/{model}",
        api_base=fake.base_url,
        api_key="fake",
        max_retries=0,
        **kwargs,
    )


async def collect(stream: Any) -> tuple[str, list[Any]]:
    """Read a litellm stream to the end; return the text and the chunks."""
    chunks = [chunk async for chunk in stream]
    text = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].delta
    )
    return text, chunks


def chat_body(model: str = "m", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, **extra}


def last(attempts: list[RecordedAttempt]) -> RecordedAttempt:
    assert attempts, "no attempt recorded"
    return attempts[-1]


def sixteen_tokens() -> str:
    return " ".join(f"tok{i}" for i in range(16))


def sse_events(text: str) -> list[str]:
    """The SSE events of a response body, without their blank-line separators."""
    return [event for event in text.split("\n\n") if event]


def deltas(events: list[str]) -> list[tuple[dict[str, Any], str | None]]:
    """(delta, finish_reason) of each chunk event with a choice; comments etc. skipped."""
    out = []
    for event in events:
        if event.startswith("data: {"):
            chunk = json.loads(event[6:])
            if chunk.get("choices"):
                choice = chunk["choices"][0]
                out.append((choice["delta"], choice["finish_reason"]))
    return out


def raw_post(port: int, body: dict[str, Any], behavior: dict[str, Any] | None = None) -> bytes:
    """POST a chat request over a bare socket with ``Connection: close``; read to EOF."""
    data = json.dumps(body).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if behavior is not None:
        head += f"x-fake-behavior: {json.dumps(behavior)}\r\n"
    head += f"Content-Length: {len(data)}\r\n\r\n"
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + data)
        while more := sock.recv(65536):
            received += more
    return received


def dechunk(raw: bytes) -> tuple[bytes, list[bytes]]:
    """A chunked response's head and chunk payloads; fails unless the body ends properly."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    payloads: list[bytes] = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", f"no proper end of the chunked body: {rest!r}"
            return head, payloads
        payloads.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


# --------------------------------------------------------------------------- responses


@asyncio_only
async def test_json_response_parses_in_litellm(fake_provider: FakeProvider) -> None:
    response = await complete(fake_provider, "plain")
    assert response.choices[0].message.content == sixteen_tokens()
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens == 16
    assert response.usage.prompt_tokens == len(MESSAGES[0]["content"]) // 4
    assert response.usage.total_tokens == response.usage.prompt_tokens + 16
    (attempt,) = fake_provider.attempts
    assert attempt.model == "plain"
    assert not attempt.stream
    assert attempt.status == 200
    assert attempt.completed and not attempt.disconnected
    assert attempt.tokens_sent == 16
    assert attempt.request_headers["authorization"] == "***"
    assert attempt.prompt_tokens == response.usage.prompt_tokens
    assert attempt.arrived_at <= attempt.first_byte_at <= attempt.ended_at  # type: ignore[operator]


@asyncio_only
async def test_sse_stream_parses_in_litellm_with_usage(fake_provider: FakeProvider) -> None:
    fake_provider.script("s", Behavior(output_tokens=5, itl=0.001))
    stream = await complete(fake_provider, "s", stream=True, stream_options={"include_usage": True})
    text, chunks = await collect(stream)
    assert text == "tok0 tok1 tok2 tok3 tok4"
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    usages = [getattr(c, "usage", None) for c in chunks]
    usage = next(u for u in usages if u is not None)
    assert usage.completion_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + 5
    attempt = last(fake_provider.attempts)
    assert attempt.stream and attempt.completed and attempt.tokens_sent == 5


async def test_raw_sse_wire_format(fake_provider: FakeProvider) -> None:
    fake_provider.script("s", Behavior(output_tokens=3, text=None))
    body = chat_body("s", stream=True, stream_options={"include_usage": True})
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{fake_provider.base_url}/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "s" for c in chunks)
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:3]] == [
        "tok0",
        " tok1",
        " tok2",
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] == 3


async def test_text_is_split_into_word_tokens(fake_provider: FakeProvider) -> None:
    fake_provider.script("t", Behavior(text="Hello there, world!"))
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        plain = (await client.post(url, json=chat_body("t"))).json()
        streamed = (await client.post(url, json=chat_body("t", stream=True))).text
    assert plain["choices"][0]["message"]["content"] == "Hello there, world!"
    assert plain["usage"]["completion_tokens"] == 3
    assert streamed.count('"content"') == 3  # three tokens, the role rides on the first
    assert last(fake_provider.attempts).tokens_sent == 3


async def test_models_endpoint_and_404(fake_provider: FakeProvider) -> None:
    fake_provider.script("b", Behavior())
    fake_provider.script("a", Behavior())
    async with httpx.AsyncClient() as client:
        models = (await client.get(f"{fake_provider.base_url}/models")).json()
        missing = await client.post(f"{fake_provider.base_url}/audio/speech", json={})
    assert [m["id"] for m in models["data"]] == ["a", "b"]
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_url"
    assert fake_provider.attempts == []  # only the APIs served are recorded


# --------------------------------------------------------------------------- scripts


@asyncio_only
async def test_per_model_scripts_and_default(fake_provider: FakeProvider) -> None:
    fake_provider.script("short", Behavior(output_tokens=2))
    fake_provider.default = Behavior(output_tokens=3)
    short = await complete(fake_provider, "short")
    other = await complete(fake_provider, "other")
    assert short.choices[0].message.content == "tok0 tok1"
    assert other.choices[0].message.content == "tok0 tok1 tok2"
    assert [a.model for a in fake_provider.attempts] == ["short", "other"]


@asyncio_only
async def test_sequence_script_last_behavior_repeats(fake_provider: FakeProvider) -> None:
    fake_provider.script("flaky", [Behavior(fault=Fault.HTTP_503), Behavior(output_tokens=1)])
    with pytest.raises(llm_errors.ServiceUnavailableError):
        await complete(fake_provider, "flaky")
    for _ in range(3):
        response = await complete(fake_provider, "flaky")
        assert response.choices[0].message.content == "tok0"
    assert [a.status for a in fake_provider.attempts] == [503, 200, 200, 200]
    assert [a.fault for a in fake_provider.attempts] == [Fault.HTTP_503, None, None, None]


@asyncio_only
async def test_callable_script_gets_request_info(fake_provider: FakeProvider) -> None:
    seen: list[RequestInfo] = []

    def script(request: RequestInfo) -> Behavior:
        seen.append(request)
        return Behavior(output_tokens=request.nth + 1)

    fake_provider.script("dyn", script)
    first = await complete(fake_provider, "dyn")
    second = await complete(fake_provider, "dyn", stream=True)
    text, _ = await collect(second)
    assert first.choices[0].message.content == "tok0"
    assert text == "tok0 tok1"
    assert [r.nth for r in seen] == [0, 1]
    assert [r.stream for r in seen] == [False, True]
    assert seen[0].model == "dyn"
    assert seen[0].prompt_tokens == len(MESSAGES[0]["content"]) // 4
    assert seen[0].headers["authorization"] == "***"
    assert seen[0].body["messages"] == MESSAGES
    assert seen[0].arrived_at == fake_provider.attempts[0].arrived_at


@asyncio_only
async def test_header_overrides_script(fake_provider: FakeProvider) -> None:
    fake_provider.script("m", Behavior(fault=Fault.HTTP_500))
    override = json.dumps({"output_tokens": 1, "ttft": 0.01})
    response = await complete(fake_provider, "m", extra_headers={"x-fake-behavior": override})
    assert response.choices[0].message.content == "tok0"
    with pytest.raises(llm_errors.RateLimitError):
        await complete(
            fake_provider, "m", extra_headers={"x-fake-behavior": '{"fault": "HTTP_429"}'}
        )
    with pytest.raises(llm_errors.InternalServerError):
        await complete(fake_provider, "m")
    with pytest.raises(llm_errors.BadRequestError, match="x-fake-behavior"):
        await complete(fake_provider, "m", extra_headers={"x-fake-behavior": '{"bogus": 1}'})


async def test_failing_script_answers_500(
    fake_provider: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(request: RequestInfo) -> Behavior:
        raise KeyError("boom")

    fake_provider.script("broken", broken)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake_provider.base_url}/chat/completions", json=chat_body("broken")
        )
    assert response.status_code == 500
    assert "boom" in response.json()["error"]["message"]
    assert "script for model 'broken' raised" in capsys.readouterr().err


def test_script_rejects_bad_values() -> None:
    fake = FakeProvider()
    with pytest.raises(ValueError, match="at least one"):
        fake.script("m", [])
    with pytest.raises(TypeError, match="item 1"):
        fake.script("m", [Behavior(), "fast"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        fake.script("m", 3.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- faults -> litellm

EXPECTED_EXCEPTIONS: list[tuple[Fault, bool, type[Exception]]] = [
    (Fault.HTTP_429, False, llm_errors.RateLimitError),
    (Fault.HTTP_500, False, llm_errors.InternalServerError),
    (Fault.HTTP_503, False, llm_errors.ServiceUnavailableError),
    (Fault.CONTEXT_LENGTH, False, llm_errors.ContextWindowExceededError),
    (Fault.CONTENT_POLICY, False, CONTENT_POLICY_ERROR),
    (Fault.RESET_BEFORE_HEADERS, False, llm_errors.InternalServerError),
    (Fault.CUT, False, llm_errors.InternalServerError),
    (Fault.MALFORMED_CHUNK, False, llm_errors.InternalServerError),
    (Fault.ERROR_EVENT, False, llm_errors.InternalServerError),
    (Fault.HTTP_429, True, llm_errors.RateLimitError),
    (Fault.HTTP_500, True, llm_errors.InternalServerError),
    (Fault.HTTP_503, True, llm_errors.ServiceUnavailableError),
    (Fault.CONTEXT_LENGTH, True, llm_errors.ContextWindowExceededError),
    (Fault.CONTENT_POLICY, True, CONTENT_POLICY_ERROR),
    (Fault.RESET_BEFORE_HEADERS, True, llm_errors.InternalServerError),
    (Fault.CUT, True, llm_errors.MidStreamFallbackError),
    (Fault.MALFORMED_CHUNK, True, llm_errors.MidStreamFallbackError),
    (Fault.ERROR_EVENT, True, llm_errors.MidStreamFallbackError),
]


@asyncio_only
@pytest.mark.parametrize(("fault", "stream", "expected"), EXPECTED_EXCEPTIONS)
async def test_fault_raises_documented_litellm_exception(
    fake_provider: FakeProvider, fault: Fault, stream: bool, expected: type[Exception]
) -> None:
    fake_provider.script("f", Behavior(fault=fault))

    async def call() -> None:
        response = await complete(fake_provider, "f", stream=stream)
        if stream:
            await collect(response)

    with pytest.raises(expected) as info:
        await call()
    assert type(info.value) is expected  # the exact class, not a parent
    attempt = last(fake_provider.attempts)
    assert attempt.fault is fault
    assert not attempt.disconnected


@asyncio_only
async def test_429_retry_after_reaches_litellm(fake_provider: FakeProvider) -> None:
    fake_provider.script("limited", Behavior(fault=Fault.HTTP_429, retry_after=1.5))
    with pytest.raises(llm_errors.RateLimitError) as info:
        await complete(fake_provider, "limited")
    headers = getattr(info.value, "litellm_response_headers", None)
    assert headers is not None
    assert headers["retry-after"] == "1.5"
    assert last(fake_provider.attempts).status == 429


@asyncio_only
async def test_content_policy_reason_reaches_the_exception(fake_provider: FakeProvider) -> None:
    fake_provider.script("unsafe", Behavior(fault=Fault.CONTENT_POLICY))
    with pytest.raises(CONTENT_POLICY_ERROR, match="flagged: violence"):
        await complete(fake_provider, "unsafe")


@asyncio_only
async def test_context_window_checks_prompt_size(fake_provider: FakeProvider) -> None:
    fake_provider.script("small", Behavior(context_window=5))
    with pytest.raises(llm_errors.ContextWindowExceededError, match="maximum context length is 5"):
        await complete(fake_provider, "small")
    response = await complete(fake_provider, "small", messages=[{"role": "user", "content": "hi"}])
    assert response.choices[0].message.content
    assert [a.fault for a in fake_provider.attempts] == [Fault.CONTEXT_LENGTH, None]
    assert [a.status for a in fake_provider.attempts] == [400, 200]


@asyncio_only
async def test_missing_done_still_parses_and_closes(fake_provider: FakeProvider) -> None:
    fake_provider.script("nodone", Behavior(fault=Fault.MISSING_DONE, output_tokens=4))
    text, _ = await collect(await complete(fake_provider, "nodone", stream=True))
    assert text == "tok0 tok1 tok2 tok3"
    async with httpx.AsyncClient() as client:
        raw = await client.post(
            f"{fake_provider.base_url}/chat/completions", json=chat_body("nodone", stream=True)
        )
    assert "[DONE]" not in raw.text
    assert '"finish_reason":"stop"' in raw.text
    assert raw.headers["connection"] == "close"
    assert last(fake_provider.attempts).completed


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("kind", "in_json", "in_stream"),
    [
        ("server_error", llm_errors.InternalServerError, llm_errors.MidStreamFallbackError),
        ("overloaded", llm_errors.APIError, llm_errors.MidStreamFallbackError),
        ("rate_limit", llm_errors.RateLimitError, llm_errors.MidStreamFallbackError),
        ("content_filter", llm_errors.BadRequestError, llm_errors.MidStreamFallbackError),
        (
            "context_length",
            llm_errors.ContextWindowExceededError,
            llm_errors.ContextWindowExceededError,
        ),
    ],
)
async def test_error_event_kinds_in_litellm(
    fake_provider: FakeProvider,
    kind: str,
    in_json: type[Exception],
    in_stream: type[Exception],
    stream: bool,
) -> None:
    fake_provider.script("e", Behavior(fault=Fault.ERROR_EVENT, error=kind, stall_after=2))

    async def call() -> None:
        response = await complete(fake_provider, "e", stream=stream)
        if stream:
            await collect(response)

    expected = in_stream if stream else in_json
    with pytest.raises(expected) as info:
        await call()
    assert type(info.value) is expected
    if stream and expected is llm_errors.MidStreamFallbackError:
        cause = "RateLimitError" if kind == "rate_limit" else "APIConnectionError"
        assert f"litellm.{cause}" in str(info.value)


@asyncio_only
async def test_stream_faults_litellm_does_not_surface(fake_provider: FakeProvider) -> None:
    fake_provider.script("role", Behavior(role_chunk=True, output_tokens=2))
    text, chunks = await collect(await complete(fake_provider, "role", stream=True))
    first = chunks[0].choices[0].delta
    assert (first.role, first.content, text) == ("assistant", "", "tok0 tok1")

    # litellm makes up a finish_reason for an answer that ended without one (before 1.110;
    # since, it raises).
    fake_provider.script("cut", Behavior(fault=Fault.CUT_WITH_DONE, stall_after=2))
    if LITELLM_1_110:
        with pytest.raises(llm_errors.MidStreamFallbackError, match="finish_reason"):
            await collect(await complete(fake_provider, "cut", stream=True))
    else:
        text, chunks = await collect(await complete(fake_provider, "cut", stream=True))
        finish = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
        assert (text, finish) == ("tok0 tok1", ["stop"])
    response = await complete(fake_provider, "cut")
    assert response.choices[0].message.content == "tok0 tok1"
    assert response.choices[0].finish_reason == "stop"  # null on the wire

    # Keep-alives restart the client's read timeout; the empty deltas are not yielded.
    fake_provider.script(
        "ka",
        Behavior(
            fault=Fault.STALL,
            stall_after=1,
            stall_for=1.0,
            stall_keepalive=True,
            keepalive_every=0.05,
            output_tokens=2,
        ),
    )
    response = await complete(fake_provider, "ka", stream=True, timeout=0.5)
    text, chunks = await collect(response)
    assert text == "tok0 tok1"
    assert len(chunks) == 3  # two tokens and the finish chunk


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
async def test_prefill_through_litellm(fake_provider: FakeProvider, stream: bool) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "tok0 tok1"}]
    fake_provider.script("p", Behavior(output_tokens=4))
    response = await complete(fake_provider, "p", messages=messages, stream=stream)
    text = (await collect(response))[0] if stream else response.choices[0].message.content
    assert text == " tok2 tok3"
    fake_provider.script("np", Behavior(rejects_prefill=True))
    with pytest.raises(llm_errors.BadRequestError, match="assistant message prefill") as info:
        await complete(fake_provider, "np", messages=messages, stream=stream)
    assert type(info.value) is llm_errors.BadRequestError


async def test_http_error_sends_the_scripted_status_body_and_headers(
    fake_provider: FakeProvider,
) -> None:
    fake_provider.script(
        "e",
        Behavior(
            fault=Fault.HTTP_ERROR,
            status=401,
            error_type="invalid_request_error",
            error_code="invalid_api_key",
            error_message="Incorrect API key provided.",
            headers={"retry-after-ms": "250", "x-trace": "t1"},
            retry_after=0.5,
            ttft=0.1,
        ),
    )
    started = time.monotonic()
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, chat_body("e", stream=True))
    assert time.monotonic() - started >= 0.09  # after ttft
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 401 Unauthorized"
    assert {"retry-after-ms: 250", "x-trace: t1", "Retry-After: 0.5"} <= set(lines)
    assert json.loads(body) == {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    attempt = last(fake_provider.attempts)
    assert (attempt.fault, attempt.status, attempt.completed) == (Fault.HTTP_ERROR, 401, True)


@pytest.mark.parametrize(
    ("status", "reason", "error_type"),
    [
        (403, "Forbidden", "permission_error"),
        (404, "Not Found", "not_found_error"),
        (409, "Conflict", "invalid_request_error"),
        (429, "Too Many Requests", "rate_limit_error"),
        (504, "Gateway Timeout", "server_error"),
        (529, "Overloaded", "overloaded_error"),
        (599, "Error", "server_error"),
    ],
)
async def test_http_error_defaults_by_status(
    fake_provider: FakeProvider, status: int, reason: str, error_type: str
) -> None:
    behavior = {"fault": "http_error", "status": status}  # per request, from the header
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, chat_body(), behavior)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.decode().split("\r\n")[0] == f"HTTP/1.1 {status} {reason}"
    error = json.loads(body)["error"]
    assert (error["type"], error["message"], error["code"]) == (error_type, reason, None)


async def test_http_error_sends_a_raw_body(fake_provider: FakeProvider) -> None:
    page = "<html><body>502 Bad Gateway</body></html>"
    fake_provider.script("gw", Behavior(fault=Fault.HTTP_ERROR, status=502, body=page))
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, chat_body("gw"))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway") and body.decode() == page


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
async def test_http_error_reaches_litellm_with_its_status_and_headers(
    fake_provider: FakeProvider, stream: bool
) -> None:
    fake_provider.script(
        "e", Behavior(fault=Fault.HTTP_ERROR, status=429, headers={"retry-after-ms": "250"})
    )
    with pytest.raises(llm_errors.RateLimitError) as info:
        await complete(fake_provider, "e", stream=stream)
    assert getattr(info.value, "litellm_response_headers", {})["retry-after-ms"] == "250"


async def test_close_before_headers_closes_silently_after_ttft(
    fake_provider: FakeProvider,
) -> None:
    fake_provider.script("close", Behavior(fault=Fault.CLOSE_BEFORE_HEADERS, ttft=0.2))
    started = time.monotonic()
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, chat_body("close"))
    assert raw == b""  # a clean end of stream (no reset), and no byte
    assert time.monotonic() - started >= 0.19
    attempt = last(await fake_provider.wait_for_async(lambda a: len(a) == 1))
    assert attempt.fault is Fault.CLOSE_BEFORE_HEADERS
    assert attempt.status is None and attempt.first_byte_at is None
    assert not attempt.completed and not attempt.disconnected


async def test_reset_before_headers_sends_rst(fake_provider: FakeProvider) -> None:
    fake_provider.script("reset", Behavior(fault=Fault.RESET_BEFORE_HEADERS))
    body = json.dumps(chat_body("reset")).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )

    def exchange() -> bytes:
        with socket.create_connection(("127.0.0.1", fake_provider.port), timeout=3) as sock:
            sock.sendall(request)
            return sock.recv(65536)

    with pytest.raises(ConnectionResetError):
        await anyio.to_thread.run_sync(exchange)
    attempt = last(await fake_provider.wait_for_async(lambda a: len(a) == 1))
    assert attempt.fault is Fault.RESET_BEFORE_HEADERS
    assert attempt.status is None and attempt.first_byte_at is None
    assert not attempt.completed and not attempt.disconnected


@asyncio_only
@pytest.mark.parametrize(
    ("fault", "stream", "expected"),
    [
        (Fault.HANG, False, llm_errors.Timeout),
        (Fault.HANG, True, llm_errors.Timeout),
        (Fault.STALL, False, llm_errors.Timeout),
        (Fault.STALL, True, STREAM_TIMEOUT_ERROR),
        (Fault.HEADERS_THEN_SILENCE, False, llm_errors.Timeout),
        (Fault.HEADERS_THEN_SILENCE, True, STREAM_TIMEOUT_ERROR),
    ],
)
async def test_silent_server_ends_in_client_timeout_and_is_recorded(
    fake_provider: FakeProvider, fault: Fault, stream: bool, expected: type[Exception]
) -> None:
    await complete(fake_provider, "warm-up")  # litellm's first call imports a lot
    fake_provider.script("quiet", Behavior(fault=fault, stall_after=2))

    async def call() -> None:
        response = await complete(fake_provider, "quiet", stream=stream, timeout=0.3)
        if stream:
            await collect(response)

    started = time.monotonic()
    with pytest.raises(expected, match=r"(?i)time"):
        await call()
    assert time.monotonic() - started < 2.0
    attempts = await fake_provider.wait_for_async(lambda a: len(a) == 2 and a[1].disconnected)
    attempt = attempts[1]
    assert not attempt.completed
    assert 0.2 < attempt.disconnected_at - attempt.arrived_at < 1.5  # type: ignore[operator]
    if fault is Fault.HANG:
        assert attempt.status is None and attempt.first_byte_at is None
    else:
        assert attempt.status == 200
        assert attempt.tokens_sent == (2 if stream and fault is Fault.STALL else 0)


async def test_raw_http_pipelining_chunked_body_and_garbage(fake_provider: FakeProvider) -> None:
    body = json.dumps(chat_body("raw")).encode()
    plain = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )

    def exchange(data: bytes, responses: int) -> bytes:
        received = b""
        with socket.create_connection(("127.0.0.1", fake_provider.port), timeout=3) as sock:
            sock.sendall(data)
            while received.count(b"HTTP/1.1 ") < responses or not received.endswith(b"}"):
                more = sock.recv(65536)
                if not more:
                    break
                received += more
        return received

    both = await anyio.to_thread.run_sync(exchange, plain + chunked, 2)  # pipelined
    assert both.count(b"HTTP/1.1 200 OK") == 2
    assert [a.connection_id for a in fake_provider.attempts] == [1, 1]
    garbage = await anyio.to_thread.run_sync(exchange, b"HELLO\r\n\r\n", 1)
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"malformed request line" in garbage


async def test_keepalive_comments_then_tokens(fake_provider: FakeProvider) -> None:
    fake_provider.script(
        "ka",
        Behavior(
            fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=0.35, keepalive_every=0.1, output_tokens=2
        ),
    )
    async with httpx.AsyncClient() as client:
        started = time.monotonic()
        body = chat_body("ka", stream=True)
        url = f"{fake_provider.base_url}/chat/completions"
        async with client.stream("POST", url, json=body) as response:
            headers_after = time.monotonic() - started
            lines = [line async for line in response.aiter_lines()]
    assert headers_after < 0.2
    comments = [line for line in lines if line.startswith(":")]
    assert comments == [": keep-alive"] * 3
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    attempt = last(fake_provider.attempts)
    assert attempt.first_byte_at - attempt.arrived_at < 0.2  # type: ignore[operator]
    assert attempt.tokens_sent == 2 and attempt.completed


async def test_stall_pauses_then_continues(fake_provider: FakeProvider) -> None:
    fake_provider.script(
        "stall", Behavior(fault=Fault.STALL, stall_after=2, stall_for=0.3, output_tokens=4)
    )
    arrivals: list[float] = []
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        async with client.stream("POST", url, json=chat_body("stall", stream=True)) as response:
            async for line in response.aiter_lines():
                if '"content"' in line:
                    arrivals.append(time.monotonic())
    assert len(arrivals) == 4
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert gaps[1] >= 0.25  # the stall sits between token 2 and token 3
    assert gaps[0] < 0.2 and gaps[2] < 0.2
    assert last(fake_provider.attempts).completed


async def test_malformed_chunk_then_stream_continues(fake_provider: FakeProvider) -> None:
    fake_provider.script(
        "bad", Behavior(fault=Fault.MALFORMED_CHUNK, stall_after=1, output_tokens=3)
    )
    async with httpx.AsyncClient() as client:
        raw = await client.post(
            f"{fake_provider.base_url}/chat/completions", json=chat_body("bad", stream=True)
        )
    events = [e for e in raw.text.split("\n\n") if e]
    assert events[1] == "data: {not json"
    assert events[-1] == "data: [DONE]"
    assert last(fake_provider.attempts).tokens_sent == 3


# --------------------------------------------------------------------------- stream faults

ROLE_ONLY = {"role": "assistant", "content": ""}
EMPTY_DELTA = {"content": ""}


async def test_role_chunk_comes_with_the_headers_before_ttft(fake_provider: FakeProvider) -> None:
    fake_provider.script("r", Behavior(role_chunk=True, ttft=0.6, output_tokens=2))
    arrivals: list[tuple[float, str]] = []
    async with httpx.AsyncClient() as client:
        started = time.monotonic()
        url = f"{fake_provider.base_url}/chat/completions"
        async with client.stream("POST", url, json=chat_body("r", stream=True)) as response:
            async for line in response.aiter_lines():
                if line:
                    arrivals.append((time.monotonic() - started, line))
    events = [line for _, line in arrivals]
    assert deltas(events) == [
        (ROLE_ONLY, None),  # exactly, and no later chunk repeats the role
        ({"content": "tok0"}, None),
        ({"content": " tok1"}, None),
        ({}, "stop"),
    ]
    assert events[-1] == "data: [DONE]"
    role_at, first_token_at = arrivals[0][0], arrivals[1][0]
    assert role_at < 0.6 <= first_token_at  # the first content token still waits ttft
    attempt = last(fake_provider.attempts)
    assert attempt.first_byte_at - attempt.arrived_at < 0.3  # type: ignore[operator]
    assert attempt.tokens_sent == 2 and attempt.completed


async def test_cut_with_done_ends_the_body_without_finish_reason(
    fake_provider: FakeProvider,
) -> None:
    fake_provider.script("c", Behavior(fault=Fault.CUT_WITH_DONE, stall_after=2, output_tokens=5))
    body = chat_body("c", stream=True, stream_options={"include_usage": True})
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, body)
    head, payloads = dechunk(raw)  # the chunked body ends with its last chunk
    assert head.startswith(b"HTTP/1.1 200 OK")
    events = [p.decode().removesuffix("\n\n") for p in payloads]
    assert events[-1] == "data: [DONE]"
    assert deltas(events) == [
        ({"role": "assistant", "content": "tok0", "refusal": None}, None),
        ({"content": " tok1"}, None),
    ]
    assert len(events) == 3  # no finish_reason chunk, no usage chunk
    attempt = last(fake_provider.attempts)
    assert attempt.fault is Fault.CUT_WITH_DONE
    assert attempt.tokens_sent == 2 and attempt.completed and not attempt.disconnected

    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        plain = (await client.post(url, json=chat_body("c"))).json()
    assert plain["choices"][0]["message"]["content"] == "tok0 tok1"
    assert plain["choices"][0]["finish_reason"] is None
    assert plain["usage"]["completion_tokens"] == 2
    assert last(fake_provider.attempts).tokens_sent == 2


ERROR_EVENTS: list[tuple[str, int, str, str | None, str]] = [
    ("server_error", 500, "server_error", None, "The server had an error while processing"),
    ("overloaded", 529, "overloaded_error", None, "Overloaded"),
    ("rate_limit", 429, "rate_limit_exceeded", "rate_limit_exceeded", "Rate limit reached"),
    ("content_filter", 400, "invalid_request_error", "content_filter", "content management"),
    ("context_length", 400, "invalid_request_error", "context_length_exceeded", "context length"),
]


@pytest.mark.parametrize(("kind", "status", "type_", "code", "message"), ERROR_EVENTS)
async def test_error_event_as_first_event_and_as_http_error(
    fake_provider: FakeProvider, kind: str, status: int, type_: str, code: str | None, message: str
) -> None:
    fake_provider.script(
        "e", Behavior(fault=Fault.ERROR_EVENT, error=kind, stall_after=0, ttft=0.2)
    )
    raw = await anyio.to_thread.run_sync(raw_post, fake_provider.port, chat_body("e", stream=True))
    head, payloads = dechunk(raw)
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Type: text/event-stream" in head
    (event,) = payloads  # the error is the only event: no role chunk before, no [DONE] after
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    error = json.loads(event[6:])
    assert list(error) == ["error"]
    assert list(error["error"]) == ["message", "type", "param", "code"]
    assert error["error"]["type"] == type_
    assert error["error"]["code"] == code
    assert error["error"]["param"] is None
    assert message in error["error"]["message"]
    attempt = last(fake_provider.attempts)
    assert attempt.fault is Fault.ERROR_EVENT and attempt.status == 200
    assert attempt.tokens_sent == 0 and attempt.completed
    assert attempt.first_byte_at - attempt.arrived_at >= 0.2  # type: ignore[operator]

    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        response = await client.post(url, json=chat_body("e"))
    assert response.status_code == status
    assert response.json() == error  # the same error object
    attempt = last(fake_provider.attempts)
    assert attempt.status == status and attempt.completed
    assert attempt.first_byte_at - attempt.arrived_at >= 0.2  # type: ignore[operator]


def test_error_events_cover_every_behavior_error() -> None:
    from latencykit.testing._behavior import ERROR_KINDS

    assert sorted(kind for kind, *_ in ERROR_EVENTS) == sorted(ERROR_KINDS)


async def test_error_event_after_tokens_from_the_header(fake_provider: FakeProvider) -> None:
    behavior = {"fault": "error_event", "error": "overloaded", "stall_after": 2}
    raw = await anyio.to_thread.run_sync(
        raw_post, fake_provider.port, chat_body("h", stream=True), behavior
    )
    _, payloads = dechunk(raw)
    events = [p.decode().removesuffix("\n\n") for p in payloads]
    assert [d for d, _ in deltas(events)] == [
        {"role": "assistant", "content": "tok0", "refusal": None},
        {"content": " tok1"},
    ]
    assert events[2:] == [
        'data: {"error":{"message":"Overloaded","type":"overloaded_error","param":null,'
        '"code":null}}'
    ]
    attempt = last(fake_provider.attempts)
    assert attempt.fault is Fault.ERROR_EVENT and attempt.tokens_sent == 2 and attempt.completed


@pytest.mark.parametrize("stream", [False, True])
async def test_headers_then_silence_until_the_client_leaves(
    fake_provider: FakeProvider, stream: bool
) -> None:
    fake_provider.script("quiet", Behavior(fault=Fault.HEADERS_THEN_SILENCE, ttft=5.0))
    received = b""
    async with httpx.AsyncClient(timeout=10) as client:
        started = time.monotonic()
        url = f"{fake_provider.base_url}/chat/completions"
        async with client.stream("POST", url, json=chat_body("quiet", stream=stream)) as response:
            headers_after = time.monotonic() - started
            with anyio.move_on_after(0.4):
                async for data in response.aiter_raw():
                    received += data
        closed_at = time.monotonic()
    assert headers_after < 3.0  # at once, not after ttft
    assert response.status_code == 200
    if stream:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
    else:
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["content-length"]) > 0
    assert received == b""
    attempts = await fake_provider.wait_for_async(lambda a: a[-1].disconnected)
    attempt = attempts[-1]
    assert attempt.fault is Fault.HEADERS_THEN_SILENCE and attempt.status == 200
    assert attempt.first_byte_at - attempt.arrived_at < 1.0  # type: ignore[operator]
    assert attempt.tokens_sent == 0 and not attempt.completed
    assert attempt.disconnected_at - closed_at <= 0.5  # type: ignore[operator]


async def test_headers_then_silence_with_keepalives(fake_provider: FakeProvider) -> None:
    fake_provider.script(
        "ka",
        Behavior(
            fault=Fault.HEADERS_THEN_SILENCE,
            stall_keepalive=True,
            keepalive_every=0.05,
            role_chunk=True,
        ),
    )
    events: list[str] = []
    async with httpx.AsyncClient(timeout=10) as client:
        url = f"{fake_provider.base_url}/chat/completions"
        async with client.stream("POST", url, json=chat_body("ka", stream=True)) as response:
            async for line in response.aiter_lines():
                if line:
                    events.append(line)
                if len(events) == 5:
                    break
    assert events[0].startswith("data: ")  # the role chunk, with the headers
    assert events[1] == events[3] == ": keep-alive"
    assert deltas(events) == [(ROLE_ONLY, None), (EMPTY_DELTA, None), (EMPTY_DELTA, None)]
    attempts = await fake_provider.wait_for_async(lambda a: a[-1].disconnected)
    assert attempts[-1].tokens_sent == 0 and not attempts[-1].completed


async def test_stall_keepalive_alternates_comments_and_empty_deltas(
    fake_provider: FakeProvider,
) -> None:
    fake_provider.script(
        "s",
        Behavior(
            fault=Fault.STALL,
            stall_after=2,
            stall_for=0.45,
            stall_keepalive=True,
            keepalive_every=0.1,
            output_tokens=3,
        ),
    )
    async with httpx.AsyncClient(timeout=10) as client:
        started = time.monotonic()
        url = f"{fake_provider.base_url}/chat/completions"
        response = await client.post(url, json=chat_body("s", stream=True))
    took = time.monotonic() - started
    events = sse_events(response.text)
    pause = events[2:6]  # between tok1 and tok2: ticks at 0.1, 0.2, 0.3 and 0.4 s
    assert pause[0] == pause[2] == ": keep-alive"
    assert deltas(pause) == [(EMPTY_DELTA, None), (EMPTY_DELTA, None)]
    assert deltas(events) == [
        ({"role": "assistant", "content": "tok0", "refusal": None}, None),
        ({"content": " tok1"}, None),
        (EMPTY_DELTA, None),
        (EMPTY_DELTA, None),
        ({"content": " tok2"}, None),
        ({}, "stop"),
    ]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 9
    assert took >= 0.45
    attempt = last(fake_provider.attempts)
    assert attempt.tokens_sent == 3 and attempt.completed


PREFILL_CASES: list[tuple[str | None, Any, list[str]]] = [
    (None, "tok0 tok1", [f" tok{i}" for i in range(2, 16)]),
    ("Hello there, world!", "Hello", [" there,", " world!"]),
    ("Hello there, world!", "Hello th", ["ere,", " world!"]),
    ("Hello there, world!", [{"type": "text", "text": "Hello "}], ["there,", " world!"]),
    ("Hello there, world!", "Goodbye", ["Hello", " there,", " world!"]),
]


@pytest.mark.parametrize(("text", "prefill", "expected"), PREFILL_CASES)
async def test_prefill_is_continued(
    fake_provider: FakeProvider, text: str | None, prefill: Any, expected: list[str]
) -> None:
    fake_provider.script("p", Behavior(text=text))
    messages = [*MESSAGES, {"role": "assistant", "content": prefill}]
    prefill_chars = len(prefill if isinstance(prefill, str) else prefill[0]["text"])
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        plain = (await client.post(url, json=chat_body("p", messages=messages))).json()
        streamed = await client.post(url, json=chat_body("p", messages=messages, stream=True))
    assert plain["choices"][0]["message"]["content"] == "".join(expected)
    assert plain["usage"]["completion_tokens"] == len(expected)
    contents = [d.get("content") for d, reason in deltas(sse_events(streamed.text)) if not reason]
    assert contents == expected
    for attempt in fake_provider.attempts:
        assert attempt.prefill_chars == prefill_chars
        assert attempt.tokens_sent == len(expected)


async def test_no_prefill_is_recorded_as_zero(fake_provider: FakeProvider) -> None:
    async with httpx.AsyncClient() as client:
        await client.post(f"{fake_provider.base_url}/chat/completions", json=chat_body())
    assert last(fake_provider.attempts).prefill_chars == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_rejects_prefill_answers_400_after_ttft(
    fake_provider: FakeProvider, stream: bool
) -> None:
    fake_provider.script(
        "np", Behavior(rejects_prefill=True, ttft=0.2, fault=Fault.STALL, stall_for=0.1)
    )
    prefilled = [*MESSAGES, {"role": "assistant", "content": "tok0"}]
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        rejected = await client.post(url, json=chat_body("np", messages=prefilled, stream=stream))
        accepted = await client.post(
            url, json=chat_body("np", stream=stream, messages=[*prefilled, MESSAGES[0]])
        )
    assert rejected.status_code == 400
    assert rejected.headers["content-type"] == "application/json"
    error = rejected.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "does not support assistant message prefill" in error["message"]
    assert accepted.status_code == 200  # the last message is the user's: the stall applies
    first, second = fake_provider.attempts
    assert first.status == 400 and first.fault is None and first.prefill_chars == 4
    assert first.first_byte_at - first.arrived_at >= 0.2  # type: ignore[operator]
    assert second.fault is Fault.STALL and second.prefill_chars == 0


# --------------------------------------------------------------------------- disconnects


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
async def test_cancelled_call_is_recorded_as_disconnect_at_once(
    fake_provider: FakeProvider, stream: bool
) -> None:
    await complete(fake_provider, "warm-up")  # litellm's first call imports a lot
    fake_provider.script("slow", Behavior(ttft=5.0))
    with anyio.move_on_after(0.2) as scope:
        await complete(fake_provider, "slow", stream=stream)
    cancelled_at = time.monotonic()  # after the cancellation, so a safe upper reference
    assert scope.cancelled_caught
    attempts = await fake_provider.wait_for_async(lambda a: a[-1].disconnected, timeout=2.0)
    attempt = attempts[-1]
    assert attempt.model == "slow"
    assert attempt.disconnected_at - cancelled_at <= 0.05  # type: ignore[operator]
    assert attempt.disconnected_at >= attempt.arrived_at  # type: ignore[operator]
    await anyio.sleep(0.1)
    after = fake_provider.attempts[-1]
    assert after.status is None and after.first_byte_at is None and after.ended_at is None
    assert after.tokens_sent == 0


async def test_abandoned_stream_is_recorded_as_disconnect(fake_provider: FakeProvider) -> None:
    fake_provider.script("long", Behavior(output_tokens=200, itl=0.01))
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        response = await client.send(
            client.build_request("POST", url, json=chat_body("long", stream=True)), stream=True
        )
        seen = 0
        async for line in response.aiter_lines():
            seen += '"content"' in line
            if seen == 3:
                break
        await response.aclose()
        closed_at = time.monotonic()
    attempts = await fake_provider.wait_for_async(lambda a: a[-1].disconnected)
    attempt = attempts[-1]
    assert attempt.status == 200 and not attempt.completed
    assert 3 <= attempt.tokens_sent < 50
    assert attempt.disconnected_at - closed_at <= 0.05  # type: ignore[operator]
    await anyio.sleep(0.1)
    assert fake_provider.attempts[-1].tokens_sent == attempt.tokens_sent  # generation stopped


@asyncio_only
async def test_litellm_reuses_keepalive_connection(fake_provider: FakeProvider) -> None:
    await complete(fake_provider, "a")
    await complete(fake_provider, "b")
    first, second = fake_provider.attempts
    assert first.connection_id == second.connection_id
    assert fake_provider.connections_opened == 1


async def test_httpx_keepalive_and_open_connection_count(fake_provider: FakeProvider) -> None:
    async with httpx.AsyncClient() as client:
        url = f"{fake_provider.base_url}/chat/completions"
        await client.post(url, json=chat_body())
        await client.post(url, json=chat_body(stream=True))
        await client.post(url, json=chat_body())
        assert fake_provider.open_connections == 1
    ids = {a.connection_id for a in fake_provider.attempts}
    assert len(ids) == 1
    await fake_provider.wait_for_async(lambda a: fake_provider.open_connections == 0)
    assert fake_provider.connections_opened == 1


async def test_many_concurrent_connections(fake_provider: FakeProvider) -> None:
    fake_provider.default = Behavior(ttft=0.4, output_tokens=2)
    url = f"{fake_provider.base_url}/chat/completions"
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    statuses: list[int] = []
    async with httpx.AsyncClient(limits=limits, timeout=10) as client:

        async def one(i: int) -> None:
            response = await client.post(url, json=chat_body(f"m{i % 7}", stream=i % 2 == 0))
            statuses.append(response.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(160):
                tg.start_soon(one, i)
        assert fake_provider.open_connections > 100  # idle in the client's pool now
    assert statuses == [200] * 160
    attempts = fake_provider.attempts
    assert all(a.completed and a.tokens_sent == 2 for a in attempts)
    in_flight = max(
        sum(b.arrived_at <= a.arrived_at < b.ended_at for b in attempts)  # type: ignore[operator]
        for a in attempts
    )
    assert in_flight > 100
    await fake_provider.wait_for_async(lambda a: fake_provider.open_connections == 0)


# --------------------------------------------------------------------------- waiting


async def test_wait_for_async_times_out_with_a_clear_message(
    fake_provider: FakeProvider,
) -> None:
    async with httpx.AsyncClient() as client:
        await client.post(f"{fake_provider.base_url}/chat/completions", json=chat_body("x"))

    def two_attempts(attempts: list[RecordedAttempt]) -> bool:
        return len(attempts) >= 2

    with pytest.raises(TimeoutError, match=r"two_attempts still false after 0.05 s") as info:
        await fake_provider.wait_for_async(two_attempts, timeout=0.05)
    assert "#0 model='x'" in str(info.value)
    assert "completed" in str(info.value)


async def test_sync_wait_for_refuses_to_block_the_event_loop(
    fake_provider: FakeProvider,
) -> None:
    with pytest.raises(RuntimeError, match="wait_for_async"):
        fake_provider.wait_for(lambda a: True)


def test_sync_wait_for_from_another_thread() -> None:
    with FakeProvider() as fake:

        def client() -> None:
            time.sleep(0.05)
            httpx.post(f"{fake.base_url}/chat/completions", json=chat_body("t"))

        thread = threading.Thread(target=client)
        thread.start()
        attempts = fake.wait_for(lambda a: len(a) == 1 and a[0].completed, timeout=3.0)
        thread.join()
        assert attempts[0].model == "t"
        with pytest.raises(TimeoutError, match="attempts recorded"):
            fake.wait_for(lambda a: len(a) == 2, timeout=0.05)


# --------------------------------------------------------------------------- lifecycle


def test_stop_is_idempotent_and_leaves_no_thread() -> None:
    fake = FakeProvider()
    fake.stop()  # never started: no-op
    fake.start()
    assert fake.running
    assert fake.base_url == f"http://127.0.0.1:{fake.port}/v1"
    with pytest.raises(RuntimeError, match="already running"):
        fake.start()
    # an open idle keep-alive connection must not keep the server alive
    client = httpx.Client()
    client.post(f"{fake.base_url}/chat/completions", json=chat_body())
    fake.stop()
    fake.stop()
    client.close()
    assert not fake.running
    assert not [t for t in threading.enumerate() if t.name == "latencykit-fake-provider"]
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"http://127.0.0.1:{fake.port}/v1/chat/completions", json=chat_body())


def test_stop_interrupts_hanging_requests() -> None:
    fake = FakeProvider().start()
    fake.script("hang", Behavior(fault=Fault.HANG))
    errors: list[BaseException] = []

    def client() -> None:
        try:
            httpx.post(f"{fake.base_url}/chat/completions", json=chat_body("hang"), timeout=5)
        except httpx.HTTPError as exc:
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    fake.wait_for(lambda a: len(a) == 1)
    started = time.monotonic()
    fake.stop()
    thread.join(3)
    assert time.monotonic() - started < 2
    assert errors and isinstance(errors[0], (httpx.RemoteProtocolError, httpx.ReadError))


def test_reset_clears_scripts_records_and_reseeds() -> None:
    draws: list[float] = []

    def script(request: RequestInfo) -> Behavior:
        draws.append(request.rng.random())
        return Behavior(output_tokens=1)

    with FakeProvider(seed=7) as fake:
        fake.default = script
        for _ in range(2):
            httpx.post(f"{fake.base_url}/chat/completions", json=chat_body("z"))
        fake.script("z", Behavior(fault=Fault.HTTP_500))
        fake.reset()
        assert fake.attempts == []
        response = httpx.post(f"{fake.base_url}/chat/completions", json=chat_body("z"))
        assert response.status_code == 200  # the script is gone, the default kept
        assert fake.attempts[0].index == 0
    assert draws[2] == draws[0]  # re-seeded


def test_port_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not been started"):
        _ = FakeProvider().port


def test_fixture_gives_a_started_provider(fake_provider: FakeProvider) -> None:
    assert fake_provider.running
    response = httpx.get(f"{fake_provider.base_url}/models")
    assert response.status_code == 200


# --------------------------------------------------------------------------- Behavior, Latency


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ttft": -1.0}, "ttft"),
        ({"ttft": float("nan")}, "ttft"),
        ({"itl": "fast"}, "itl"),
        ({"output_tokens": -1}, "output_tokens"),
        ({"output_tokens": 2.5}, "output_tokens"),
        ({"fault": "http_429"}, "fault"),
        ({"retry_after": -2}, "retry_after"),
        ({"stall_after": -1}, "stall_after"),
        ({"stall_for": -0.1}, "stall_for"),
        ({"keepalive_every": 0}, "keepalive_every"),
        ({"context_window": 0}, "context_window"),
        ({"text": 12}, "text"),
        ({"role_chunk": 1}, "role_chunk"),
        ({"stall_keepalive": "yes"}, "stall_keepalive"),
        ({"rejects_prefill": None}, "rejects_prefill"),
        ({"error": "boom"}, "error"),
        ({"error": None}, "error"),
        ({"status": 200}, "status"),
        ({"status": 600}, "status"),
        ({"status": "500"}, "status"),
        ({"error_type": 1}, "error_type"),
        ({"error_code": 1.5}, "error_code"),
        ({"error_code": True}, "error_code"),
        ({"error_message": b"x"}, "error_message"),
        ({"body": {}}, "body"),
        ({"headers": "retry-after: 1"}, "headers"),
        ({"headers": {"retry-after": 1}}, "headers"),
        ({"headers": {"x": "a\r\nInjected: 1"}}, "headers"),
        ({"headers": {"bad:name": "1"}}, "headers"),
    ],
)
def test_behavior_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"Behavior\.{field}\b"):
        Behavior(**kwargs)


def test_behavior_defaults_and_from_json() -> None:
    default = Behavior()
    assert (default.ttft, default.itl, default.output_tokens, default.fault) == (0.0, 0.0, 16, None)
    assert (default.stall_after, default.stall_for, default.keepalive_every) == (4, None, 0.5)
    assert (default.role_chunk, default.stall_keepalive, default.rejects_prefill) == (
        False,
        False,
        False,
    )
    assert default.error == "server_error"
    new_fields = {
        "fault": "CUT_WITH_DONE",
        "role_chunk": True,
        "stall_keepalive": True,
        "rejects_prefill": True,
        "error": "content_filter",
    }
    assert Behavior.from_json(new_fields) == Behavior(
        fault=Fault.CUT_WITH_DONE,
        role_chunk=True,
        stall_keepalive=True,
        rejects_prefill=True,
        error="content_filter",
    )
    assert Behavior.from_json({"fault": "headers_then_silence"}).fault is (
        Fault.HEADERS_THEN_SILENCE
    )
    assert Behavior.from_json({"fault": "error_event"}).fault is Fault.ERROR_EVENT
    parsed = Behavior.from_json({"fault": "HTTP_503", "ttft": 1})
    assert parsed == Behavior(fault=Fault.HTTP_503, ttft=1)
    parsed = Behavior.from_json(
        {"fault": "http_error", "status": 422, "error_code": 400, "headers": {"a": "b"}}
    )
    assert parsed == Behavior(
        fault=Fault.HTTP_ERROR, status=422, error_code=400, headers=(("a", "b"),)
    )
    assert (default.status, default.error_type, default.error_code) == (500, None, None)
    assert (default.error_message, default.body, default.headers) == (None, None, ())
    with pytest.raises(ValueError, match="unknown Behavior field"):
        Behavior.from_json({"tttf": 1})
    with pytest.raises(ValueError, match=r"Behavior\.fault must be one of"):
        Behavior.from_json({"fault": "explode"})


def test_latency_distributions_are_seeded_and_bounded() -> None:
    import random

    uniform = Latency.uniform(0.1, 0.2)
    lognormal = Latency.lognormal(0.5, 1.0)
    samples = Latency.samples([1.0, 2.0, 3.0])
    rng_a, rng_b = random.Random(1), random.Random(1)
    draws_a = [d.sample(rng_a) for d in (uniform, lognormal, samples) for _ in range(50)]
    draws_b = [d.sample(rng_b) for d in (uniform, lognormal, samples) for _ in range(50)]
    assert draws_a == draws_b
    assert all(0.1 <= x <= 0.2 for x in draws_a[:50])
    assert all(x > 0 for x in draws_a[50:100])
    assert set(draws_a[100:]) <= {1.0, 2.0, 3.0}
    assert Latency.fixed(0.25).sample(rng_a) == 0.25
    with pytest.raises(ValueError, match="seconds must be"):
        Latency.fixed(-1)
    with pytest.raises(ValueError, match="hi must be >= lo"):
        Latency.uniform(2, 1)
    with pytest.raises(ValueError, match="median must be > 0"):
        Latency.lognormal(0, 1)
    with pytest.raises(ValueError, match="at least one"):
        Latency.samples([])


async def test_latency_ttft_is_applied(fake_provider: FakeProvider) -> None:
    fake_provider.script("u", Behavior(ttft=Latency.uniform(0.15, 0.2), output_tokens=1))
    async with httpx.AsyncClient() as client:
        await client.post(f"{fake_provider.base_url}/chat/completions", json=chat_body("u"))
    attempt = last(fake_provider.attempts)
    assert 0.15 <= attempt.first_byte_at - attempt.arrived_at < 2.0  # type: ignore[operator]


# --------------------------------------------------------------------------- LlmperfProfile


def test_llmperf_runs_and_unknown_run() -> None:
    runs = LlmperfProfile.runs()
    assert len(runs) == 19
    assert "together/13b" in runs and "groq/70b" in runs
    with pytest.raises(ValueError, match="available runs: anyscale/13b") as info:
        LlmperfProfile.load("nobody/1b")
    assert "together/13b" in str(info.value)


def test_llmperf_sampling_keeps_rows_together_and_scales() -> None:
    import random

    full = LlmperfProfile.load("together/13b", scale=1.0)
    scaled = LlmperfProfile.load("together/13b", scale=0.05)
    assert len(full.ttfts) == 149  # one failed row is left out
    assert scaled.ttfts == pytest.approx([t * 0.05 for t in full.ttfts])
    assert max(full.ttfts) > 50  # the heavy tail is there
    rows = list(zip(full.ttfts, full.e2es, strict=True))
    rng = random.Random(3)
    for _ in range(100):
        b = full.sample(rng)
        assert isinstance(b.ttft, float) and isinstance(b.itl, float)
        e2e = b.ttft + b.itl * b.output_tokens
        # ttft, itl and tokens come from one recorded request: they rebuild its e2e
        assert any(t == b.ttft and abs(e - e2e) < 1e-9 for t, e in rows)
    rng_a, rng_b = random.Random(3), random.Random(3)
    for _ in range(20):
        a, b = full.sample(rng_a), scaled.sample(rng_b)
        assert isinstance(a.ttft, float) and isinstance(a.itl, float)
        assert b.ttft == pytest.approx(a.ttft * 0.05)
        assert b.itl == pytest.approx(a.itl * 0.05)
        assert b.output_tokens == a.output_tokens


def test_llmperf_token_cap_keeps_end_to_end_time() -> None:
    import random

    full = LlmperfProfile.load("anyscale/7b", scale=1.0)
    capped = LlmperfProfile.load("anyscale/7b", scale=1.0, max_output_tokens=10)
    rng_a, rng_b = random.Random(5), random.Random(5)
    for _ in range(20):
        a, b = full.sample(rng_a), capped.sample(rng_b)
        assert b.output_tokens == 10
        assert b.ttft == a.ttft
        assert b.itl * b.output_tokens == pytest.approx(a.itl * a.output_tokens)  # type: ignore[operator]


def test_llmperf_error_rows_replay_as_faults() -> None:
    import random

    profile = LlmperfProfile.load("lepton/13b", include_errors=True)
    faults = {profile.sample(random.Random(i)).fault for i in range(200)}
    assert Fault.HTTP_429 in faults and None in faults
    assert len(LlmperfProfile.load("lepton/13b").ttfts) == 20  # 130 of 150 were 429s
    with pytest.raises(ValueError, match="scale"):
        LlmperfProfile.load(scale=0)


async def test_llmperf_profile_as_script_is_reproducible(fake_provider: FakeProvider) -> None:
    profile = LlmperfProfile.load("fireworks/7b", scale=0.001, max_output_tokens=5)
    fake_provider.script("p", profile)
    async with httpx.AsyncClient() as client:
        for _ in range(3):
            response = await client.post(
                f"{fake_provider.base_url}/chat/completions", json=chat_body("p")
            )
            assert response.json()["usage"]["completion_tokens"] == 5
    import random

    rng = random.Random(0)  # the fixture's provider is seeded with 0
    expected = [profile.sample(rng) for _ in range(3)]
    for attempt, behavior in zip(fake_provider.attempts, expected, strict=True):
        assert isinstance(behavior.ttft, float) and isinstance(behavior.itl, float)
        took = attempt.first_byte_at - attempt.arrived_at  # type: ignore[operator]
        assert took >= behavior.ttft + 5 * behavior.itl - 0.002


@pytest.mark.slow
async def test_past_the_knee_throughput_levels_off_and_latency_queues(fake: FakeProvider) -> None:
    # What adaptive concurrency relies on: a server of 2 at a time, 0.1 s alone, kept busy by
    # 8 closed-loop clients, answers about 2 / 0.1 = 20 per second however many ask, and each
    # waits about 8 / 2 times as long.
    fake.script("knee", Behavior(ttft=0.1, concurrency_knee=2))
    body = {"model": "knee", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{fake.base_url}/chat/completions"
    waits: list[float] = []
    async with httpx.AsyncClient(timeout=10) as client:

        async def client_loop(until: float) -> None:
            while time.monotonic() < until:
                started = time.monotonic()
                (await client.post(url, json=body)).raise_for_status()
                waits.append(time.monotonic() - started)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(client_loop, started + 3.0)
        elapsed = time.monotonic() - started
    throughput = len(waits) / elapsed
    assert throughput <= 20 * 1.15, throughput  # the knee caps it (a slow machine only lowers it)
    later = sorted(waits[len(waits) // 2 :])
    assert later[len(later) // 2] >= 0.3, later  # about 0.4 s: queued behind the others
