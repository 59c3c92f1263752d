"""The stream guard's limits without an SLO (issue 25): learned per target from its recent
streams once it has enough samples, the attempt timeout before.

The rule's logic on fake samples (virtual time), then end to end on the fake provider over
HTTP, on both lanes and both backends: a warm target that turns silent is failed over within
3x its healthy p99 time to first token (the bound read from the LLM's own recorder), a limit
the user sets wins, a cold target keeps the attempt timeout, a long prompt is not failed early,
and a stall is caught at the learned stall limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec
import pytest

import latencykit as lk
from helpers import KEY, read_all, text_of
from latencykit.llm import CallReport
from latencykit.policies.guard import (
    FIRST_TOKEN_FLOOR,
    LEARN_MIN_SAMPLES,
    LEARN_MULTIPLE,
    STALL_FLOOR,
)
from latencykit.stats import Recorder
from latencykit.stream import Limit
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio
E = TypeVar("E", bound=lk.events.Event)

MESSAGES = [{"role": "user", "content": "hello"}]
PRIMARY, BACKUP = "openai/primary", "openai/backup"
HEALTHY_TTFT = 0.4  # seconds: 3x it is above the floor, so the rule's multiple is what is tested
MARGIN = 1.0  # seconds of slack for a loaded machine on top of a bound


# --- the rule, on fake samples ----------------------------------------------------------------


def _guard(recorder: Recorder, **options: Any) -> lk.StreamGuard:
    async def run(call: Any, trace: Any) -> Any:
        raise AssertionError("not called")

    return lk.StreamGuard(**options).bound(
        (), lambda target: run, run, raise_truncated=False, recorder=recorder
    )


def _feed(recorder: Recorder, key: str, seconds: float, *, n: int = LEARN_MIN_SAMPLES) -> None:
    for _ in range(n):
        recorder.first_chunk(key, seconds)


TARGET = lk.Target("openai/t", timeout=30.0)


@pytest.mark.virtual_time
async def test_a_cold_target_keeps_the_timeout_then_learns_3x_its_p99() -> None:
    recorder = Recorder()
    guard = _guard(recorder)
    _feed(recorder, TARGET.key, 0.5, n=LEARN_MIN_SAMPLES - 1)
    first_token, stall = guard.limits(TARGET)
    assert (first_token, stall) == (30.0, 30.0)
    assert isinstance(first_token, Limit) and first_token.source == "timeout"
    recorder.first_chunk(TARGET.key, 0.6)  # the 20th sample, and the window's p99
    first_token, stall = guard.limits(TARGET)
    assert first_token == pytest.approx(LEARN_MULTIPLE * 0.6)
    assert isinstance(first_token, Limit) and first_token.source == "learned"
    assert repr(first_token) == f"Limit({float(first_token)!r}, 'learned')"
    assert stall == 30.0  # no complete stream yet: the stall limit is not learned
    first, stall_learned = guard.learned(TARGET.key)
    assert first == pytest.approx(1.8) and stall_learned is None


@pytest.mark.virtual_time
async def test_learned_limits_have_a_floor_and_the_timeout_as_a_cap() -> None:
    recorder = Recorder()
    guard = _guard(recorder)
    _feed(recorder, TARGET.key, 0.01)
    for _ in range(LEARN_MIN_SAMPLES):
        recorder.longest_gap(TARGET.key, 0.02)
    assert guard.limits(TARGET) == (FIRST_TOKEN_FLOOR, STALL_FLOOR)
    slow = lk.Target("openai/slow", timeout=30.0)
    _feed(recorder, slow.key, 20.0)
    first_token, _ = guard.limits(slow)
    assert first_token == 30.0 and isinstance(first_token, Limit)
    assert first_token.source == "timeout"


@pytest.mark.virtual_time
async def test_a_limit_the_user_sets_wins() -> None:
    recorder = Recorder()
    guard = _guard(recorder, first_token=5.0)
    _feed(recorder, TARGET.key, 0.1)
    for _ in range(LEARN_MIN_SAMPLES):
        recorder.longest_gap(TARGET.key, 1.0)
    first_token, stall = guard.limits(TARGET)
    assert isinstance(first_token, Limit) and isinstance(stall, Limit)
    assert (first_token, first_token.source) == (5.0, "configured")
    assert (stall, stall.source) == (3.0, "learned")  # the other limit is still learned
    assert guard.learned(TARGET.key) == (None, 3.0)


@pytest.mark.virtual_time
async def test_silence_is_not_learned_and_an_emptied_window_relaxes_the_limit() -> None:
    """Abandoned attempts are no samples: once the window has emptied, the last learned limit
    holds for a window after the window last backed it, then doubles per window until the
    target answers again."""
    recorder = Recorder(window=60.0)
    guard = _guard(recorder)
    _feed(recorder, TARGET.key, 0.5)
    await anyio.sleep(30)
    assert guard.limits(TARGET)[0] == 1.5  # the window backs it still (30 s old samples)
    await anyio.sleep(31)  # every sample expired: the target said nothing since
    assert guard.limits(TARGET)[0] == 1.5  # held for a window after it was last backed
    await anyio.sleep(30)
    assert guard.limits(TARGET)[0] == 3.0
    await anyio.sleep(120)
    assert guard.limits(TARGET)[0] == 12.0
    await anyio.sleep(600)
    first_token, _ = guard.limits(TARGET)
    assert first_token == 30.0 and isinstance(first_token, Limit)
    assert first_token.source == "timeout"
    _feed(recorder, TARGET.key, 4.0)  # it answers again, slower: the limit follows
    assert guard.limits(TARGET)[0] == 12.0


@pytest.mark.virtual_time
async def test_the_stats_table_shows_the_learned_limits() -> None:
    recorder = Recorder()
    guard = _guard(recorder)
    _feed(recorder, TARGET.key, 0.5)
    table = guard.with_learned(recorder.stats([TARGET.key, "openai/cold"]))
    assert table[TARGET.key].first_token_limit == 1.5
    assert table[TARGET.key].stall_limit is None
    assert table["openai/cold"].first_token_limit is None
    assert "ft limit" in str(table) and "1,500" in str(table)


# --- end to end, on the fake provider --------------------------------------------------------


@pytest.fixture(params=["litellm", "openai"])
def lane(request: pytest.FixtureRequest) -> str:
    """Every HTTP test runs through litellm and on the fast lane."""
    return str(request.param)


def _collect(into: list[E], kind: type[E]) -> Callable[[lk.events.Event], None]:
    """An event handler that keeps the events of type ``kind``."""

    def handler(event: lk.events.Event) -> None:
        if isinstance(event, kind):
            into.append(event)

    return handler


def _llm(fake: FakeProvider, lane: str, **options: Any) -> lk.LLM:
    """An out-of-the-box LLM (the issue's 30 s attempt timeout) with a failover target."""
    backup = {"model": BACKUP, "api_base": fake.base_url, "api_key": KEY, "transport": lane}
    options.setdefault("failover", [backup])
    options.setdefault("timeout", 30.0)
    return lk.LLM(PRIMARY, api_base=fake.base_url, api_key=KEY, transport=lane, **options)


async def _warm(llm: lk.LLM, fake: FakeProvider, **behavior: Any) -> float:
    """Stream enough healthy answers from the primary for its limits to be learned; the
    primary's p99 time to first chunk, as its recorder measured it."""
    fake.script("primary", Behavior(ttft=HEALTHY_TTFT, output_tokens=4, **behavior))
    fake.script("backup", Behavior(output_tokens=4))

    async def one() -> None:
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        assert lk.report(stream).target == PRIMARY
        await read_all(stream)

    for _ in range(2):  # in two rounds: the first of a process may do litellm's set-up
        async with anyio.create_task_group() as tg:
            for _ in range(LEARN_MIN_SAMPLES // 2):
                tg.start_soon(one)
    p99 = llm.stats()[PRIMARY].ttft.p99
    assert p99 is not None
    return p99


async def _answer(llm: lk.LLM, messages: Any = MESSAGES) -> tuple[CallReport, float, str]:
    """One streamed answer: its report, the seconds to its first chunk, its text."""
    started = time.monotonic()
    stream = await llm.acompletion(messages=messages, stream=True)
    first = time.monotonic() - started
    text = text_of(await read_all(stream))
    return lk.report(stream), first, text  # once the stream ended: every attempt recorded


async def test_a_warm_target_that_turns_silent_is_failed_over_within_3x_its_p99(
    fake: FakeProvider, lane: str
) -> None:
    llm = _llm(fake, lane)
    p99 = await _warm(llm, fake)
    learned = llm.stats()[PRIMARY].first_token_limit
    assert learned == pytest.approx(max(FIRST_TOKEN_FLOOR, LEARN_MULTIPLE * p99), rel=0.05)
    fake.script("primary", Behavior(fault=Fault.HANG))
    missed: list[lk.events.FirstTokenMissed] = []
    with lk.subscribe(_collect(missed, lk.events.FirstTokenMissed)):
        report, first, text = await _answer(llm)
    assert report.target == BACKUP and text
    gave_up = report.attempts[0]
    assert (gave_up.target, gave_up.error_type) == (PRIMARY, "FirstTokenTimeout")
    assert gave_up.duration <= 3 * p99 + MARGIN  # the bound, not the 30 s timeout
    assert first <= 3 * p99 + 2 * MARGIN
    assert [(e.target, e.source) for e in missed] == [(PRIMARY, "learned")]
    assert missed[0].first_token == pytest.approx(learned)
    assert b'"source":"learned"' in msgspec.json.encode(missed[0])  # events encode (a float)
    # The silence taught nothing: the next call gives up as fast.
    assert llm.stats()[PRIMARY].first_token_limit == learned
    report, _, _ = await _answer(llm)
    assert report.target == BACKUP and report.attempts[0].duration <= 3 * p99 + MARGIN


async def test_a_limit_the_user_sets_wins_over_the_learned_one(
    fake: FakeProvider, lane: str
) -> None:
    llm = _llm(fake, lane, stream_guard=lk.StreamGuard(first_token=8.0))
    p99 = await _warm(llm, fake)
    slow = max(3.0, 3 * p99 + MARGIN)  # past what would be learned, within the user's limit
    assert slow < 8.0
    fake.script("primary", Behavior(ttft=slow, output_tokens=4))
    report, first, text = await _answer(llm)
    assert report.target == PRIMARY and len(report.attempts) == 1 and text
    assert first >= slow
    assert llm.stats()[PRIMARY].first_token_limit is None  # nothing learned: it is set


async def test_a_cold_target_keeps_the_attempt_timeout(fake: FakeProvider, lane: str) -> None:
    llm = _llm(fake, lane, timeout=2.0)
    fake.script("primary", Behavior(ttft=1.2, output_tokens=4))  # slow, but within the timeout
    report, _, text = await _answer(llm)
    assert report.target == PRIMARY and text
    fake.script("primary", Behavior(fault=Fault.HANG))
    fake.script("backup", Behavior(output_tokens=4))
    missed: list[lk.events.FirstTokenMissed] = []
    with lk.subscribe(_collect(missed, lk.events.FirstTokenMissed)):
        report, _, text = await _answer(llm)
    assert report.target == BACKUP and text
    assert report.attempts[0].duration >= 2.0 - 0.05  # waited for the timeout, as before
    assert [(e.target, e.first_token, e.source) for e in missed] == [(PRIMARY, 2.0, "timeout")]
    assert llm.stats()[PRIMARY].first_token_limit is None


async def test_a_long_prompt_is_given_time_in_proportion(fake: FakeProvider, lane: str) -> None:
    """TTFT grows with the prompt: a prompt 12x longer than any the target answered recently
    gets a first-token limit 12x longer; the same first token for a short prompt is late.
    (The long prompt's first token then enters the window, and its p99: the rule errs on the
    side of waiting.)"""
    llm = _llm(fake, lane)
    p99 = await _warm(llm, fake)
    slow = max(2.5, 3 * p99 + MARGIN)  # late for a short prompt
    long_prompt = [{"role": "user", "content": "hello " * 10}]  # 60 characters vs 5: 12x
    assert slow < 10 * LEARN_MULTIPLE * p99 / 2
    fake.script("primary", Behavior(ttft=slow, output_tokens=4))
    report, _, _ = await _answer(llm)
    assert report.target == BACKUP
    assert report.attempts[0].error_type == "FirstTokenTimeout"
    report, _, text = await _answer(llm, long_prompt)
    assert report.target == PRIMARY and len(report.attempts) == 1 and text


async def test_a_stall_is_caught_at_the_learned_stall_limit(fake: FakeProvider, lane: str) -> None:
    llm = _llm(fake, lane)
    await _warm(llm, fake, itl=0.01)
    learned = llm.stats()[PRIMARY].stall_limit
    assert learned == STALL_FLOOR  # healthy gaps of ~10 ms: the floor
    fake.script("primary", Behavior(fault=Fault.STALL, stall_after=2, output_tokens=4))
    stalls: list[lk.events.StallDetected] = []
    with lk.subscribe(_collect(stalls, lk.events.StallDetected)):
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        started = time.monotonic()
        with pytest.raises(lk.StreamStalled) as raised:
            await read_all(stream)
    waited = time.monotonic() - started
    assert STALL_FLOOR - 0.05 <= waited <= STALL_FLOOR + MARGIN  # not the 30 s timeout
    assert "stall limit: learned" in str(raised.value)
    assert [(e.target, e.stall, e.source) for e in stalls] == [(PRIMARY, STALL_FLOOR, "learned")]
    assert b'"source":"learned"' in msgspec.json.encode(stalls[0])


async def test_an_abandoned_stream_says_its_limit_was_configured(
    fake: FakeProvider, lane: str
) -> None:
    llm = _llm(fake, lane, failover=[], stream_guard=lk.StreamGuard(first_token=0.5))
    fake.script("primary", Behavior(fault=Fault.HANG))
    missed: list[lk.events.FirstTokenMissed] = []
    with (
        lk.subscribe(_collect(missed, lk.events.FirstTokenMissed)),
        pytest.raises(lk.FirstTokenTimeout, match=r"first-token limit: configured"),
    ):
        await llm.acompletion(messages=MESSAGES, stream=True)
    assert [(e.target, e.first_token, e.source) for e in missed] == [(PRIMARY, 0.5, "configured")]
