"""Streaming through lk.LLM(stream=True): real litellm, the fake provider on 127.0.0.1, asyncio and
trio. Each case asserts what the user receives (the full text or a typed error, never a truncated
success), the attempts per target, the disconnects the server saw, and time bounds."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import latencykit as lk
from helpers import read_all, text_of
from latencykit.testing import Behavior, FakeProvider, Fault, RecordedAttempt

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "sk-stream-test-0123456789"
CLOSE_BOUND = 0.05  # the server sees the client go within this of the close (the bound)
TEXT = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"


@pytest.fixture
async def fake(fake_provider: FakeProvider) -> FakeProvider:
    # litellm's first request on a loop initialises its HTTP stack (up to seconds, blocking):
    # do it here, not inside a test that times the first token.
    warm = await make_llm(fake_provider, "warm-up").acompletion(messages=MESSAGES, stream=True)
    await read_all(warm)
    fake_provider.reset()
    return fake_provider


LANE = "litellm"  # the transport of every target these tests make (see the lane fixture)


@pytest.fixture(autouse=True, params=["litellm", "openai"])
def lane(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on both lanes: through litellm, and on the fast lane."""
    global LANE
    LANE = str(request.param)
    yield LANE
    LANE = "litellm"


def make_llm(fake: FakeProvider, model: str = "primary", **options: Any) -> lk.LLM:
    options.setdefault("transport", LANE)
    return lk.LLM(f"openai/{model}", api_base=fake.base_url, api_key=KEY, **options)


def target(fake: FakeProvider, model: str, **extra: Any) -> dict[str, Any]:
    extra.setdefault("transport", LANE)
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": KEY, **extra}


async def disconnected(fake: FakeProvider, model: str) -> RecordedAttempt:
    await fake.wait_for_async(
        lambda seen: any(a.model == model and a.disconnected for a in seen), 3.0
    )
    return next(a for a in fake.attempts if a.model == model and a.disconnected)


async def test_a_stream_yields_litellm_chunks_and_reports_its_timing(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(output_tokens=8, itl=0.005))
    llm = make_llm(fake)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        stream = await llm.acompletion(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        assert isinstance(stream, lk.Stream) and stream.chunks == 1  # committed on content
        chunks = await read_all(stream)
    import litellm

    assert text_of(chunks) == TEXT
    built: Any = litellm.stream_chunk_builder(chunks)
    assert built.choices[0].message.content == TEXT
    assert stream.outcome == "ok" and stream.finish_reason == "stop"
    assert stream.output_tokens == 8
    report = lk.report(stream)
    assert report.target == "openai/primary" and report.chunks == 8
    assert report.ttft is not None and 0 < report.ttft <= report.duration
    [attempt] = report.attempts
    assert attempt.outcome == "ok" and attempt.chunks == 8 and attempt.output_tokens == 8
    assert attempt.ttft is not None and attempt.gap_max is not None
    tpot = attempt.time_per_output_token
    assert tpot is not None and 0 < tpot < attempt.duration
    assert stream.time_per_output_token is not None
    [first] = [e for e in seen if isinstance(e, lk.events.FirstToken)]
    assert first.target == "openai/primary"
    [ended] = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert ended.outcome == "ok" and ended.target == "openai/primary"
    assert [a.completed for a in fake.attempts] == [True]


async def test_errors_before_the_first_chunk_fail_over(fake: FakeProvider) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    fake.script("reset", Behavior(fault=Fault.RESET_BEFORE_HEADERS))
    fake.script("limited", Behavior(fault=Fault.HTTP_429))
    fake.script("good", Behavior(output_tokens=8))
    llm = make_llm(
        fake,
        "down",
        failover=[target(fake, "reset"), target(fake, "limited"), target(fake, "good")],
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    report = lk.report(stream)
    assert report.target == "openai/good"
    assert [(a.target, a.error_kind) for a in report.attempts] == [
        ("openai/down", lk.ErrorKind.SERVER_ERROR),
        ("openai/reset", lk.ErrorKind.CONNECTION),
        ("openai/limited", lk.ErrorKind.RATE_LIMITED),
        ("openai/good", None),
    ]


async def test_a_slow_first_token_behind_keepalives_fails_over_after_first_token(
    fake: FakeProvider,
) -> None:
    fake.script(
        "slow", Behavior(fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=30.0, keepalive_every=0.05)
    )
    fake.script("good", Behavior(output_tokens=8))
    llm = make_llm(
        fake, "slow", failover=[target(fake, "good")], stream_guard=lk.StreamGuard(first_token=0.4)
    )
    started = time.monotonic()
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    committed = time.monotonic() - started
    assert text_of(await read_all(stream)) == TEXT
    assert 0.4 <= committed < 0.4 + 1.0
    [timed_out, ok] = lk.report(stream).attempts
    assert timed_out.error_type == "FirstTokenTimeout" and ok.outcome == "ok"
    await disconnected(fake, "slow")


async def test_a_stall_after_the_first_chunk_raises_stream_stalled_with_the_partial_text(
    fake: FakeProvider,
) -> None:
    fake.script("stalls", Behavior(fault=Fault.STALL, stall_after=3, output_tokens=8))
    # The three chunks are sent back to back: a stall limit of a second leaves room for a
    # loaded machine's pauses (a 0.3 s limit once cut the stream after two, late in the suite).
    llm = make_llm(fake, "stalls", stream_guard=lk.StreamGuard(stall=1.0))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    received: list[Any] = []

    async def consume() -> None:
        async with stream:
            async for chunk in stream:
                received.append(chunk)

    with pytest.raises(lk.StreamStalled) as info:
        await consume()
    raised_at = time.monotonic()
    assert info.value.partial_text == "tok0 tok1 tok2" == text_of(received)
    assert info.value.reason == "stall" and info.value.chunks == 3
    assert stream.outcome == "error"
    [attempt] = info.value.attempts
    assert attempt.outcome == "error" and attempt.chunks == 3
    gone = await disconnected(fake, "stalls")
    assert gone.disconnected_at is not None and gone.disconnected_at - raised_at <= CLOSE_BOUND


@pytest.mark.parametrize("fault", [Fault.CUT, Fault.MALFORMED_CHUNK])
async def test_a_broken_stream_is_never_a_complete_answer(fake: FakeProvider, fault: Fault) -> None:
    fake.script("breaks", Behavior(fault=fault, stall_after=3, output_tokens=8))
    stream = await make_llm(fake, "breaks").acompletion(messages=MESSAGES, stream=True)
    if fault is Fault.MALFORMED_CHUNK and LANE == "openai":
        # The fast lane's SSE reader skips an event that does not parse, and counts it; the
        # answer goes on (through litellm, the OpenAI SDK ends the stream on it: a break).
        assert text_of(await read_all(stream)) == TEXT
        assert stream.outcome == "ok" and stream.skipped == 1
        return
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.partial_text == "tok0 tok1 tok2"
    assert info.value.finish_reason is None
    assert lk.errors.classify(info.value) is lk.ErrorKind.STREAM_BROKEN


async def test_a_stream_without_done_but_with_finish_reason_is_complete(
    fake: FakeProvider,
) -> None:
    fake.script("nodone", Behavior(fault=Fault.MISSING_DONE, output_tokens=8))
    stream = await make_llm(fake, "nodone").acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    assert stream.outcome == "ok"


async def test_content_policy_before_the_first_chunk_is_raised_at_once(
    fake: FakeProvider,
) -> None:
    fake.script("strict", Behavior(fault=Fault.CONTENT_POLICY))
    fake.script("other", Behavior())
    llm = make_llm(fake, "strict", failover=[target(fake, "other")])
    with pytest.raises(lk.ContentPolicyViolation):
        await llm.acompletion(messages=MESSAGES, stream=True)
    assert [a.model for a in fake.attempts] == ["strict"]


async def test_context_length_goes_only_to_a_larger_window(fake: FakeProvider) -> None:
    fake.script("small", Behavior(context_window=1))
    fake.script("same", Behavior())
    fake.script("large", Behavior(output_tokens=8))
    llm = make_llm(
        fake,
        "small",
        context_window=1,
        failover=[target(fake, "same", context_window=1), target(fake, "large", context_window=9)],
    )
    long_prompt = [{"role": "user", "content": "word " * 100}]  # about 125 tokens: > 1
    stream = await llm.acompletion(messages=long_prompt, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    assert [a.model for a in fake.attempts] == ["small", "large"]


async def test_a_hedged_stream_is_won_by_the_first_content_chunk(fake: FakeProvider) -> None:
    # The first request is slow to its first token, the second (the hedge) is fast.
    fake.script("model", [Behavior(ttft=30.0), Behavior(output_tokens=8)])
    llm = make_llm(fake, "model", hedge=lk.Hedge(0.2, max_extra_load=1.0))
    started = time.monotonic()
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    returned_at = time.monotonic()
    assert returned_at - started < 2.0
    assert text_of(await read_all(stream)) == TEXT
    report = lk.report(stream)
    assert report.answering_attempt == 2
    assert str(report).startswith("openai/model answered after 2 attempts (hedged), first token ")
    assert sorted((a.number, a.outcome) for a in report.attempts) == [(1, "cancelled"), (2, "ok")]
    loser = await disconnected(fake, "model")
    assert loser.tokens_sent == 0
    # The loser was closed before the winner was handed over.
    assert loser.disconnected_at is not None and loser.disconnected_at - returned_at <= CLOSE_BOUND


async def test_breaking_out_closes_the_response_at_once(fake: FakeProvider) -> None:
    fake.script("long", Behavior(output_tokens=200, itl=0.02))
    llm = make_llm(fake, "long", breaker={"minimum_calls": 1})
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        async for _ in stream:
            if stream.chunks == 3:
                break
    closed_at = time.monotonic()
    assert stream.outcome == "closed"
    gone = await disconnected(fake, "long")
    assert gone.disconnected_at is not None and gone.disconnected_at - closed_at <= CLOSE_BOUND
    [attempt] = lk.report(stream).attempts
    assert attempt.outcome == "cancelled" and attempt.chunks == 3
    # The consumer's choice says nothing bad about the provider.
    assert lk.policies.breaker.breakers()["openai/long"].metrics().failures == 0


async def test_a_cancelled_consumer_closes_the_response(fake: FakeProvider) -> None:
    fake.script("long", Behavior(output_tokens=200, itl=0.02))
    stream = await make_llm(fake, "long").acompletion(messages=MESSAGES, stream=True)
    with anyio.move_on_after(0.2):
        async for _ in stream:
            pass
    cancelled_at = time.monotonic()
    assert stream.outcome == "cancelled"
    gone = await disconnected(fake, "long")
    assert gone.disconnected_at is not None and gone.disconnected_at - cancelled_at <= CLOSE_BOUND


async def test_the_total_deadline_holds_on_every_chunk(fake: FakeProvider) -> None:
    fake.script("long", Behavior(output_tokens=200, itl=0.02))
    stream = await make_llm(fake, "long", deadline=0.5).acompletion(messages=MESSAGES, stream=True)
    started = time.monotonic()
    with pytest.raises(lk.DeadlineExceeded) as info:
        await read_all(stream)
    raised_at = time.monotonic()
    assert raised_at - started < 0.5 + 0.2
    assert info.value.partial_text and TEXT.startswith(info.value.partial_text[:20])
    assert info.value.budget == pytest.approx(0.5, abs=0.05)
    gone = await disconnected(fake, "long")
    assert gone.disconnected_at is not None and gone.disconnected_at - raised_at <= CLOSE_BOUND


async def test_degrade_after_counts_to_the_first_content_chunk(fake: FakeProvider) -> None:
    fake.script(
        "slow", Behavior(fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=30.0, keepalive_every=0.05)
    )
    fake.script("cheap", Behavior(output_tokens=8))
    llm = make_llm(fake, "slow", deadline=5.0, degrade=lk.Degrade(model="openai/cheap", after=0.3))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    report = lk.report(stream)
    assert report.degraded and report.fallback_reason == "timeout"
    assert report.target == "openai/cheap"


async def test_an_unclosed_stream_is_closed_when_collected(fake: FakeProvider) -> None:
    fake.script("long", Behavior(output_tokens=200, itl=0.02))
    ended: list[lk.events.Event] = []
    with lk.subscribe(ended.append):
        stream = await make_llm(fake, "long").acompletion(messages=MESSAGES, stream=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del stream
            gc.collect()
            collected_at = time.monotonic()
        assert any(issubclass(w.category, ResourceWarning) for w in caught)
    gone = await disconnected(fake, "long")
    assert gone.disconnected_at is not None and gone.disconnected_at - collected_at <= CLOSE_BOUND
    [call] = [e for e in ended if isinstance(e, lk.events.CallEnded)]
    assert call.outcome == "cancelled"


async def test_decorated_async_generators_stream_through_the_policies() -> None:
    @lk.deadline(5)
    @lk.stream_guard(first_token=0.2, stall=0.2)
    async def tokens(n: int, pause_at: int | None = None) -> AsyncIterator[int]:
        for i in range(n):
            if i == pause_at:
                await anyio.sleep(10)
            yield i

    assert [x async for x in tokens(3)] == [0, 1, 2]
    started = time.monotonic()
    with pytest.raises(lk.FirstTokenTimeout):
        async for _ in tokens(3, pause_at=0):
            pass
    with pytest.raises(lk.StreamStalled) as info:
        async for _ in tokens(3, pause_at=2):
            pass
    assert info.value.chunks == 2
    assert time.monotonic() - started < 0.2 + 0.2 + 1.0


async def test_guard_stream_guards_any_async_iterator() -> None:
    async def items() -> AsyncIterator[str]:
        yield "a"
        await anyio.sleep(10)
        yield "b"

    received = []

    async def consume() -> None:
        async with lk.guard_stream(items(), first_token=1.0, stall=0.2) as guarded:
            async for item in guarded:
                received.append(item)

    with pytest.raises(lk.StreamStalled):
        await consume()
    assert received == ["a"]


def test_stream_guard_validates_its_options() -> None:
    with pytest.raises(ValueError, match=r"StreamGuard\.stall"):
        lk.StreamGuard(stall=0)
    with pytest.raises(TypeError, match=r"StreamGuard\.first_token"):
        lk.StreamGuard(first_token="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LLM\.stream_guard"):
        lk.LLM("openai/x", stream_guard=3)  # type: ignore[arg-type]


# --- continuing a broken stream (StreamGuard(on_break="continue")) --------------------------


def resuming(**options: Any) -> lk.StreamGuard:
    return lk.StreamGuard(on_break="continue", **options)


async def test_a_cut_stream_is_continued_by_regenerating_and_skipping_the_delivered_text(
    fake: FakeProvider,
) -> None:
    fake.script(
        "model",
        [Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8), Behavior(output_tokens=8)],
    )
    llm = make_llm(fake, "model", stream_guard=resuming())
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        chunks = await read_all(stream)
    assert text_of(chunks) == TEXT == stream.partial_text
    assert stream.outcome == "ok" and stream.resumes == 1
    [resumed] = [e for e in seen if isinstance(e, lk.events.StreamResumed)]
    assert resumed.mode == "regenerate" and resumed.chunks == 3
    broken, continued = sorted(lk.report(stream).attempts, key=lambda a: a.number)
    assert broken.error_kind is lk.ErrorKind.STREAM_BROKEN and broken.chunks == 3
    assert continued.outcome == "ok"
    assert [a.prefill_chars for a in fake.attempts] == [0, 0]


async def test_a_prefill_capable_target_continues_from_the_delivered_text(
    fake: FakeProvider,
) -> None:
    fake.script(
        "model",
        [Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8), Behavior(output_tokens=8)],
    )
    llm = make_llm(fake, "model", capabilities={"prefill"}, stream_guard=resuming())
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        assert text_of(await read_all(stream)) == TEXT
    [resumed] = [e for e in seen if isinstance(e, lk.events.StreamResumed)]
    assert resumed.mode == "prefill"
    _, second = fake.attempts
    assert second.prefill_chars == len("tok0 tok1 tok2")
    assert second.tokens_sent == 5  # only what was missing


async def test_a_rejected_prefill_is_not_a_failure_and_falls_back_to_regenerating(
    fake: FakeProvider,
) -> None:
    strict = Behavior(rejects_prefill=True, output_tokens=8)
    fake.script(
        "model", [Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8), strict, strict]
    )
    llm = make_llm(
        fake,
        "model",
        capabilities={"prefill"},
        stream_guard=resuming(),
        breaker={"minimum_calls": 3},
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    assert [(a.prefill_chars > 0, a.status) for a in fake.attempts] == [
        (False, 200),
        (True, 400),
        (False, 200),
    ]
    metrics = lk.policies.breaker.breakers()["openai/model"].metrics()
    assert metrics.failures == 1  # the cut only: the rejected prefill does not count


async def test_a_regeneration_that_diverges_is_never_spliced(fake: FakeProvider) -> None:
    fake.script(
        "model",
        [
            Behavior(fault=Fault.CUT, stall_after=3, text="The answer is forty two."),
            Behavior(text="A different answer altogether."),
        ],
    )
    llm = make_llm(fake, "model", stream_guard=resuming())
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.reason == "recovery_diverged"
    assert info.value.partial_text == "The answer is"


async def test_a_stall_is_recovered_on_the_next_target_within_the_stall_limit(
    fake: FakeProvider,
) -> None:
    fake.script(
        "stalls",
        [
            Behavior(fault=Fault.STALL, stall_after=3, output_tokens=8),
            Behavior(fault=Fault.HTTP_503),
        ],
    )
    fake.script("backup", Behavior(output_tokens=8))
    llm = make_llm(
        fake, "stalls", failover=[target(fake, "backup")], stream_guard=resuming(stall=0.3)
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    started = time.monotonic()
    assert text_of(await read_all(stream)) == TEXT
    assert time.monotonic() - started < 0.3 + 1.0
    assert lk.report(stream).target == "openai/backup"
    assert [a.model for a in fake.attempts] == ["stalls", "backup"]  # the stalled one is left
    await disconnected(fake, "stalls")


async def test_a_target_that_keeps_cutting_is_left_for_the_failover_target(
    fake: FakeProvider,
) -> None:
    """Every stream of the primary is cut at the same point: the continuation goes to the
    failover target, which completes the answer exactly once (no word lost or repeated)."""
    fake.script("cuts", Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8))
    fake.script("backup", Behavior(output_tokens=8))
    llm = make_llm(fake, "cuts", failover=[target(fake, "backup")], stream_guard=resuming())
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    chunks = await read_all(stream)
    assert text_of(chunks) == TEXT == stream.partial_text
    assert stream.outcome == "ok" and stream.resumes == 1
    assert [a.model for a in fake.attempts] == ["cuts", "backup"]
    assert lk.report(stream).target == "openai/backup"
    assert [(a.target, a.reason, a.outcome) for a in lk.report(stream).attempts] == [
        ("openai/cuts", "primary", "error"),
        ("openai/backup", "resume", "ok"),
    ]


async def test_a_stream_that_cannot_be_completed_is_stream_broken_with_every_attempt(
    fake: FakeProvider,
) -> None:
    cut = Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8)
    fake.script("cuts", cut)
    fake.script("backup", cut)
    llm = make_llm(fake, "cuts", failover=[target(fake, "backup")], stream_guard=resuming())
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    error = info.value
    assert type(error) is lk.StreamBroken and error.reason == "cut"
    assert lk.errors.classify(error) is lk.ErrorKind.STREAM_BROKEN
    assert error.partial_text == "tok0 tok1 tok2" and stream.resumes == 2
    assert [(a.target, a.reason) for a in error.attempts] == [
        ("openai/cuts", "primary"),
        ("openai/backup", "resume"),
        ("openai/cuts", "resume"),
    ]
    assert all(a.outcome == "error" for a in error.attempts)


async def test_a_continuation_that_stalls_is_an_error_its_breaker_counts(
    fake: FakeProvider,
) -> None:
    fake.script("cuts", Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8))
    fake.script("stalls", Behavior(fault=Fault.STALL, stall_after=4, output_tokens=8))
    llm = make_llm(
        fake,
        "cuts",
        failover=[target(fake, "stalls")],
        stream_guard=resuming(stall=0.3, max_resumes=1),
        breaker={"minimum_calls": 5},
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamStalled) as info:
        await read_all(stream)
    assert info.value.partial_text == "tok0 tok1 tok2 tok3"
    resumed = info.value.attempts[-1]
    assert (resumed.target, resumed.outcome) == ("openai/stalls", "error")
    assert resumed.error_type == "StreamStalled"
    assert lk.policies.breaker.breakers()["openai/stalls"].metrics().failures == 1
    assert llm.stats()["openai/stalls"].errors == 1


async def test_recovery_gives_up_after_max_resumes(fake: FakeProvider) -> None:
    cut = Behavior(fault=Fault.CUT, stall_after=3, output_tokens=8)
    fake.script("model", [cut, cut, cut])
    llm = make_llm(fake, "model", stream_guard=resuming(max_resumes=1))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.reason != "recovery_diverged" and stream.resumes == 1
    assert len(fake.attempts) == 2


# --- what the provider sends, as it sends it ----------------------------------------------------


async def test_a_role_only_first_chunk_does_not_commit_the_stream(fake: FakeProvider) -> None:
    # Role chunk at once, content after 30 s: the guard must wait for content, not the role.
    fake.script("slow", Behavior(role_chunk=True, ttft=30.0))
    fake.script("good", Behavior(role_chunk=True, output_tokens=8))
    llm = make_llm(
        fake, "slow", failover=[target(fake, "good")], stream_guard=lk.StreamGuard(first_token=0.3)
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    chunks = await read_all(stream)
    assert text_of(chunks) == TEXT
    assert chunks[0].choices[0].delta.role == "assistant"  # chunks read before commit are kept
    assert [a.error_type for a in lk.report(stream).attempts] == ["FirstTokenTimeout", None]


async def test_headers_then_silence_fails_over_after_first_token(fake: FakeProvider) -> None:
    fake.script("silent", Behavior(fault=Fault.HEADERS_THEN_SILENCE))
    fake.script("good", Behavior(output_tokens=8))
    llm = make_llm(
        fake,
        "silent",
        failover=[target(fake, "good")],
        stream_guard=lk.StreamGuard(first_token=0.3),
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    await disconnected(fake, "silent")


async def test_keepalives_and_empty_deltas_do_not_hide_a_stall(fake: FakeProvider) -> None:
    fake.script(
        "stalls",
        Behavior(fault=Fault.STALL, stall_after=3, stall_keepalive=True, keepalive_every=0.05),
    )
    stream = await make_llm(fake, "stalls", stream_guard=lk.StreamGuard(stall=0.4)).acompletion(
        messages=MESSAGES, stream=True
    )
    started = time.monotonic()
    with pytest.raises(lk.StreamStalled) as info:
        await read_all(stream)
    assert 0.3 <= time.monotonic() - started < 0.4 + 0.5
    assert info.value.partial_text == "tok0 tok1 tok2"


async def test_a_stall_is_stream_stalled_whether_the_guard_or_the_read_timeout_fires(
    fake: FakeProvider,
) -> None:
    """A stall limit equal to the attempt timeout: the two race, and the stall is a
    StreamStalled every time (a stream's read timeout is the silence the guard watches for)."""
    fake.script("stalls", Behavior(fault=Fault.STALL, stall_after=3, output_tokens=8))
    llm = make_llm(fake, "stalls", timeout=0.4, stream_guard=lk.StreamGuard(stall=0.4))
    for _ in range(3):
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        with pytest.raises(lk.StreamStalled):
            await read_all(stream)


async def test_a_slow_consumer_is_not_taken_for_a_stall(fake: FakeProvider) -> None:
    """The consumer spends twice the stall limit on the first six tokens, while the provider
    sends the rest after a pause shorter than the limit. That time is the consumer's, not
    the provider's: no stall (tests/test_fast_lane.py has the case of events read at
    once)."""
    fake.script(
        "burst", Behavior(fault=Fault.STALL, stall_after=6, stall_for=0.15, output_tokens=12)
    )
    llm = make_llm(fake, "burst", stream_guard=lk.StreamGuard(stall=0.3))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    chunks = []
    async with stream:
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) <= 6:
                await anyio.sleep(0.1)
    assert text_of(chunks) == " ".join(f"tok{i}" for i in range(12))
    assert stream.outcome == "ok" and stream.chunks == 12


@pytest.mark.parametrize("error", ["overloaded", "server_error", "rate_limit"])
async def test_a_transient_error_event_before_content_fails_over(
    fake: FakeProvider, error: str
) -> None:
    fake.script("flaky", Behavior(fault=Fault.ERROR_EVENT, error=error, stall_after=0))
    fake.script("good", Behavior(output_tokens=8))
    llm = make_llm(fake, "flaky", failover=[target(fake, "good")])
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert text_of(await read_all(stream)) == TEXT
    assert [a.model for a in fake.attempts] == ["flaky", "good"]


async def test_a_content_filter_event_stops_at_once(fake: FakeProvider) -> None:
    fake.script("strict", Behavior(fault=Fault.ERROR_EVENT, error="content_filter", stall_after=0))
    fake.script("other", Behavior())
    llm = make_llm(fake, "strict", failover=[target(fake, "other")], retry=lk.Retry())
    with pytest.raises(lk.ContentPolicyViolation):
        await llm.acompletion(messages=MESSAGES, stream=True)
    assert [a.model for a in fake.attempts] == ["strict"]


async def test_a_content_filter_mid_stream_is_raised_with_the_partial_text_and_not_resumed(
    fake: FakeProvider,
) -> None:
    fake.script(
        "strict",
        [
            Behavior(fault=Fault.ERROR_EVENT, error="content_filter", stall_after=3),
            Behavior(output_tokens=8),
        ],
    )
    llm = make_llm(fake, "strict", stream_guard=lk.StreamGuard(on_break="continue"))
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.ContentPolicyViolation) as info:
        await read_all(stream)
    assert info.value.partial_text == "tok0 tok1 tok2"
    assert len(fake.attempts) == 1


async def test_an_overload_event_mid_stream_is_a_transient_break(fake: FakeProvider) -> None:
    fake.script("busy", Behavior(fault=Fault.ERROR_EVENT, error="overloaded", stall_after=3))
    stream = await make_llm(fake, "busy").acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.partial_text == "tok0 tok1 tok2" and lk.errors.is_transient(info.value)


async def test_done_without_a_finish_reason_is_a_cut(fake: FakeProvider) -> None:
    fake.script("cut", Behavior(fault=Fault.CUT_WITH_DONE, stall_after=3))
    stream = await make_llm(fake, "cut").acompletion(messages=MESSAGES, stream=True)
    with pytest.raises(lk.StreamBroken) as info:
        await read_all(stream)
    assert info.value.reason == "cut" and info.value.partial_text == "tok0 tok1 tok2"


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_many_mixed_streams_leave_no_task_nor_connection_behind(fake: FakeProvider) -> None:
    fake.script("ok", Behavior(output_tokens=6))
    fake.script("stalls", Behavior(fault=Fault.STALL, stall_after=2, output_tokens=6))
    fake.script("cut", Behavior(fault=Fault.CUT, stall_after=2, output_tokens=6))
    fake.script("long", Behavior(output_tokens=50, itl=0.002))
    fake.script("silent", Behavior(fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=30.0))
    # litellm costs ~20 ms of CPU per stream here: 20 at a time keeps healthy streams far from
    # the limits on a loaded 2-core machine.
    guard = lk.StreamGuard(first_token=3.0, stall=2.0)
    mix = ("ok", "long", "cut", "ok", "stalls", "ok", "long", "cut", "ok", "ok") * 2
    mix = (*mix[:-1], "silent")
    llms = {m: make_llm(fake, m, stream_guard=guard) for m in set(mix)}
    outcomes: dict[str, int] = {}
    workers = anyio.CapacityLimiter(20)

    async def one(i: int) -> None:
        model = mix[i % len(mix)]
        async with workers:
            try:
                stream = await llms[model].acompletion(messages=MESSAGES, stream=True)
                async with stream:
                    async for _ in stream:
                        if model == "long" and stream.chunks == 5:
                            break  # the consumer leaves early
            except lk.LatencykitError as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
            else:
                outcomes[model] = outcomes.get(model, 0) + 1

    tasks_before = _tasks()
    with anyio.fail_after(200):
        async with anyio.create_task_group() as group:
            for i in range(1000):
                group.start_soon(one, i)
    # Every stream ends as a full answer or a typed error (under load a cut may be seen as a
    # stall first: the loop is busy longer than the stall limit).
    counts = (outcomes["ok"], outcomes["long"], outcomes["FirstTokenTimeout"])
    assert counts == (450, 200, 50), outcomes
    assert outcomes.get("StreamStalled", 0) + outcomes.get("StreamBroken", 0) == 300
    # Every response finished, or its client went away (a cut is the server's own doing).
    await fake.wait_for_async(
        lambda seen: all(a.ended_at or a.disconnected or a.fault is Fault.CUT for a in seen), 5.0
    )
    assert len(fake.attempts) == 1000
    for _ in range(100):  # a keep-alive pool may stay; nothing per stream
        if fake.open_connections <= 20:
            break
        await anyio.sleep(0.05)
    assert fake.open_connections <= 20
    assert _tasks() <= tasks_before + 2


def _tasks() -> int:
    """Tasks alive in this event loop."""
    import asyncio

    import sniffio

    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())
    import trio

    return trio.lowlevel.current_statistics().tasks_living
