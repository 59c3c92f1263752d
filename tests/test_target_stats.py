"""Per-target statistics: ``lk.LLM.stats()`` and ``Hedge.stats()`` through real litellm against
the fake provider, and the values they return (no timing assertions: counts and windows)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio
import pytest

import latencykit as lk
from helpers import MESSAGES, make_llm, target
from latencykit.policies.breaker import BreakerState
from latencykit.stats import Percentiles, StatsTable, TargetStats
from latencykit.testing import Behavior, FakeProvider, Fault


async def read_all(stream: lk.Stream[Any], *, stop_after: int | None = None) -> None:
    async with stream:
        async for _ in stream:
            if stop_after is not None and stream.chunks >= stop_after:
                break


@pytest.mark.anyio
async def test_an_llm_without_a_hedge_records_every_attempt(fake: FakeProvider) -> None:
    llm = make_llm(fake, failover=[target(fake, "backup")], degrade=lk.Degrade(model="openai/c"))
    for _ in range(5):
        await llm.acompletion(messages=MESSAGES)
    table = llm.stats()
    # The LLM's targets in failover order, then the degraded path's, even before any attempt.
    assert list(table) == ["openai/primary", "openai/backup", "openai/c"]
    primary = table["openai/primary"]
    assert (primary.attempts, primary.ok, primary.errors, primary.cancelled) == (5, 5, 0, 0)
    assert primary.latency.samples == 5 and primary.latency.censored == 0
    assert primary.latency.p50 is not None and primary.latency.p95 is not None
    assert primary.latency.p99 is not None
    assert 0 < primary.latency.p50 <= primary.latency.p95 <= primary.latency.p99 < 30
    assert primary.ttft == Percentiles()  # no stream
    assert primary.breaker is None and primary.hedge_budget is None and primary.window == 60
    assert table["openai/backup"].attempts == 0 and table["openai/backup"].latency.p50 is None
    text = str(table)
    assert text.splitlines()[0].split()[:5] == ["target", "attempts", "ok", "errors", "cancel"]
    assert "openai/primary" in text and "breaker" not in text and "budget" not in text


@pytest.mark.anyio
async def test_failures_count_by_kind_and_breakers_show_their_state(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    options = {"window_size": 3, "minimum_calls": 3, "open_duration": 60.0}
    llm = make_llm(
        fake,
        failover=[target(fake, "backup")],
        # Private breakers: the registry's are process-wide.
        breaker=lambda key: lk.Breaker(key, **options),  # type: ignore[arg-type]
    )
    for _ in range(5):
        await llm.acompletion(messages=MESSAGES)
    table = llm.stats()
    primary, backup = table["openai/primary"], table["openai/backup"]
    # Three 503s opened the primary's breaker: the last two calls went straight to the backup.
    assert (primary.ok, primary.errors, primary.cancelled) == (0, 3, 0)
    assert primary.error_kinds == {lk.ErrorKind.SERVER_ERROR: 3}
    assert primary.latency.samples == 0  # failures feed no window
    assert primary.breaker is BreakerState.OPEN
    assert (backup.ok, backup.errors, backup.breaker) == (5, 0, BreakerState.CLOSED)
    text = str(table)
    assert "breaker" in text.splitlines()[0] and "errors of openai/primary: server_error 3" in text


@pytest.mark.anyio
async def test_the_hedge_reads_the_windows_stats_shows(fake: FakeProvider) -> None:
    fake.script("primary", [Behavior(ttft=30.0), Behavior()])  # one slow, then fast
    given = lk.Hedge(0.2, max_extra_load=1.0)
    llm = make_llm(fake, deadline=10, hedge=given)
    for _ in range(3):
        await llm.acompletion(messages=MESSAGES)
    primary = llm.stats()["openai/primary"]
    # The first call's primary was cancelled when its hedge answered: a censored sample.
    assert (primary.ok, primary.cancelled, primary.errors) == (3, 1, 0)
    # One sample per attempt (the hedge does not record them a second time).
    assert primary.latency.samples == 4 and primary.latency.censored == 1
    hedge = llm.hedge
    assert hedge is not None and hedge.budget is given.budget  # the budget is shared
    assert primary.hedge_budget == pytest.approx(hedge.budget.balance)
    window = hedge.window("openai/primary")  # the window the hedge's delay reads...
    assert window.count() == 4 and window.censored() == 1  # ...is the one stats() shows
    assert hedge.stats()["openai/primary"].latency == primary.latency
    assert not given.windows  # the hedge given to the LLM records nothing itself


@pytest.mark.anyio
async def test_an_adaptive_hedge_sets_the_window(fake: FakeProvider) -> None:
    llm = make_llm(
        fake, hedge=lk.Hedge(lk.quantile(0.9, min_samples=2, window=30.0, max_samples=3))
    )
    for _ in range(5):
        await llm.acompletion(messages=MESSAGES)
    primary = llm.stats()["openai/primary"]
    assert primary.window == 30.0
    assert primary.ok == 5 and primary.latency.samples == 3  # the newest max_samples


@pytest.mark.anyio
async def test_streams_record_their_first_chunk_and_their_end(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(output_tokens=40))
    llm = make_llm(fake)
    await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    # Closed by the consumer after 3 chunks: cancelled, its end-to-end latency censored.
    await read_all(await llm.acompletion(messages=MESSAGES, stream=True), stop_after=3)
    primary = llm.stats()["openai/primary"]
    assert (primary.ok, primary.cancelled, primary.errors) == (1, 1, 0)
    assert primary.ttft.samples == 2 and primary.ttft.censored == 0
    assert primary.ttft.p50 is not None
    assert primary.latency.samples == 2 and primary.latency.censored == 1
    assert "ttft50" in str(llm.stats()).splitlines()[0]


@pytest.mark.anyio
async def test_a_stream_that_breaks_is_a_failed_attempt(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(fault=Fault.CUT))
    llm = make_llm(fake)
    with pytest.raises(lk.StreamBroken):
        await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    primary = llm.stats()["openai/primary"]
    assert (primary.ok, primary.errors) == (0, 1)
    assert primary.error_kinds == {lk.ErrorKind.STREAM_BROKEN: 1}
    assert primary.ttft.samples == 1 and primary.latency.samples == 0


@pytest.mark.anyio
async def test_an_attempt_cut_off_by_the_deadline_is_cancelled_and_censored(
    fake: FakeProvider,
) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    llm = make_llm(fake, "slow", deadline=0.3)
    with pytest.raises(lk.DeadlineExceeded):
        await llm.acompletion(messages=MESSAGES)
    slow = llm.stats()["openai/slow"]
    assert (slow.ok, slow.errors, slow.cancelled) == (0, 0, 1)
    assert slow.latency.censored == 1 and slow.latency.p50 is None  # nothing completed


@pytest.mark.anyio
async def test_a_decorated_hedge_offers_the_same_stats() -> None:
    policy = lk.hedge(0.05, max_extra_load=1.0)
    calls = 0

    @policy
    async def ask() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(10)  # the first primary is slow: the hedge answers
        return "ok"

    assert await ask() == "ok"
    assert await ask() == "ok"
    [stats] = policy.stats().values()
    assert stats.target == ask.__qualname__
    assert (stats.ok, stats.cancelled, stats.errors) == (2, 1, 0)
    assert stats.latency.samples == 3 and stats.latency.censored == 1
    assert stats.hedge_budget == pytest.approx(policy.budget.balance)


def test_target_stats_read_as_text_and_as_json() -> None:
    stats = TargetStats(
        target="openai/x",
        ok=3,
        errors=1,
        cancelled=1,
        error_kinds={lk.ErrorKind.TIMEOUT: 1},
        latency=Percentiles(p50=0.1, p95=0.2, p99=0.3, samples=4, censored=1),
        breaker=BreakerState.OPEN,
        hedge_budget=2.5,
    )
    assert stats.attempts == 5
    assert str(stats) == (
        "openai/x: 5 attempts (3 ok, 1 failed [timeout 1], 1 cancelled); latency p50 0.100s "
        "p95 0.200s p99 0.300s (4 samples, 1 censored) over 60s; breaker open; hedge budget 2.5"
    )
    hash(stats)  # a frozen value
    data = json.loads(json.dumps(dataclasses.asdict(stats)))
    assert data["error_kinds"] == {"timeout": 1} and data["breaker"] == "open"
    assert data["latency"]["p99"] == 0.3
    table = StatsTable([stats, TargetStats(target="openai/y")])
    assert list(table) == ["openai/x", "openai/y"] and len(table) == 2
    assert table["openai/y"].attempts == 0
    header, _, x, y, *notes = str(table).splitlines()
    assert header.split() == [
        "target",
        "attempts",
        "ok",
        "errors",
        "cancel",
        "p50",
        "p95",
        "p99",
        "n",
        "breaker",
        "budget",
    ]
    assert x.split() == ["openai/x", "5", "3", "1", "1", "100", "200", "300", "4", "open", "2.5"]
    assert y.split() == ["openai/y", "0", "0", "0", "0", "-", "-", "-", "0", "-", "-"]
    assert notes[-1] == "errors of openai/x: timeout 1"


def test_recorder_options_are_validated() -> None:
    with pytest.raises(ValueError, match="window"):
        lk.stats.Recorder(window=0)
    with pytest.raises(ValueError, match="max_samples"):
        lk.stats.Recorder(max_samples=0)
