"""The same bytes, the same truth, from servers this project did not write (issue 22/24-27
seams): raw sockets (tests/wire.py) send what real servers send, byte for byte, and what hostile
ones do, through both lanes (litellm, and the fast lane ``transport="openai"``); each lane must
give the same answer, or the same typed error with the same kind and reason. Then the waits
that never end (a server that never answers, or stalls after its headers), a key a server
echoes back, and a soak of mixed chaos that must leak nothing."""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import anyio
import pytest

import latencykit as lk
from latencykit.errors import ErrorKind
from wire import RESET, Answer, chunk, http, raw_server, sse

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]
KEY = "sk-chaos-5f2d8e1a9b7c3d4e6f0a"
LANES = ("litellm", "openai")
SSE = "text/event-stream"
DONE = b"data: [DONE]"
K = ErrorKind


def completion(content: str | None = "fine", finish: str = "stop", **message: Any) -> bytes:
    """A chat-completion answer's body."""
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, **message},
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()


def event(choices: list[dict[str, Any]], **fields: Any) -> bytes:
    """One ``data:`` event of a chunk with these ``choices`` (and top-level ``fields``)."""
    payload = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + json.dumps({**payload, "choices": choices, **fields}).encode()


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": 0, "delta": fields, "finish_reason": finish}


def stream_of(*events: bytes) -> Answer:
    return http(200, sse(*events), content_type=SSE)


def head(status: int = 200, *lines: str) -> bytes:
    return "\r\n".join((f"HTTP/1.1 {status} X", *lines)).encode() + b"\r\n\r\n"


GOOD = completion()
GOOD_STREAM = (chunk("Hel"), chunk("lo"), chunk(None, "stop"), DONE)


# --- what a lane made of an answer ------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    """A lane's answer: its text and the provider's finish reason."""

    text: str | None
    finish: str | None


@dataclass(frozen=True)
class Failed:
    """A lane's error: its type, kind and (a stream's break) reason."""

    error: type[Exception]
    kind: ErrorKind
    reason: str | None = None


Outcome = Answered | Failed


def failed(error: lk.ProviderError) -> Failed:
    assert lk.errors.classify(error) is error.kind
    assert error.attempts, "no attempt history"  # the history travels with every error
    return Failed(type(error), error.kind, getattr(error, "reason", None))


def llm(base: str, transport: str, **options: Any) -> lk.LLM:
    return lk.LLM("openai/m", api_base=base, api_key=KEY, transport=transport, **options)


async def complete(base: str, transport: str) -> Outcome:
    try:
        response = await llm(base, transport).acompletion(messages=MESSAGES)
    except lk.ProviderError as error:
        return failed(error)
    choice = response.choices[0]
    return Answered(choice.message.content, choice.finish_reason)


async def streamed(base: str, transport: str) -> Outcome:
    try:
        stream = await llm(base, transport).acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                pass
    except lk.ProviderError as error:
        return failed(error)
    return Answered(stream.partial_text, stream.finish_reason)


async def call(front: lk.LLM, stream: bool) -> Any:
    """One call: the response, or the stream read to its end (and closed)."""
    if not stream:
        return await front.acompletion(messages=MESSAGES)
    answer = await front.acompletion(messages=MESSAGES, stream=True)
    async with answer:
        async for _ in answer:
            pass
    return answer


async def on_both_lanes(
    answer: Callable[[bytes], Answer] | Answer, call: Callable[[str, str], Any]
) -> dict[str, Any]:
    seen = {}
    for transport in LANES:
        async with raw_server(answer) as base:
            with anyio.fail_after(30):
                seen[transport] = await call(base, transport)
    return seen


# --- answers that are not streamed -------------------------------------------------------------


def http_date_in(seconds: int) -> Callable[[bytes], Answer]:
    """A 429 whose Retry-After is an HTTP-date ``seconds`` from when it is sent."""

    def answer(_request: bytes) -> Answer:
        date = formatdate(time.time() + seconds, usegmt=True)
        return http(429, b'{"error": {"message": "slow down"}}', headers=[("retry-after", date)])

    return answer


COMPLETE: dict[str, tuple[Any, Outcome]] = {
    "gzip": (
        http(200, gzip.compress(GOOD), headers=[("content-encoding", "gzip")]),
        Answered("fine", "stop"),
    ),
    "deflate": (
        http(200, zlib.compress(GOOD), headers=[("content-encoding", "deflate")]),
        Answered("fine", "stop"),
    ),
    "a byte-order mark before the JSON": (
        http(200, b"\xef\xbb\xbf" + GOOD, content_type="application/json; charset=utf-8"),
        Answered("fine", "stop"),
    ),
    "100 Continue first": (
        [b"HTTP/1.1 100 Continue\r\n\r\n", *http(200, GOOD)],
        Answered("fine", "stop"),
    ),
    "x-request-id": (
        http(200, GOOD, headers=[("x-request-id", "req_1")]),
        Answered("fine", "stop"),
    ),
    "cut at the output cap": (
        http(200, completion("parti", "length")),
        Answered("parti", "length"),
    ),
    "content filter finish": (
        http(200, completion(None, "content_filter")),
        Answered(None, "content_filter"),
    ),
    "tool call, content null": (
        http(
            200,
            completion(
                None,
                "tool_calls",
                tool_calls=[
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            ),
        ),
        Answered(None, "tool_calls"),
    ),
    "chunked, cut between chunks": (
        http(200, [GOOD[:40], GOOD[40:80]], chunked=True, cut=True),
        Failed(lk.ProviderConnectionError, K.CONNECTION),
    ),
    "chunked, cut inside a chunk": (
        http(200, [GOOD[:40], GOOD[40:]], chunked=True, cut_inside=True),
        Failed(lk.ProviderConnectionError, K.CONNECTION),
    ),
    "content-length longer than the body": (
        [head(200, "content-type: application/json", f"content-length: {len(GOOD) + 40}"), GOOD],
        Failed(lk.ProviderConnectionError, K.CONNECTION),
    ),
    "reset before headers": ([RESET], Failed(lk.ProviderConnectionError, K.CONNECTION)),
    "closed before headers": ([], Failed(lk.ProviderConnectionError, K.CONNECTION)),
    "reset after headers": (
        [head(200, "content-type: application/json", "content-length: 500"), GOOD[:30], RESET],
        Failed(lk.ProviderConnectionError, K.CONNECTION),
    ),
    "200, empty body": (http(200, b""), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, {}": (http(200, b"{}"), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, null": (http(200, b"null"), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, HTML": (
        http(200, b"<html><body>Welcome to nginx!</body></html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, choices []": (
        http(200, b'{"id": "x", "object": "chat.completion", "choices": []}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, a choice without a message": (
        http(200, b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0}]}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, a null message": (
        http(
            200, b'{"id": "x", "choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}'
        ),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, an event stream": (
        http(200, sse(*GOOD_STREAM), content_type=SSE),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, error object": (
        http(200, b'{"error": {"message": "upstream failed", "type": "server_error"}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, error object with code 429": (
        http(200, b'{"error": {"message": "slow down", "code": 429}}'),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "200, error object with code 503": (
        http(200, b'{"error": {"message": "busy", "code": 503}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "408": (
        http(408, b'{"error": {"message": "timed out"}}'),
        Failed(lk.AttemptTimeout, K.TIMEOUT),
    ),
    "413": (
        http(
            413,
            b"<html><title>413 Request Entity Too Large</title></html>",
            content_type="text/html",
        ),
        Failed(lk.BadRequest, K.BAD_REQUEST),
    ),
    "422 (FastAPI)": (
        http(422, b'{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}'),
        Failed(lk.BadRequest, K.BAD_REQUEST),
    ),
    "401, text": (
        http(401, b"Unauthorized", content_type="text/plain"),
        Failed(lk.AuthenticationFailed, K.AUTHENTICATION),
    ),
    "404 HTML": (
        http(404, b"<html><title>404 Not Found</title></html>", content_type="text/html"),
        Failed(lk.ModelNotFound, K.NOT_FOUND),
    ),
    "400, TGI's error string": (
        http(
            400,
            b'{"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be '
            b'<= 4096", "error_type": "validation"}',
        ),
        Failed(lk.ContextLengthExceeded, K.CONTEXT_LENGTH),
    ),
    "500 with x-request-id": (
        http(500, b'{"error": {"message": "boom"}}', headers=[("x-request-id", "req_2")]),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "502 HTML": (
        http(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "504 HTML": (
        http(504, b"<html><body>504 Gateway Time-out</body></html>", content_type="text/html"),
        Failed(lk.AttemptTimeout, K.TIMEOUT),
    ),
    "529": (
        http(529, b'{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "429, Retry-After an HTTP-date": (http_date_in(30), Failed(lk.RateLimited, K.RATE_LIMITED)),
    "429, retry-after-ms": (
        http(429, b'{"error": {"message": "slow"}}', headers=[("retry-after-ms", "1500")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
}
COMPLETE |= {
    "429, Retry-After in the past": (
        http(429, b"{}", headers=[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "429, Retry-After not a number": (
        http(429, b"{}", headers=[("retry-after", "soon")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "503, Retry-After": (
        http(503, b'{"error": {"message": "busy"}}', headers=[("retry-after", "2")]),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
}
RETRY_AFTER: dict[str, tuple[float | None, float | None]] = {
    "429, Retry-After an HTTP-date": (20.0, 31.0),
    "429, retry-after-ms": (1.5, 1.5),
    "429, Retry-After in the past": (0.0, 0.0),
    "429, Retry-After not a number": (None, None),
    "503, Retry-After": (2.0, 2.0),
}


@pytest.mark.parametrize("case", COMPLETE)
async def test_an_answer_is_read_the_same_on_both_lanes(case: str) -> None:
    answer, expected = COMPLETE[case]
    seen = await on_both_lanes(answer, complete)
    assert seen == {"litellm": expected, "openai": expected}


async def test_a_body_longer_than_its_content_length_is_transient_on_both_lanes() -> None:
    """The one divergence left in kind, the HTTP clients': litellm's (aiohttp) refuses the
    bytes past ``Content-Length`` (a broken connection), the fast lane's (httpx) reads the
    declared 20 bytes, which are no JSON (a malformed answer). Either is transient: retried,
    failed over, counted by the breaker."""
    answer = [head(200, "content-type: application/json", "content-length: 20") + GOOD]
    seen = await on_both_lanes(answer, complete)
    assert seen == {
        "litellm": Failed(lk.ProviderConnectionError, K.CONNECTION),
        "openai": Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    }


async def test_a_keep_alive_connection_the_server_closed_while_idle_is_not_reused() -> None:
    """A server that keeps a connection open after its answer (no ``connection: close``), then
    closes it when idle (uvicorn does after 5 s): the next call opens a new one, on both lanes,
    and is answered."""
    kept = [head(200, "content-type: application/json", f"content-length: {len(GOOD)}") + GOOD]

    async def three_calls(base: str, transport: str) -> list[Answered]:
        front, seen = llm(base, transport), []
        for _ in range(3):
            response = await front.acompletion(messages=MESSAGES)
            seen.append(Answered(response.choices[0].message.content, "stop"))
            await anyio.sleep(0.3)  # the server closed the connection after 1 ms
        return seen

    seen = await on_both_lanes(kept, three_calls)
    assert seen == {lane: [Answered("fine", "stop")] * 3 for lane in LANES}


@pytest.mark.parametrize("case", RETRY_AFTER)
async def test_the_wait_a_429_asks_for_is_read_the_same_on_both_lanes(case: str) -> None:
    low, high = RETRY_AFTER[case]

    async def wait(base: str, transport: str) -> float | None:
        with pytest.raises(lk.TransientError) as caught:
            await llm(base, transport).acompletion(messages=MESSAGES)
        return caught.value.retry_after

    for transport, seconds in (await on_both_lanes(COMPLETE[case][0], wait)).items():
        if low is None:
            assert seconds is None, transport
        else:
            assert seconds is not None and low <= seconds <= high, transport


# --- streams ------------------------------------------------------------------------------------


def split_inside(data: bytes, char: str) -> list[bytes | tuple[bytes, float]]:
    """``data`` in three TCP writes, the second ending inside ``char``'s UTF-8 bytes."""
    at = data.index(char.encode()) + 1
    return [(data[:9], 0.01), (data[9:at], 0.01), data[at:]]


TOOL_CALL = {"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}

STREAM: dict[str, tuple[Any, Outcome]] = {
    "CRLF line ends": (
        [head(200, f"content-type: {SSE}"), *(e + b"\r\n\r\n" for e in GOOD_STREAM)],
        Answered("Hello", "stop"),
    ),
    "CR line ends": (
        [head(200, f"content-type: {SSE}"), *(e + b"\r\r" for e in GOOD_STREAM)],
        Answered("Hello", "stop"),
    ),
    "keep-alive comments and event/id/retry fields": (
        http(
            200,
            [
                b": keep-alive\n\n",
                b"event: message\nid: 1\nretry: 3000\n" + GOOD_STREAM[0] + b"\n\n",
                b"id: 2\n" + GOOD_STREAM[1] + b"\n\n",
                *(e + b"\n\n" for e in GOOD_STREAM[2:]),
            ],
            content_type=SSE,
        ),
        Answered("Hello", "stop"),
    ),
    "an id field, then a keep-alive comment": (
        http(
            200,
            [b"id: 1\n" + GOOD_STREAM[0] + b"\n\n", b": ping\n\n", *sse(*GOOD_STREAM[1:])],
            content_type=SSE,
        ),
        Answered("Hello", "stop"),
    ),
    "a retry field alone": (
        http(200, [b"retry: 3000\n\n", *sse(*GOOD_STREAM)], content_type=SSE),
        Answered("Hello", "stop"),
    ),
    "a byte-order mark": (
        http(
            200,
            [b"\xef\xbb\xbf" + GOOD_STREAM[0] + b"\n\n", *sse(*GOOD_STREAM[1:])],
            content_type=SSE,
        ),
        Answered("Hello", "stop"),
    ),
    "an event split inside a UTF-8 character": (
        [
            head(200, f"content-type: {SSE}"),
            *split_inside(chunk("héllo wörld €") + b"\n\n", "€"),
            *sse(*GOOD_STREAM[2:]),
        ],
        Answered("héllo wörld €", "stop"),
    ),
    "multi-line data": (
        stream_of(
            b'data: {"id": "c1", "object": "chat.completion.chunk", "created": 1,\n'
            b'data: "model": "m", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}',
            *GOOD_STREAM[2:],
        ),
        Answered("Hi", "stop"),
    ),
    "a finish, then close (no [DONE])": (
        stream_of(*GOOD_STREAM[:3]),
        Answered("Hello", "stop"),
    ),
    "the last text with the finish": (
        stream_of(chunk("Hel"), chunk("lo", "stop"), DONE),
        Answered("Hello", "stop"),
    ),
    "events after [DONE]": (
        stream_of(*GOOD_STREAM, chunk("X"), DONE),
        Answered("Hello", "stop"),
    ),
    "usage only, no finish": (
        stream_of(event([], usage=USAGE), DONE),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "cut"),
    ),
    "[DONE] without a finish": (
        stream_of(*GOOD_STREAM[:2], DONE),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "cut"),
    ),
    "empty choices, delta {}, a usage-only last chunk": (
        stream_of(
            event([], prompt_filter_results=[{"prompt_index": 0}]),
            event([delta(role="assistant")]),
            chunk("Hi"),
            event([delta("stop")]),
            event([], usage=USAGE),
            DONE,
        ),
        Answered("Hi", "stop"),
    ),
    "tool-call deltas, content null": (
        stream_of(
            event([delta(role="assistant", content=None, tool_calls=[TOOL_CALL])]),
            event(
                [delta(content=None, tool_calls=[{"index": 0, "function": {"arguments": "{}"}}])]
            ),
            event([delta("tool_calls")]),
            DONE,
        ),
        Answered("", "tool_calls"),
    ),
    "content as a list of parts (Mistral)": (
        stream_of(
            event(
                [delta(content=[{"type": "thinking", "thinking": [{"type": "text", "text": "h"}]}])]
            ),
            event(
                [delta(content=[{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}])]
            ),
            *GOOD_STREAM[2:],
        ),
        Answered("Hello", "stop"),
    ),
    "reasoning deltas": (
        stream_of(
            event([delta(reasoning_content="hmm")]),
            event([delta(reasoning="so")]),
            chunk("Hi"),
            *GOOD_STREAM[2:],
        ),
        Answered("Hi", "stop"),
    ),
    "cut at the output cap": (
        stream_of(chunk("Hi"), chunk(None, "length"), DONE),
        Answered("Hi", "length"),
    ),
    "content filter finish": (
        stream_of(chunk("Hi"), chunk(None, "content_filter"), DONE),
        Answered("Hi", "content_filter"),
    ),
    "data: without a space, [DONE] too": (
        stream_of(*(e.replace(b"data: ", b"data:") for e in GOOD_STREAM)),
        Answered("Hello", "stop"),
    ),
    "finish_reason an empty string until the last": (
        stream_of(chunk("Hel", ""), chunk("lo", ""), *GOOD_STREAM[2:]),
        Answered("Hello", "stop"),
    ),
    "an error event with event: error": (
        stream_of(
            chunk("Hi"),
            b'event: error\ndata: {"error": {"message": "x", "type": "overloaded_error"}}',
        ),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "error"),
    ),
    "a rate-limit error event before content": (
        stream_of(
            chunk(role="assistant", content=""),
            b'data: {"error": {"message": "Rate limit reached", "code": 429}}',
        ),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "error"),
    ),
    "gzip": (
        http(
            200,
            gzip.compress(b"".join(sse(*GOOD_STREAM))),
            content_type=SSE,
            headers=[("content-encoding", "gzip")],
        ),
        Answered("Hello", "stop"),
    ),
    "a 300 kB event": (
        stream_of(chunk("x" * 300_000), *GOOD_STREAM[2:]),
        Answered("x" * 300_000, "stop"),
    ),
    "200, a JSON error object": (
        http(200, b'{"error": {"message": "rate limited", "code": 429}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "chunked, cut inside a chunk": (
        http(200, sse(*GOOD_STREAM), content_type=SSE, chunked=True, cut_inside=True),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "cut"),
    ),
    "reset mid-stream": (
        [*http(200, sse(*GOOD_STREAM[:2]), content_type=SSE), RESET],
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "cut"),
    ),
    "200, empty body": (
        http(200, b"", content_type=SSE),
        Failed(lk.StreamBroken, K.STREAM_BROKEN, "cut"),
    ),
    "200, a JSON answer": (http(200, GOOD), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, HTML": (
        http(200, b"<html>captive portal</html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "reset before headers": ([RESET], Failed(lk.ProviderConnectionError, K.CONNECTION)),
    "401, text": (
        http(401, b"Unauthorized", content_type="text/plain"),
        Failed(lk.AuthenticationFailed, K.AUTHENTICATION),
    ),
    "400, context length (vLLM)": (
        http(
            400,
            b'{"object": "error", "message": "This model\'s maximum context length is 10 '
            b'tokens", "type": "BadRequestError", "code": 400}',
        ),
        Failed(lk.ContextLengthExceeded, K.CONTEXT_LENGTH),
    ),
    "408": (http(408, b'{"error": {"message": "x"}}'), Failed(lk.AttemptTimeout, K.TIMEOUT)),
    "413": (http(413, b'{"error": {"message": "x"}}'), Failed(lk.BadRequest, K.BAD_REQUEST)),
    "429, retry-after-ms": (
        http(429, b'{"error": {"message": "slow"}}', headers=[("retry-after-ms", "1500")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "502 HTML": (
        http(502, b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "504 HTML": (
        http(504, b"<html><body>504 Gateway Time-out</body></html>", content_type="text/html"),
        Failed(lk.AttemptTimeout, K.TIMEOUT),
    ),
    "529": (
        http(529, b'{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
}


# What the litellm lane is known to get wrong, below latencykit. It reads events with the OpenAI
# SDK's decoder, which departs from the SSE spec: an event without data is dispatched (after an
# ``id:`` field, whose value it keeps, every blank line dispatches one) and fails to parse as
# JSON, which breaks the stream; a leading byte-order mark becomes part of the first field's
# name, and the first event is lost. And litellm drops a delta's content sent as a list of parts
# (the stream ends as an empty answer). Nothing under litellm can read past these; the fast lane
# reads them as sent. Strict: a litellm or SDK that gets one right shows up here.
LITELLM_LANE_KNOWN = {
    "an id field, then a keep-alive comment": "the SDK dispatches an event without data",
    "a retry field alone": "the SDK dispatches an event without data",
    "a byte-order mark": "the SDK reads the BOM into the first field's name",
    "content as a list of parts (Mistral)": "litellm drops content sent as parts",
}


def per_lane(cases: Mapping[str, object]) -> list[Any]:
    """Each case on each lane; the litellm lane's known breakages marked as expected to fail
    (strictly: an SDK that reads them right shows up)."""
    return [
        pytest.param(case, transport, marks=marks, id=f"{case}-{transport}")
        for case in cases
        for transport in LANES
        for known in [LITELLM_LANE_KNOWN.get(case) if transport == "litellm" else None]
        for marks in [[pytest.mark.xfail(reason=known, strict=True)] if known else []]
    ]


@pytest.mark.parametrize(("case", "transport"), per_lane(STREAM))
async def test_a_stream_is_read_the_same_on_both_lanes(case: str, transport: str) -> None:
    answer, expected = STREAM[case]
    async with raw_server(answer) as base:
        with anyio.fail_after(30):
            assert await streamed(base, transport) == expected


# --- embeddings ---------------------------------------------------------------------------------


def embeddings(*vectors: list[float]) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": 1, "total_tokens": 1}
    return json.dumps({"object": "list", "data": data, "model": "m", "usage": usage}).encode()


EMBED: dict[str, tuple[Any, list[list[float]] | Failed]] = {
    "an answer": (http(200, embeddings([0.5, 0.25])), [[0.5, 0.25]]),
    "gzip": (
        http(200, gzip.compress(embeddings([1.0])), headers=[("content-encoding", "gzip")]),
        [[1.0]],
    ),
    "200, {}": (http(200, b"{}"), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, HTML": (
        http(200, b"<html>hi</html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, error object": (
        http(200, b'{"error": {"message": "busy", "type": "server_error"}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "429": (
        http(429, b'{"error": {"message": "slow"}}', headers=[("retry-after", "2")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "502 HTML": (
        http(502, b"<html>502 Bad Gateway</html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "cut": (
        http(200, [embeddings([1.0])[:20], b"x"], chunked=True, cut_inside=True),
        Failed(lk.ProviderConnectionError, K.CONNECTION),
    ),
}


@pytest.mark.parametrize("case", EMBED)
async def test_an_embedding_answer_is_read_the_same_on_both_lanes(case: str) -> None:
    answer, expected = EMBED[case]

    async def embed(base: str, transport: str) -> list[list[float]] | Failed:
        try:
            response = await llm(base, transport).aembedding(input=["a"])
        except lk.ProviderError as error:
            return failed(error)
        return [list(item["embedding"]) for item in response.data]

    seen = await on_both_lanes(answer, embed)
    assert seen == {"litellm": expected, "openai": expected}


# --- servers that never finish ------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """What a process holds that a finished call must have given back."""

    fds: int
    tasks: int
    timers: int

    @staticmethod
    def now() -> Resources:
        import sniffio

        fds = len(os.listdir("/proc/self/fd"))
        if sniffio.current_async_library() == "asyncio":
            import asyncio

            loop = asyncio.get_running_loop()
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            timers = sum(1 for timer in scheduled if not timer.cancelled())
            return Resources(fds, len(asyncio.all_tasks()), timers)
        import trio

        statistics = trio.lowlevel.current_statistics()
        return Resources(fds, statistics.tasks_living, statistics.seconds_to_next_deadline < 1e6)

    def not_above(self, before: Resources) -> bool:
        return (
            self.fds <= before.fds and self.tasks <= before.tasks and self.timers <= before.timers
        )


async def settled(before: Resources) -> None:
    """Wait (up to 10 s) until the process holds no more than ``before``: a closed socket's
    descriptor may be released a moment after the call returned (litellm's loop on trio)."""
    for _ in range(200):
        gc.collect()
        if Resources.now().not_above(before):
            return
        await anyio.sleep(0.05)
    assert Resources.now() == before


SILENT: dict[str, Answer] = {
    "accepts, never sends a byte": [(b"", 60.0)],
    "sends its headers, then nothing": [(head(200, f"content-type: {SSE}"), 60.0)],
    "sends a first chunk, then nothing": [
        head(200, f"content-type: {SSE}"),
        (chunk("Hel") + b"\n\n", 60.0),
    ],
}


@pytest.mark.parametrize("transport", LANES)
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("case", SILENT)
async def test_a_server_that_stops_sending_is_left_at_the_deadline(
    case: str, stream: bool, transport: str
) -> None:
    """The deadline ends the call (DeadlineExceeded, with its history) and closes the
    connection: no descriptor, task or timer is left behind."""
    answers: Iterator[Answer] = iter(
        [stream_of(*GOOD_STREAM) if stream else http(200, GOOD), SILENT[case]]
    )
    async with raw_server(lambda _request: next(answers)) as base:
        front = llm(base, transport, deadline=1.0)
        # The lane's set-up (litellm's first call and its client for this host, with its
        # connection pool's timer; the fast lane's client) is not a leak.
        await call(front, stream)
        before = Resources.now()
        started = time.monotonic()
        with anyio.fail_after(30), pytest.raises(lk.DeadlineExceeded) as caught:
            await call(front, stream)
        assert 0.9 <= time.monotonic() - started < 10
        assert caught.value.attempts
    await settled(before)


# --- keys servers echo back ---------------------------------------------------------------------


def everything_shown(error: BaseException) -> str:
    """Everything a user may see of ``error``: its printed traceback, and the str and repr of
    every exception in it (causes, contexts, the attempts' errors) and of their attributes
    (an httpx request or response, a body, headers)."""
    shown = ["".join(traceback.format_exception(error))]
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        exc = pending.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        shown += [str(exc), repr(exc)]
        for value in vars(exc).values():
            shown.append(repr(value))
            for part in ("headers", "request", "url", "text"):
                with contextlib.suppress(Exception):  # a stream's body that was never read
                    shown.append(repr(getattr(value, part, None)))
        pending += [e for e in (exc.__cause__, exc.__context__) if e is not None]
        pending += [e for e in getattr(exc, "exceptions", ()) if isinstance(e, BaseException)]
    return "\n".join(shown)


ECHOED = json.dumps(
    {
        "error": {
            "message": f"Incorrect API key provided: {KEY}. You can find your API key at "
            "https://example.invalid/keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
            "key": KEY,
        }
    }
).encode()


@pytest.mark.parametrize("transport", LANES)
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("status", [401, 403])
async def test_a_key_the_server_echoes_is_shown_nowhere(
    status: int, stream: bool, transport: str
) -> None:
    answer = http(
        status, ECHOED, headers=[("www-authenticate", f'Bearer error="invalid_token" key="{KEY}"')]
    )
    async with raw_server(answer) as base:
        with pytest.raises(lk.AuthenticationFailed) as caught:
            await call(llm(base, transport), stream)
    shown = everything_shown(caught.value)
    assert "Incorrect API key provided" in shown  # the provider's message is kept, but
    assert KEY not in shown and KEY[4:20] not in shown  # not the key in it


# --- a soak of mixed chaos ----------------------------------------------------------------------

ROLE_ONLY = chunk(role="assistant", content="")
# name: (answer to a completion, to a stream, the kind of error each is on that attempt)
CHAOS: dict[str, tuple[Answer, Answer, ErrorKind | None, ErrorKind | None]] = {
    "fine": (http(200, GOOD), stream_of(*GOOD_STREAM), None, None),
    "500": (http(500, b'{"error": {"message": "boom"}}'),) * 2 + (K.SERVER_ERROR,) * 2,
    "429": (http(429, b"{}", headers=[("retry-after", "0")]),) * 2 + (K.RATE_LIMITED,) * 2,
    "reset": ([RESET], [RESET], K.CONNECTION, K.CONNECTION),
    "502 HTML": (http(502, b"<html>bad</html>", content_type="text/html"),) * 2
    + (K.SERVER_ERROR,) * 2,
    "not an answer": (http(200, b"{}"), http(200, GOOD), K.SERVER_ERROR, K.SERVER_ERROR),
    "cut before content": (
        http(200, [GOOD[:50], GOOD[50:]], chunked=True, cut_inside=True),
        stream_of(ROLE_ONLY),
        K.CONNECTION,
        K.STREAM_BROKEN,
    ),
    "error object": (
        http(200, b'{"error": {"message": "busy", "type": "server_error"}}'),
        stream_of(ROLE_ONLY, b'data: {"error": {"message": "x", "code": 500}}'),
        K.SERVER_ERROR,
        K.STREAM_BROKEN,
    ),
    "stalls after its headers": (
        [(head(200, "content-type: application/json", "content-length: 500"), 4.0)],
        [(head(200, f"content-type: {SSE}"), 4.0)],
        K.TIMEOUT,
        K.TIMEOUT,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("transport", LANES)
async def test_a_soak_of_mixed_chaos_fails_over_every_call_and_leaks_nothing(
    transport: str,
) -> None:
    """500 calls, streamed and not, 10 at a time, to a primary that answers each of CHAOS in
    turn, failing over to a healthy target: every call is answered, each failed attempt is the
    error its fault is, and no descriptor, task or timer outlives the calls (a stalled
    server's own socket closes when its 4 s are up)."""
    names = list(CHAOS)
    sent: list[ErrorKind | None] = []

    def chaos(request: bytes) -> Answer:
        name = names[len(sent) % len(names)]
        complete_answer, stream_answer, complete_kind, stream_kind = CHAOS[name]
        stream = b'"stream":true' in request.replace(b" ", b"")
        sent.append(stream_kind if stream else complete_kind)
        return stream_answer if stream else complete_answer

    healthy = lambda request: (  # noqa: E731
        stream_of(*GOOD_STREAM)
        if b'"stream":true' in request.replace(b" ", b"")
        else http(200, GOOD)
    )
    async with raw_server(chaos) as bad, raw_server(healthy) as good:
        front = lk.LLM(
            "openai/bad",
            api_base=bad,
            api_key=KEY,
            transport=transport,
            failover=[
                {
                    "model": "openai/good",
                    "api_base": good,
                    "api_key": KEY,
                    "transport": transport,
                    "timeout": 30,  # a loaded machine's slow answer is no failure here
                }
            ],
            deadline=20.0,
            timeout=1.5,  # the primary's attempts', and its streams' first-token limit
        )
        for stream in (False, True):  # set-up (litellm's clients, pools) is not a leak
            await call(front, stream)
        sent.clear()
        before = Resources.now()
        seen: list[ErrorKind | None] = []
        texts: Counter[str] = Counter()
        limit = anyio.Semaphore(10)

        async def one(number: int) -> None:
            async with limit:
                answer = await call(front, stream=number % 2 == 1)
            if isinstance(answer, lk.Stream):
                texts[answer.partial_text] += 1
            else:
                texts[answer.choices[0].message.content] += 1
            attempts = lk.report(answer).attempts
            assert attempts[-1].outcome == "ok"
            seen.extend(a.error_kind for a in attempts if a.target == "openai/bad")

        with anyio.fail_after(300):
            async with anyio.create_task_group() as group:
                for number in range(500):
                    group.start_soon(one, number)
        assert texts == {"fine": 250, "Hello": 250}
        assert len(sent) == 500
        assert Counter(map(str, seen)) == Counter(map(str, sent))
        await settled(before)


# --- the Responses API (through litellm: it has no fast lane) ------------------------------------

RESPONSE = json.dumps(
    {
        "id": "r1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "fine", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }
).encode()

RESPONSES: dict[str, tuple[Any, str | Failed]] = {
    "an answer": (http(200, RESPONSE), "fine"),
    "200, {}": (http(200, b"{}"), Failed(lk.ProviderUnavailable, K.SERVER_ERROR)),
    "200, HTML": (
        http(200, b"<html>hi</html>", content_type="text/html"),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "200, error object": (
        http(200, b'{"error": {"message": "busy", "code": 503}}'),
        Failed(lk.ProviderUnavailable, K.SERVER_ERROR),
    ),
    "429": (
        http(429, b'{"error": {"message": "slow"}}', headers=[("retry-after", "3")]),
        Failed(lk.RateLimited, K.RATE_LIMITED),
    ),
    "504 HTML": (
        http(504, b"<html>504 Gateway Time-out</html>", content_type="text/html"),
        Failed(lk.AttemptTimeout, K.TIMEOUT),
    ),
}


@pytest.mark.parametrize("case", RESPONSES)
async def test_a_responses_answer_that_is_not_one_is_a_transient_error(case: str) -> None:
    """A 200 litellm cannot read as a response (it raises its own 200) is a malformed answer,
    worth another attempt, as it is for a chat completion; not a client-side UNKNOWN."""
    answer, expected = RESPONSES[case]

    async def respond(base: str) -> str | Failed:
        try:
            response = await llm(base, "litellm").aresponses(input="hi")
        except lk.ProviderError as error:
            return failed(error)
        return str(response.output_text)

    async with raw_server(answer) as base:
        assert await respond(base) == expected
