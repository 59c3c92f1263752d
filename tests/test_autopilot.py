"""The SLO autopilot (latencykit.autopilot): the objective's validation, the pure tuner's steps
and hysteresis, the replay check, runs on virtual time from a bad setting, its events, stats
and span, and its loop's life on both backends."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import latencykit as lk
from helpers import MESSAGES, make_llm, read_all, until
from latencykit import autopilot, events
from latencykit.autopilot import SLO, Measured, Setting, propose
from latencykit.lab.replay import TraceRecord
from latencykit.lab.tune import autopilot_run
from latencykit.testing import Behavior, FakeProvider

# --- the objective ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, "SLO.ttft_p99 or SLO.total_p99"),
        ({"ttft_p99": -1}, "SLO.ttft_p99"),
        ({"total_p99": float("nan")}, "SLO.total_p99"),
        ({"ttft_p99": 1, "max_extra_load": 1.5}, "SLO.max_extra_load"),
        ({"ttft_p99": 1, "max_extra_load": -0.1}, "SLO.max_extra_load"),
        ({"ttft_p99": 1, "every": 0}, "SLO.every"),
        ({"ttft_p99": 1, "window": -5}, "SLO.window"),
    ],
)
def test_an_invalid_slo_fails_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SLO(**options)


def test_an_llm_refuses_an_slo_that_is_not_one() -> None:
    with pytest.raises(TypeError, match=r"LLM\.slo"):
        lk.LLM("openai/m", slo={"ttft_p99": 1.0})  # type: ignore[arg-type]


def test_the_slo_comes_from_a_config() -> None:
    from latencykit.config import LLMConfig

    llm = LLMConfig.model_validate({"model": "openai/m", "slo": {"ttft_p99": 2}}).build()
    assert llm.autopilot is not None and llm.autopilot.slo == SLO(ttft_p99=2.0)
    assert llm.to_config()["slo"] == {"ttft_p99": 2.0}


def test_without_an_slo_there_is_no_autopilot() -> None:
    llm = lk.LLM("openai/m")
    assert llm.autopilot is None
    assert llm._recorder.on_record is None
    assert llm._guard.tuned is None


# --- the tuner (pure) ---------------------------------------------------------------------------

SLO2 = SLO(ttft_p99=2.0, max_extra_load=0.05)
MISSED = Measured(samples=500, ttft_p99=8.0, gap_p99=0.1, predicted={"ttft_p99": 9.0, "extra": 0})
BAD = Setting(hedge_quantile=None, first_token=30.0, stall=2.0)


def test_no_step_before_enough_samples() -> None:
    assert propose(SLO2, BAD, MISSED._replace(samples=10), streaming=True) == []


def test_a_missed_slo_turns_hedging_on_and_halves_the_first_token_limit() -> None:
    steps = {name: new for name, new, _ in propose(SLO2, BAD, MISSED, streaming=True)}
    # One rung (no hedge -> the 99th percentile), and half the limit: small steps.
    assert steps == {"hedge_quantile": 0.99, "first_token": 15.0}


def test_the_hedge_goes_no_lower_than_the_budget_allows() -> None:
    at_budget = BAD._replace(hedge_quantile=0.95, first_token=2.0)
    assert propose(SLO2, at_budget, MISSED, streaming=True) == []
    # With a budget of 10 %, the next rung.
    steps = propose(SLO(ttft_p99=2.0, max_extra_load=0.1), at_budget, MISSED, streaming=True)
    assert [(name, new) for name, new, _ in steps] == [("hedge_quantile", 0.94)]


def test_no_tightening_once_the_predicted_extra_load_is_at_the_budget() -> None:
    spent = MISSED._replace(predicted={"ttft_p99": 9.0, "extra": 0.05})
    steps = propose(SLO2, BAD._replace(hedge_quantile=0.99), spent, streaming=True)
    assert "hedge_quantile" not in {name for name, _, _ in steps}


def test_hysteresis_holds_a_setting_inside_the_band() -> None:
    met = Measured(samples=500, ttft_p99=0.6, gap_p99=0.1, predicted={"ttft_p99": 1.8})
    # p99 under the SLO but above 75 % of it: the hedge stays; the limit is within 25 % of
    # its goal (3 x 0.6 = 1.8): it stays.
    assert propose(SLO2, Setting(0.97, 1.9, 2.0), met, streaming=True) == []
    # Well under: the hedge loosens by one rung.
    easy = met._replace(predicted={"ttft_p99": 1.0})
    assert [(n, v) for n, v, _ in propose(SLO2, Setting(0.97, 1.9, 2.0), easy, streaming=True)] == [
        ("hedge_quantile", 0.98)
    ]
    top = [(n, v) for n, v, _ in propose(SLO2, Setting(0.99, 1.9, 2.0), easy, streaming=True)]
    assert top == [("hedge_quantile", None)]


def test_limits_stay_within_the_slo_and_above_their_floors() -> None:
    slow = Measured(samples=500, ttft_p99=5.0, gap_p99=3.0, predicted={"ttft_p99": 1.0})
    setting = Setting(None, 4.0, 10.0)
    steps = {
        n: v for n, v, _ in propose(SLO(ttft_p99=2.0, total_p99=6.0), setting, slow, streaming=True)
    }
    assert steps == {"first_token": 2.0, "stall": 6.0}  # bounded by ttft_p99 and total_p99
    fast = Measured(samples=500, ttft_p99=0.01, gap_p99=0.01, predicted={"ttft_p99": 1.0})
    steps = {n: v for n, v, _ in propose(SLO2, Setting(None, 1.6, 3.5), fast, streaming=True)}
    assert steps == {"first_token": 1.0, "stall": 2.0}  # the floors


def test_the_slow_call_threshold_follows_the_latency_within_total_p99() -> None:
    slo = SLO(total_p99=10.0)
    measured = Measured(samples=500, latency_p99=1.0, predicted={"total_p99": 5.0})
    steps = propose(slo, Setting(slow_call_duration=60.0), measured, streaming=False)
    assert [(n, v) for n, v, _ in steps] == [("slow_call_duration", 30.0)]  # halved, toward 3 s
    steps = propose(slo, Setting(slow_call_duration=None), measured, streaming=False)
    assert steps == []  # no breaker: nothing to set


def test_a_refusal_says_why() -> None:
    pilot = make_pilot(SLO2)
    met = {"ttft_p99": 1.5, "extra": 0.01, "failed": 0.0}
    missed = {"ttft_p99": 3.0, "extra": 0.01, "failed": 0.0}

    def refusal(before: dict[str, float], **after: float) -> str | None:
        return pilot._refusal(before, {"extra": 0.0, "failed": 0.0, **after}, True)

    assert refusal(missed, ttft_p99=2.5, extra=0.02) is None  # closer
    assert refusal(met, ttft_p99=1.8) is None
    assert "over the budget" in str(refusal(met, ttft_p99=1.0, extra=0.08))
    assert "miss the SLO" in str(refusal(met, ttft_p99=2.5))
    assert "move away" in str(refusal(missed, ttft_p99=float("inf")))
    assert "fail more calls" in str(refusal(missed, ttft_p99=2.0, failed=0.02))


def test_a_slow_call_threshold_that_would_open_a_healthy_targets_breaker_is_refused() -> None:
    # Recent attempts: 60 % take 1 s, 40 % take 2.5 s, none fails. The breaker opens when half
    # of 10+ calls in its 20-call window are slow: a threshold of 2 s leaves it closed (40 %
    # slow), one of 0.8 s would open it on a healthy target.
    llm = lk.LLM(
        "openai/breaker-check",
        slo=SLO(total_p99=10.0),
        breaker={"window_size": 20, "minimum_calls": 10, "slow_call_rate": 0.5},
    )
    pilot = llm.autopilot
    assert pilot is not None
    seen = [
        autopilot._Seen(float(i), lk.Attempt(1, "openai/breaker-check", 0.0, d, "ok"))
        for i, d in enumerate([1.0, 1.0, 2.5, 1.0, 2.5] * 10)
    ]
    assert pilot._breaker_refusal("openai/breaker-check", seen, 60.0, 2.0) is None
    refused = pilot._breaker_refusal("openai/breaker-check", seen, 60.0, 0.8)
    assert refused is not None and "breaker would open" in refused
    # A threshold that opens it already is no reason to refuse one that opens it too.
    assert pilot._breaker_refusal("openai/breaker-check", seen, 0.9, 0.8) is None
    # Calls cut short (a hedge's losers) are not the breaker's: all slow, still closed.
    cut = [s._replace(attempt=s.attempt._replace(outcome="cancelled")) for s in seen]
    assert pilot._breaker_refusal("openai/breaker-check", cut, 60.0, 0.8) is None


def make_pilot(slo: SLO) -> autopilot.Autopilot:
    llm = lk.LLM("openai/m", slo=slo)
    assert llm.autopilot is not None
    return llm.autopilot


# --- runs on virtual time -----------------------------------------------------------------------


def heavy_tail(n: int = 600, seed: int = 3, target: str = "m") -> list[TraceRecord]:
    """Times to first token around 0.3-0.6 s, 4 % of them 5-20 s; answers 1 s after."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        ttft = rng.uniform(5.0, 20.0) if rng.random() < 0.04 else rng.uniform(0.3, 0.6)
        records.append(TraceRecord(target, ttft, ttft + 1.0))
    return records


@pytest.mark.slow
def test_from_a_bad_setting_the_autopilot_meets_the_slo_within_its_budget() -> None:
    seen: list[events.Event] = []
    slo = SLO(ttft_p99=2.0, max_extra_load=0.05, every=60.0)
    with lk.subscribe(seen.append):
        run = autopilot_run(heavy_tail(), slo, minutes=10, rate=4.0, seed=1)
    assert run.minutes[0].ttft_p99 is not None and run.minutes[0].ttft_p99 > 2.0  # the start
    assert run.setting.hedge_quantile is not None  # hedging turned on
    assert run.setting.first_token is not None and run.setting.first_token < 30.0
    assert run.reached is not None and run.reached <= 10
    assert run.extra <= slo.max_extra_load
    assert run.monotone
    # Explained: an event per step, with the measurements behind it.
    changed = [e for e in seen if isinstance(e, events.AutopilotChanged)]
    assert [(e.setting, e.old, e.new, e.applied) for e in changed] == [
        (c.setting, c.old, c.new, c.applied) for c in run.history
    ]
    first = changed[0]
    assert first.target == "m" and first.reason
    assert {"samples", "ttft_p99", "before_ttft_p99", "after_ttft_p99"} <= first.measurements.keys()
    # Deterministic for a seed.
    again = autopilot_run(heavy_tail(), slo, minutes=10, rate=4.0, seed=1)
    assert again.report() == run.report()


@pytest.mark.slow
def test_a_step_the_replay_refuses_is_not_applied() -> None:
    # No hedge budget: only the first-token limit can move. Halving it from 30 s is harmless
    # until it cuts the slow 5 s answers (then 10 % of calls would fail): the replay refuses
    # that step, so the limit stays above 5 s.
    rng = random.Random(5)
    records = [
        TraceRecord("m", ttft, ttft + 0.5)
        for ttft in (5.0 if rng.random() < 0.1 else rng.uniform(0.2, 0.4) for _ in range(400))
    ]
    slo = SLO(ttft_p99=1.0, max_extra_load=0.0, every=60.0)
    run = autopilot_run(records, slo, minutes=8, rate=3.0, seed=2)
    applied = [c.new for c in run.history if c.applied and c.setting == "first_token"]
    refused = [c for c in run.history if not c.applied]
    assert applied == [15.0, 7.5]
    assert refused and all(c.new == 3.75 and "refused" in c.reason for c in refused)
    assert run.setting.first_token == 7.5
    assert all(m.requests and m.ttft_p99 is not None and m.ttft_p99 < 6.0 for m in run.minutes[2:])


@pytest.mark.slow
def test_stats_and_spans_explain_the_settings() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    slo = SLO(ttft_p99=2.0, max_extra_load=0.05, every=60.0)
    with lk.telemetry.instrument(tracer_provider=provider):
        run = autopilot_run(heavy_tail(), slo, minutes=4, rate=4.0, seed=1)
    applied = [c for c in run.history if c.applied]
    assert applied
    found = [s for s in spans.get_finished_spans() if s.name == "latencykit autopilot"]
    assert len(found) == len(run.history)
    event = found[0].events[0]
    assert event.name == "latencykit.autopilot.changed"
    attributes = dict(event.attributes or {})
    assert attributes["latencykit.target"] == "m"
    assert attributes["latencykit.autopilot.setting"] == run.history[0].setting
    assert "latencykit.autopilot.before_ttft_p99" in attributes


# --- on a live LLM, both backends ----------------------------------------------------------------


@pytest.mark.anyio
async def test_stats_show_the_settings_and_their_sources(fake: FakeProvider) -> None:
    fake.script("quick", Behavior(ttft=0.01, output_tokens=3))
    llm = make_llm(fake, "quick", transport="openai", slo=SLO(ttft_p99=2.0))
    async with llm:
        await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
        assert llm.autopilot is not None
        key = llm.targets[0].key
        row = llm.stats()[key]
        assert row.sources == {
            "hedge_quantile": "off",
            "first_token": "timeout",
            "stall": "timeout",
            "slow_call_duration": "off",
        }
        llm.autopilot._apply(key, "first_token", 1.5)
        llm.autopilot._apply(key, "hedge_quantile", 0.97)
        row = llm.stats()[key]
        assert (row.first_token_limit, row.hedge_quantile) == (1.5, 0.97)
        assert row.sources["first_token"] == row.sources["hedge_quantile"] == "slo"
        assert "hq,ft" in str(llm.stats())
        # The calls use them: the hedge's delay is now its 97th percentile.
        assert llm.hedge is not None and llm.hedge.max_attempts == 2
        assert llm._guard.limits(llm.targets[0])[0] == 1.5


@pytest.mark.anyio
async def test_a_round_on_a_live_llm_replays_its_recent_attempts(fake: FakeProvider) -> None:
    fake.script("quick", Behavior(ttft=0.01, output_tokens=3))
    slo = SLO(ttft_p99=0.001, max_extra_load=0.05)  # unreachable: it must try to tighten
    llm = make_llm(
        fake, "quick", transport="openai", slo=slo, stream_guard=lk.StreamGuard(first_token=30)
    )
    async with llm:
        for _ in range(autopilot.MIN_SAMPLES):
            await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
        assert llm.autopilot is not None
        seen: list[events.Event] = []
        with lk.subscribe(seen.append):
            changes = await llm.autopilot.step()
    # The replays made hundreds of calls: none of their events reached the subscriber.
    assert seen and all(isinstance(e, events.AutopilotChanged) for e in seen)
    key = llm.targets[0].key
    assert [(c.target, c.setting, c.old, c.new) for c in changes][:1] == [
        (key, "hedge_quantile", None, 0.99)
    ]
    assert llm.autopilot.history == changes
    assert llm.autopilot.forecasts and llm.autopilot.forecasts[0][1] == key


@pytest.mark.anyio
async def test_the_loop_runs_every_interval_and_stops_on_aclose(fake: FakeProvider) -> None:
    fake.script("quick", Behavior(ttft=0.01, output_tokens=3))
    llm = make_llm(fake, "quick", transport="openai", slo=SLO(ttft_p99=2.0, every=0.01))
    pilot = llm.autopilot
    assert pilot is not None
    await read_all(await llm.acompletion(messages=MESSAGES, stream=True))  # starts the loop
    await until(lambda: pilot.rounds >= 3)
    await llm.aclose()
    assert pilot._done is not None and pilot._done.is_set()  # the task ended: no leak
    rounds = pilot.rounds
    await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    import anyio

    await anyio.sleep(0.1)
    assert pilot.rounds == rounds  # no loop after aclose
    await llm.aclose()


# --- lab tune --slo ------------------------------------------------------------------------------


@pytest.mark.slow
def test_lab_tune_with_an_slo_prints_the_run_and_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from latencykit.__main__ import main

    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"target": r.target, "ttft": r.ttft, "duration": r.duration}) + "\n"
            for r in heavy_tail()
        )
    )
    argv = ["lab", "tune", str(trace), "--slo", "ttft_p99=2,every=60", "--minutes", "4"]
    assert main([*argv, "--rate", "4"]) == 0
    out = capsys.readouterr().out
    assert "ttft_p99 2s, max extra load 5%" in out
    assert "applied hedge_quantile off -> 0.99" in out
    assert 'recommended: {"stream_guard": {"first_token":' in out
    assert main(["lab", "tune", str(trace), "--slo", "ttft_p99=2,max_extra=0.1"]) == 2
    assert "--slo: expected name=value with a name among ttft_p99" in capsys.readouterr().err
    assert main(["lab", "tune", str(trace), "--slo", "max_extra_load=0.1"]) == 2
    assert "SLO.ttft_p99 or SLO.total_p99" in capsys.readouterr().err
    assert main(["lab", "tune", str(trace)]) == 2
    assert "give --param and --values (a sweep), or --slo" in capsys.readouterr().err


def test_replays_never_write_to_the_fleets_windows() -> None:
    # The autopilot's replays (and the lab's) are simulations: with a process default store,
    # their samples must not join the fleet's latency windows.
    class Watched(lk.RedisStore):
        def latency(self, key: str, *, window: float) -> Any:
            raise AssertionError(f"a replay asked the store for {key!r}")

    from latencykit.lab.replay import replay

    previous = lk.use_store(Watched("redis://127.0.0.1:1"))
    try:
        row = replay(heavy_tail(100), {"model": "m", "hedge": {"delay": {"q": 0.9}}}, rate=2.0)
    finally:
        lk.use_store(previous)
    assert row.requests == 100 and row.errors == 0
