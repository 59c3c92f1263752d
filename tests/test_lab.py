"""The latency lab end to end (small workload), and its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latencykit.__main__ import main as latencykit_main
from latencykit.lab import LabConfig, run_lab
from latencykit.lab.outage import OutageResult
from latencykit.lab.report import format_stats, format_table, percentile
from latencykit.lab.streaming import format_streaming


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_lab_bounds_the_tail_the_bare_row_does_not() -> None:
    # replicate/70b has a heavy body and tail (e2e p90 23 s): at x0.02 most tails exceed 0.3 s.
    config = LabConfig(
        run="replicate/70b",
        scale=0.02,
        requests=80,
        concurrency=10,
        deadline=0.6,
        degrade_after=0.3,
        outage=False,
        turn=False,
        fast_lane=False,
        streaming=False,
    )
    result = run_lab(config, progress=None)
    bare, guarded, hedged = result.rows
    assert bare.key == "bare" and guarded.key == "deadline+degrade"
    assert bare.requests == guarded.requests == 80
    assert bare.errors == 0 and guarded.errors == 0
    assert bare.max > config.deadline  # the tail is there...
    assert guarded.max < bare.max  # ...and the policies cut it
    assert guarded.p99 <= config.deadline + 0.3  # bounded by the deadline (margin: loaded CI)
    assert guarded.degraded > 0
    assert bare.upstream_requests == 80 and bare.extra_load_pct == 0.0
    assert guarded.upstream_requests == 80 + guarded.degraded
    assert hedged.key == "hedge" and hedged.errors == 0
    assert 0 < hedged.hedges_won <= hedged.upstream_requests - 80
    assert hedged.upstream_requests > 80  # it hedged...
    # ...within the budget: 0.1 per call (the 30 warm-up calls included) plus the default
    # reserve of one hedge per second over the 10 s window.
    assert hedged.upstream_requests - 80 <= config.max_extra_load * (80 + 30) + 1.0 * 10
    table = format_table(result)
    assert "litellm.acompletion (bare)" in table and "lk.LLM deadline + degrade" in table
    assert json.loads(result.to_json())["rows"][1]["degraded"] == guarded.degraded
    # Each lk.LLM row's llm.stats(), taken after its row: the attempts the provider saw.
    degrade_stats, hedge_stats = result.stats
    assert degrade_stats.label == guarded.label and hedge_stats.label == hedged.label
    primary, cheap = degrade_stats.targets
    assert primary.target == "openai/lab-primary" and cheap.target == "openai/lab-degraded"
    assert cheap.ok == guarded.degraded and primary.cancelled >= guarded.degraded
    [hedged_primary] = hedge_stats.targets
    assert hedged_primary.attempts >= hedged.upstream_requests + 30  # the warm-up included
    assert hedged_primary.hedge_budget is not None
    stats = format_stats(result)
    assert "lk.LLM hedge(quantile)" in stats and "openai/lab-degraded" in stats
    assert json.loads(result.to_json())["stats"][1]["targets"][0]["ok"] == hedged_primary.ok


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_prints_the_per_target_stats(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["lab", "--rows", "hedge", "--requests", "20", "--concurrency", "5", "--scale", "0.01"]
    assert (
        latencykit_main(
            [*argv, "--no-outage", "--no-streaming", "--no-turn", "--no-fast-lane", "--json", "-"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "per-target statistics of each lk.LLM client (llm.stats()" in out
    assert "latency distribution per row (log scale" in out  # no --plot-dir: as text
    _, stats = out.split("per-target statistics", 1)
    assert "lk.LLM hedge(quantile)" in stats
    header, rule, row, *_ = stats.splitlines()[3:]
    assert header.split()[:4] == ["target", "attempts", "ok", "errors"] and set(rule) == {" ", "-"}
    target, attempts, *_ = row.split()
    assert target == "openai/lab-primary" and int(attempts) >= 30 + 20  # warm-up + requests


def test_cli_lists_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert latencykit_main(["lab", "--list-runs"]) == 0
    runs = capsys.readouterr().out.split()
    assert "together/13b" in runs and "groq/70b" in runs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deadline", "0.2", "--degrade-after", "0.3"], "degrade_after"),
        (["--requests", "0"], "requests"),
        (["--rows", "nope"], "rows"),
        (["--run", "acme/1b"], "run"),
    ],
)
def test_cli_rejects_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert latencykit_main(["lab", *args, "--json", str(tmp_path / "x.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.01) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_outage_scenario_fails_over_then_returns_to_the_primary() -> None:
    import anyio

    from latencykit.lab.outage import format_outage, run_outage
    from latencykit.lab.runner import prepare_litellm
    from latencykit.testing import FakeProvider

    prepare_litellm()

    async def scenario() -> OutageResult:
        with FakeProvider() as fake:
            return await run_outage(fake, outage=1.5, duration=4.0, clients=2)

    result = anyio.run(scenario)
    assert result.errors == 0 and result.calls > 20
    assert result.by_secondary > 0  # answered by the fallback target during the outage
    states = [(before, after) for _, before, after in result.transitions]
    assert states[0] == ("closed", "open")
    assert ("open", "half_open") in states and states[-1] == ("half_open", "closed")
    opened_at = result.transitions[0][0]
    assert opened_at < 1.5
    # Once open, the primary is left alone: far fewer requests than calls during the outage.
    assert result.primary_requests_during_outage < result.by_secondary
    assert result.timeline[-1]["secondary"] == 0  # traffic is back on the primary
    assert "breaker half_open -> closed" in format_outage(result)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_streaming_scenario_bounds_the_first_token_and_recovers_stalls() -> None:
    # together/13b's TTFT tail (p99 53 s) at x0.02: about 1 s, against a 0.3 s first-token limit.
    config = LabConfig(
        scale=0.02,
        requests=100,
        concurrency=8,
        deadline=0.6,
        degrade_after=0.3,
        rows=("bare",),
        outage=False,
        turn=False,
        fast_lane=False,
    )
    result = run_lab(config, progress=None)
    assert result.streaming is not None
    bare, guarded, hedged = result.streaming.ttft
    assert bare.requests == guarded.requests == hedged.requests == 50
    assert bare.errors == 0 and bare.max > 0.6  # the first-token tail is there...
    assert guarded.max < bare.max and guarded.p99 < 0.3 + 0.5  # ...the guard moves it on
    assert guarded.extra_load_pct > 0
    bare_stalls, guarded_stalls = result.streaming.stalls
    assert bare_stalls.hung == bare_stalls.stalled > 0  # without a guard they hang
    assert guarded_stalls.complete == guarded_stalls.streams  # every answer whole
    assert guarded_stalls.hung == guarded_stalls.failed == 0
    assert "StreamGuard" in format_streaming(result.streaming)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_turn_scenario_meets_its_p95_budget_only_with_stage_budgets_and_fan_out() -> None:
    import anyio

    from latencykit.lab.runner import prepare_litellm
    from latencykit.lab.turn import TurnResult, format_turns, run_turns
    from latencykit.testing import FakeProvider

    prepare_litellm()

    async def scenario() -> TurnResult:
        with FakeProvider(seed=3) as fake:
            return await run_turns(fake, turns=40, budget=0.6, concurrency=10, seed=3)

    result = anyio.run(scenario)
    sequential, fan_out, budgeted = result.rows
    assert sequential.turns == fan_out.turns == budgeted.turns == 40
    # One source in four is slow (0.6-1.2 s): without budgets the p95 turn waits for it.
    assert sequential.p95 > result.budget and fan_out.p95 > result.budget
    assert budgeted.p95 <= result.budget
    assert budgeted.within_budget > sequential.within_budget
    assert "meets the p95 budget: stage budgets + fan-out" in format_turns(result)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_many_streams_saturate_litellm_but_not_the_fast_lane() -> None:
    import anyio

    from latencykit.lab.fast_lane import FastLaneResult, format_fast_lane, run_fast_lane
    from latencykit.lab.runner import prepare_litellm
    from latencykit.testing import FakeProvider

    prepare_litellm()

    async def scenario() -> FastLaneResult:
        with FakeProvider() as fake:
            return await run_fast_lane(fake, streams=40, chunks=60, itl=0.01)

    result = anyio.run(scenario)
    litellm_lane, fast_lane = result.rows
    # 4,000 chunks/s asked: more than litellm's client can process, a fraction of the fast
    # lane's. litellm's gaps and first chunks wait behind the backlog.
    assert litellm_lane.gap_p99 > 2 * fast_lane.gap_p99
    assert fast_lane.chunks_per_second > litellm_lane.chunks_per_second
    assert "fast lane" in format_fast_lane(result)
