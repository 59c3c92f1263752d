"""The slow-call log: real ``lk.LLM`` calls against the fake provider, read back with caplog.

Latencies are scripted well apart from the threshold (a fast call answers in milliseconds, a
slow one takes at least 0.8 s against a 0.5 s threshold), so a loaded machine cannot flip them.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

import latencykit as lk
from latencykit.slow_calls import log_slow_calls
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "a question the log must never show"}]
KEY = "sk-test-slow-calls-0123456789"
THRESHOLD = 0.5
SLOW = Behavior(ttft=0.8)


@pytest.fixture
async def fake(fake_provider: FakeProvider) -> FakeProvider:
    # litellm's first request in a process is cold (0.5-1 s of set-up): not a slow call.
    await make_llm(fake_provider, "warm-up").acompletion(messages=MESSAGES)
    return fake_provider


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="latencykit.slow_calls")
    return caplog


def make_llm(fake: FakeProvider, model: str = "fast", **options: Any) -> lk.LLM:
    return lk.LLM(f"openai/{model}", api_base=fake.base_url, api_key=KEY, **options)


def target(fake: FakeProvider, model: str) -> dict[str, Any]:
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": KEY}


def logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == "latencykit.slow_calls"]
    for record in records:
        text = record.getMessage()
        assert KEY not in text and "never show" not in text and "tok0" not in text
        json.dumps(story(record))  # JSON-ready
    return records


def story(record: logging.LogRecord) -> dict[str, Any]:
    """What the record carries for JSON handlers: ``extra={"latencykit": {...}}``."""
    data: dict[str, Any] = record.__dict__["latencykit"]
    return data


async def test_a_slow_call_is_logged_and_a_fast_one_is_not(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("slow", SLOW)
    fast, slow = make_llm(fake), make_llm(fake, "slow")
    with log_slow_calls(THRESHOLD):
        await fast.acompletion(messages=MESSAGES)
        await slow.acompletion(messages=MESSAGES)
    [record] = logged(caplog)
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("slow call ")
    assert ": ok from openai/slow; 1 attempt: #1 openai/slow at +0.0" in message
    data = story(record)
    assert data["outcome"] == "ok" and data["slow"] and data["duration"] >= 0.8
    assert data["target"] == "openai/slow" and not data["degraded"] and not data["stream"]
    assert data["threshold"] == THRESHOLD and data["parent_id"] is None
    [attempt] = data["attempts"]
    assert attempt["target"] == "openai/slow" and attempt["reason"] == "primary"
    assert attempt["outcome"] == "ok" and attempt["duration"] >= 0.8 and attempt["start"] >= 0


async def test_a_failover_tells_each_attempt(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    fake.script("backup", SLOW)
    llm = make_llm(fake, "down", failover=[target(fake, "backup")])
    with log_slow_calls(THRESHOLD):
        await llm.acompletion(messages=MESSAGES)
    [record] = logged(caplog)
    message = record.getMessage()
    assert ": ok from openai/backup; 2 attempts: #1 openai/down at +" in message
    assert re.search(
        r"ProviderUnavailable \[server_error\] \(request id req_fake_\d+\); "
        r"#2 \(failover\) openai/backup at \+",
        message,
    )
    data = story(record)
    assert [
        (a["target"], a["reason"], a["outcome"], a["error_kind"]) for a in data["attempts"]
    ] == [
        ("openai/down", "primary", "error", "server_error"),
        ("openai/backup", "failover", "ok", None),
    ]
    first, second = data["attempts"]
    assert second["start"] >= first["start"] + first["duration"] - 0.01


async def test_a_hedged_call_shows_the_cancelled_primary(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("tail", [Behavior(ttft=30.0), Behavior(ttft=0.4)])
    llm = make_llm(fake, "tail", deadline=10, hedge=lk.Hedge(0.3, max_extra_load=1.0))
    with log_slow_calls(THRESHOLD):
        await llm.acompletion(messages=MESSAGES)
    [record] = logged(caplog)
    assert "#1 openai/tail at +0.0" in record.getMessage()
    assert "cancelled; #2 (hedge) openai/tail at +0." in record.getMessage()
    data = story(record)
    assert [(a["number"], a["reason"], a["outcome"]) for a in data["attempts"]] == [
        (1, "primary", "cancelled"),
        (2, "hedge", "ok"),
    ]
    assert data["attempts"][1]["start"] >= 0.3 and data["duration"] >= 0.7


async def test_a_degraded_call_says_so(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("hang", Behavior(ttft=30.0))
    fake.script("cheap", Behavior(ttft=0.4))
    llm = make_llm(fake, "hang", deadline=10, degrade=lk.Degrade(model="openai/cheap", after=0.3))
    with log_slow_calls(THRESHOLD):
        await llm.acompletion(messages=MESSAGES)
    [record] = logged(caplog)
    assert ": ok from openai/cheap (degraded); 2 attempts: " in record.getMessage()
    data = story(record)
    assert data["degraded"] and data["target"] == "openai/cheap"
    assert [a["reason"] for a in data["attempts"]] == ["primary", "fallback"]


async def test_a_failed_call_is_logged_however_fast_unless_told_not_to(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    llm = make_llm(fake, "down")
    with log_slow_calls(THRESHOLD), pytest.raises(lk.ProviderUnavailable):
        await llm.acompletion(messages=MESSAGES)
    [record] = logged(caplog)
    message = record.getMessage()
    assert message.startswith("failed call ")
    assert ": ProviderUnavailable [server_error] on openai/down; 1 attempt: #1" in message
    data = story(record)
    assert data["outcome"] == "error" and not data["slow"]
    assert (data["error_type"], data["error_kind"]) == ("ProviderUnavailable", "server_error")
    caplog.clear()
    with log_slow_calls(THRESHOLD, failures=False), pytest.raises(lk.ProviderUnavailable):
        await llm.acompletion(messages=MESSAGES)
    assert logged(caplog) == []


async def test_a_slow_stream_is_logged_when_it_ends_with_its_first_chunk(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("slow", SLOW)
    llm = make_llm(fake, "slow")
    with log_slow_calls(THRESHOLD):
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                pass
    [record] = logged(caplog)
    assert " (stream, first chunk at 0." in record.getMessage()
    data = story(record)
    assert data["stream"] and data["ttft"] >= 0.8
    [attempt] = data["attempts"]
    assert attempt["ttft"] >= 0.8 and attempt["chunks"] == 16
    assert attempt["gap_max"] is not None and attempt["gap_p50"] <= attempt["gap_max"]


async def test_nested_calls_are_logged_each_with_their_parent(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("slow", SLOW)
    llm = make_llm(fake, "slow")

    @lk.deadline(10.0)
    async def ask() -> Any:
        return await llm.acompletion(messages=MESSAGES)

    with log_slow_calls(THRESHOLD):
        await ask()
    inner, outer = logged(caplog)
    assert story(inner)["target"] == "openai/slow"
    assert story(outer)["target"].endswith("ask")
    assert story(inner)["parent_id"] == story(outer)["call_id"]
    assert story(outer)["parent_id"] is None


async def test_the_logger_the_level_and_closing(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script("slow", SLOW)
    llm = make_llm(fake, "slow")
    caplog.set_level(logging.INFO, logger="app.latency")
    log = log_slow_calls(THRESHOLD, logger="app.latency", level=logging.INFO)
    assert log.logger is logging.getLogger("app.latency") and log.level == logging.INFO
    await llm.acompletion(messages=MESSAGES)
    log.close()
    log.close()  # idempotent
    await llm.acompletion(messages=MESSAGES)  # not logged any more
    [record] = [r for r in caplog.records if r.name == "app.latency"]
    assert record.levelno == logging.INFO and record.getMessage().startswith("slow call ")


def test_options_are_validated() -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold"):
            log_slow_calls(bad)
    for wrong in ("1", True):
        with pytest.raises(TypeError, match="threshold"):
            log_slow_calls(wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logger"):
        log_slow_calls(logger=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="level"):
        log_slow_calls(level="WARNING")  # type: ignore[arg-type]
    with log_slow_calls(0) as log:  # 0: every call
        assert log.threshold == 0.0 and "latencykit.slow_calls" in repr(log)
