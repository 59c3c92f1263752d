"""Streaming: hedging on the first token against real tails, and how fast a stall is detected.

1. **First-token hedging.** The method of ``benchmarks/tail.py``, on streams and on the time to
   first token (TTFT). Two llmperf runs with heavy TTFT tails, together/13b and replicate/70b,
   are replayed through the fake provider on 127.0.0.1 with their ``ttft_s`` samples scaled
   down in time, each answer cut to a few tokens so that a stream is short. For each run, N
   streaming requests per variant go through, in alternating blocks of 500 in ABBA order (so
   that machine drift hits both alike), arriving at a steady rate R (one every 1/R s, whatever
   the earlier ones are doing: an open loop),

   * bare ``litellm.acompletion(stream=True)``: TTFT = the time until the first chunk with a
     non-empty ``delta.content``; the stream is then read to its end and ``aclose()``-d;
   * ``lk.LLM(..., hedge=lk.Hedge(lk.quantile(0.9), max_extra_load=0.1))
     .acompletion(stream=True)``: TTFT = the time until the call returned the stream (it
     returns at the first content chunk; ``lk.report(stream).ttft`` is checked against it);
     the stream is read to its end inside ``async with``.

   Request i's primary gets TTFT X_i and its backup Y_i in both variants (``ReplayScript``). The
   **ideal hedger** is computed offline from the same samples: it fires the backup exactly when
   X_i exceeds a delay d, so its TTFT is min(X_i, d + Y_i), plus the client's own cost (the
   median of bare TTFT - X_i), which no hedger avoids. It is computed at the extra load the
   hedged pass actually used (d = the (1 - extra load)-quantile of the X's: the target's
   comparison), and, as in tail.py, at d = the p90 of the X's (10 % extra load).

   Why an open loop and not tail.py's N requests at concurrency C: a litellm stream costs
   ~20 ms of CPU in this process (litellm's own Python: request building, chunk objects,
   cost calculation and success logging; measured with the fake provider in another process
   too), so the client saturates at ~50 streams/s. At concurrency 20 and a ~0.1 s TTFT that is
   far past saturation (bare TTFT 0.17-0.29 s above the provider's at the median: client
   queueing), and a closed loop makes the faster hedged variant offer more load than the bare
   one. A steady arrival rate offers both the same load, kept well below saturation.

2. **Stall detection.** Streams that stall after 4 content chunks and never resume
   (``Fault.STALL``, ``stall_for=None``; every other one sends keep-alive comments and empty
   deltas during the stall, which must not count as content) go through
   ``lk.LLM(..., stream_guard=lk.StreamGuard(stall=S))`` for S = 0.2 s and 1.0 s. For each, the
   overshoot is the time from the consumer receiving the last content chunk to
   ``lk.StreamStalled`` reaching it, minus S (the stream closes its HTTP response before it
   raises, so that is included); also the overshoot at the ``StallDetected`` event, and when
   the fake provider saw the client disconnect. Streams start at a steady rate (20/s: at most
   a few dozen open at once) for the same reason as above. On asyncio and on trio.

Warnings, unraisable exceptions, WARNING+ log records, report fields that disagree with what was
measured, streams left alive and attempts the provider never saw closed are collected and
printed at the end.

    .venv/bin/python benchmarks/ttft.py            # 1,000 streams per variant, about 4.5 minutes
    .venv/bin/python benchmarks/ttft.py --quick    # 300 streams per variant, about 2 minutes
    # the hedger after 2 minutes of hedged traffic instead of 60 calls (its delay has converged):
    .venv/bin/python benchmarks/ttft.py --part hedge --run replicate/70b --warmup 3000

It prints each target with PASS or FAIL and always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import gc
import json
import logging
import math
import os
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
from tail import BLOCK, CAP, HEAVY, QUANTILES, Q, offset, stats

import latencykit as lk
from latencykit.lab.report import percentile
from latencykit.lab.rows import MESSAGES, PRIMARY, REQUEST_HEADER, Sent
from latencykit.lab.runner import ReplayScript, prepare_litellm, run_requests
from latencykit.testing import Behavior, FakeProvider, Fault, LlmperfProfile

RUNS = {"together/13b": 0.2, "replicate/70b": 0.1}
"""Run -> time scale: TTFT p50 about 0.11-0.12 s (together p90 0.13 s, tail 20 s; replicate p90
1.2 s, tail 7 s)."""
assert set(RUNS) == set(HEAVY)
OUTPUT_TOKENS = 4
ITL = 0.002
"""Each replayed answer: 4 tokens, 2 ms apart (the llmperf TTFT is kept, the decode is not)."""
TARGET_RATIO = 1.2
RATE = 25.0
"""Streams started per second in the hedging passes (both variants' blocks in one schedule)."""
KEY = "bench-key-not-secret"

STALLS = (0.2, 1.0)
STALL_MODEL = "bench-stall"
STALL_AFTER = 4
STALL_TARGET = 0.050
STALL_RATE = 20.0
SILENT = Behavior(
    ttft=0.02, itl=0.005, output_tokens=16, fault=Fault.STALL, stall_after=STALL_AFTER
)
KEEPALIVE = dataclasses.replace(SILENT, stall_keepalive=True, keepalive_every=0.05)


@dataclasses.dataclass(frozen=True)
class FirstTokens(LlmperfProfile):
    """An llmperf run's TTFTs with short answers: the recorded TTFT, then OUTPUT_TOKENS tokens."""

    def behavior_for(self, row_index: int) -> Behavior:
        recorded = super().behavior_for(row_index)
        return dataclasses.replace(recorded, itl=ITL, output_tokens=OUTPUT_TOKENS)


# --- what went wrong along the way ----------------------------------------------------------


@dataclasses.dataclass
class Anomalies:
    """Warnings, errors, wrong report fields, leaks: everything that is not a number."""

    warnings: Counter[str] = dataclasses.field(default_factory=Counter)
    unraisable: Counter[str] = dataclasses.field(default_factory=Counter)
    logs: Counter[str] = dataclasses.field(default_factory=Counter)
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    notes: Counter[str] = dataclasses.field(default_factory=Counter)
    checked: list[str] = dataclasses.field(default_factory=list)  # passes checked for leaks

    def note(self, text: str) -> None:
        self.notes[text] += 1

    def lines(self) -> list[str]:
        lines = []
        for title, counter in (
            ("errors", self.errors),
            ("warnings", self.warnings),
            ("unraisable exceptions", self.unraisable),
            ("log records (WARNING+)", self.logs),
            ("notes", self.notes),
        ):
            for text, count in counter.most_common():
                lines.append(f"  {title}: {text} (x{count})")
        lines = lines or ["  none"]
        if self.checked:
            lines.append(
                f"  (checked after each pass ({', '.join(self.checked)}): lk.Stream, LitellmChunks,"
                " BridgedStream and litellm CustomStreamWrapper objects left alive, provider"
                " attempts neither completed nor closed; report fields against the measurements)"
            )
        return lines


class _Logs(logging.Handler):
    def __init__(self, anomalies: Anomalies, where: str) -> None:
        super().__init__(logging.WARNING)
        self.anomalies = anomalies
        self.where = where

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().splitlines()[0][:160] if record.getMessage() else ""
        self.anomalies.logs[f"{self.where}: {record.name} {record.levelname}: {message}"] += 1


@contextlib.contextmanager
def collecting(anomalies: Anomalies, where: str) -> Iterator[None]:
    """Record warnings, unraisable exceptions and WARNING+ log records into ``anomalies``."""
    previous = sys.unraisablehook

    def unraisable(info: Any) -> None:
        name = getattr(info.exc_type, "__name__", "?")
        anomalies.unraisable[f"{where}: {name}: {info.exc_value} in {info.object!r}"[:200]] += 1

    handler = _Logs(anomalies, where)
    loggers = [logging.getLogger()] + [
        logger
        for logger in map(logging.getLogger, ("latencykit", "LiteLLM", "asyncio"))
        if not logger.propagate
    ]
    for logger in loggers:
        logger.addHandler(handler)
    sys.unraisablehook = unraisable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        warnings.simplefilter("always", ResourceWarning)
        # litellm's use of pydantic, not ours (pyproject.toml ignores it in the tests too).
        warnings.filterwarnings("ignore", "Item .* is using the `ReadOnly` qualifier", UserWarning)
        try:
            yield
        finally:
            gc.collect()  # finalisers of abandoned streams warn now, inside the net
            sys.unraisablehook = previous
            for logger in loggers:
                logger.removeHandler(handler)
            for w in caught:
                at = f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}"
                text = f"{where}: {w.category.__name__}: {str(w.message)[:160]} ({at})"
                anomalies.warnings[text] += 1


def alive() -> dict[str, int]:
    """Streaming objects still alive after a collection (should all be 0 between passes)."""
    import litellm

    from latencykit._asyncio_bridge import BridgedStream
    from latencykit._litellm import LitellmChunks

    gc.collect()
    kinds: dict[str, type] = {
        "lk.Stream": lk.Stream,
        "LitellmChunks": LitellmChunks,
        "BridgedStream": BridgedStream,
        "litellm.CustomStreamWrapper": litellm.CustomStreamWrapper,
    }
    counts = dict.fromkeys(kinds, 0)
    for obj in gc.get_objects():
        for name, kind in kinds.items():
            if isinstance(obj, kind):
                counts[name] += 1
    return counts


def check_alive(anomalies: Anomalies, where: str) -> None:
    counts = alive()
    anomalies.checked.append(where)
    for name, count in counts.items():
        if count:
            anomalies.note(f"{where}: {count} {name} object(s) still alive after the pass")


# --- 1. first-token hedging -----------------------------------------------------------------


def ideal(
    primaries: Sequence[float], backups: Sequence[float], extra: float
) -> tuple[list[float], float, float]:
    """The oracle hedger on the same samples, hedging the ``extra`` share of slowest primaries:
    its TTFTs, its delay and its extra load (the share of X_i > delay)."""
    delay = percentile(sorted(primaries), 1 - extra) if extra > 0 else math.inf
    latencies = [
        x if x <= delay else min(x, delay + y) for x, y in zip(primaries, backups, strict=True)
    ]
    return latencies, delay, sum(x > delay for x in primaries) / len(primaries)


async def open_loop(send: Callable[[int], Awaitable[Sent]], n: int, rate: float) -> float:
    """Start ``send(k)`` at ``k / rate`` seconds for k < n, each on time whatever the others are
    doing (an open loop); return the wall time until all have finished."""
    start = anyio.current_time() + 0.05

    async def on_time(k: int) -> Sent:
        await anyio.sleep_until(start + k / rate)
        return await send(k)

    _, wall = await run_requests(on_time, n, n, "open loop", None)
    return wall


async def hedge_run(
    run: str, scale: float, requests: int, rate: float, warmup: int, anomalies: Anomalies
) -> dict[str, Any]:
    import litellm

    profile = FirstTokens.load(run, scale=scale)
    results: dict[str, Any] = {"run": run, "scale": scale}
    models = {"bare": f"{PRIMARY}-bare", "hedge": f"{PRIMARY}-hedge"}
    with FakeProvider(seed=11) as fake:
        hedge = lk.Hedge(lk.quantile(Q), max_extra_load=CAP)
        llm = lk.LLM(f"openai/{models['hedge']}", api_base=fake.base_url, api_key=KEY, hedge=hedge)
        ttft: dict[str, dict[int, float]] = {"bare": {}, "hedge": {}}
        reported: dict[int, float] = {}
        single: set[int] = set()  # requests the hedged pass answered with one attempt
        delays: list[float] = []  # the hedging delay in force at each hedge

        async def bare(i: int) -> Sent:
            started = time.monotonic()
            first = None
            try:
                response = await litellm.acompletion(
                    model=f"openai/{models['bare']}",
                    api_base=fake.base_url,
                    api_key=KEY,
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={REQUEST_HEADER: str(i)},
                )
                try:
                    async for chunk in response:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.monotonic() - started
                finally:
                    await response.aclose()
            except Exception as exc:
                anomalies.errors[f"{run} bare: {type(exc).__name__}: {str(exc)[:120]}"] += 1
                return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
            if first is None:
                anomalies.errors[f"{run} bare: a stream without content"] += 1
                return Sent(time.monotonic() - started, ok=False, error_type="no content")
            ttft["bare"][i] = first
            return Sent(first, ok=True)

        async def hedged(i: int) -> Sent:
            started = time.monotonic()
            try:
                stream = await llm.acompletion(
                    messages=MESSAGES, stream=True, extra_headers={REQUEST_HEADER: str(i)}
                )
                first = time.monotonic() - started
                async with stream:
                    async for _ in stream:
                        pass
            except Exception as exc:
                anomalies.errors[f"{run} hedge: {type(exc).__name__}: {str(exc)[:120]}"] += 1
                return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
            check_stream(run, stream, first, anomalies)
            ttft["hedge"][i] = first
            if i >= 0:
                report = lk.report(stream)
                assert report.ttft is not None
                reported[i] = report.ttft
                if len(report.attempts) == 1:
                    single.add(i)
            return Sent(first, ok=True, hedge_won=lk.report(stream).answering_attempt > 1)

        sends = {"bare": bare, "hedge": hedged}
        for name in models.values():  # warm-up: fresh samples, the TTFT window, connections
            fake.script(name, profile)
        await open_loop(offset(bare, -1, -1), 60, rate)
        await open_loop(offset(hedged, -1, -1), warmup, rate)
        fake.reset()
        scripts = {name: ReplayScript(profile, requests, seed=5) for name in models}
        for name, model in models.items():
            fake.script(model, scripts[name])
        # One schedule: blocks of BLOCK requests per variant in ABBA order, at a steady rate.
        schedule: list[tuple[str, int]] = []
        for block in range(0, requests, BLOCK):
            order = list(sends)
            if block // BLOCK % 2:
                order.reverse()  # ABBA: neither variant always runs second
            for name in order:
                schedule += [(name, i) for i in range(block, min(block + BLOCK, requests))]

        def scheduled(k: int) -> Awaitable[Sent]:
            name, i = schedule[k]
            return sends[name](i)

        counts: Counter[str] = Counter()

        def count(event: lk.events.Event) -> None:
            name = type(event).__name__
            if isinstance(event, lk.events.HedgeSkipped):
                name += f"({event.reason})"
            if isinstance(event, lk.events.HedgeFired) and event.delay is not None:
                delays.append(event.delay)
            counts[name] += 1

        with lk.subscribe(count):
            wall = await open_loop(scheduled, len(schedule), rate)
        await anyio.sleep(0.2)  # the provider records the losers' disconnects
        attempts = fake.attempts
        for name, model in models.items():
            upstream = sum(a.model == model for a in attempts)
            done = [ttft[name][i] for i in range(requests) if i in ttft[name]]
            results[name] = {
                **stats(done),
                "extra_load": (upstream - requests) / requests,
                "errors": requests - len(done),
            }
            unfinished = [
                a for a in attempts if a.model == model and not (a.completed or a.disconnected)
            ]
            if unfinished:
                anomalies.note(f"{run} {name}: {len(unfinished)} attempt(s) never completed/closed")
        losers = [
            a
            for a in attempts
            if a.model == models["hedge"] and a.disconnected and a.tokens_sent < OUTPUT_TOKENS
        ]
        results["hedge"].update(
            hedges_fired=counts["HedgeFired"],
            hedges_won=counts["HedgeWon"],
            skipped_budget=counts["HedgeSkipped(budget)"],
            skipped_deadline=counts["HedgeSkipped(deadline)"],
            losers_closed_early=len(losers),
            delay_ms=summary([d * 1000 for d in delays]),
        )
        # latencykit's cost on the first token: the same request (same X_i) unhedged vs bare.
        paired = [ttft["hedge"][i] - ttft["bare"][i] for i in single if i in ttft["bare"]]
        results["unhedged_minus_bare_ms"] = summary([d * 1000 for d in paired])
        results["wall_s"] = wall
        print(f"  {run:<14} done in {wall:5.1f}s", file=sys.stderr, flush=True)
        draws = scripts["bare"].draws
        xs = [float(d[0].ttft) for d in draws]  # type: ignore[arg-type]
        ys = [float(d[1].ttft) for d in draws]  # type: ignore[arg-type]
        # What the client itself adds to the first token (litellm, HTTP, the event loop),
        # measured on the bare pass: the ideal hedger cannot avoid it either.
        overhead = statistics.median(ttft["bare"][i] - xs[i] for i in ttft["bare"])
        # lk.report(stream).ttft against the client's own clock (which starts a little earlier).
        gaps = sorted(ttft["hedge"][i] - reported[i] for i in reported)
        results["report_ttft_minus_own_ms"] = {
            "min": -gaps[-1] * 1000,
            "median": -statistics.median(gaps) * 1000,
            "max": -gaps[0] * 1000,
        }
        if gaps[0] < -0.001:
            anomalies.note(f"{run}: report(stream).ttft is later than the caller got the stream")
        if gaps[-1] > 0.01:
            anomalies.note(
                f"{run}: the caller got the stream up to {gaps[-1] * 1000:.1f} ms after the "
                f"report(stream).ttft instant (median {statistics.median(gaps) * 1000:.2f} ms)"
            )
        for key, extra in (("ideal", results["hedge"]["extra_load"]), ("ideal_p90", 1 - Q)):
            latencies, delay, fired = ideal(xs, ys, max(extra, 0.0))
            results[key] = {
                **stats([x + overhead for x in latencies]),
                "extra_load": fired,
                "delay": delay,
                "client_overhead": overhead,
            }
            results[f"ratios_{key}"] = {
                q: results["hedge"][q] / results[key][q] for q in stats([1.0])
            }
    return results


def check_stream(run: str, stream: lk.Stream[Any], first: float, anomalies: Anomalies) -> None:
    """Is what latencykit says about a finished stream true?"""
    report = lk.report(stream)
    if stream.outcome != "ok":
        anomalies.note(f"{run} hedge: stream outcome {stream.outcome!r} after a full read")
    if report.chunks != OUTPUT_TOKENS or stream.chunks != OUTPUT_TOKENS:
        anomalies.note(f"{run} hedge: {report.chunks} content chunks, {OUTPUT_TOKENS} sent")
    if report.ttft is None or not 0 < report.ttft <= first + 0.001:
        anomalies.note(f"{run} hedge: report.ttft {report.ttft} vs measured {first:.4f}")
    answered = [a for a in report.attempts if a.number == report.answering_attempt]
    if len(answered) != 1 or answered[0].outcome != "ok" or answered[0].ttft is None:
        anomalies.note(f"{run} hedge: the answering attempt is not recorded as ok with a ttft")
    others = [a for a in report.attempts if a.number != report.answering_attempt]
    if any(a.outcome != "cancelled" for a in others):
        outcomes = sorted({a.outcome for a in others})
        anomalies.note(f"{run} hedge: losing attempt(s) recorded as {outcomes}")
    if report.duration < (report.ttft or 0.0):
        anomalies.note(f"{run} hedge: report.duration < report.ttft")


# --- 2. stall detection ---------------------------------------------------------------------

_request: contextvars.ContextVar[int] = contextvars.ContextVar("request", default=-1)


def stall_script(request: Any) -> Behavior:
    """Odd requests send keep-alives during the stall; even ones are silent."""
    return KEEPALIVE if int(request.headers.get(REQUEST_HEADER, "0")) % 2 else SILENT


async def stall_passes(
    backend: str, requests: int, rate: float, anomalies: Anomalies
) -> list[dict[str, Any]]:
    results = []
    with FakeProvider(seed=3) as fake:
        warm = lk.LLM("openai/bench-warm", api_base=fake.base_url, api_key=KEY)
        for _ in range(5):  # litellm's HTTP stack (and on trio the bridge) start outside timing
            async with await warm.acompletion(messages=MESSAGES, stream=True) as s:
                async for _chunk in s:
                    pass
        for stall in STALLS:
            fake.reset()
            fake.script(STALL_MODEL, stall_script)
            results.append(await stall_pass(fake, backend, stall, requests, rate, anomalies))
    return results


async def stall_pass(
    fake: FakeProvider,
    backend: str,
    stall: float,
    requests: int,
    rate: float,
    anomalies: Anomalies,
) -> dict[str, Any]:
    llm = lk.LLM(
        f"openai/{STALL_MODEL}",
        api_base=fake.base_url,
        api_key=KEY,
        stream_guard=lk.StreamGuard(stall=stall),
    )
    where = f"{backend} stall={stall:g}"
    last: dict[int, float] = {}
    raised: dict[int, float] = {}
    detected: dict[int, float] = {}

    def seen(event: lk.events.Event) -> None:
        if isinstance(event, lk.events.StallDetected):
            detected[_request.get()] = time.monotonic()

    async def one(i: int) -> Sent:
        _request.set(i)
        started = time.monotonic()
        try:
            stream = await llm.acompletion(
                messages=MESSAGES, stream=True, extra_headers={REQUEST_HEADER: str(i)}
            )
            async with stream:
                try:
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            last[i] = time.monotonic()
                except lk.StreamStalled as exc:
                    raised[i] = time.monotonic()
                    if exc.chunks != STALL_AFTER or stream.chunks != STALL_AFTER:
                        anomalies.note(
                            f"{where}: StreamStalled.chunks {exc.chunks}, stream.chunks "
                            f"{stream.chunks}, {STALL_AFTER} sent"
                        )
                    if stream.outcome != "error":
                        anomalies.note(f"{where}: stalled stream outcome {stream.outcome!r}")
                    return Sent(raised[i] - started, ok=True)
        except Exception as exc:
            anomalies.errors[f"{where}: {type(exc).__name__}: {exc}"[:160]] += 1
            return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
        anomalies.errors[f"{where}: stream ended without a stall"] += 1
        return Sent(time.monotonic() - started, ok=False, error_type="no stall")

    with lk.subscribe(seen):
        wall = await open_loop(one, requests, rate)
    await anyio.sleep(0.2)  # the provider records the last disconnects
    closed: dict[int, float] = {}
    for a in fake.attempts:
        i = int(a.request_headers.get(REQUEST_HEADER, "-1"))
        if a.disconnected_at is not None:
            closed[i] = a.disconnected_at
        else:
            anomalies.note(f"{where}: the provider never saw the client close a stream")
    ok = sorted(raised)
    by_kind = {
        kind: [raised[i] - last[i] - stall for i in ok if i % 2 == parity]
        for kind, parity in (("silent", 0), ("keep-alives", 1))
    }
    print(
        f"  {backend:<7} stall={stall:g}s: {len(ok)}/{requests} in {wall:4.1f}s",
        file=sys.stderr,
        flush=True,
    )
    return {
        "backend": backend,
        "stall": stall,
        "requests": requests,
        "stalled": len(ok),
        "wall_s": wall,
        "overshoot": summary([raised[i] - last[i] - stall for i in ok]),
        "overshoot_event": summary([detected[i] - last[i] - stall for i in ok if i in detected]),
        "overshoot_by_kind": {k: summary(v) for k, v in by_kind.items()},
        "close_after_raise": summary([closed[i] - raised[i] for i in ok if i in closed]),
        "events": len(detected),
    }


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return dict.fromkeys(("min", "p50", "p90", "p99", "max"), math.nan) | {"n": 0}
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p50": percentile(ordered, 0.5),
        "p90": percentile(ordered, 0.9),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
    }


# --- report ---------------------------------------------------------------------------------


def targets(
    hedges: Sequence[dict[str, Any]], stalls: Sequence[dict[str, Any]]
) -> list[tuple[str, bool]]:
    checks: list[tuple[str, bool]] = []
    for r in hedges:
        ratio, extra = r["ratios_ideal"]["p99"], r["hedge"]["extra_load"]
        checks.append(
            (
                f"{r['run']}: TTFT p99 {ratio:.2f} x the ideal hedger at the same extra load "
                f"({extra:.1%}) <= {TARGET_RATIO}",
                ratio <= TARGET_RATIO,
            )
        )
        checks.append(
            (f"{r['run']}: extra load {extra:.1%} <= {CAP + 0.01:.0%}", extra <= CAP + 0.01)
        )
    for s in stalls:
        p99 = s["overshoot"]["p99"]
        checks.append(
            (
                f"{s['backend']} stall={s['stall']:g}s: StreamStalled p99 {p99 * 1000:.1f} ms "
                f"after the stall limit <= {STALL_TARGET * 1000:.0f} ms "
                f"({s['stalled']}/{s['requests']} detected)",
                p99 <= STALL_TARGET and s["stalled"] == s["requests"],
            )
        )
    return checks


def render_hedges(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<14} {'variant':<10} {'p50':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} {'extra':>7}",
        "-" * 66,
    ]
    for r in results:
        for name in ("bare", "hedge", "ideal", "ideal_p90"):
            row = r[name]
            label = {"ideal": "ideal=", "ideal_p90": "ideal@p90"}.get(name, name)
            lines.append(
                f"{r['run'] if name == 'bare' else '':<14} {label:<10} "
                + " ".join(f"{row[f'p{q * 100:g}'] * 1000:>7.0f}" for q in QUANTILES)
                + f" {row['extra_load']:>7.1%}"
            )
        for key, label in (("ratios_ideal", "h/ideal="), ("ratios_ideal_p90", "h/i@p90")):
            lines.append(
                f"{'':<14} {label:<10} "
                + " ".join(f"{r[key][f'p{q * 100:g}']:>7.2f}" for q in QUANTILES)
            )
        hedge, rep = r["hedge"], r["report_ttft_minus_own_ms"]
        lines.append(
            f"{'':<14} hedges fired {hedge['hedges_fired']}, won {hedge['hedges_won']}, skipped "
            f"for budget {hedge['skipped_budget']}, for deadline {hedge['skipped_deadline']}; "
            f"losers closed before their end {hedge['losers_closed_early']}"
        )
        lines.append(
            f"{'':<14} ideal= hedges the same share as the hedge pass (delay "
            f"{r['ideal']['delay'] * 1000:.0f} ms), ideal@p90 at the p90 of the X's "
            f"({r['ideal_p90']['delay'] * 1000:.0f} ms); both plus the client's own "
            f"{r['ideal']['client_overhead'] * 1000:.1f} ms"
        )
        delay, paired = hedge["delay_ms"], r["unhedged_minus_bare_ms"]
        lines.append(
            f"{'':<14} delay in force at the hedges: median {delay['p50']:.0f} ms "
            f"[{delay['min']:.0f}, {delay['max']:.0f}]; unhedged calls vs bare, same request: "
            f"{paired['p50']:+.1f} ms at the median, p90 {paired['p90']:+.1f} ms (n={paired['n']})"
        )
        lines.append(
            f"{'':<14} report(stream).ttft - own clock: median {rep['median']:+.2f} ms "
            f"[{rep['min']:+.2f}, {rep['max']:+.2f}]; errors: bare {r['bare']['errors']}, "
            f"hedge {r['hedge']['errors']}; wall {r['wall_s']:.1f}s"
        )
    return "\n".join(lines)


def render_stalls(results: Sequence[dict[str, Any]]) -> str:
    def ms(s: dict[str, float]) -> str:
        return f"{s['p50'] * 1000:>6.1f} {s['p99'] * 1000:>6.1f} {s['max'] * 1000:>6.1f}"

    lines = [
        f"{'backend':<8} {'stall':>5} {'n':>5}   {'raised: p50':>11} {'p99':>6} {'max':>6}   "
        f"{'event: p50':>10} {'p99':>6} {'max':>6}   {'close-raise: p50':>16} {'max':>6}",
        "-" * 103,
    ]
    for s in results:
        close = s["close_after_raise"]
        lines.append(
            f"{s['backend']:<8} {s['stall']:>5g} {s['stalled']:>5}   {ms(s['overshoot']):>25}   "
            f"{ms(s['overshoot_event']):>24}   {close['p50'] * 1000:>16.1f} "
            f"{close['max'] * 1000:>6.1f}"
        )
    for s in results:
        kinds = s["overshoot_by_kind"]
        lines.append(
            f"  {s['backend']} stall={s['stall']:g}: p99 silent {kinds['silent']['p99'] * 1000:.1f}"
            f" ms, with keep-alives {kinds['keep-alives']['p99'] * 1000:.1f} ms; "
            f"StallDetected events {s['events']}; wall {s['wall_s']:.1f}s"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="300 streams per variant, 60 stalls")
    parser.add_argument("--requests", type=int, default=None, help="streams per hedging variant")
    parser.add_argument("--rate", type=float, default=RATE, help="streams started per second")
    parser.add_argument("--stall-requests", type=int, default=None, help="per stall limit")
    parser.add_argument("--stall-rate", type=float, default=STALL_RATE)
    parser.add_argument(
        "--warmup", type=int, default=60, help="hedged calls before the measured ones (60)"
    )
    parser.add_argument("--part", choices=("all", "hedge", "stall"), default="all")
    parser.add_argument(
        "--run", action="append", choices=list(RUNS), help="hedging run(s) to replay (both)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    requests = args.requests or (300 if args.quick else 1000)
    stall_requests = args.stall_requests or (60 if args.quick else 200)
    prepare_litellm()
    started = time.monotonic()
    anomalies = Anomalies()
    hedges = []
    runs = [(run, RUNS[run]) for run in args.run or RUNS]
    for run, scale in runs if args.part != "stall" else ():
        with collecting(anomalies, run):
            hedges.append(
                anyio.run(hedge_run, run, scale, requests, args.rate, args.warmup, anomalies)
            )
        check_alive(anomalies, run)
    stalls = []
    for backend in ("asyncio", "trio") if args.part != "hedge" else ():
        with collecting(anomalies, f"stall on {backend}"):
            stalls += anyio.run(
                stall_passes, backend, stall_requests, args.stall_rate, anomalies, backend=backend
            )
        check_alive(anomalies, f"stall on {backend}")
    if hedges:
        print(
            f"\n1. Time to first content chunk, ms; {requests} streams per variant, "
            f"{args.rate:g} started per second; {OUTPUT_TOKENS} tokens each; hedge = "
            f"lk.Hedge(lk.quantile({Q}), max_extra_load={CAP}); {args.warmup} warm-up calls"
        )
        print(render_hedges(hedges))
    if stalls:
        print(
            f"\n2. Stall detection: ms from the last content chunk to StreamStalled, minus the "
            f"stall limit; {stall_requests} streams per limit, {args.stall_rate:g} started per "
            f"second, stalling after {STALL_AFTER} chunks (half with keep-alives); close-raise = "
            f"when the provider saw the disconnect, relative to the raise"
        )
        print(render_stalls(stalls))
    print("\nTargets")
    for name, ok in targets(hedges, stalls):
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    print("\nAnomalies")
    print("\n".join(anomalies.lines()))
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    if args.json is not None:
        found = {
            f.name: dict(value)
            if isinstance(value := getattr(anomalies, f.name), Counter)
            else value
            for f in dataclasses.fields(anomalies)
        }
        payload = {"hedging": hedges, "stalls": stalls, "anomalies": found}
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
