"""Trace replay and what-if tuning on virtual time (latencykit.lab.replay / .tune)."""

from __future__ import annotations

import csv
import json
import random
import time
from pathlib import Path

import anyio
import pytest

import latencykit as lk
from latencykit.lab import virtual
from latencykit.lab.replay import TraceRecord, load_trace, replay, replay_rows
from latencykit.lab.tune import tune, with_value
from latencykit.policies.breaker import reset_breakers


def write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def bimodal(path: Path, n: int = 2000, seed: int = 7) -> Path:
    """95 % of requests take 50-150 ms, 5 % take 10 s: the tail hedging is for."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for i in range(n):
        slow = rng.random() < 0.05
        e2e = 10.0 if slow else rng.uniform(0.05, 0.15)
        rows.append({"target": "m", "ttft_s": e2e / 2, "e2e_s": e2e, "error": "", "at_s": i * 0.5})
    return write_trace(path, rows)


def test_the_virtual_loop_jumps_over_waits() -> None:
    async def main() -> float:
        with lk.deadline(3600):
            await anyio.sleep(1800)
        return anyio.current_time()

    started = time.monotonic()
    assert virtual.run(main) == pytest.approx(1800)
    assert time.monotonic() - started < 10  # not half an hour


def test_same_trace_and_seed_give_the_same_report_byte_for_byte(tmp_path: Path) -> None:
    trace = bimodal(tmp_path / "t.csv", n=400)
    first = replay_rows(trace, seed=3).report()
    reset_breakers()
    assert replay_rows(trace, seed=3).report() == first
    assert "bare" in first and "default" in first


def test_an_hour_of_recorded_traffic_replays_at_its_times(tmp_path: Path) -> None:
    trace = bimodal(tmp_path / "hour.csv", n=7200)  # one request every 0.5 s: an hour
    row = replay(load_trace(trace), {"model": "m"}, name="bare")
    assert row.requests == 7200 and row.extra == 0.0
    assert row.p99 == pytest.approx(10.0)  # bare: the slow mode is the tail
    assert 0.05 <= row.p50 <= 0.15


def test_hedging_cuts_the_tail_it_was_tuned_for(tmp_path: Path) -> None:
    records = load_trace(bimodal(tmp_path / "t.csv"))
    bare = replay(records, {"model": "m"}, name="bare")
    hedged = replay(
        records,
        {"model": "m", "hedge": {"delay": {"q": 0.85}, "max_extra_load": 0.5}},
        name="hedged",
    )
    assert bare.p99 == pytest.approx(10.0)
    assert hedged.p99 < 1.0 < bare.p99
    assert 0.1 < hedged.extra < 0.3  # the slow 5 % and the fast requests past the delay


def test_the_tuner_recommends_the_cheapest_setting_meeting_the_target(tmp_path: Path) -> None:
    trace = bimodal(tmp_path / "t.csv")
    result = tune(
        trace,
        "hedge.delay.q",
        [0.5, 0.7, 0.85, 0.97, 0.99],
        policy={"model": "m", "hedge": {"delay": {"q": 0.9}, "max_extra_load": 0.6}},
        p99=1.0,
    )
    by_name = {row.name: row for row in result.rows}
    # Below the slow mode's 5 %, the delay sits in the fast mode: the tail is hedged, and a
    # higher quantile hedges fewer fast requests. At 0.97 and 0.99 the delay is 10 s: useless.
    assert by_name["hedge.delay.q=0.97"].p99 > 1.0
    assert by_name["hedge.delay.q=0.99"].p99 > 1.0
    assert result.recommended is not None
    assert result.recommended.name == "hedge.delay.q=0.85"
    extras = [by_name[f"hedge.delay.q={q}"].extra for q in (0.5, 0.7, 0.85)]
    assert extras == sorted(extras, reverse=True)
    assert "hedge.delay.q=0.85" in result.frontier
    assert "recommended: hedge.delay.q=0.85" in result.report()


def test_errors_replay_and_retries_absorb_them(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {
            "target": "m",
            "ttft_s": 0.1,
            "e2e_s": 0.2,
            "error": "429:slow down" if i % 5 == 0 else "",
            "at_s": i,
        }
        for i in range(200)
    ]
    records = load_trace(write_trace(tmp_path / "e.csv", rows))
    bare = replay(records, {"model": "m"}, name="bare")
    assert bare.errors == 40
    retried = replay(
        records, {"model": "m", "retry": {"max_attempts": 3, "initial": 0.01}}, name="retry"
    )
    assert retried.errors < 10 and retried.extra > 0


def test_trace_formats(tmp_path: Path) -> None:
    llmperf = write_trace(
        tmp_path / "llmperf.csv",
        [
            {"provider": "p", "model_size": "7b", "ttft_s": 0.1, "e2e_s": 0.5, "error": ""},
            {"provider": "p", "model_size": "7b", "ttft_s": 0.1, "e2e_s": 0.4, "error": "429:x"},
            {"provider": "p", "model_size": "7b", "ttft_s": 0.1, "e2e_s": 0.3, "error": "-100:y"},
        ],
    )
    assert [(r.target, r.error) for r in load_trace(llmperf)] == [
        ("p/7b", None),
        ("p/7b", "429"),
        ("p/7b", None),
    ]
    lines = tmp_path / "t.jsonl"
    lines.write_text(json.dumps({"target": "m", "duration": 1.5, "at": 2.0}) + "\n")
    assert load_trace(lines) == [TraceRecord("m", 1.5, 1.5, None, 2.0)]
    bad = write_trace(tmp_path / "bad.csv", [{"target": "m", "ttft_s": "x", "e2e_s": 1}])
    with pytest.raises(ValueError, match=r"bad\.csv:2 ttft_s"):
        load_trace(bad)


def test_missing_targets_and_arrivals_are_clear_errors(tmp_path: Path) -> None:
    records = load_trace(bimodal(tmp_path / "t.csv", n=20))
    with pytest.raises(ValueError, match=r"no samples of \['other'\]"):
        replay(records, {"model": "m", "failover": ["other"]})
    no_times = [TraceRecord("m", 0.1, 0.2)]
    with pytest.raises(ValueError, match="give a rate"):
        replay(no_times, {"model": "m"})
    assert replay(no_times, {"model": "m"}, rate=1.0).requests == 1


def test_with_value_sets_a_dotted_path() -> None:
    base = {"model": "m", "hedge": {"delay": 0.5}}
    assert with_value(base, "hedge.delay.q", 0.9) == {"model": "m", "hedge": {"delay": {"q": 0.9}}}
    assert base == {"model": "m", "hedge": {"delay": 0.5}}  # a copy


def test_a_slow_call_log_is_a_trace(tmp_path: Path) -> None:
    import logging

    from latencykit.slow_calls import log_slow_calls

    lines: list[str] = []

    class JsonLines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            fields = record.latencykit  # type: ignore[attr-defined]
            lines.append(json.dumps({"created": record.created, "latencykit": fields}))

    logger = logging.getLogger("test_replay.slow_calls")
    logger.addHandler(JsonLines())
    logger.propagate = False

    starts: list[int] = []

    @lk.hedge(0.05)
    async def slow_then_fast() -> str:
        starts.append(1)
        await anyio.sleep(0.3 if len(starts) == 1 else 0.01)  # the backup answers first
        return "ok"

    with log_slow_calls(threshold=0.0, logger=logger):
        anyio.run(slow_then_fast)
    path = tmp_path / "slow.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = load_trace(path)
    assert len(records) == 1  # the hedge that answered; the cancelled primary says too little
    assert records[0].error is None and 0.0 < records[0].duration < 0.3
    assert records[0].at is not None


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from latencykit.__main__ import main

    trace = bimodal(tmp_path / "t.csv", n=1000)
    policy = tmp_path / "policy.yaml"
    policy.write_text("model: m\nhedge: {delay: {q: 0.85, min_samples: 5}, max_extra_load: 0.5}\n")
    assert main(["lab", "replay", str(trace), "--policy", str(policy), "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "bare" in out and "policy" in out and "p99 s" in out
    assert main(["lab", "replay", str(trace), "--plot", str(tmp_path / "cdf.png")]) == 0
    assert (tmp_path / "cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    argv = ["lab", "tune", str(trace), "--policy", str(policy), "--param", "hedge.delay.q"]
    assert main([*argv, "--values", "0.85,0.99", "--p99", "1.0"]) == 0
    assert "recommended: hedge.delay.q=0.85" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: m\nhedge: {delay: 1, max_extra_lod: 0.1}\n")
    assert main(["lab", "replay", str(trace), "--policy", str(bad)]) == 2
    assert "hedge.max_extra_lod" in capsys.readouterr().err


def stalling_first_token(path: Path, n: int = 1000, seed: int = 11) -> Path:
    """95 % of streams start within 50-150 ms, 5 % stall 8 s before their first token; every
    stream then takes 1 s to its end and produces 100 tokens."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for i in range(n):
        ttft = 8.0 if rng.random() < 0.05 else rng.uniform(0.05, 0.15)
        rows.append(
            {"target": "m", "ttft_s": ttft, "e2e_s": ttft + 1.0, "output_tokens": 100, "at_s": i}
        )
    return write_trace(path, rows)


def test_streams_replay_and_the_first_token_limit_is_tuned(tmp_path: Path) -> None:
    trace = stalling_first_token(tmp_path / "s.csv")
    # Retries on the same target take timeouts only when asked (on=).
    base = {"model": "m", "retry": {"max_attempts": 3, "initial": 0.01, "on": ["timeout"]}}
    result = tune(
        trace,
        "stream_guard.first_token",
        [0.2, 0.5, 2.0, 10.0],
        policy=base,
        p99=2.0,
        stream=True,
    )
    rows = {row.name: row for row in result.rows}
    unguarded = rows["stream_guard.first_token=10.0"]
    assert unguarded.ttft_p99 is not None and unguarded.ttft_p99 >= 8.0
    assert unguarded.extra == 0.0
    cut = rows["stream_guard.first_token=0.2"]
    assert cut.ttft_p99 is not None and cut.ttft_p99 < 0.5 and cut.p99 < 2.0
    assert 0.03 < cut.extra < 0.08  # the stalled 5 % retried, once each (mostly)
    assert rows["stream_guard.first_token=2.0"].p99 > 2.0
    assert result.recommended is not None
    assert result.recommended.name == "stream_guard.first_token=0.2"  # same cost, lower p99
    assert "ttft p99" in result.report()


def test_abandoned_attempts_count_their_tokens(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = []
    rng = random.Random(5)
    for i in range(400):
        e2e = 6.0 if rng.random() < 0.04 else 1.0
        rows.append(
            {"target": "m", "ttft_s": 0.1, "e2e_s": e2e, "output_tokens": 100, "at_s": i * 2.0}
        )
    records = load_trace(write_trace(tmp_path / "w.csv", rows))
    bare = replay(records, {"model": "m"}, name="bare")
    hedged = replay(
        records, {"model": "m", "hedge": {"delay": 1.5, "max_extra_load": 0.5}}, name="hedged"
    )
    assert bare.wasted_tokens == 0.0
    assert hedged.wasted_tokens > 0.0 and hedged.p99 < bare.p99
    assert records[0].tokens_by(0.05) == 0 and records[0].tokens_by(100.0) == 100


def light_tail_with_hangs(path: Path, n: int = 200) -> Path:
    """Requests of 1.0-1.2 s, one every 0.5 s, but 3 of them, after the warm-up and before
    the first one ends, hang 100 s: bare p99 is a hang, and no call before them was slow."""
    rng = random.Random(3)
    rows: list[dict[str, object]] = []
    for i in range(n):
        e2e = 100.0 if i in (40, 70, 100) else rng.uniform(1.0, 1.2)
        rows.append({"target": "m", "ttft_s": 0.5, "e2e_s": e2e, "at_s": i * 0.5})
    return write_trace(path, rows)


def test_the_tuner_shows_hedging_cut_a_hang_on_a_light_tail(tmp_path: Path) -> None:
    trace = light_tail_with_hangs(tmp_path / "hangs.csv")
    policy = {"model": "m", "hedge": {"delay": {"q": 0.9}, "max_extra_load": 0.1}}
    result = tune(trace, "hedge.delay.q", [0.5, 0.9, 0.99], policy=policy, p99=5.0)
    assert result.bare is not None and result.bare.p99 == pytest.approx(100.0)
    for row in result.rows:
        # Each hang is hedged once it outlasts the quantile plus the fastest request
        # (<= 2.4 s), and the backup answers 1.0-1.2 s later.
        assert row.p99 < 4.0, row
    assert result.rows[-1].extra < 0.05  # q=0.99: hardly more than the hangs' backups
    assert result.recommended is not None
    report = result.report().splitlines()
    assert report[2].startswith("bare") and "100.000" in report[2]
