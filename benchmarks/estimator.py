"""Cost of the latency estimator behind adaptive hedging: update and quantile query.

Compares latencykit's LatencyWindow (exact quantiles over a sliding time window, a sorted list)
with two well-kept sketch libraries, when installed: ddsketch (DataDog) and hdrhistogram
(HdrHistogram's Python port). Each gets the same stream of heavy-tailed latencies (lognormal,
median 0.5 s, clamped to [1 ms, 10 min]); we time `record` per sample and a p90 query after
every 10 samples, with the structure holding ~1,000 samples (LatencyWindow's default cap).
LatencyWindow is also timed with censored samples (``record_censored``: attempts cancelled
before they finished), as a hedger at the p90 leaves them (the slowest 10 %, censored above the
p90) and in a worst case (15 % censored anywhere, so every query walks the censored samples).
The sketches keep everything they saw (no time window), which only flatters them.

    .venv/bin/python benchmarks/estimator.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import latencykit as lk

SAMPLES = 200_000
ROUNDS = 7
Q = 0.9


def _stream(n: int) -> list[float]:
    rng = random.Random(42)
    return [min(600.0, max(0.001, rng.lognormvariate(-0.69, 1.2))) for _ in range(n)]


P90 = sorted(_stream(10_000))[8_999]


def _censoring(censored: Callable[[float], bool]) -> Callable[[Any, float], None]:
    def record(window: lk.stats.LatencyWindow, value: float) -> None:
        if censored(value):
            window.record_censored(value)
        else:
            window.record(value)

    return record


def _candidates() -> dict[
    str, tuple[Callable[[], Any], Callable[[Any, float], None], Callable[[Any], float | None]]
]:
    found: dict[str, Any] = {
        "latencykit.LatencyWindow": (
            lambda: lk.stats.LatencyWindow(window=3600.0, max_samples=1000),
            lambda s, v: s.record(v),
            lambda s: s.quantile(Q),
        ),
        # A hedger at the p90: the slowest ~10 % are censored (cancelled) at >= the p90.
        "  10 % censored, above the p90": (
            lambda: lk.stats.LatencyWindow(window=3600.0, max_samples=1000),
            _censoring(lambda v: v > P90),
            lambda s: s.quantile(Q),
        ),
        # Worst case: 15 % censored anywhere (a cold start, losers cancelled early).
        "  15 % censored, at random": (
            lambda: lk.stats.LatencyWindow(window=3600.0, max_samples=1000),
            _censoring(lambda v: int(v * 1e6) % 100 < 15),
            lambda s: s.quantile(Q),
        ),
    }
    try:
        from ddsketch import DDSketch

        found["ddsketch.DDSketch(0.01)"] = (
            lambda: DDSketch(relative_accuracy=0.01),
            lambda s, v: s.add(v),
            lambda s: s.get_quantile_value(Q),
        )
    except ImportError:
        pass
    try:
        from hdrh.histogram import HdrHistogram

        # Integer microseconds from 1 ms to 10 min, 2 significant digits.
        found["hdrhistogram(1ms..10min, 2 digits)"] = (
            lambda: HdrHistogram(1_000, 600_000_000, 2),
            lambda s, v: s.record_value(int(v * 1e6)),
            lambda s: s.get_value_at_percentile(Q * 100) / 1e6,
        )
    except ImportError:
        pass
    return found


def main() -> None:
    stream = _stream(SAMPLES)
    print(f"{'estimator':<36} {'update us':>10} {'p90 query us':>13}   (median of {ROUNDS} rounds)")
    for name, (make, record, query) in _candidates().items():
        updates: list[float] = []
        queries: list[float] = []
        for _ in range(ROUNDS):
            sketch = make()
            for value in stream[:2_000]:  # fill first: measure at steady state
                record(sketch, value)
            start = time.perf_counter_ns()
            for value in stream:
                record(sketch, value)
            updates.append((time.perf_counter_ns() - start) / len(stream) / 1000)
            start = time.perf_counter_ns()
            for _ in range(20_000):
                query(sketch)
            queries.append((time.perf_counter_ns() - start) / 20_000 / 1000)
        print(f"{name:<36} {statistics.median(updates):>10.2f} {statistics.median(queries):>13.2f}")
    print("\ntargets: update <= 2 us, quantile query <= 5 us")
    per_call(stream)


def per_call(stream: list[float]) -> None:
    """What a hedged call pays: one sample recorded, then the delay read for the next call.

    The hedge does not query the window on every call: it re-reads the estimate once the
    window changed by 1/32 of its samples (``Hedge.current_delay``). Compared here with an exact
    quantile after every sample, on the worst-case stream (15 % censored anywhere).
    """
    censored = _censoring(lambda v: int(v * 1e6) % 100 < 15)
    calls = 50_000

    def exact() -> Callable[[float], None]:
        window = lk.stats.LatencyWindow(window=3600.0, max_samples=1000)

        def one(value: float) -> None:
            censored(window, value)
            window.quantile(Q)

        return one

    def hedge() -> Callable[[float], None]:
        policy = lk.hedge(lk.quantile(Q, window=3600.0))
        window = policy.window("t")

        def one(value: float) -> None:
            censored(window, value)
            policy.current_delay("t")  # the hot path's read (memoised)

        return one

    print(f"\n{'per call: record + delay read':<36} {'median us':>10} {'p99 us':>13}")
    for name, make in (("exact quantile every call", exact), ("hedge's memoised read", hedge)):
        one = make()
        for value in stream[:2_000]:
            one(value)
        times: list[float] = []
        for value in stream[2_000 : 2_000 + calls]:
            start = time.perf_counter_ns()
            one(value)
            times.append((time.perf_counter_ns() - start) / 1000)
        times.sort()
        mean = statistics.fmean(times)
        print(
            f"  {name:<34} {times[len(times) // 2]:>10.2f} {times[int(len(times) * 0.99)]:>13.2f}"
            f"   (mean {mean:.2f})"
        )


if __name__ == "__main__":
    main()
