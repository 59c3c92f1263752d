"""The governor (``LLM(governor=True)``): pacing from the provider's rate-limit headers, over
real HTTP to the fake provider's quota, on both lanes, on asyncio and trio.

The quota's clock is frozen where a test reads exact numbers (``fake.freeze_quota()``); the
pacing test runs on real time with a quota of 2 requests per second (a few seconds).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

import latencykit as lk
from latencykit import events, ratelimit
from latencykit._cancel import process_clock
from latencykit.pipeline import Call
from latencykit.policies.governor import Governor
from latencykit.testing import Behavior, FakeProvider, Fault, ProviderQuota

pytestmark = pytest.mark.anyio

KEY = "sk-governor-0123456789"
OTHER_KEY = "sk-governor-9876543210"
MESSAGES = [{"role": "user", "content": "x" * 40}]  # 10 prompt tokens


@pytest.fixture(autouse=True)
def _fresh_rooms() -> Iterator[None]:
    """Rooms are process-wide, by target and key: each test starts with none."""
    ratelimit._rooms.clear()
    yield
    ratelimit._rooms.clear()


def drain(fake: FakeProvider, requests: int, key: str = KEY) -> None:
    """Spend ``requests`` of ``key``'s quota with plain HTTP requests."""
    with httpx.Client() as client:
        for _ in range(requests):
            client.post(
                f"{fake.base_url}/chat/completions",
                json={"model": "m", "messages": MESSAGES, "max_tokens": 1},
                headers={"authorization": f"Bearer {key}"},
            )


def governed(fake: FakeProvider, lane: str = "openai", **options: Any) -> lk.LLM:
    return lk.LLM(
        "openai/m",
        api_base=fake.base_url,
        api_key=options.pop("api_key", KEY),
        transport=lane,
        governor=options.pop("governor", True),
        **options,
    )


async def answer(llm: lk.LLM, stream: bool = False, **kwargs: Any) -> None:
    kwargs.setdefault("max_tokens", 16)
    if not stream:
        await llm.acompletion(messages=MESSAGES, **kwargs)
        return
    async with await llm.acompletion(messages=MESSAGES, stream=True, **kwargs) as chunks:
        async for _ in chunks:
            pass


@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_each_lane_reads_what_the_provider_sent(
    quota: FakeProvider, lane: str, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[ratelimit.RateLimits | None] = []
    heard = ratelimit.heard

    def recording(target: str, api_key: str | None, headers: Any) -> None:
        read.append(None if headers is None else ratelimit.read_limits(headers))
        heard(target, api_key, headers)

    monkeypatch.setattr(ratelimit, "heard", recording)
    await answer(governed(quota, lane), stream)
    # The quota's clock is frozen and the 16-token answer used what it reserved: the room
    # left now is what the answer's headers told.
    usage = quota.quota_usage(KEY)
    assert read == [
        ratelimit.RateLimits(
            usage.requests_limit,
            usage.requests_remaining,
            pytest.approx(usage.requests_reset, abs=1e-3),  # type: ignore[arg-type]
            usage.tokens_limit,
            usage.tokens_remaining,
            pytest.approx(usage.tokens_reset, abs=1e-3),  # type: ignore[arg-type]
        )
    ]
    room = ratelimit.room_for("openai/m", KEY)
    assert (room.requests.limit, room.requests.level) == (6, 5)
    assert room.tokens.limit == 600


async def test_anthropic_headers_through_litellm(quota: FakeProvider) -> None:
    llm = lk.LLM("anthropic/m", api_base=quota.anthropic_base_url, api_key=KEY, governor=True)
    await llm.acompletion(messages=MESSAGES, max_tokens=16)
    room = ratelimit.room_for("anthropic/m", KEY)
    assert (room.requests.limit, room.requests.level) == (6, 5)
    assert room.tokens.limit == 600


async def test_a_limit_learned_is_told_once_and_shown_in_stats(quota: FakeProvider) -> None:
    llm = governed(quota)
    seen: list[events.Event] = []
    with events.subscribe(seen.append):
        await answer(llm)
        await answer(llm)
    learned = [e for e in seen if isinstance(e, events.LimitLearned)]
    assert [(e.limit, e.value, e.previous) for e in learned] == [
        ("requests", 6, None),
        ("tokens", 600, None),
    ]
    room = llm.stats()["openai/m"].room
    assert room is not None
    assert (room.requests_limit, room.tokens_limit, room.waits) == (6, 600, 0)
    assert room.requests_left == pytest.approx(4, abs=0.5)
    assert "req left" in str(llm.stats())


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_fails_fast_when_the_wait_would_pass_the_deadline(
    quota: FakeProvider, lane: str
) -> None:
    drain(quota, 5)
    llm = governed(quota, lane, deadline=2.0)
    await answer(llm)  # learns: no request left, one back every 10 s
    sent = len(quota.attempts)
    with anyio.fail_after(1.5), pytest.raises(lk.LimitExceeded) as info:
        await answer(llm)
    assert info.value.limit == "requests"
    assert info.value.wait is not None and info.value.wait > 9
    assert len(quota.attempts) == sent  # nothing was sent


@pytest.mark.parametrize("headers", ["missing", "full"])
@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_without_honest_headers_a_429s_retry_after_pauses_the_target(
    quota: FakeProvider, headers: str, lane: str
) -> None:
    drain(quota, 6)
    llm = governed(
        quota,
        lane,
        deadline=2.0,
        defaults={"extra_headers": {"x-fake-behavior": json.dumps({"limit_headers": headers})}},
    )
    with pytest.raises(lk.RateLimited):
        await answer(llm)  # nothing (or a lie) learned: sent, refused
    sent = len(quota.attempts)
    with pytest.raises(lk.LimitExceeded):
        await answer(llm)  # the 429's retry-after (10 s) does not fit the deadline
    assert len(quota.attempts) == sent


@pytest.mark.parametrize("governor", [True, False], ids=["governor", "none"])
async def test_a_burst_past_the_room_waits_instead_of_a_429(governor: bool) -> None:
    with FakeProvider(
        quota=ProviderQuota(requests_per_minute=120, tokens_per_minute=100_000)
    ) as fake:
        drain(fake, 118)
        llm = governed(fake, governor=governor, deadline=30.0)
        await answer(llm)  # the first answer tells the room
        # Past the room by 4 requests, whatever refilled while the drain ran (2 a second: on a
        # loaded machine the room is not "1 or so"): a burst of a fixed size may fit.
        burst = fake.quota_usage(KEY).requests_remaining + 4
        failures: list[BaseException] = []

        async def one() -> None:
            try:
                await answer(llm)
            except lk.RateLimited as exc:
                failures.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                for _ in range(burst):
                    group.start_soon(one)
        statuses = [a.status for a in fake.attempts]
    if governor:
        assert failures == [] and 429 not in statuses
        room = llm.stats()["openai/m"].room
        assert room is not None and room.waits >= 2 and room.waited > 0
    else:  # today's behaviour, the contrast: the burst is refused
        assert failures and 429 in statuses


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_a_rotated_key_starts_a_room_of_its_own(quota: FakeProvider, lane: str) -> None:
    drain(quota, 5)
    old = governed(quota, lane, deadline=2.0)
    await answer(old)  # KEY: no request left, the next one 10 s away
    rotated = governed(quota, lane, api_key=OTHER_KEY, deadline=2.0)
    with anyio.fail_after(1.5):
        await answer(rotated)  # not held back by the old key's room
    assert ratelimit.room_for("openai/m", OTHER_KEY).requests.level == 5
    assert ratelimit.room_for("openai/m", KEY).requests.level == 0  # nor the old one by it
    with pytest.raises(lk.LimitExceeded):
        await answer(old)


def behaving(**behaviour: Any) -> dict[str, Any]:
    """A call's arguments asking the fake provider for ``behaviour``."""
    return {"extra_headers": {"x-fake-behavior": json.dumps(behaviour)}}


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_azures_remaining_and_retry_after_ms_pause_the_target(
    fake: FakeProvider, lane: str
) -> None:
    llm = governed(fake, lane, deadline=2.0)
    azure = {  # Azure OpenAI's form: what is left, no limit, no reset; the wait in ms
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-remaining-tokens": "900",
        "retry-after-ms": "5000",
    }
    with pytest.raises(lk.RateLimited):
        await answer(llm, **behaving(fault="http_error", status=429, headers=azure))
    room = ratelimit.room_for("openai/m", KEY)
    # No limit told: the most room seen.
    assert (room.requests.limit, room.requests.level, room.tokens.limit) == (3, 3, 900)
    sent = len(fake.attempts)
    with pytest.raises(lk.LimitExceeded) as info:
        await answer(llm)  # 5 s paused: past the deadline, nothing sent
    assert info.value.wait == pytest.approx(5.0, abs=1.0)
    assert len(fake.attempts) == sent


async def test_geminis_retry_info_in_a_429_body_pauses_the_target(fake: FakeProvider) -> None:
    llm = lk.LLM(
        "gemini/m", api_base=fake.gemini_base_url, api_key=KEY, governor=True, deadline=2.0
    )
    with pytest.raises(lk.RateLimited):  # no header: the wait is the body's retryDelay
        await answer(llm, **behaving(fault="http_429", retry_after=5))
    sent = len(fake.attempts)
    with pytest.raises(lk.LimitExceeded) as info:
        await answer(llm)
    assert info.value.wait == pytest.approx(5.0, abs=1.0)
    assert len(fake.attempts) == sent


@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_unused_output_is_given_back_and_its_size_learned(
    quota: FakeProvider, lane: str, stream: bool
) -> None:
    llm = governed(quota, lane)
    options = {"stream_options": {"include_usage": True}} if stream else {}
    await answer(llm, stream, max_tokens=64, **options)  # reserves 64, the answer has 16
    room = ratelimit.room_for("openai/m", KEY)
    # The provider told 600 - 10 - 64 left, then gave back the 48 tokens not sent: so do we.
    assert room.tokens.level == pytest.approx(600 - 10 - 16, abs=2)
    assert quota.quota_usage(KEY).tokens_remaining == 600 - 10 - 16
    governor = next(p for p in llm.pipeline.policies if isinstance(p, Governor))
    call = Call(print, kwargs={"messages": MESSAGES}, target=llm.targets[0])
    # No cap: the output learned, 16 tokens.
    assert governor.estimate(call) == (governor.estimate(call.with_kwargs(max_tokens=16))[0], None)


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_a_429_after_a_wait_for_room_is_retried(fake: FakeProvider, lane: str) -> None:
    # The wait in line is no time of the attempt's: retry's estimate of the next attempt is
    # the 429's few ms, not the 2 s waited (2 + 2 s would pass the deadline: no retry).
    fake.script("m", [Behavior(fault=Fault.HTTP_429, retry_after=0.05), Behavior()])
    llm = governed(fake, lane, deadline=3.0, retry=lk.Retry(max_attempts=3, initial=0.1))
    room = ratelimit.room_for("openai/m", KEY)
    room.came_back()
    room.paused_until = process_clock() + 2.0  # a retry-after heard before
    await answer(llm)
    assert [a.status for a in fake.attempts] == [429, 200]


class _Refused(Exception):
    """An error carrying an answer's headers, as litellm's do."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("refused")
        self.litellm_response_headers = headers


EXHAUSTED = {
    "x-ratelimit-limit-requests": "6",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "1m0s",
}


def test_only_a_429_pauses_the_target() -> None:
    room = ratelimit.Room()
    Governor._read_error(room, "t", _Refused(EXHAUSTED))  # an error of another kind
    assert room.paused_until == 0.0
    assert room.requests.limit == 6  # its headers are read all the same
    limited = lk.RateLimited("slow down", target="t", status_code=429, retry_after=5.0)
    Governor._read_error(room, "t", limited)
    assert room.paused_until - time.monotonic() == pytest.approx(5.0, abs=0.5)


# --- lanes ------------------------------------------------------------------------------------


@pytest.fixture
def tight() -> Iterator[FakeProvider]:
    """A provider with 120 requests a minute (one every 0.5 s), all but one spent (and the
    few that refill while they are)."""
    with FakeProvider(
        quota=ProviderQuota(requests_per_minute=120, tokens_per_minute=100_000)
    ) as fake:
        drain(fake, 119)
        yield fake


async def test_batch_yields_to_interactive_under_a_tight_room(tight: FakeProvider) -> None:
    llm = governed(tight, deadline=30.0)
    await answer(llm, priority="interactive")  # learns the room: none left
    done: list[str] = []

    async def one(lane: str) -> None:
        await answer(llm, priority=lane)
        done.append(lane)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(one, "batch")
            await anyio.sleep(0.05)  # the batch calls wait first
            for _ in range(2):
                group.start_soon(one, "interactive")
            await until_true(lambda: len(done) >= 2)
            group.cancel_scope.cancel()  # batch would wait for 20 % of the limit to refill
    assert done == ["interactive", "interactive"]
    assert 429 not in [a.status for a in tight.attempts]
    room = llm.stats()["openai/m"].room
    assert room is not None and room.lanes["interactive"][0] == 2


async def test_a_lane_is_served_in_arrival_order(tight: FakeProvider) -> None:
    llm = governed(tight, deadline=30.0)
    await answer(llm, priority="interactive")  # learns the room: none left
    done: list[int] = []

    async def one(index: int) -> None:
        await answer(llm, priority="interactive")
        done.append(index)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for index in range(4):
                group.start_soon(one, index)
                await anyio.sleep(0.01)  # arrival order
    assert done == [0, 1, 2, 3]


async def test_a_lane_with_room_is_not_held_back(quota: FakeProvider) -> None:
    llm = governed(quota, deadline=2.0)
    for _ in range(3):  # 5, 4, 3 of 6 left: above the batch lane's reserve (1.2)
        await answer(llm, priority="batch")
    room = llm.stats()["openai/m"].room
    assert room is not None and room.waits == 0 and room.shed == 0


async def test_a_shed_call_says_its_lane(tight: FakeProvider) -> None:
    llm = governed(tight, deadline=2.0)
    await answer(llm, priority="batch")  # nothing learned yet: sent; no room left, it says
    sent = len(tight.attempts)
    with pytest.raises(lk.LimitExceeded) as info:
        await answer(llm, priority="batch")
    assert info.value.lane == "batch" and "batch lane" in str(info.value)
    assert len(tight.attempts) == sent  # nothing was sent
    room = llm.stats()["openai/m"].room
    assert room is not None and room.lanes["batch"] == (0, 1) and room.shed == 1
    assert "shed" in str(llm.stats())


async def until_true(predicate: Any) -> None:
    while not predicate():  # noqa: ASYNC110 - the calls' own progress is what is awaited
        await anyio.sleep(0.01)


async def test_room_left_waits_and_sheds_are_metrics_by_lane(tight: FakeProvider) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from latencykit import telemetry

    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    llm = governed(tight, deadline=2.0)
    with telemetry.instrument(meter_provider=meter_provider):
        await answer(llm)
        with pytest.raises(lk.LimitExceeded):
            await answer(llm, priority="batch")
        data = reader.get_metrics_data()
    meter_provider.shutdown()
    assert data is not None
    points: dict[str, list[Any]] = {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    shed = {p.attributes["latencykit.lane"]: p.value for p in points["latencykit.room.shed"]}
    assert shed == {"interactive": 0, "default": 0, "batch": 1}
    left = {p.attributes["latencykit.limit.kind"]: p.value for p in points["latencykit.room.left"]}
    assert 0 <= left["requests"] < 0.2 * 120  # below the batch lane's reserve: shed
    assert "latencykit.room.waits" in points
    hashes = {None, ratelimit.key_hash(KEY)}
    for series in points.values():
        for point in series:
            assert KEY not in str(point.attributes)
            assert point.attributes.get("latencykit.api_key.hash") in hashes


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_retries_and_hedges_are_spent_only_from_room_to_spare(
    quota: FakeProvider, lane: str
) -> None:
    from latencykit.testing import Behavior, Fault

    drain(quota, 3)
    retrying = governed(quota, lane, deadline=5.0, retry=lk.Retry(max_attempts=2, initial=0.01))
    await answer(retrying)  # learns: 2 requests left of 6, the batch reserve is 1.2
    quota.script("m", [Behavior(fault=Fault.HTTP_503), Behavior()])
    sent = len(quota.attempts)
    with anyio.fail_after(4.5), pytest.raises(lk.LimitExceeded) as info:
        await answer(retrying)  # the first attempt fits; its retry would spend the reserve
    assert len(quota.attempts) == sent + 1  # the retry was not sent: its wait (10 s) is shed
    assert info.value.limit == "requests" and info.value.wait is not None
    assert [a.outcome for a in info.value.attempts][:1] == ["error"]
    hedged = governed(quota, lane, hedge=lk.Hedge(0.05), deadline=30.0)
    quota.script("m", Behavior(ttft=0.3))
    sent = len(quota.attempts)
    await answer(hedged)  # the last request left: the primary answers, no backup is sent
    assert len(quota.attempts) == sent + 1
