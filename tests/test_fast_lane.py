"""The fast lane (transport="openai"): what is particular to it. Every policy's behaviour on it
is tested by the fault matrix (tests/test_faults.py, tests/test_stream.py run on both lanes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import litellm
import msgspec
import pytest

import latencykit as lk
from latencykit.chunks import Chunk, Node, Response
from latencykit.llm import to_model_response
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo
from wire import http, raw_server

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
SECRET = "sk-fast-lane-secret-0123456789"


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


async def test_a_response_reads_like_litellms_and_converts_to_it(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(text="Paris is the capital."))
    response = await fast(fake).acompletion(messages=MESSAGES, temperature=0)
    assert isinstance(response, Response)  # typed, no pydantic
    [choice] = response.choices
    assert choice.message is not None and choice.message.content == "Paris is the capital."
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert response.usage is not None and response.usage.completion_tokens == 4
    assert response.id and response.model == "primary"
    assert response["choices"][0]["message"]["role"] == "assistant"
    assert response.get("usage") is response.usage and "system_fingerprint" in response
    assert response.model_dump(mode="json")["choices"][0]["message"]["content"] == (
        "Paris is the capital."
    )
    report = lk.report(response)
    assert report.target == "openai/primary" and report.answering_attempt == 1
    converted: Any = to_model_response(response)
    assert type(converted) is litellm.ModelResponse
    assert converted.choices[0].message.content == "Paris is the capital."
    assert converted.usage.completion_tokens == 4
    assert lk.report(converted) is report


async def test_a_message_goes_back_into_the_conversation_as_it_came(fake: FakeProvider) -> None:
    received = bodies(fake, "primary", Behavior(text="Paris."))
    llm = fast(fake)
    first = await llm.acompletion(messages=MESSAGES)
    follow_up = [*MESSAGES, first.choices[0].message, {"role": "user", "content": "why?"}]
    await llm.acompletion(messages=follow_up)
    sent: Any = received[1].body["messages"]
    assert sent[1] == {"role": "assistant", "content": "Paris."}


async def test_a_response_with_fields_the_schema_lacks_keeps_them() -> None:
    body = {
        "id": "c1",
        "model": "m",
        "x_vendor": {"a": 1},
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
    }
    async with raw_server(http(200, json.dumps(body).encode())) as base:
        llm = lk.LLM("openai/m", api_base=base, transport="openai")
        response: Any = await llm.acompletion(messages=MESSAGES)
        await llm.aclose()
    assert isinstance(response, Node) and response.x_vendor.a == 1
    assert response.choices[0].message.content == "hi"
    assert lk.report(response).target == "openai/m"
    assert "_hidden_params" not in response and "_hidden_params" not in response.model_dump()


async def test_chunks_read_like_litellms_and_build_a_response(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(text="one two three"))
    stream = await fast(fake).acompletion(
        messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    first: Any = chunks[0]
    assert isinstance(chunks[0], Chunk) and first.choices[0].delta.content == "one"
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


# --- the SSE reader and the chunks it makes ---------------------------------------------------

# One of each thing an SSE body may hold, with CRLF line ends in part of it: events of one data
# line, with or without the space after "data:"; an "event:" field; a comment (a keep-alive);
# a data field over two lines (joined by LF); an empty event; one that does not parse; then
# [DONE] (with a space too many) and what follows it, which is never read as an event.
TRICKY = (
    b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\r\n\r\n'
    b": keep-alive\n\n"
    b'event: message\ndata:{"choices":[{"delta":{"content":"b"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"delta":{"content":\ndata: "c"},"finish_reason":null}]}\n\n'
    b"data:\n\n"
    b"data: {not json\n\n"
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\r\r'
    b"data:  [DONE]\n\n"
    b'data: {"choices":[{"delta":{"content":"after"}}]}\n\n'
)


def read_events(pieces: list[bytes]) -> tuple[list[tuple[Any, ...]], int, bool]:
    """What the fast lane's reader makes of a body arriving in ``pieces``: each chunk as
    ``(text, finish)``, the count of skipped (malformed) events, and whether it saw [DONE]."""
    from latencykit._openai import OpenAIChunks

    source: Any = object.__new__(OpenAIChunks)
    OpenAIChunks.__init__(source, None, None, ())  # type: ignore[arg-type]
    read: list[tuple[Any, ...]] = []
    for piece in pieces:
        if source._done:
            break  # the rest of the body is read, not parsed
        source._split(piece)
        while (got := source.buffered()) is not _nothing():
            read.append(tuple(got[1:]))
    return read, source.skipped, source._done


def _nothing() -> Any:
    from latencykit.stream import NOTHING

    return NOTHING


def test_sse_events_are_read_the_same_however_the_body_is_split() -> None:
    expected = [("a", None), ("b", None), ("c", None), (None, "stop")]
    assert read_events([TRICKY]) == (expected, 2, True)  # the empty and the unparsable event
    for cut in range(1, len(TRICKY)):
        assert read_events([TRICKY[:cut], TRICKY[cut:]]) == (expected, 2, True), cut
    assert read_events([TRICKY[i : i + 1] for i in range(len(TRICKY))]) == (expected, 2, True)


TOOL_EVENT = (
    b'{"id":"c1","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1",'
    b'"type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}'
)


def both_kinds(raw: bytes) -> list[Any]:
    """The event as a typed Chunk and as a Node (the form for events the schema does not fit)."""
    from latencykit.chunks import decode_chunk, decode_node

    return [decode_chunk(raw), Node(decode_node(raw))]


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def test_typed_chunks_and_nodes_read_the_same() -> None:
    typed, node = both_kinds(TOOL_EVENT)
    assert isinstance(typed, Chunk) and isinstance(node, Node)
    readers: list[Callable[[Any], Any]] = [
        lambda c: c.choices[0].delta.tool_calls[0].function.name,
        lambda c: c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
        lambda c: c.get("choices")[0].get("delta").tool_calls[0].get("function").name,
    ]
    chunk: Any
    for chunk in (typed, node):
        assert [read(chunk) for read in readers] == ["f", "f", "f"]
        assert chunk.missing is None and chunk.choices[0].delta.content is None
        assert chunk.get("usage") is None and chunk.get("usage", 0) == 0
        assert "choices" in chunk and "usage" not in chunk
        with pytest.raises(KeyError):
            chunk["not_a_field"]
        with pytest.raises(AttributeError):
            chunk._private  # noqa: B018
        assert without_nulls(chunk.model_dump()) == without_nulls(msgspec.json.decode(TOOL_EVENT))
    assert node.choices is node["choices"]  # a Node's nested objects: made once, kept


def test_a_node_keeps_what_the_typed_schema_does_not_name() -> None:
    raw = TOOL_EVENT.replace(b'"model":"m"', b'"model":"m","x_extra":[[{"k":1}]]')
    from latencykit.chunks import decode_chunk, decode_node

    node = Node(decode_node(raw))
    assert node.x_extra[0][0].k == 1 and node == msgspec.json.decode(raw)
    with pytest.raises(msgspec.ValidationError):
        decode_chunk(raw)


def test_a_stream_switches_to_nodes_at_the_first_event_the_schema_does_not_fit() -> None:
    from latencykit._openai import OpenAIChunks

    def event(text: str, extra: str = "") -> bytes:
        return (
            sse_event(f'{{"content":"{text}"}}').replace(b'"c1"', b'"c1"' + extra.encode())
            + b"\n\n"
        )

    source: Any = object.__new__(OpenAIChunks)
    OpenAIChunks.__init__(source, None, None, ())  # type: ignore[arg-type]
    source._split(event("a") + event("b", ',"vendor":{"queue":1}') + event("c"))
    kinds = []
    while (got := source.buffered()) is not _nothing():
        kinds.append((type(got[0]).__name__, got[1]))
        if got[1] == "b":
            assert got[0].vendor.queue == 1  # kept, with attribute access
    assert kinds == [("Chunk", "a"), ("Node", "b"), ("Node", "c")]


def test_stream_chunk_builder_builds_the_same_response_from_either_kind() -> None:
    events = [
        b'{"id":"c1","model":"m","created":1,"choices":[{"index":0,"delta":{"role":"assistant",'
        b'"reasoning_content":"think"},"finish_reason":null}]}',
        b'{"id":"c1","model":"m","created":1,"choices":[{"index":0,"delta":{"content":"Hi"},'
        b'"finish_reason":null}]}',
        TOOL_EVENT.replace(b'"model":"m"', b'"model":"m","created":1'),
        b'{"id":"c1","model":"m","created":1,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"arguments":"x"}}]},"finish_reason":"tool_calls"}]}',
        b'{"id":"c1","model":"m","created":1,"choices":[],"usage":{"prompt_tokens":3,'
        b'"completion_tokens":4,"total_tokens":7}}',
    ]
    built = []
    for kind in (0, 1):
        chunks = [both_kinds(raw)[kind] for raw in events]
        response: Any = litellm.stream_chunk_builder(chunks)
        message = response.choices[0].message
        built.append(
            (
                message.content,
                message.tool_calls[0].function.name,
                message.tool_calls[0].function.arguments,
                response.choices[0].finish_reason,
                response.usage.completion_tokens,
            )
        )
    assert built[0] == built[1] == ("Hi", "f", "{}x", "tool_calls", 4)


def raw_sse_server(writes: list[tuple[bytes, float]]) -> Any:
    """A raw server answering with an SSE body written as ``(bytes, pause after)`` pieces, its
    end marked by closing the connection (tests/wire.py)."""
    return raw_server([*http(200, [], content_type="text/event-stream"), *writes])


def sse_event(delta: str, finish: str = "null") -> bytes:
    return b'data: {"id":"c1","model":"m","choices":[{"delta":%s,"finish_reason":%s}]}' % (
        delta.encode(),
        finish.encode(),
    )


async def test_a_raw_sse_body_in_pieces_with_crlf_and_no_final_blank_line() -> None:
    """Over real HTTP: a server that writes its SSE body in small pieces with CRLF line ends,
    a keep-alive and an unparsable event, and ends the body (closing the connection) right
    after the last event's data line."""
    events = [
        sse_event('{"content":"Hel"}'),
        b": ping",
        b"data: {broken",
        sse_event('{"content":"lo"}'),
        sse_event("{}", '"stop"'),
    ]
    body = b"\r\n\r\n".join(events) + b"\r\n"
    async with raw_sse_server([(body[i : i + 7], 0.001) for i in range(0, len(body), 7)]) as base:
        llm = lk.LLM("openai/m", api_base=base, api_key=SECRET, transport="openai")
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            texts = [chunk.choices[0].delta.content async for chunk in stream]
    assert texts == ["Hel", "lo", None]
    assert stream.partial_text == "Hello" and stream.finish_reason == "stop"
    assert stream.outcome == "ok" and stream.skipped == 1


async def test_a_slow_consumer_of_events_read_at_once_is_not_taken_for_a_stall() -> None:
    """Six events arrive in one write, the rest 0.1 s later (within the stall limit); the
    consumer spends twice the limit on the six. The events carry the time of the read that
    brought them, but that time is the consumer's, not the provider's: no stall."""
    burst = b"".join(sse_event(f'{{"content":"t{i}"}}') + b"\n\n" for i in range(6))
    rest = b"".join(sse_event(f'{{"content":"t{i}"}}') + b"\n\n" for i in range(6, 9))
    rest += sse_event("{}", '"stop"') + b"\n\ndata: [DONE]\n\n"
    async with raw_sse_server([(burst, 0.1), (rest, 0.0)]) as base:
        llm = lk.LLM(
            "openai/m",
            api_base=base,
            api_key=SECRET,
            transport="openai",
            stream_guard=lk.StreamGuard(stall=0.3),
        )
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        texts = []
        async with stream:
            async for chunk in stream:
                texts.append(chunk.choices[0].delta.content)
                if len(texts) <= 6:
                    await anyio.sleep(0.1)
    assert texts == [f"t{i}" for i in range(9)] + [None]
    assert stream.outcome == "ok"
    assert max(stream.gaps[:5]) < 0.05  # the six arrived together: gaps of the provider's


async def test_an_llm_closes_the_connections_it_opened(fake: FakeProvider) -> None:
    """``async with lk.LLM(...)`` (``aclose()``) closes its pooled connections: the server
    sees them go. A later call opens a new one."""
    async with fast(fake) as llm:
        await llm.acompletion(messages=MESSAGES)
        assert fake.open_connections == 1
    await fake.wait_for_async(lambda _: fake.open_connections == 0, 3.0)
    await llm.acompletion(messages=MESSAGES)
    assert fake.connections_opened == 2
    await llm.aclose()


NEVER_LITELLM = """
import sys
import anyio
import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

async def main():
    with FakeProvider() as fake:
        fake.script("refused", Behavior(fault=Fault.HTTP_ERROR, status=401))
        fake.script("cut", Behavior(fault=Fault.CUT, stall_after=2))
        llm = lk.LLM(
            "openai/m", api_base=fake.base_url, api_key="sk-x", transport="openai",
            failover=[{"model": "gpt-4o-mini", "api_base": fake.base_url, "transport": "openai"}],
            defaults={"temperature": 0}, retry=lk.Retry(max_attempts=2), deadline=30,
        )
        assert "litellm" not in sys.modules, "at construction"
        response = await llm.acompletion(messages=[{"role": "user", "content": "hi"}])
        assert response.choices[0].message.content and lk.report(response).answering_attempt == 1
        stream = await llm.acompletion(messages=[{"role": "user", "content": "hi"}], stream=True)
        async with stream:
            assert [chunk async for chunk in stream]
        for model, error in (("refused", lk.AuthenticationFailed), ("cut", lk.StreamBroken)):
            try:
                one = lk.LLM(f"openai/{model}", api_base=fake.base_url, transport="openai")
                answer = await one.acompletion(messages=[{"role": "user", "content": "x"}],
                                               stream=model == "cut")
                async with answer:
                    async for _ in answer:
                        pass
            except error:
                pass
            else:
                raise AssertionError(f"{model}: no {error.__name__}")
        await llm.aclose()
    print("litellm" in sys.modules)

anyio.run(main)
"""


@pytest.mark.slow
def test_an_llm_all_on_the_fast_lane_never_imports_litellm() -> None:
    """Constructed, called (a response, a stream, an error answer, a cut stream): litellm, its
    seconds of import and its memory, are never loaded."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", NEVER_LITELLM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.slow
def test_an_application_that_loaded_litellm_has_its_heap_frozen_all_the_same() -> None:
    """litellm's million long-lived objects make every full collection a ~200 ms pause: an LLM
    freezes them when litellm is loaded, even if its own targets never need litellm."""
    import subprocess
    import sys

    code = (
        "import gc, litellm, latencykit as lk\n"
        "lk.LLM('openai/m', api_base='http://127.0.0.1:9/v1', transport='openai')\n"
        "print(gc.get_freeze_count() > 100_000)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
