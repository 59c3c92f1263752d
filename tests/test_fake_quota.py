"""The fake provider's quota (requests and tokens per minute per API key, told in OpenAI's and
Anthropic's headers, 429 past it) and its concurrency knee, over real HTTP on 127.0.0.1.

The quota's clock is frozen in these tests (``fake.freeze_quota()``): buckets refill only
through ``fake.advance_quota``, so every number the headers tell is exact and no test sleeps
for a refill. Raw httpx tests and the ``lk.LLM`` tests run on asyncio and trio; those calling
``litellm.acompletion`` directly run on asyncio (litellm's own limit).
"""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
import httpx
import litellm
import pytest
from litellm import exceptions as llm_errors

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, ProviderQuota, QuotaUsage
from latencykit.testing.__main__ import main

pytestmark = pytest.mark.anyio

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

KEY = "sk-quota-0123456789"
PROMPT = "x" * 40  # 10 prompt tokens (characters // 4)
MESSAGES = [{"role": "user", "content": PROMPT}]
COST = 10 + 16  # the prompt and the default 16-token answer


@pytest.fixture
def fake(quota: FakeProvider) -> FakeProvider:
    """The quota'd provider (conftest's ``quota``) under this file's short name."""
    return quota


def request(
    fake: FakeProvider,
    wire: str = "openai",
    *,
    key: str = KEY,
    stream: bool = False,
    max_tokens: int | None = None,
    behavior: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """URL, JSON body and headers of a chat request in ``wire``'s format, with its key."""
    headers = {"x-fake-behavior": json.dumps(behavior)} if behavior else {}
    if wire == "gemini":
        verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
        if max_tokens is not None:
            body["generationConfig"] = {"maxOutputTokens": max_tokens}
        headers["x-goog-api-key"] = key
        return f"{fake.gemini_base_url}/models/m:{verb}", body, headers
    body = {"model": "m", "messages": MESSAGES, "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if wire == "anthropic":
        headers["x-api-key"] = key
        return f"{fake.anthropic_base_url}/v1/messages", body, headers
    headers["authorization"] = f"Bearer {key}"
    return f"{fake.base_url}/chat/completions", body, headers


async def send(fake: FakeProvider, wire: str = "openai", **kwargs: Any) -> httpx.Response:
    """One chat request, its body read to the end (a stream too)."""
    url, body, headers = request(fake, wire, **kwargs)
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(url, json=body, headers=headers)
        await response.aread()
        return response


def ratelimit_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if "ratelimit" in k}


def stamp(text: str) -> float:
    """An RFC 3339 reset as a POSIX time."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------- header forms


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_headers_tell_the_room_left(fake: FakeProvider, stream: bool) -> None:
    response = await send(fake, stream=stream)
    assert response.status_code == 200
    assert ratelimit_headers(response) == {
        "x-ratelimit-limit-requests": "6",
        "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-remaining-tokens": str(600 - COST),
        "x-ratelimit-reset-requests": "10s",  # one request refills in 60 / 6 s
        "x-ratelimit-reset-tokens": "2.6s",  # 26 tokens at 10 per second
    }
    assert fake.quota_usage(KEY) == QuotaUsage(6, 5, 10.0, 600, 600 - COST, 2.6)
    assert fake.quota_usage(KEY).requests_used == 1
    assert fake.quota_usage(KEY).tokens_used == COST


async def test_openai_resets_are_go_durations() -> None:
    quota = ProviderQuota(requests_per_minute=1, tokens_per_minute=600_000)  # 10,000 tokens per s
    with FakeProvider(quota=quota) as fake:
        fake.freeze_quota()
        headers = (await send(fake)).headers
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    assert headers["x-ratelimit-reset-tokens"] == "3ms"  # 2.6 ms, rounded up


async def test_max_tokens_is_reserved_then_settled(fake: FakeProvider) -> None:
    response = await send(fake, max_tokens=100)
    # Told on arrival: the prompt and the whole max_tokens reserved...
    assert response.headers["x-ratelimit-remaining-tokens"] == str(600 - 10 - 100)
    # ...settled to the 16 tokens sent when the answer ended.
    assert fake.quota_usage(KEY).tokens_remaining == 600 - COST


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_headers_tell_the_room_left(fake: FakeProvider, stream: bool) -> None:
    before = time.time()
    response = await send(fake, "anthropic", stream=stream, max_tokens=50)
    after = time.time()
    headers = ratelimit_headers(response)
    assert response.status_code == 200
    assert headers["anthropic-ratelimit-requests-limit"] == "6"
    assert headers["anthropic-ratelimit-requests-remaining"] == "5"
    assert before + 10 <= stamp(headers["anthropic-ratelimit-requests-reset"]) <= after + 11
    for name in ("tokens", "input-tokens", "output-tokens"):  # one token budget, told thrice
        assert headers[f"anthropic-ratelimit-{name}-limit"] == "600"
        assert headers[f"anthropic-ratelimit-{name}-remaining"] == str(600 - 10 - 50)
        reset = stamp(headers[f"anthropic-ratelimit-{name}-reset"])  # 6 s, rounded up
        assert before + 6 <= reset <= after + 7
    assert len(headers) == 12
    assert fake.quota_usage(KEY).tokens_remaining == 600 - COST


@pytest.mark.parametrize("stream", [False, True])
async def test_gemini_sends_no_room_headers(fake: FakeProvider, stream: bool) -> None:
    response = await send(fake, "gemini", stream=stream)
    assert response.status_code == 200
    assert ratelimit_headers(response) == {}
    assert fake.quota_usage(KEY).requests_remaining == 5


# --------------------------------------------------------------------------- past the quota


async def exhaust(fake: FakeProvider, wire: str = "openai", key: str = KEY) -> None:
    for _ in range(6):
        assert (await send(fake, wire, key=key)).status_code == 200


async def test_openai_429_past_the_requests(fake: FakeProvider) -> None:
    await exhaust(fake)
    response = await send(fake)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "10"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.headers["x-ratelimit-reset-requests"] == "1m0s"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert error["message"].startswith(
        "Rate limit reached for m in organization org-fake on requests per min (RPM): "
        "Limit 6, Used 6, Requested 1. Please try again in 10s."
    )
    attempt = fake.attempts[-1]
    assert (attempt.status, attempt.fault, attempt.tokens_sent) == (429, None, 0)
    assert fake.quota_usage(KEY).requests_remaining == 0  # a refused request costs nothing


async def test_openai_429_past_the_tokens(fake: FakeProvider) -> None:
    await send(fake)  # 574 tokens left
    response = await send(fake, max_tokens=580)  # 590 tokens: 16 too many, 1.6 s away
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"  # whole seconds, rounded up
    error = response.json()["error"]
    assert error["type"] == "tokens"
    assert "on tokens per min (TPM): Limit 600, Used 26, Requested 590. " in error["message"]
    assert "Please try again in 1.6s." in error["message"]
    fake.advance_quota(1.6)
    assert (await send(fake, max_tokens=580)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_429_past_the_quota(fake: FakeProvider, stream: bool) -> None:
    await exhaust(fake, "anthropic")
    response = await send(fake, "anthropic", stream=stream)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "10"
    assert response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert "rate limit of 6 requests per minute" in body["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_gemini_429_resource_exhausted_with_retry_info(
    fake: FakeProvider, stream: bool
) -> None:
    await exhaust(fake, "gemini")
    response = await send(fake, "gemini", stream=stream)
    assert response.status_code == 429
    assert "retry-after" not in response.headers  # Google says it in the body
    assert ratelimit_headers(response) == {}
    error = response.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    retry = [d for d in error["details"] if d["@type"].endswith("google.rpc.RetryInfo")]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "10s"}]


async def test_a_request_larger_than_the_quota_is_never_admitted(fake: FakeProvider) -> None:
    response = await send(fake, max_tokens=1000)
    assert response.status_code == 429
    assert "Requested 1010" in response.json()["error"]["message"]
    fake.advance_quota(3600)
    assert (await send(fake, max_tokens=1000)).status_code == 429


# --------------------------------------------------------------------------- refill and keys


async def test_buckets_refill_continuously(fake: FakeProvider) -> None:
    await exhaust(fake)
    fake.advance_quota(5)  # half a request
    assert (await send(fake)).status_code == 429
    fake.advance_quota(5)  # one whole request
    response = await send(fake)
    assert response.status_code == 200
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert (await send(fake)).status_code == 429
    fake.advance_quota(60)  # a minute refills everything
    assert fake.quota_usage(KEY) == QuotaUsage(6, 6, 0.0, 600, 600, 0.0)


async def test_the_real_clock_refills_unless_frozen() -> None:
    quota = ProviderQuota(requests_per_minute=600, tokens_per_minute=600_000)  # 10 per second
    with FakeProvider(quota=quota) as fake:
        fake.freeze_quota()
        for _ in range(600):
            assert fake._ledger is not None
            fake._ledger.admit(KEY, 1)
        await anyio.sleep(0.15)
        assert (await send(fake)).status_code == 429  # frozen: no refill
        fake.freeze_quota(False)  # the clock restarts where it stopped
        assert fake.quota_usage(KEY).requests_remaining == 0
        await anyio.sleep(0.15)
        assert (await send(fake)).status_code == 200


async def test_each_key_has_its_own_quota(fake: FakeProvider) -> None:
    await exhaust(fake, key="sk-a")
    assert (await send(fake, key="sk-a")).status_code == 429
    response = await send(fake, key="sk-b")
    assert response.status_code == 200
    assert response.headers["x-ratelimit-remaining-requests"] == "5"
    assert fake.quota_usage("sk-a").requests_remaining == 0
    assert fake.quota_usage("sk-b").requests_remaining == 5
    assert fake.quota_usage("sk-never-seen").requests_remaining == 6


async def test_one_key_is_one_quota_in_every_wire_format(fake: FakeProvider) -> None:
    await send(fake, "openai")  # Authorization: Bearer
    await send(fake, "anthropic")  # x-api-key
    await send(fake, "gemini")  # x-goog-api-key
    url, body, _ = request(fake, "gemini")
    async with httpx.AsyncClient() as client:
        assert (await client.post(f"{url}?key={KEY}", json=body)).status_code == 200
        assert (await client.post(url, json=body)).status_code == 200  # no key: the key ""
    assert fake.quota_usage(KEY).requests_used == 4
    assert fake.quota_usage().requests_used == 1


async def test_reset_refills_every_key(fake: FakeProvider) -> None:
    await exhaust(fake)
    fake.reset_quota()
    assert fake.quota_usage(KEY).requests_remaining == 6
    await send(fake)
    fake.reset()  # a fresh start refills the quota too
    assert fake.quota_usage(KEY).requests_remaining == 6
    assert fake.quota is not None


# --------------------------------------------------------------------------- test hooks


async def test_missing_headers(fake: FakeProvider) -> None:
    fake.script("m", Behavior(limit_headers="missing"))
    assert ratelimit_headers(await send(fake)) == {}
    assert ratelimit_headers(await send(fake, "anthropic")) == {}
    for _ in range(4):
        await send(fake)
    response = await send(fake)
    assert response.status_code == 429
    assert ratelimit_headers(response) == {}
    assert response.headers["retry-after"] == "10"  # the 429 path still says when


async def test_lying_headers_claim_all_the_room(fake: FakeProvider) -> None:
    fake.script("m", Behavior(limit_headers="full"))
    await exhaust(fake)
    response = await send(fake)
    assert response.status_code == 429  # the quota is enforced all the same
    assert response.headers["x-ratelimit-remaining-requests"] == "6"
    assert response.headers["x-ratelimit-remaining-tokens"] == "600"
    assert response.headers["x-ratelimit-reset-requests"] == "0s"


async def test_reset_skew_moves_every_reset(fake: FakeProvider) -> None:
    fake.script("m", Behavior(reset_skew=5.0))
    headers = (await send(fake)).headers
    assert headers["x-ratelimit-reset-requests"] == "15s"
    assert headers["x-ratelimit-reset-tokens"] == "7.6s"  # 2.6 s + 5 s
    headers = (await send(fake, "anthropic", behavior={"reset_skew": -30})).headers
    answered = time.time()  # the provider stamped its reset before this (rounded up)
    assert stamp(headers["anthropic-ratelimit-requests-reset"]) <= answered - 30 + 20 + 1
    fake.script("m", Behavior(reset_skew=-30.0))
    assert (await send(fake)).headers["x-ratelimit-reset-requests"] == "0s"  # floored


async def test_an_injected_429_tells_the_quota_headers(fake: FakeProvider) -> None:
    response = await send(fake, "anthropic", behavior={"fault": "http_429", "retry_after": 3})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    # The quota's headers only, no stand-in numbers of the fault's own.
    assert response.headers["anthropic-ratelimit-requests-limit"] == "6"
    assert len(ratelimit_headers(response)) == 12


def test_setting_the_quota_and_validation() -> None:
    fake = FakeProvider()
    assert fake.quota is None
    with pytest.raises(RuntimeError, match="no quota"):
        fake.quota_usage(KEY)
    fake.reset_quota()  # nothing to do
    fake.quota = ProviderQuota(requests_per_minute=2, tokens_per_minute=3)
    assert fake.quota_usage(KEY) == QuotaUsage(2, 2, 0.0, 3, 3, 0.0)
    with pytest.raises(ValueError, match="seconds"):
        fake.advance_quota(-1)
    with pytest.raises(TypeError):
        fake.quota = {"requests_per_minute": 2}  # type: ignore[assignment]
    for bad in (0, 1.5, True, None):
        with pytest.raises(ValueError, match="requests_per_minute"):
            ProviderQuota(requests_per_minute=bad, tokens_per_minute=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit_headers"):
        Behavior(limit_headers="sometimes")
    with pytest.raises(ValueError, match="reset_skew"):
        Behavior(reset_skew=float("nan"))
    with pytest.raises(ValueError, match="concurrency_knee"):
        Behavior(concurrency_knee=0)
    assert Behavior.from_json({"concurrency_knee": 4, "reset_skew": -2}).concurrency_knee == 4


# --------------------------------------------------------------------------- the knee


async def burst(fake: FakeProvider, n: int, model: str) -> list[tuple[int, float]]:
    """Send ``n`` requests for ``model`` at once; for each, in arrival order, the requests in
    flight when it arrived (itself included) and the seconds to its first response byte."""
    url, body, headers = request(fake)
    body["model"] = model
    async with httpx.AsyncClient(timeout=10) as client, anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(lambda: client.post(url, json=body, headers=headers))
    attempts = [a for a in fake.attempts if a.model == model]
    assert [a.status for a in attempts] == [200] * n
    spans = [(a.arrived_at, a.ended_at or 0.0) for a in attempts]  # all ended (200s)
    out = []
    for a in attempts:
        assert a.first_byte_at is not None
        # Counted from the records, so a slow machine that lets one end early is no flake.
        k = sum(start <= a.arrived_at < end for start, end in spans)
        out.append((k, a.first_byte_at - a.arrived_at))
    return out


async def test_latency_grows_past_the_knee() -> None:
    with FakeProvider() as fake:
        fake.script("m", Behavior(ttft=0.2, concurrency_knee=2))
        waits = await burst(fake, 6, "m")
    # With k in flight a request waits 0.2 s * max(1, k / 2): 0.2 0.2 0.3 0.4 0.5 0.6.
    assert max(k for k, _ in waits) > 2
    for k, waited in waits:
        expected = 0.2 * max(1.0, k / 2)
        assert expected - 0.01 <= waited <= expected + 0.25, (k, waited)


async def test_no_knee_no_slowdown_and_itl_grows_too() -> None:
    with FakeProvider() as fake:
        fake.script("flat", Behavior(ttft=0.1))
        fake.script("m", Behavior(itl=0.02, output_tokens=5, concurrency_knee=1))
        flat = await burst(fake, 4, "flat")
        slowed = await burst(fake, 2, "m")
    assert all(0.09 <= waited <= 0.1 + 0.25 for _, waited in flat)
    # A JSON answer comes after 5 * itl: 0.1 s alone, 0.2 s with 2 in flight past a knee of 1.
    assert max(k for k, _ in slowed) == 2
    for k, waited in slowed:
        assert 0.1 * k - 0.01 <= waited <= 0.1 * k + 0.25, (k, waited)


# --------------------------------------------------------------------------- real clients


@asyncio_only
async def test_litellm_sees_the_headers_and_the_429(fake: FakeProvider) -> None:
    kwargs: dict[str, Any] = {
        "model": "openai/m",
        "api_base": fake.base_url,
        "api_key": KEY,
        "messages": MESSAGES,
        "max_retries": 0,
    }
    for _ in range(6):
        response = await litellm.acompletion(**kwargs)
    headers = response._hidden_params["additional_headers"]
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["llm_provider-x-ratelimit-reset-requests"] == "1m0s"
    with pytest.raises(llm_errors.RateLimitError) as info:
        await litellm.acompletion(**kwargs)
    assert info.value.response.headers["retry-after"] == "10"


async def answer(llm: lk.LLM, stream: bool) -> None:
    """One call through ``llm``, a stream read to its end."""
    result = await llm.acompletion(messages=MESSAGES, max_tokens=64, stream=stream)
    if stream:
        async with result:
            async for _ in result:
                pass


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("wire", ["openai", "anthropic", "gemini"])
async def test_llm_is_rate_limited_past_the_quota(wire: str, stream: bool) -> None:
    quota = ProviderQuota(requests_per_minute=1, tokens_per_minute=100_000)
    with FakeProvider(quota=quota) as fake:
        fake.freeze_quota()
        base = {
            "openai": fake.base_url,
            "anthropic": fake.anthropic_base_url,
            "gemini": fake.gemini_base_url,
        }[wire]
        llm = lk.LLM(f"{wire}/m", api_base=base, api_key=KEY)
        await llm.acompletion(messages=MESSAGES, max_tokens=64)
        with pytest.raises(lk.RateLimited) as info:
            await answer(llm, stream)
        assert info.value.retry_after == 60.0  # a whole minute for one request
        assert fake.quota_usage(KEY).requests_remaining == 0
        assert [a.status for a in fake.attempts] == [200, 429]


def test_command_line_options() -> None:
    with pytest.raises(SystemExit):
        main(["--rpm", "600"])  # --rpm and --tpm go together
    with pytest.raises(SystemExit):
        main(["--rpm", "0", "--tpm", "10"])


@pytest.mark.slow
def test_command_line_runs_a_quota_and_a_knee() -> None:
    command = [sys.executable, "-m", "latencykit.testing", "--port", "0", "--rpm", "1"]
    command += ["--tpm", "1000", "--ttft", "0.01", "--knee", "4", "--output-tokens", "3"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            base_url = first.split("base_url=")[1].split()[0]
            said = process.stdout.readline()
            assert "3 tokens, ttft 0.01s" in said and "slower past 4 in flight" in said
            assert "quota 1 requests and 1000 tokens per minute per API key" in said
            body = {"model": "m", "messages": MESSAGES}
            key = {"authorization": f"Bearer {KEY}"}
            answer = httpx.post(f"{base_url}/chat/completions", json=body, headers=key)
            assert answer.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2"
            assert answer.headers["x-ratelimit-remaining-requests"] == "0"
            refused = httpx.post(f"{base_url}/chat/completions", json=body, headers=key)
            assert refused.status_code == 429
            assert "status 200" in process.stdout.readline()  # one line per finished request
            assert "status 429" in process.stdout.readline()
        finally:
            process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
