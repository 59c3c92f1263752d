"""The fake provider's three wire formats (OpenAI, Anthropic Messages, Gemini) and a fault
matrix through real litellm and through ``lk.LLM`` on each.

litellm's ``acompletion`` runs on asyncio only, so the tests calling it directly pin the
backend; the ``lk.LLM`` tests and the raw-HTTP tests run on asyncio and trio. Where
latencykit's answer is wrong today the test asserts the right one and is marked
``xfail(strict=True)`` with the reason.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import httpx
import litellm
import pytest
from litellm import exceptions as llm_errors

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

FORMATS = ("openai", "anthropic", "gemini")
MESSAGES = [{"role": "user", "content": "Say something about latency, please."}]
KEY = "sk-wire-formats-secret-0123456789"

# What each format calls an overloaded server (Fault.HTTP_503).
OVERLOADED_STATUS = {"openai": 503, "anthropic": 529, "gemini": 503}


def api_base(fake: FakeProvider, wire: str) -> str:
    return {
        "openai": fake.base_url,
        "anthropic": fake.anthropic_base_url,
        "gemini": fake.gemini_base_url,
    }[wire]


async def through_litellm(fake: FakeProvider, wire: str, model: str, **kwargs: Any) -> Any:
    """One raw litellm call in ``wire``'s format (no retries)."""
    return await litellm.acompletion(
        model=f"{wire}/{model}",
        api_base=api_base(fake, wire),
        api_key=KEY,
        messages=MESSAGES,
        max_retries=0,
        **kwargs,
    )


def make_llm(fake: FakeProvider, wire: str, model: str) -> lk.LLM:
    return lk.LLM(f"{wire}/{model}", api_base=api_base(fake, wire), api_key=KEY)


async def read_stream(stream: Any) -> tuple[str, str, list[Any]]:
    """Read a stream to its end: (content text, reasoning text, chunks)."""
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta]
    text = "".join(d.content or "" for d in deltas)
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    return text, reasoning, chunks


async def llm_text(llm: lk.LLM, stream: bool) -> str:
    """The answer's text through lk.LLM, read to the end when streamed."""
    if not stream:
        response = await llm.acompletion(messages=MESSAGES)
        return str(response.choices[0].message.content)
    result = await llm.acompletion(messages=MESSAGES, stream=True)
    async with result:
        text, _, _ = await read_stream(result)
    return text


async def litellm_failure(
    fake: FakeProvider, wire: str, model: str, stream: bool, expected: type[Exception]
) -> Any:
    """The ``expected`` error a raw litellm call raises (read to its end when streamed).

    For Gemini, litellm wraps even an HTTP error that comes before a stream's first chunk
    in a MidStreamFallbackError (``is_pre_first_chunk``): the error it wraps is checked.
    """
    try:
        response = await through_litellm(fake, wire, model, stream=stream)
        await read_stream(response)
    except llm_errors.MidStreamFallbackError as wrapper:
        error, before_first_chunk = wrapper.original_exception, wrapper.is_pre_first_chunk
    except Exception as raised:
        error, before_first_chunk = raised, True
    else:
        raise AssertionError(f"{wire}/{model} did not fail")
    assert before_first_chunk
    assert isinstance(error, expected), repr(error)
    return error


def words(n: int) -> str:
    return " ".join(f"tok{i}" for i in range(n))


# --------------------------------------------------------------------------- through litellm


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_litellm_reads_each_format(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("plain", Behavior(output_tokens=5))
    response = await through_litellm(fake, wire, "plain", stream=stream)
    if stream:
        text, _, chunks = await read_stream(response)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert [f for f in finishes if f] == ["stop"]
    else:
        text = response.choices[0].message.content
        assert response.choices[0].finish_reason == "stop"
        assert response.usage.completion_tokens == 5
    assert text == words(5)
    [attempt] = fake.attempts
    assert (attempt.wire, attempt.model, attempt.stream) == (wire, "plain", stream)
    assert attempt.completed and attempt.status == 200 and attempt.tokens_sent == 5
    assert KEY not in json.dumps(dict(attempt.request_headers))  # keys are redacted


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_litellm_reads_reasoning_then_a_tool_call(
    fake: FakeProvider, wire: str, stream: bool
) -> None:
    fake.script(
        "agent",
        Behavior(reasoning="The user wants weather.", tool_call="get_weather"),
    )
    response = await through_litellm(fake, wire, "agent", stream=stream)
    if stream:
        text, reasoning, chunks = await read_stream(response)
        calls = [
            call
            for c in chunks
            if c.choices and c.choices[0].delta
            for call in c.choices[0].delta.tool_calls or ()
        ]
        name = next(c.function.name for c in calls if c.function.name)
        arguments = "".join(c.function.arguments or "" for c in calls)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert [f for f in finish if f] == ["tool_calls"]
    else:
        message = response.choices[0].message
        text, reasoning = message.content or "", message.reasoning_content
        [call] = message.tool_calls
        name, arguments = call.function.name, call.function.arguments
        assert response.choices[0].finish_reason == "tool_calls"
    assert reasoning == "The user wants weather."
    assert text == ""  # a tool-call-only answer
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})
    # 4 reasoning words and the call
    assert fake.attempts[0].tokens_sent == 5


@asyncio_only
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_litellm_maps_each_formats_errors(
    fake: FakeProvider, wire: str, stream: bool
) -> None:
    fake.script("limited", Behavior(fault=Fault.HTTP_429, retry_after=2))
    limited = await litellm_failure(fake, wire, "limited", stream, llm_errors.RateLimitError)
    headers = limited.litellm_response_headers or {}
    if wire == "gemini":  # Gemini says how long to wait in the body only
        assert "retry-after" not in headers
        assert '"retryDelay":"2s"' in str(limited)
    else:
        assert headers["retry-after"] == "2"
    if wire == "anthropic":
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"

    fake.script("long", Behavior(context_window=2))
    await litellm_failure(fake, wire, "long", stream, llm_errors.ContextWindowExceededError)
    assert fake.attempts[-1].fault is Fault.CONTEXT_LENGTH
    assert fake.attempts[-1].status == 400


# --------------------------------------------------------------------------- through lk.LLM


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_answers_in_each_format(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("plain", Behavior(text="Latency is the time an answer takes."))
    text = await llm_text(make_llm(fake, wire, "plain"), stream)
    assert text == "Latency is the time an answer takes."
    assert [(a.wire, a.completed) for a in fake.attempts] == [(wire, True)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "wire",
    [
        "openai",
        "anthropic",
        "gemini",
    ],
)
async def test_llm_rate_limited_with_its_wait(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("limited", Behavior(fault=Fault.HTTP_429, retry_after=2))
    with pytest.raises(lk.RateLimited) as info:
        await llm_text(make_llm(fake, wire, "limited"), stream)
    assert info.value.status_code == 429
    assert info.value.retry_after == 2.0  # Gemini's from the body's RetryInfo
    assert len(fake.attempts) == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_overloaded_is_transient(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("busy", Behavior(fault=Fault.HTTP_503))
    with pytest.raises(lk.ProviderUnavailable) as info:
        await llm_text(make_llm(fake, wire, "busy"), stream)
    assert lk.errors.is_transient(info.value)
    assert info.value.status_code == OVERLOADED_STATUS[wire]
    assert fake.attempts[0].status == OVERLOADED_STATUS[wire]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_context_length_exceeded(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("long", Behavior(context_window=3))
    with pytest.raises(lk.ContextLengthExceeded) as info:
        await llm_text(make_llm(fake, wire, "long"), stream)
    assert info.value.status_code == 400
    assert not lk.errors.is_transient(info.value)


async def read_broken(fake: FakeProvider, wire: str, model: str) -> lk.StreamBroken:
    """Open a stream through lk.LLM, read it, and return the StreamBroken it raises."""
    stream = await make_llm(fake, wire, model).acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        async with stream:
            await read_stream(stream)
    return info.value


@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_cut_stream_is_broken(fake: FakeProvider, wire: str) -> None:
    fake.script("cut", Behavior(fault=Fault.CUT, stall_after=2, output_tokens=8))
    error = await read_broken(fake, wire, "cut")
    assert error.partial_text == words(2) and error.finish_reason is None
    assert lk.errors.is_transient(error)


@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_cut_stream_reason_is_cut(fake: FakeProvider, wire: str) -> None:
    fake.script("cut", Behavior(fault=Fault.CUT, stall_after=2, output_tokens=8))
    error = await read_broken(fake, wire, "cut")
    assert error.reason == "cut"


@pytest.mark.parametrize("wire", ["openai", "anthropic", "gemini"])
async def test_llm_stream_ended_without_finish_is_cut(fake: FakeProvider, wire: str) -> None:
    # The body ends properly ([DONE], message_stop, or just the end) but no finish was sent.
    fake.script("early", Behavior(fault=Fault.CUT_WITH_DONE, stall_after=2, output_tokens=8))
    error = await read_broken(fake, wire, "early")
    assert error.reason == "cut" and error.partial_text == words(2)
    assert fake.attempts[0].completed  # the server ended the body properly


@pytest.mark.parametrize(
    "wire",
    [
        "openai",
        "anthropic",
        "gemini",
    ],
)
async def test_llm_malformed_event_breaks_the_stream(fake: FakeProvider, wire: str) -> None:
    fake.script("garbled", Behavior(fault=Fault.MALFORMED_CHUNK, stall_after=2, output_tokens=8))
    error = await read_broken(fake, wire, "garbled")
    assert error.partial_text == words(2)


@pytest.mark.parametrize(
    ("wire", "flavor"),
    [("openai", None), ("openai", "vllm"), ("anthropic", None), ("gemini", None)],
)
async def test_llm_error_event_mid_stream_is_a_transient_break(
    fake: FakeProvider, wire: str, flavor: str | None
) -> None:
    fake.script(
        "busy",
        Behavior(fault=Fault.ERROR_EVENT, error="overloaded", stall_after=2, flavor=flavor),
    )
    error = await read_broken(fake, wire, "busy")
    assert error.partial_text == words(2)
    assert lk.errors.is_transient(error)
    assert fake.attempts[0].completed  # an error event ends the body properly


@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_stall_with_keepalives_is_detected(fake: FakeProvider, wire: str) -> None:
    # Keep-alives (comments, Anthropic pings, empty parts) are not content: a stall.
    fake.script(
        "stalls",
        Behavior(fault=Fault.STALL, stall_after=2, stall_keepalive=True, keepalive_every=0.1),
    )
    llm = lk.LLM(
        f"{wire}/stalls",
        api_base=api_base(fake, wire),
        api_key=KEY,
        stream_guard=lk.StreamGuard(stall=0.6),
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamStalled) as info:
        async with stream:
            await read_stream(stream)
    assert info.value.reason == "stall" and info.value.partial_text == words(2)
    [attempt] = await fake.wait_for_async(lambda seen: seen[0].disconnected, 5.0)
    assert attempt.tokens_sent == 2


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_keepalives_before_the_answer(
    fake: FakeProvider, wire: str, stream: bool
) -> None:
    fake.script(
        "slow",
        Behavior(fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=0.4, keepalive_every=0.1, output_tokens=3),
    )
    assert await llm_text(make_llm(fake, wire, "slow"), stream) == words(3)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_prefill_is_continued(fake: FakeProvider, wire: str, stream: bool) -> None:
    fake.script("m", Behavior(text="The answer is 42."))
    prefilled = [*MESSAGES, {"role": "assistant", "content": "The answer"}]
    llm = make_llm(fake, wire, "m")
    response = await llm.acompletion(messages=prefilled, stream=stream)
    if stream:
        async with response:
            text, _, _ = await read_stream(response)
    else:
        text = response.choices[0].message.content
    assert text == " is 42."
    assert fake.attempts[0].prefill_chars == len("The answer")


@pytest.mark.parametrize("wire", FORMATS)
async def test_llm_header_selects_the_behavior_in_each_format(
    fake: FakeProvider, wire: str
) -> None:
    fake.script("m", Behavior(text="never sent"))
    llm = lk.LLM(
        f"{wire}/m",
        api_base=api_base(fake, wire),
        api_key=KEY,
        defaults={"extra_headers": {"x-fake-behavior": '{"fault": "context_length"}'}},
    )
    with pytest.raises(lk.ContextLengthExceeded):
        await llm.acompletion(messages=MESSAGES)
    assert fake.attempts[0].fault is Fault.CONTEXT_LENGTH


# --------------------------------------------------------------------------- the wire itself


async def post(
    fake: FakeProvider, path: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{fake.port}") as client:
        return await client.post(path, json=body, headers=headers)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each SSE event; comments are kept as (":", text)."""
    out: list[tuple[str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block:
            continue
        if block.startswith(":"):
            out.append((":", block))
            continue
        name, data = None, ""
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data = value
        out.append((name, data))
    return out


def anthropic_body(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-fake", "max_tokens": 1024, "messages": MESSAGES, **extra}


def gemini_body() -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": MESSAGES[0]["content"]}]}]}


async def test_anthropic_stream_events(fake: FakeProvider) -> None:
    fake.script(
        "claude-fake",
        Behavior(reasoning="Think first.", text="Hi there.", tool_call="get_weather"),
    )
    response = await post(fake, "/v1/messages", anthropic_body(stream=True), **{"x-api-key": KEY})
    assert response.status_code == 200
    events = sse_events(response.text)
    for name, data in events:  # the event line names the data's type
        assert name == json.loads(data)["type"]
    objects = [json.loads(data) for _, data in events]
    summary = [
        (o["type"], (o.get("delta") or o.get("content_block") or {}).get("type")) for o in objects
    ]
    assert summary == [
        ("message_start", None),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert [o["index"] for o in objects if o["type"] == "content_block_start"] == [0, 1, 2]
    assert objects[0]["message"]["usage"]["input_tokens"] == fake.attempts[0].prompt_tokens
    assert objects[-2]["delta"]["stop_reason"] == "tool_use"
    assert objects[-2]["usage"] == {"output_tokens": 5}
    assert fake.attempts[0].request_headers["x-api-key"] == "***"


async def test_anthropic_json_errors_and_pings(fake: FakeProvider) -> None:
    fake.script("claude-fake", Behavior(fault=Fault.HTTP_429, retry_after=3))
    response = await post(fake, "/v1/messages", anthropic_body())
    assert response.status_code == 429
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert response.headers["retry-after"] == "3"
    reset = datetime.datetime.fromisoformat(
        response.headers["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00")
    )
    assert reset > datetime.datetime.now(datetime.timezone.utc)

    fake.script("claude-fake", Behavior(context_window=2))
    response = await post(fake, "/v1/messages", anthropic_body())
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt is too long: ")

    fake.script(
        "claude-fake",
        Behavior(fault=Fault.ERROR_EVENT, error="overloaded", stall_after=1, output_tokens=3),
    )
    response = await post(fake, "/v1/messages", anthropic_body(stream=True))
    name, data = sse_events(response.text)[-1]
    assert name == "error"
    assert json.loads(data)["error"] == {"type": "overloaded_error", "message": "Overloaded"}

    fake.script(
        "claude-fake",
        Behavior(
            fault=Fault.STALL,
            stall_after=1,
            stall_for=0.5,
            stall_keepalive=True,
            keepalive_every=0.1,
            output_tokens=2,
        ),
    )
    response = await post(fake, "/v1/messages", anthropic_body(stream=True))
    names = [name for name, _ in sse_events(response.text)]
    assert names.count("ping") >= 2
    assert names[-1] == "message_stop"


async def test_gemini_stream_and_answer(fake: FakeProvider) -> None:
    fake.script("gemini-fake", Behavior(reasoning="Hmm.", text="Hi there."))
    path = "/v1beta/models/gemini-fake:streamGenerateContent?alt=sse"
    response = await post(fake, path, gemini_body(), **{"x-goog-api-key": KEY})
    assert response.status_code == 200
    chunks = [json.loads(data) for _, data in sse_events(response.text)]
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    assert [p for p in parts if p.get("thought")] == [{"text": "Hmm.", "thought": True}]
    assert "".join(p["text"] for p in parts if not p.get("thought")) == "Hi there."
    finishes = [c["candidates"][0].get("finishReason") for c in chunks]
    assert finishes[-1] == "STOP" and not any(finishes[:-1])
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 2
    attempt = fake.attempts[0]
    assert (attempt.wire, attempt.model, attempt.stream) == ("gemini", "gemini-fake", True)
    assert attempt.request_headers["x-goog-api-key"] == "***"

    fake.script("gemini-fake", Behavior(tool_call="lookup", tool_arguments='{"q": 1}'))
    response = await post(
        fake, f"/v1beta/models/gemini-fake:generateContent?key={KEY}", gemini_body()
    )
    [candidate] = response.json()["candidates"]
    assert candidate["content"]["parts"] == [{"functionCall": {"name": "lookup", "args": {"q": 1}}}]
    assert candidate["finishReason"] == "STOP"
    assert fake.attempts[1].stream is False


async def test_gemini_stream_that_ends_without_finish_reason(fake: FakeProvider) -> None:
    fake.script("gemini-fake", Behavior(fault=Fault.CUT_WITH_DONE, stall_after=3))
    path = "/v1beta/models/gemini-fake:streamGenerateContent?alt=sse"
    response = await post(fake, path, gemini_body())
    chunks = [json.loads(data) for _, data in sse_events(response.text)]
    assert len(chunks) == 3
    assert not any("finishReason" in c["candidates"][0] for c in chunks)
    assert fake.attempts[0].completed and fake.attempts[0].tokens_sent == 3


async def test_gemini_error_bodies(fake: FakeProvider) -> None:
    path = "/v1beta/models/gemini-fake:generateContent"
    fake.script("gemini-fake", Behavior(fault=Fault.HTTP_429, retry_after=2.5))
    response = await post(fake, path, gemini_body())
    assert response.status_code == 429
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
    retry = [d for d in error["details"] if d["@type"].endswith("google.rpc.RetryInfo")]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2.5s"}]

    fake.script("gemini-fake", Behavior(fault=Fault.HTTP_503, flavor="gemini_list_errors"))
    response = await post(fake, path, gemini_body())
    assert response.status_code == 503
    [item] = response.json()
    assert item["error"]["status"] == "UNAVAILABLE"

    fake.script(
        "gemini-fake",
        Behavior(
            fault=Fault.HTTP_ERROR,
            status=400,
            error_code="API_KEY_INVALID",
            error_message="API key not valid. Please pass a valid API key.",
        ),
    )
    response = await post(fake, path, gemini_body())
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert error["details"][0]["reason"] == "API_KEY_INVALID"

    fake.script("gemini-fake", Behavior(fault=Fault.CONTENT_POLICY))
    response = await post(fake, path, gemini_body())
    assert response.status_code == 200  # a blocked prompt: no candidates
    assert response.json()["promptFeedback"]["blockReason"] == "SAFETY"
    assert "candidates" not in response.json()


async def test_vllm_and_ollama_flavors(fake: FakeProvider) -> None:
    body = {"model": "m", "messages": MESSAGES}
    fake.script("m", Behavior(fault=Fault.HTTP_ERROR, status=400, flavor="vllm"))
    response = await post(fake, "/v1/chat/completions", body)
    assert response.json() == {
        "object": "error",
        "message": "Bad Request",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }

    fake.script(
        "m", Behavior(fault=Fault.ERROR_EVENT, stall_after=1, output_tokens=2, flavor="vllm")
    )
    response = await post(fake, "/v1/chat/completions", {**body, "stream": True})
    _, data = sse_events(response.text)[-1]
    assert json.loads(data) == {
        "error": {
            "object": "error",
            "type": "InternalServerError",
            "message": "The server had an error while processing your request. Sorry about that!",
            "code": 500,
        }
    }

    fake.script("m", Behavior(reasoning="Hmm, well.", output_tokens=1, flavor="ollama"))
    response = await post(fake, "/v1/chat/completions", {**body, "stream": True})
    deltas = [
        json.loads(data)["choices"][0]["delta"]
        for _, data in sse_events(response.text)
        if data.startswith("{")
    ]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Hmm, well."
    assert not any("reasoning_content" in d for d in deltas)
    assert deltas[2]["content"] == "tok0"  # the answer after the reasoning


async def test_requests_that_cannot_be_served_get_the_formats_error(fake: FakeProvider) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{fake.port}") as client:
        bad_body = await client.post("/v1/messages", content=b"[1, 2")
        bad_header = await client.post(
            "/v1beta/models/g:generateContent",
            json=gemini_body(),
            headers={"x-fake-behavior": '{"bogus": 1}'},
        )
    assert bad_body.status_code == 400
    assert bad_body.json()["type"] == "error"
    assert bad_body.json()["error"]["type"] == "invalid_request_error"
    assert bad_header.status_code == 400
    assert bad_header.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "x-fake-behavior" in bad_header.json()["error"]["message"]
    assert [(a.wire, a.status) for a in fake.attempts] == [("anthropic", 400), ("gemini", 400)]


async def test_unknown_urls_get_a_404_naming_every_format(fake: FakeProvider) -> None:
    response = await post(fake, "/v1beta/models/g:countTokens", gemini_body())
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "/v1/chat/completions" in message and "/v1/messages" in message
    assert ":streamGenerateContent" in message
    assert fake.attempts == []


def test_the_new_behavior_fields_are_validated() -> None:
    with pytest.raises(ValueError, match=r"Behavior\.flavor"):
        Behavior(flavor="tgi")
    with pytest.raises(ValueError, match=r"Behavior\.tool_arguments"):
        Behavior(tool_arguments={"city": "Paris"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Behavior\.reasoning"):
        Behavior(reasoning=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Behavior\.tool_call"):
        Behavior(tool_call=True)  # type: ignore[arg-type]
    assert Behavior.from_json({"tool_call": "f", "flavor": "ollama"}).flavor == "ollama"
