"""Stages of a turn (lk.stage) and the turn's ledger (lk.ledger), with real LLM calls to the
fake provider where a stage's budget must cancel one."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import latencykit as lk
from helpers import MESSAGES, make_llm
from latencykit import telemetry
from latencykit.testing import Behavior, FakeProvider

pytestmark = pytest.mark.anyio


async def test_stages_are_written_in_the_turns_ledger() -> None:
    with lk.deadline(10.0) as turn:
        assert lk.ledger() is None  # no stage ran yet
        async with lk.stage("retrieval", budget=2.0) as retrieval:
            assert retrieval.remaining() <= 2.0
            await anyio.sleep(0.01)
        with lk.stage("rerank", budget=3.0):
            pass
        found = lk.ledger()
        assert found is not None and found is turn.ledger
    ledger = found
    assert ledger is not None
    assert lk.ledger() is None  # outside the turn
    assert [r.name for r in ledger] == ["retrieval", "rerank"]
    assert [r.outcome for r in ledger] == ["ok", "ok"]
    first = ledger["retrieval"]
    assert first.budget == 2.0 and first.allowed == pytest.approx(2.0, abs=1e-3)
    assert 0.01 <= first.spent < 2.0
    assert first.lent == pytest.approx(2.0 - first.spent, abs=1e-3)
    assert ledger["rerank"].start >= first.start + first.spent
    assert ledger.budget == pytest.approx(10.0, abs=1e-3)
    assert retrieval.record is first
    assert "retrieval: budget 2.000s" in str(ledger)


async def test_a_stage_never_gets_more_than_what_remains_of_the_turn() -> None:
    with lk.deadline(1.0):
        await anyio.sleep(0.2)
        with lk.stage("model", budget=60.0) as model:
            assert model.allowed is not None and model.allowed <= 0.8 + 1e-6
            assert lk.remaining() == pytest.approx(model.remaining(), abs=0.05)
        with lk.stage("tools") as tools:  # no budget of its own: whatever the turn has left
            assert tools.allowed is not None and tools.allowed <= 0.8 + 1e-6
    assert model.record is not None and model.record.budget == 60.0


async def test_time_a_stage_does_not_use_stays_with_the_turn() -> None:
    with lk.deadline(2.0):
        with lk.stage("retrieval", budget=1.5):
            await anyio.sleep(0.01)
        with lk.stage("model") as model:  # gets the retrieval's unused time back
            pass
    assert model.allowed is not None and model.allowed > 1.5


async def test_a_stage_that_overruns_cancels_its_llm_call_and_names_itself(
    fake: FakeProvider,
) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    llm = make_llm(fake, "slow")

    async def turn() -> None:
        with lk.deadline(20.0):
            with lk.stage("retrieval", budget=5.0):
                pass
            async with lk.stage("model", budget=1.5):  # the process's first call may take 0.5 s
                await llm.acompletion(messages=MESSAGES)

    with pytest.raises(lk.DeadlineExceeded) as info:
        await turn()
    error = info.value
    assert error.stage == "model"
    assert "in stage 'model'" in str(error)
    assert error.budget == pytest.approx(1.5, abs=1e-3)
    assert error.ledger is not None
    assert [(r.name, r.outcome) for r in error.ledger] == [
        ("retrieval", "ok"),
        ("model", "overran"),
    ]
    model = error.ledger["model"]
    assert model.overran and model.attempts == 1 and model.lent == 0.0
    assert "model: budget 1.500s" in str(error)  # the ledger is in the message
    assert [a.outcome for a in error.attempts] == ["cancelled"]
    [attempt] = await fake.wait_for_async(lambda a: len(a) == 1 and a[0].disconnected, 5.0)
    assert attempt.ended_at is None  # cut mid-request: the connection was closed


async def test_the_turns_deadline_expiring_inside_a_stage_names_the_innermost_stage() -> None:
    async def turn() -> None:
        with lk.deadline(0.3):
            with lk.stage("retrieval", budget=5.0):
                pass
            with lk.stage("model"), lk.stage("tool call", budget=60.0):
                await anyio.sleep(30)

    with pytest.raises(lk.DeadlineExceeded) as info:
        await turn()
    error = info.value
    assert error.budget == pytest.approx(0.3)  # the turn's deadline
    assert error.stage == "tool call"
    assert error.ledger is not None
    assert [(r.name, r.outcome, r.parent) for r in error.ledger] == [
        ("retrieval", "ok", None),
        ("tool call", "overran", "model"),
        ("model", "overran", None),
    ]


async def test_a_stage_that_overran_and_was_handled_is_not_blamed_for_the_turn() -> None:
    handled: list[str | None] = []

    async def turn() -> None:
        with lk.deadline(0.5):
            try:
                with lk.stage("cache lookup", budget=0.05):
                    await anyio.sleep(30)
            except lk.DeadlineExceeded as error:
                handled.append(error.stage)
            await anyio.sleep(30)  # outside any stage

    with pytest.raises(lk.DeadlineExceeded) as info:
        await turn()
    assert handled == ["cache lookup"]
    assert info.value.stage is None
    assert info.value.ledger is not None and info.value.ledger["cache lookup"].overran


async def test_stage_outcomes_error_and_cancelled() -> None:
    with lk.deadline(10.0) as turn:
        with pytest.raises(KeyError), lk.stage("parse"):
            raise KeyError("x")
        with anyio.CancelScope() as outside:
            with lk.stage("wait", budget=5.0):
                outside.cancel()
                await anyio.sleep(30)
    assert turn.ledger is not None
    assert [(r.name, r.outcome) for r in turn.ledger] == [("parse", "error"), ("wait", "cancelled")]


async def test_a_stage_outside_any_deadline_is_a_turn_of_its_own() -> None:
    async with lk.stage("alone", budget=0.05) as alone:
        assert lk.ledger() is alone.ledger
        assert alone.ledger.budget == pytest.approx(0.05, abs=1e-3)
    with lk.stage("unbounded") as unbounded:
        assert unbounded.allowed is None and unbounded.remaining() == math.inf
    assert unbounded.record is not None and unbounded.record.lent == 0.0
    with pytest.raises(lk.DeadlineExceeded) as info:
        async with lk.stage("alone", budget=0.05):
            await anyio.sleep(30)
    assert info.value.stage == "alone"


async def test_the_decorator_form_runs_each_call_as_a_stage() -> None:
    @lk.stage("rerank", budget=0.2)
    async def rerank(items: list[int], pause: float) -> list[int]:
        await anyio.sleep(pause)
        return sorted(items)

    with lk.deadline(10.0) as turn:
        assert await rerank([3, 1, 2], 0) == [1, 2, 3]
        with pytest.raises(lk.DeadlineExceeded) as info:
            await rerank([1], 30)
    assert info.value.stage == "rerank"
    assert turn.ledger is not None
    assert [r.outcome for r in turn.ledger] == ["ok", "overran"]
    assert rerank.__name__ == "rerank"


async def test_one_stage_object_serves_concurrent_tasks() -> None:
    retrieval = lk.stage("retrieval", budget=5.0)

    async def fetch(pause: float) -> None:
        with retrieval:
            await anyio.sleep(pause)

    with lk.deadline(10.0) as turn:
        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch, 0.05)
            tg.start_soon(fetch, 0.01)
    assert turn.ledger is not None
    assert [r.name for r in turn.ledger] == ["retrieval", "retrieval"]
    assert turn.ledger.running == ()


async def test_stages_inside_a_decorated_call_share_its_ledger() -> None:
    seen: list[lk.events.Event] = []

    @lk.deadline(10.0)
    async def answer() -> tuple[str, ...]:
        with lk.stage("retrieval"):
            pass
        with lk.stage("model"):
            ledger = lk.ledger()
            assert ledger is not None and ledger.running == ("model",)
        return tuple(r.name for r in ledger)

    with lk.subscribe(seen.append):
        assert await answer() == ("retrieval", "model")
    [ended] = [e for e in seen if isinstance(e, lk.events.TurnEnded)]
    assert [r.name for r in ended.ledger] == ["retrieval", "model"]
    started = [e for e in seen if isinstance(e, lk.events.StageStarted)]
    stage_ends = [e for e in seen if isinstance(e, lk.events.StageEnded)]
    assert [e.name for e in started] == ["retrieval", "model"]
    assert [e.record.name for e in stage_ends] == ["retrieval", "model"]
    call_id = next(e.call_id for e in seen if isinstance(e, lk.events.CallStarted))
    assert {e.parent_id for e in started} == {call_id}


async def test_events_of_an_overrun() -> None:
    seen: list[lk.events.Event] = []

    async def turn() -> None:
        with lk.deadline(5.0), lk.stage("slow", budget=0.05):
            await anyio.sleep(30)

    with lk.subscribe(seen.append), pytest.raises(lk.DeadlineExceeded):
        await turn()
    names = [type(e).__name__ for e in seen]
    assert names == ["StageStarted", "StageEnded", "DeadlineExpired", "TurnEnded"]
    expired = next(e for e in seen if isinstance(e, lk.events.DeadlineExpired))
    assert expired.stage == "slow"
    turn_ended = seen[-1]
    assert isinstance(turn_ended, lk.events.TurnEnded)
    assert [r.outcome for r in turn_ended.ledger] == ["overran"]  # complete when emitted


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with telemetry.instrument(tracer_provider=provider):
        yield exporter


async def test_each_stage_is_a_span_and_the_calls_inside_are_its_children(
    fake: FakeProvider, spans: InMemorySpanExporter
) -> None:
    llm = make_llm(fake)

    async def turn() -> None:
        with lk.deadline(10.0):
            async with lk.stage("model", budget=5.0):
                await llm.acompletion(messages=MESSAGES)
            with lk.stage("tools", budget=0.05):
                await anyio.sleep(30)

    with pytest.raises(lk.DeadlineExceeded):
        await turn()
    finished = {s.name: s for s in spans.get_finished_spans()}
    model, tools, call = finished["stage model"], finished["stage tools"], finished["chat primary"]
    assert call.parent is not None and call.parent.span_id == model.context.span_id
    model_attributes: dict[str, Any] = dict(model.attributes or {})
    assert 0 < model_attributes.pop("latencykit.stage.spent") < 5.0
    assert model_attributes == {
        "latencykit.stage.name": "model",
        "latencykit.stage.budget": 5.0,
        "latencykit.stage.allowed": pytest.approx(5.0, abs=0.01),
        "latencykit.stage.outcome": "ok",
        "latencykit.stage.overran": False,
        "latencykit.stage.attempts": 1,
    }
    tools_attributes = dict(tools.attributes or {})
    assert tools_attributes["latencykit.stage.outcome"] == "overran"
    assert tools_attributes["latencykit.stage.overran"] is True
    assert not tools.status.is_ok


async def test_bad_stage_options_fail_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"stage\.name"):
        lk.stage("")
    with pytest.raises(TypeError, match=r"stage\.name"):
        lk.stage(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"stage\.budget"):
        lk.stage("x", budget=-1)
    with pytest.raises(TypeError, match=r"stage\.budget"):
        lk.stage("x", budget="1s")  # type: ignore[arg-type]
