"""LLM.aembedding: the same pipeline as acompletion (deadline, hedge, failover, breaker, retry,
cache, telemetry), on both lanes, against the fake provider's ``POST /v1/embeddings``. The
fault matrix runs through it in test_faults.py."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import pytest

import latencykit as lk
from helpers import KEY, make_llm, target, until
from latencykit.cache import ResponseCache
from latencykit.chunks import EmbeddingResponse
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo
from latencykit.testing._openai import embedding_of

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["litellm", "openai"])
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def vectors(response: Any) -> list[list[float]]:
    """The vectors of an answer from either lane (litellm keeps its items as dicts)."""
    return [item["embedding"] for item in response.data]


# --- the fake provider's endpoint ----------------------------------------------------------------


def test_the_fake_provider_embeds_each_input_deterministically(fake: FakeProvider) -> None:
    fake.script("e", Behavior(dimensions=5))
    url = f"{fake.base_url}/embeddings"
    body = {"model": "e", "input": ["a cat", "a dog"]}
    first = httpx.post(url, json=body).json()
    again = httpx.post(url, json={"model": "e", "input": "a dog"}).json()
    asked = httpx.post(url, json={**body, "dimensions": 3, "encoding_format": "base64"}).json()
    assert [d["index"] for d in first["data"]] == [0, 1]
    assert first["data"][1]["embedding"] == again["data"][0]["embedding"]
    assert first["data"][0]["embedding"] != first["data"][1]["embedding"]
    assert len(first["data"][0]["embedding"]) == 5
    assert abs(sum(x * x for x in first["data"][0]["embedding"]) - 1) < 1e-9
    assert first["usage"]["prompt_tokens"] == first["usage"]["total_tokens"] > 0
    packed = base64.b64decode(asked["data"][0]["embedding"])
    assert struct.unpack("<3f", packed) == pytest.approx(embedding_of("a cat", 3), abs=1e-6)
    assert [a.wire for a in fake.attempts] == ["openai-embeddings"] * 3


def test_the_fake_provider_s_embeddings_honour_faults(fake: FakeProvider) -> None:
    fake.script("e", [Behavior(fault=Fault.HTTP_429, retry_after=1), Behavior(ttft=0.2)])
    url = f"{fake.base_url}/embeddings"
    refused = httpx.post(url, json={"model": "e", "input": "x"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    started = time.monotonic()
    assert httpx.post(url, json={"model": "e", "input": "x"}).status_code == 200
    assert time.monotonic() - started >= 0.2


# --- answers -------------------------------------------------------------------------------------


async def test_an_embedding_reads_like_litellm_s_on_both_lanes(
    fake: FakeProvider, lane: str
) -> None:
    fake.script("embed", Behavior(dimensions=6))
    llm = make_llm(fake, "embed", transport=lane)
    response = await llm.aembedding(input=["first text", "second text"])
    assert vectors(response) == [embedding_of("first text", 6), embedding_of("second text", 6)]
    assert response.usage.prompt_tokens > 0 and response.model == "embed"
    if lane == "openai":
        assert isinstance(response, EmbeddingResponse)
        assert response.data[0].embedding == response.data[0]["embedding"]
    report = lk.report(response)
    assert report.target == "openai/embed" and report.answering_attempt == 1
    assert [a.outcome for a in report.attempts] == ["ok"]
    [attempt] = fake.attempts
    assert attempt.wire == "openai-embeddings" and attempt.request_headers["authorization"]
    await llm.aclose()


async def test_the_fast_lane_keeps_base64_vectors_as_sent(fake: FakeProvider) -> None:
    llm = make_llm(fake, "embed", transport="openai", dimensions=8)
    response = await llm.aembedding(input="text", encoding_format="base64")
    assert isinstance(response.data[0].embedding, str)
    await llm.aclose()


async def test_vectors_of_another_length_are_an_error_of_that_target(
    fake: FakeProvider, lane: str
) -> None:
    fake.script("small", Behavior(dimensions=4))
    fake.script("right", Behavior(dimensions=8))
    llm = make_llm(
        fake,
        "small",
        transport=lane,
        dimensions=8,
        failover=[target(fake, "right", transport=lane, dimensions=8)],
    )
    response = await llm.aembedding(input="text")
    assert len(vectors(response)[0]) == 8
    failed, answered = lk.report(response).attempts
    assert (failed.target, failed.error_type) == ("openai/small", "ProviderUnavailable")
    assert answered.target == "openai/right"
    with pytest.raises(lk.ProviderUnavailable, match="4 dimensions, not 8"):
        await make_llm(fake, "small", transport=lane, dimensions=8).aembedding(input="text")


async def test_a_call_s_own_dimensions_are_the_length_expected(fake: FakeProvider) -> None:
    sent: list[Mapping[str, object]] = []

    def record(request: RequestInfo) -> Behavior:
        sent.append(request.body)
        return Behavior()

    fake.script("embed", record)
    llm = make_llm(fake, "embed", transport="openai", dimensions=8)
    response = await llm.aembedding(input="text", dimensions=3)
    assert len(response.data[0].embedding) == 3
    assert sent == [{"model": "embed", "input": "text", "dimensions": 3}]
    await llm.aclose()


# --- the dimensions rule, and what an embedding call refuses -------------------------------------


def test_target_dimensions_are_validated() -> None:
    with pytest.raises(ValueError, match=r"target\.dimensions must be a positive int"):
        lk.Target("openai/e", dimensions=0)
    with pytest.raises(ValueError, match=r"LLM\.failover\[0\]: target\.dimensions"):
        lk.LLM("openai/e", failover=[{"model": "openai/f", "dimensions": "8"}])
    assert lk.Target("openai/e", dimensions=1536).dimensions == 1536


async def test_failover_targets_must_declare_the_same_dimensions(fake: FakeProvider) -> None:
    differ = make_llm(fake, "a", dimensions=8, failover=[target(fake, "b", dimensions=16)])
    undeclared = make_llm(fake, "a", dimensions=8, failover=[target(fake, "b")])
    for llm in (differ, undeclared):
        with pytest.raises(ValueError, match=r"same Target\(dimensions=\.\.\.\)") as info:
            await llm.aembedding(input="text")
        assert "'openai/b'" in str(info.value)
        response = await llm.acompletion(messages=[{"role": "user", "content": "hi"}])
        assert lk.report(response).target == "openai/a"  # completions are not concerned
    assert [a.wire for a in fake.attempts] == ["openai"] * 2  # no embedding request was sent


async def test_what_an_embedding_call_refuses(fake: FakeProvider) -> None:
    llm = make_llm(fake, "e")
    with pytest.raises(ValueError, match=r"aembedding\(stream=\.\.\.\) is not accepted"):
        await llm.aembedding(input="x", stream=True)
    with pytest.raises(ValueError, match=r"aembedding\(timeout=\.\.\.\) is not accepted"):
        await llm.aembedding(input="x", timeout=3)
    with pytest.raises(ValueError, match=r"aembedding\(api_key=\.\.\.\) is not accepted"):
        await llm.aembedding(input="x", api_key="sk-other")
    degrading = make_llm(fake, "e", degrade=lk.Degrade(model="openai/f"))
    with pytest.raises(ValueError, match="degrade"):
        await degrading.aembedding(input="x")
    assert fake.attempts == []


# --- the policies --------------------------------------------------------------------------------


async def test_a_deadline_ends_a_silent_embedding_and_closes_its_request(
    fake: FakeProvider, lane: str
) -> None:
    fake.script("e", Behavior(fault=Fault.HANG))
    llm = make_llm(fake, "e", transport=lane, deadline=0.5)
    started = time.monotonic()
    with pytest.raises(lk.DeadlineExceeded) as info:
        await llm.aembedding(input="x")
    assert time.monotonic() - started < 3.0
    assert [a.target for a in info.value.attempts] == ["openai/e"]
    await until(lambda: fake.attempts[0].disconnected_at is not None)


async def test_a_slow_embedding_is_hedged(fake: FakeProvider, lane: str) -> None:
    fake.script("e", [Behavior(ttft=5.0), Behavior()])
    llm = make_llm(fake, "e", transport=lane, hedge=lk.Hedge(delay=0.2), deadline=4.0)
    started = time.monotonic()
    response = await llm.aembedding(input="x")
    assert time.monotonic() - started < 3.0
    report = lk.report(response)
    assert report.answering_attempt == 2
    assert {a.number: a.reason for a in report.attempts} == {1: "primary", 2: "hedge"}
    await until(lambda: fake.attempts[0].disconnected_at is not None)  # the loser was closed


async def test_the_breaker_opens_on_failing_embeddings_and_skips_the_target(
    fake: FakeProvider, lane: str
) -> None:
    fake.script("a", Behavior(fault=Fault.HTTP_503))
    llm = make_llm(
        fake,
        "a",
        transport=lane,
        dimensions=8,
        failover=[target(fake, "b", transport=lane, dimensions=8)],
        breaker={"minimum_calls": 2, "window_size": 2, "open_duration": 60},
    )
    for _ in range(4):
        response = await llm.aembedding(input="x")
        assert lk.report(response).target == "openai/b"
    assert [a.model for a in fake.attempts].count("a") == 2  # then the breaker was open
    assert llm.stats()["openai/a"].breaker == "open"


async def test_a_cached_embedding_answers_without_a_request(fake: FakeProvider, lane: str) -> None:
    llm = make_llm(fake, "e", transport=lane, cache=ResponseCache())
    first = await llm.aembedding(input="same text")
    second = await llm.aembedding(input="same text")
    other = await llm.aembedding(input="other text")
    assert len(fake.attempts) == 2
    assert type(second) is type(first) and vectors(second) == vectors(first)
    assert vectors(other) != vectors(first)
    assert (lk.report(first).cache, lk.report(second).cache) == ("miss", "hit")
    assert lk.report(second).target == "openai/e"


async def test_embedding_spans_say_their_operation(fake: FakeProvider) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from latencykit import telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    fake.script("a", Behavior(fault=Fault.HTTP_500))
    llm = make_llm(
        fake, "a", transport="openai", dimensions=8, failover=[target(fake, "b", dimensions=8)]
    )
    with telemetry.instrument(tracer_provider=provider):
        await llm.aembedding(input="secret text")
        await llm.acompletion(messages=[{"role": "user", "content": "hi"}])
    by_name = {s.name: s for s in spans.get_finished_spans()}
    embedding, chat = by_name["embeddings a"], by_name["chat a"]
    assert embedding.attributes is not None and chat.attributes is not None
    assert embedding.attributes["gen_ai.operation.name"] == "embeddings"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    for span in spans.get_finished_spans():
        assert "secret text" not in str(span.attributes) and KEY not in str(span.attributes)
    await llm.aclose()


async def test_concurrent_embeddings_on_one_llm(fake: FakeProvider) -> None:
    fake.script("e", Behavior(ttft=0.05))
    llm = make_llm(fake, "e", transport="openai")
    found: dict[int, list[float]] = {}

    async def embed(i: int) -> None:
        found[i] = (await llm.aembedding(input=f"text {i}")).data[0].embedding

    async with anyio.create_task_group() as group:
        for i in range(20):
            group.start_soon(embed, i)
    assert found == {i: embedding_of(f"text {i}", 8) for i in range(20)}
    await llm.aclose()
