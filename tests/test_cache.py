"""ResponseCache: through lk.LLM against the fake provider, and as a decorator."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import latencykit as lk
from latencykit._litellm import LITELLM_CHUNKS
from latencykit.cache import (
    CacheLookup,
    CacheStats,
    CacheStore,
    CacheStored,
    MemoryStore,
    ResponseCache,
    normalize_text,
)
from latencykit.chunks import Node
from latencykit.pipeline import Call, Pipeline
from latencykit.stream import ChunkSource
from latencykit.target import Target
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def make_llm(fake: FakeProvider, cache: ResponseCache, model: str = "m", **options: Any) -> lk.LLM:
    return lk.LLM(
        f"openai/{model}", api_base=fake.base_url, api_key="sk-test", cache=cache, **options
    )


def requests(fake: FakeProvider, model: str = "m") -> int:
    """HTTP requests the fake provider received for ``model``."""
    return sum(1 for attempt in fake.attempts if attempt.model == model)


def text_of(response: Any) -> str:
    return str(response.choices[0].message.content)


async def read_stream(stream: lk.Stream[Any]) -> tuple[str, list[Any]]:
    async with stream:
        chunks = [chunk async for chunk in stream]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    return text, chunks


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class DictStore:
    """A custom CacheStore (as a Redis one would be): async, no set_nowait."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.ttls: dict[str, float | None] = {}
        self.gets = 0
        self.written = anyio.Event()  # set at every write, then replaced

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        await anyio.lowlevel.checkpoint()  # a real store suspends
        return self.data.get(key)

    async def set(self, key: str, value: bytes, ttl: float | None) -> None:
        await anyio.lowlevel.checkpoint()
        self.data[key] = value
        self.ttls[key] = ttl
        self.written.set()
        self.written = anyio.Event()


# --- through lk.LLM -------------------------------------------------------------------------


async def test_second_identical_call_is_a_hit_without_a_request(fake: FakeProvider) -> None:
    cache = ResponseCache()
    llm = make_llm(fake, cache)
    first = await llm.acompletion(messages=MESSAGES)
    second = await llm.acompletion(messages=MESSAGES)
    assert requests(fake) == 1
    assert lk.report(first).cache == "miss"
    hit = lk.report(second)
    assert hit.cache == "hit"
    assert hit.attempts == () and hit.answering_attempt == 0 and hit.target == "openai/m"
    assert not hit.degraded
    assert type(second) is type(first)
    assert text_of(second) == text_of(first) and second.id == first.id
    assert second.usage.total_tokens == first.usage.total_tokens
    # Each hit is a fresh object: a caller mutating one does not change the next.
    second.choices[0].message.content = "changed"
    third = await llm.acompletion(messages=MESSAGES)
    assert text_of(third) == text_of(first)
    assert third is not second
    assert cache.stats() == CacheStats(hits=2, misses=1, stored=1, errors=0)
    assert cache.hits == 2 and cache.misses == 1
    assert cache.hit_rate == pytest.approx(2 / 3)


async def test_the_fast_lane_is_cached_without_litellms_types(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache(), transport="openai")
    first = await llm.acompletion(messages=MESSAGES)
    second = await llm.acompletion(messages=MESSAGES)
    assert requests(fake) == 1 and lk.report(second).cache == "hit"
    assert isinstance(second, Node) and text_of(second) == text_of(first)
    assert second.usage.total_tokens == first.usage.total_tokens


async def test_whitespace_dict_order_and_irrelevant_arguments_hit(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache())
    await llm.acompletion(
        messages=[
            {"role": "system", "content": "Be brief.\n\nAnswer in English."},
            {"role": "user", "content": "What is  the capital\tof France?"},
        ],
        temperature=0,
        max_tokens=50,
    )
    variants: list[dict[str, Any]] = [
        {  # CRLF, trailing spaces, extra blank lines, dict order, 0.0 for 0
            "max_tokens": 50,
            "temperature": 0.0,
            "messages": [
                {"content": "  Be brief.  \r\n\r\n\r\nAnswer in English.\r\n", "role": "system"},
                {"content": "What is the capital of France?  ", "role": "user"},
            ],
        },
        {  # text parts, and arguments that do not change the answer
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "Be brief.\n\nAnswer in English."}],
                },
                {"role": "user", "content": "What is the capital of France?"},
            ],
            "temperature": 0,
            "max_tokens": 50,
            "user": "alice",
            "metadata": {"request": 7},
            "extra_headers": {"x-trace": "abc"},
            "stream_options": {"include_usage": True},
        },
    ]
    # The text-parts variant differs from a plain string: it is its own entry, then a hit.
    for variant in variants:
        await llm.acompletion(**variant)
    assert requests(fake) == 2
    for variant in variants:
        assert lk.report(await llm.acompletion(**variant)).cache == "hit"
    assert requests(fake) == 2


async def test_what_changes_the_answer_misses(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache())
    await llm.acompletion(messages=MESSAGES, temperature=0)
    changed: list[dict[str, Any]] = [
        {"messages": MESSAGES, "temperature": 0.7},
        {"messages": MESSAGES},  # no temperature is not temperature=0
        {"messages": MESSAGES, "temperature": 0, "seed": 1},
        {"messages": MESSAGES, "temperature": 0, "stop": ["\n"]},
        {"messages": MESSAGES, "temperature": 0, "response_format": {"type": "json_object"}},
        {"messages": MESSAGES, "temperature": 0, "some_provider_option": True},  # unknown: keyed
        {
            "messages": [{"role": "user", "content": "What is the capital of Spain?"}],
            "temperature": 0,
        },
        {
            "messages": [{"role": "system", "content": "What is the capital of France?"}],
            "temperature": 0,
        },
    ]
    for arguments in changed:
        assert lk.report(await llm.acompletion(**arguments)).cache == "miss"
    assert requests(fake) == 1 + len(changed)
    other = await llm.acompletion(model="openai/other", messages=MESSAGES, temperature=0)
    assert lk.report(other).cache == "miss" and requests(fake, "other") == 1


async def test_normalize_whitespace_off_keys_text_exactly(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache(normalize_whitespace=False))
    await llm.acompletion(messages=[{"role": "user", "content": "hi there"}])
    spaced = await llm.acompletion(messages=[{"role": "user", "content": "hi  there"}])
    assert lk.report(spaced).cache == "miss"
    assert requests(fake) == 2


async def test_errors_are_not_cached(fake: FakeProvider) -> None:
    fake.script("m", [Behavior(fault=Fault.HTTP_ERROR, status=400), Behavior()])
    cache = ResponseCache()
    llm = make_llm(fake, cache)
    with pytest.raises(lk.BadRequest):
        await llm.acompletion(messages=MESSAGES)
    answer = await llm.acompletion(messages=MESSAGES)
    assert lk.report(answer).cache == "miss"
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "hit"
    assert requests(fake) == 2
    assert cache.stats() == CacheStats(hits=1, misses=2, stored=1, errors=0)


async def test_degraded_answers_are_not_cached_unless_asked(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("cheap", Behavior(output_tokens=3))
    degrade = lk.Degrade(model="openai/cheap", after=0.3)
    llm = make_llm(fake, ResponseCache(), "slow", deadline=20.0, degrade=degrade)
    for _ in range(2):
        report = lk.report(await llm.acompletion(messages=MESSAGES))
        assert report.degraded and report.cache == "miss"
    assert requests(fake, "cheap") == 2

    fake.reset()
    fake.script("slow", Behavior(ttft=30.0))
    keeping = make_llm(
        fake, ResponseCache(cache_degraded=True), "slow", deadline=20.0, degrade=degrade
    )
    first = await keeping.acompletion(messages=MESSAGES)
    hit = lk.report(await keeping.acompletion(messages=MESSAGES))
    assert hit.cache == "hit" and hit.attempts == ()
    # A hit of a degraded answer says so, and which target gave it.
    assert hit.degraded and hit.fallback_reason == "timeout"
    assert hit.target == lk.report(first).target == "openai/cheap"
    assert requests(fake, "cheap") == 1


async def test_truncated_answers_are_not_cached_unless_asked_through_llm(
    fake: FakeProvider,
) -> None:
    # The fake provider cuts an answer longer than max_tokens there, with "length".
    llm = make_llm(fake, ResponseCache())
    for stream in (False, True, False):
        if stream:
            text, _ = await read_stream(
                await llm.acompletion(messages=MESSAGES, max_tokens=3, stream=True)
            )
            assert text == "tok0 tok1 tok2"
        else:
            response = await llm.acompletion(messages=MESSAGES, max_tokens=3)
            assert response.choices[0].finish_reason == "length"
            assert lk.report(response).cache == "miss"
    assert requests(fake) == 3

    keeping = make_llm(fake, ResponseCache(cache_truncated=True))
    text, _ = await read_stream(
        await keeping.acompletion(messages=MESSAGES, max_tokens=3, stream=True)
    )
    hit = await keeping.acompletion(messages=MESSAGES, max_tokens=3)
    assert lk.report(hit).cache == "hit"
    assert hit.choices[0].finish_reason == "length" and text_of(hit) == text
    assert requests(fake) == 4


async def test_requests_for_several_choices_pass_the_cache_by(fake: FakeProvider) -> None:
    cache = ResponseCache()
    llm = make_llm(fake, cache)
    for _ in range(2):
        assert lk.report(await llm.acompletion(messages=MESSAGES, n=2)).cache is None
    assert requests(fake) == 2
    assert cache.stats() == CacheStats(0, 0, 0, 0)
    # n=1 is the default: the same entry as no n.
    await llm.acompletion(messages=MESSAGES, n=1)
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "hit"


async def test_ttl_expiry(fake: FakeProvider) -> None:
    clock = FakeClock()
    llm = make_llm(fake, ResponseCache(ttl=10.0, store=MemoryStore(clock=clock)))
    await llm.acompletion(messages=MESSAGES)
    clock.now += 9.9
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "hit"
    clock.now += 0.1
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "miss"
    assert requests(fake) == 2
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "hit"


async def test_max_entries_evicts_the_least_recently_used(fake: FakeProvider) -> None:
    cache = ResponseCache(max_entries=2)
    llm = make_llm(fake, cache)

    def ask(question: str) -> Any:
        return llm.acompletion(messages=[{"role": "user", "content": question}])

    await ask("a")
    await ask("b")
    assert lk.report(await ask("a")).cache == "hit"  # "a" is now the most recently used
    await ask("c")  # evicts "b"
    assert len(cache.store) == 2  # type: ignore[arg-type]
    assert lk.report(await ask("a")).cache == "hit"
    assert lk.report(await ask("c")).cache == "hit"
    assert lk.report(await ask("b")).cache == "miss"
    assert requests(fake) == 4


async def test_streaming_miss_is_stored_and_a_streaming_hit_replays_it(fake: FakeProvider) -> None:
    fake.script("m", Behavior(text="Paris is the capital of France."))
    cache = ResponseCache()
    llm = make_llm(fake, cache)
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert isinstance(stream, lk.Stream)
    text, _ = await read_stream(stream)
    assert text == "Paris is the capital of France."
    assert lk.report(stream).cache == "miss"

    replay = await llm.acompletion(messages=MESSAGES, stream=True)
    assert isinstance(replay, lk.Stream)
    replayed, chunks = await read_stream(replay)
    assert replayed == text
    report = lk.report(replay)
    assert report.cache == "hit" and report.attempts == () and report.answering_attempt == 0
    assert str(report).startswith("openai/m answered from the cache, first token ")
    assert report.target == "openai/m" and report.chunks == 1 and report.ttft is not None
    assert replay.outcome == "ok" and replay.finish_reason == "stop"
    assert requests(fake) == 1
    # litellm chunk objects, as litellm's own stream gives them.
    assert all(type(chunk).__name__ == "ModelResponseStream" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].model == "m"
    assert chunks[-1].choices[0].finish_reason == "stop"
    import litellm

    built: Any = litellm.stream_chunk_builder(chunks)
    assert built.choices[0].message.content == text


async def test_streamed_and_plain_calls_share_their_entries(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache())
    # Streamed first, then asked without streaming: a ModelResponse from the stream's answer.
    streamed, _ = await read_stream(
        await llm.acompletion(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    response = await llm.acompletion(messages=MESSAGES)
    assert lk.report(response).cache == "hit"
    assert text_of(response) == streamed
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens == 16  # as the stream reported it
    # Asked plainly first, then streamed: the response replayed as chunks.
    other = [{"role": "user", "content": "Another question"}]
    plain = await llm.acompletion(messages=other)
    replay = await llm.acompletion(messages=other, stream=True)
    replayed, chunks = await read_stream(replay)
    assert lk.report(replay).cache == "hit"
    assert replayed == text_of(plain)
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens
    assert requests(fake) == 2


async def test_a_stream_closed_before_its_end_is_not_stored(fake: FakeProvider) -> None:
    seen: list[lk.events.Event] = []
    llm = make_llm(fake, ResponseCache())
    with lk.subscribe(seen.append):
        async with await llm.acompletion(messages=MESSAGES, stream=True) as stream:
            async for _ in stream:
                break
        again = await llm.acompletion(messages=MESSAGES, stream=True)
        await read_stream(again)
    assert lk.report(again).cache == "miss"
    stored = [(e.stored, e.reason) for e in seen if isinstance(e, CacheStored)]
    assert stored == [(False, "incomplete"), (True, None)]


async def test_a_broken_stream_is_not_stored(fake: FakeProvider) -> None:
    fake.script("m", [Behavior(fault=Fault.CUT, stall_after=3), Behavior()])
    cache = ResponseCache()
    llm = make_llm(fake, cache)
    with pytest.raises(lk.StreamBroken):
        await read_stream(await llm.acompletion(messages=MESSAGES, stream=True))
    text, _ = await read_stream(await llm.acompletion(messages=MESSAGES, stream=True))
    assert text.startswith("tok0") and cache.stats().stored == 1


async def test_custom_store(fake: FakeProvider) -> None:
    store = DictStore()
    assert isinstance(store, CacheStore)
    cache = ResponseCache(store=store, ttl=datetime.timedelta(minutes=1))
    llm = make_llm(fake, cache)
    await llm.acompletion(messages=MESSAGES)
    assert len(store.data) == 1 and list(store.ttls.values()) == [60.0]
    [raw] = store.data.values()
    assert json.loads(raw)["value"]["choices"][0]["message"]["content"].startswith("tok0")
    assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "hit"
    # A streamed answer is written by a task of its own once the stream ends (no set_nowait).
    other = [{"role": "user", "content": "Another question"}]
    written = store.written
    await read_stream(await llm.acompletion(messages=other, stream=True))
    with anyio.fail_after(10):
        await written.wait()
    assert len(store.data) == 2
    assert lk.report(await llm.acompletion(messages=other)).cache == "hit"
    assert requests(fake) == 2 and store.gets == 4


async def test_a_failing_store_never_fails_the_call(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(DictStore):
        async def get(self, key: str) -> bytes | None:
            raise ConnectionError("store down")

        async def set(self, key: str, value: bytes, ttl: float | None) -> None:
            raise ConnectionError("store down")

    cache = ResponseCache(store=Broken())
    llm = make_llm(fake, cache)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        for _ in range(2):
            assert lk.report(await llm.acompletion(messages=MESSAGES)).cache == "miss"
    assert cache.stats() == CacheStats(hits=0, misses=2, stored=0, errors=4)
    assert "ResponseCache store get failed" in caplog.text
    assert [e.reason for e in seen if isinstance(e, CacheStored)] == ["store_error"] * 2


async def test_an_unreadable_or_unknown_entry_is_a_miss() -> None:
    store = DictStore()
    cache = ResponseCache(store=store)
    calls = 0

    @cache
    async def answer() -> str:
        nonlocal calls
        calls += 1
        return "an answer"

    await answer()
    [(key, raw)] = store.data.items()
    newer = raw.replace(b'"latencykit.cache":1', b'"latencykit.cache":2')
    assert newer != raw
    for unusable in (b"not json", newer):
        store.data[key] = unusable
        assert await answer() == "an answer"
    assert calls == 3
    assert cache.stats() == CacheStats(hits=0, misses=3, stored=3, errors=2)


async def test_a_hung_store_is_a_miss_after_store_timeout(fake: FakeProvider) -> None:
    class Hung(DictStore):
        async def get(self, key: str) -> bytes | None:
            await anyio.sleep_forever()
            raise AssertionError  # unreachable

        async def set(self, key: str, value: bytes, ttl: float | None) -> None:
            await anyio.sleep_forever()

    cache = ResponseCache(store=Hung(), store_timeout=0.2)
    llm = make_llm(fake, cache)
    with anyio.fail_after(10):
        response = await llm.acompletion(messages=MESSAGES)
    assert text_of(response).startswith("tok0")
    assert cache.stats().errors == 2  # the lookup and the write both gave up
    # Within a deadline, a lookup slower than what is left is the deadline's business.
    bounded = make_llm(fake, ResponseCache(store=Hung(), store_timeout=60), deadline=0.3)
    with anyio.fail_after(10), pytest.raises(lk.DeadlineExceeded):
        await bounded.acompletion(messages=MESSAGES)


async def test_events_report_lookups_with_the_hit_rate(fake: FakeProvider) -> None:
    llm = make_llm(fake, ResponseCache())
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        await llm.acompletion(messages=MESSAGES)
        await llm.acompletion(messages=MESSAGES)
    lookups = [e for e in seen if isinstance(e, CacheLookup)]
    assert [(e.target, e.hit, e.hit_rate) for e in lookups] == [
        ("openai/m", False, 0.0),
        ("openai/m", True, 0.5),
    ]
    [stored] = [e for e in seen if isinstance(e, CacheStored)]
    assert stored.stored and stored.target == "openai/m"
    ended = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert [(e.attempts, e.outcome, e.target) for e in ended] == [
        (1, "ok", "openai/m"),
        (0, "ok", "openai/m"),
    ]
    assert len({e.call_id for e in lookups}) == 2


# --- truncated answers from any async function ----------------------------------------------


def make_response(finish_reason: str, text: str = "an answer") -> Any:
    import litellm

    return litellm.ModelResponse(
        model="x",
        choices=[
            {
                "index": 0,
                "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": text},
            }
        ],
    )


@pytest.mark.parametrize("finish_reason", ["length", "content_filter"])
async def test_truncated_answers_are_not_cached_unless_asked(finish_reason: str) -> None:
    calls = 0

    async def answer(question: str) -> Any:
        nonlocal calls
        calls += 1
        return make_response(finish_reason)

    ask = ResponseCache()(answer)
    await ask("q")
    await ask("q")
    assert calls == 2
    keeping = ResponseCache(cache_truncated=True)(answer)
    first = await keeping("q")
    second = await keeping("q")
    assert calls == 3
    assert second.choices[0].finish_reason == finish_reason
    assert second.choices[0].message.content == first.choices[0].message.content


class Chunks(ChunkSource):
    """A source of litellm chunks that a Stream reads as litellm's own."""

    chunk_reader = LITELLM_CHUNKS

    def __init__(self, finish_reason: str) -> None:
        import litellm
        from litellm.types.utils import Delta, StreamingChoices

        def chunk(delta: Delta, finish: str | None) -> Any:
            return litellm.ModelResponseStream(
                id="c1",
                model="x",
                choices=[StreamingChoices(index=0, delta=delta, finish_reason=finish)],
            )

        self._chunks = iter(
            [
                chunk(Delta(role="assistant", content="cut"), None),
                chunk(Delta(content=" short"), None),
                chunk(Delta(), finish_reason),
            ]
        )

    async def pull(self) -> Any:
        await anyio.lowlevel.checkpoint()
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


@pytest.mark.parametrize(
    ("finish_reason", "options", "arguments", "stored"),
    [
        ("stop", {}, {}, True),
        ("length", {}, {}, False),
        ("length", {"cache_truncated": True}, {}, True),
        ("content_filter", {}, {}, False),
        ("tool_calls", {}, {}, False),
        ("stop", {}, {"tools": TOOLS}, False),  # it may have called them: the text is not all
    ],
)
async def test_which_streamed_answers_are_stored(
    finish_reason: str, options: dict[str, Any], arguments: dict[str, Any], stored: bool
) -> None:
    cache = ResponseCache(**options)
    pipeline = Pipeline([cache])
    events: list[lk.events.Event] = []

    def open_stream(**kwargs: Any) -> Chunks:
        return Chunks(finish_reason)

    call = Call(open_stream, (), arguments, Target("openai/x"), lk.StreamGuard())
    with lk.subscribe(events.append):
        stream, _ = await pipeline.run_traced(call)
        text, _ = await read_stream(stream)
    assert text == "cut short"
    [event] = [e for e in events if isinstance(e, CacheStored)]
    assert event.stored is stored
    again, trace = await pipeline.run_traced(call)
    await read_stream(again)
    assert trace.cache == ("hit" if stored else "miss")
    assert again.partial_text == "cut short" and again.finish_reason == finish_reason


# --- as a decorator -----------------------------------------------------------------------------


async def test_decorated_function() -> None:
    calls: list[tuple[Any, ...]] = []
    cache = ResponseCache()

    @cache
    async def lookup(city: str, *, details: dict[str, Any] | None = None) -> dict[str, Any]:
        calls.append((city, details))
        return {"city": city, "tags": ["a", "b"]}

    first = await lookup("paris", details={"b": 1, "a": [1, 2.0]})
    first["tags"].append("mutated")
    second = await lookup("paris", details={"a": [1, 2], "b": 1.0})
    assert second == {"city": "paris", "tags": ["a", "b"]}
    assert len(calls) == 1
    await lookup("rome")
    await lookup("paris")  # no details is another call
    assert len(calls) == 3
    assert cache.stats() == CacheStats(hits=1, misses=3, stored=3, errors=0)
    assert lookup.__name__ == "lookup"


async def test_decorated_functions_refuse_what_they_cannot_key_or_store() -> None:
    class Opaque:
        pass

    @ResponseCache()
    async def takes(value: object) -> str:
        return "ok"

    with pytest.raises(TypeError, match=r"cannot key the arguments\[0\] of type Opaque.*key="):
        await takes(Opaque())
    with pytest.raises(TypeError, match=r"cannot key .* keys must be strings"):
        await takes({1: "a"})

    @ResponseCache()
    async def gives() -> object:
        return Opaque()

    with pytest.raises(TypeError, match=r"ResponseCache stores .* returned Opaque"):
        await gives()

    @ResponseCache()
    async def gives_tuple() -> object:
        return (1, 2)  # JSON would give back a list

    with pytest.raises(TypeError, match="returned tuple"):
        await gives_tuple()


async def test_key_function() -> None:
    calls = 0

    class Session:
        def __init__(self, user: str) -> None:
            self.user = user

    @ResponseCache(key=lambda session, question: [session.user, question.lower()])
    async def ask(session: Session, question: str) -> str:
        nonlocal calls
        calls += 1
        return f"answer to {question}"

    assert await ask(Session("ann"), "Hello") == "answer to Hello"
    assert await ask(Session("ann"), "HELLO") == "answer to Hello"
    await ask(Session("bob"), "hello")
    assert calls == 2


async def test_functions_with_the_same_arguments_do_not_share_entries() -> None:
    cache = ResponseCache()

    @cache
    async def one(x: int) -> int:
        return 1

    @cache
    async def two(x: int) -> int:
        return 2

    assert (await one(0), await two(0), await one(0), await two(0)) == (1, 2, 1, 2)


async def test_async_generator_streams_pass_the_cache_by() -> None:
    cache = ResponseCache()
    runs = 0

    @cache
    async def numbers() -> AsyncIterator[int]:
        nonlocal runs
        runs += 1
        yield 1
        yield 2

    for _ in range(2):
        async with numbers() as stream:
            assert [n async for n in stream] == [1, 2]
    assert runs == 2 and cache.stats() == CacheStats(0, 0, 0, 0)


# --- keys and options -----------------------------------------------------------------------


def test_normalize_text() -> None:
    assert normalize_text("  a  b\t c \r\n\r\n\r\n\r\n  d  \re  ") == "a b c\n\n  d\ne"
    assert normalize_text("def f():\n    return  1\n") == "def f():\n    return 1"
    assert normalize_text("") == ""


def test_keys_are_stable_and_hex() -> None:
    cache = ResponseCache()
    target = Target("openai/x")
    key = cache.key_for(Call(print, kwargs={"messages": MESSAGES, "temperature": 0}, target=target))
    assert len(key) == 64 and int(key, 16) >= 0
    same = Call(
        print, kwargs={"temperature": 0.0, "messages": MESSAGES, "user": "u"}, target=target
    )
    assert cache.key_for(same) == key
    elsewhere = target.replace(api_base="http://127.0.0.1:1/v1")
    assert cache.key_for(same._replace(target=elsewhere)) != key
    # The target's own arguments are part of the request (the call's win, as in litellm).
    seeded = Target("openai/x", arguments={"seed": 1})
    assert cache.key_for(same._replace(target=seeded)) != key
    overridden = Target("openai/x", arguments={"temperature": 1})
    assert cache.key_for(same._replace(target=overridden)) == key


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"ttl": 0}, ValueError, "ResponseCache.ttl must be a positive"),
        ({"ttl": "5"}, TypeError, "ResponseCache.ttl must be a number"),
        ({"max_entries": 0}, ValueError, "ResponseCache.max_entries must be a positive int"),
        ({"max_entries": True}, ValueError, "ResponseCache.max_entries must be a positive int"),
        ({"max_entries": 5, "store": MemoryStore()}, ValueError, "ResponseCache.max_entries"),
        ({"store": {}}, TypeError, "ResponseCache.store must be a CacheStore"),
        ({"cache_degraded": 1}, TypeError, "ResponseCache.cache_degraded must be a bool"),
        ({"cache_truncated": None}, TypeError, "ResponseCache.cache_truncated must be a bool"),
        ({"normalize_whitespace": "y"}, TypeError, "ResponseCache.normalize_whitespace"),
        ({"key": "messages"}, TypeError, "ResponseCache.key must be a function"),
        ({"store_timeout": -1}, ValueError, "ResponseCache.store_timeout must be a positive"),
    ],
)
def test_invalid_options_name_the_field(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ResponseCache(**options)


def test_memory_store_validation() -> None:
    with pytest.raises(ValueError, match=r"MemoryStore.max_entries must be a positive int"):
        MemoryStore(0)
    with pytest.raises(TypeError, match=r"MemoryStore\.clock must be a function"):
        MemoryStore(clock=3.0)  # type: ignore[arg-type]


def test_defaults() -> None:
    cache = ResponseCache()
    assert cache.ttl == 300.0 and cache.store_timeout == 1.0
    assert not cache.cache_degraded and not cache.cache_truncated and cache.normalize_whitespace
    assert isinstance(cache.store, MemoryStore) and cache.store.max_entries == 1024
    assert cache.stage == lk.pipeline.Stage.CACHE
    assert cache.hit_rate == 0.0 and ResponseCache(ttl=None).ttl is None
