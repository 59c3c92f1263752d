"""What OpenTelemetry export costs: ``lk.LLM`` calls with telemetry off and on, side by side.

Run it from the repository root::

    .venv/bin/python benchmarks/telemetry.py            # about 1 minute
    .venv/bin/python benchmarks/telemetry.py --quick    # about 20 seconds

Method. Telemetry is process-wide (``latencykit.telemetry.instrument()`` subscribes to every
event), so the variants cannot alternate call by call; they alternate in blocks, and every
block also times bare ``litellm.acompletion`` call by call between the ``lk.LLM`` calls, as the
yardstick the target is stated in.

1. **Per call**, on litellm's ``mock_response`` path (no network: the call costs ~1.5 ms, nearly
   all litellm, so latencykit's share is as large as it gets). ``none``: nothing instrumented (no
   subscriber: no event is even built: telemetry off); ``sdk``: ``instrument()`` with the
   OpenTelemetry SDK, a ``BatchSpanProcessor`` into an in-memory span exporter and an in-memory
   metric reader (what a deployment pays in the calling task; the export itself runs in the SDK's
   thread); ``noop``: ``instrument()`` without an SDK (the API's no-op providers). Each round runs
   one block of each variant, in a shuffled order. Reported: per block, the median ``lk.LLM`` call
   minus the median bare call of the same block; a variant's cost is its difference from ``none``
   in the same round, as microseconds and as a % of the bare call, median with a 95 % bootstrap
   interval. A second ``none`` variant (``none again``) gives the noise floor.
2. **Per streamed chunk**: 1,000-chunk streams from the fake provider (a child process) over
   loopback, through ``lk.LLM(stream=True)``, off and on in ABBA order, one stream per block;
   time from the call to the end of ``aclose()`` (telemetry records every inter-chunk gap when
   the stream ends), per chunk.

Targets (from the observability issue): off within noise; on <= 10 % of a mock litellm call.
The script prints PASS/FAIL and always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from overhead import _load, _version, bootstrap_ci, verdict
from provider import provider_process

import latencykit as lk
from latencykit import telemetry

MODEL = "openai/gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hi"}]
SETTLE = 5  # loop turns after each call, untimed: litellm's logging tasks run there

PROVIDER = """
import sys
from latencykit.testing import Behavior, FakeProvider
fake = FakeProvider()
fake.script("chunks", Behavior(output_tokens=1000, ttft=0.0, itl=0.0))
fake.start()
print(fake.base_url, flush=True)
sys.stdin.read()
fake.stop()
"""


class SDK:
    """The OpenTelemetry SDK set up as a deployment would, exporting to memory."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(BatchSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def instrument(self) -> telemetry.Instrumentation:
        return telemetry.instrument(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )

    def exported_spans(self) -> int:
        self.tracer_provider.force_flush()
        count = len(self.spans.get_finished_spans())
        self.spans.clear()
        return count


async def _settle() -> None:
    for _ in range(SETTLE):
        await asyncio.sleep(0)


async def _timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter_ns()
    await call()
    elapsed = (time.perf_counter_ns() - start) / 1e3
    await _settle()
    return elapsed


VARIANTS = ("none", "none again", "noop", "sdk", "sdk floor")


def sdk_floor(sdk: SDK) -> Callable[[lk.events.Event], None]:
    """The least any GenAI instrumentation pays the SDK per call, as an event handler: a call
    span and an attempt span started and ended, a duration and two token-usage measurements;
    nothing else (none of latencykit's attributes, span events or counters)."""
    tracer = sdk.tracer_provider.get_tracer("floor")
    meter = sdk.meter_provider.get_meter("floor")
    duration = meter.create_histogram("floor.duration", unit="s")
    tokens = meter.create_histogram("floor.tokens", unit="{token}")
    spans: dict[int, Any] = {}
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL}

    def on_event(event: lk.events.Event) -> None:
        if isinstance(event, lk.events.CallStarted):
            spans[event.call_id] = tracer.start_span("chat", attributes=attributes)
        elif isinstance(event, lk.events.AttemptStarted):
            spans[-event.call_id] = tracer.start_span("attempt")
        elif isinstance(event, lk.events.AttemptEnded):
            spans.pop(-event.call_id).end()
        elif isinstance(event, lk.events.CallEnded):
            spans.pop(event.call_id).end()
            duration.record(event.duration, attributes)
            tokens.record(1, {**attributes, "gen_ai.token.type": "input"})
            tokens.record(1, {**attributes, "gen_ai.token.type": "output"})

    return on_event


async def per_call(rounds: int, block: int, seed: int) -> dict[str, Any]:
    """Block medians (us) of lk.LLM minus bare litellm, per variant."""
    import litellm

    litellm.suppress_debug_info = True
    sdk = SDK()
    llm = lk.LLM(MODEL)

    async def bare() -> object:
        return await litellm.acompletion(
            model=MODEL, messages=MESSAGES, mock_response="hi", max_retries=0, timeout=600.0
        )

    async def through_llm() -> object:
        return await llm.acompletion(messages=MESSAGES, mock_response="hi")

    for _ in range(200):  # warm-up, both ways
        await _timed(bare)
        await _timed(through_llm)
    with sdk.instrument():
        for _ in range(100):
            await _timed(through_llm)
    sdk.exported_spans()

    rng = random.Random(seed)
    added: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    bare_medians: list[float] = []
    spans = 0
    for _ in range(rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            handle: Any = None
            if variant == "sdk":
                handle = sdk.instrument()
            elif variant == "sdk floor":
                handle = lk.subscribe(sdk_floor(sdk))
            elif variant == "noop":
                handle = telemetry.instrument()  # the API's no-op providers: no SDK installed
            gc.collect()
            gc.disable()
            try:
                llm_times: list[float] = []
                bare_times: list[float] = []
                for _ in range(block):
                    pair = [(through_llm, llm_times), (bare, bare_times)]
                    rng.shuffle(pair)
                    for call, into in pair:
                        into.append(await _timed(call))
            finally:
                gc.enable()
                if handle is not None:
                    handle.close()
            bare_median = statistics.median(bare_times)
            bare_medians.append(bare_median)
            added[variant].append(statistics.median(llm_times) - bare_median)
            if variant == "sdk":
                spans += sdk.exported_spans()
    return {"added": added, "bare": statistics.median(bare_medians), "spans": spans}


async def per_chunk(base_url: str, rounds: int) -> dict[str, list[float]]:
    """Per-chunk time (us) of whole 1,000-chunk streams, per variant."""
    sdk = SDK()
    llm = lk.LLM("openai/chunks", api_base=base_url, api_key="bench-key-not-secret")

    async def one_stream() -> int:
        chunks = 0
        async with await llm.acompletion(messages=MESSAGES, stream=True) as stream:
            async for _ in stream:
                chunks += 1
        return chunks

    await one_stream()
    times: dict[str, list[float]] = {"off": [], "on": []}
    for index in range(rounds):
        for variant in ("off", "on") if index % 2 == 0 else ("on", "off"):
            handle = sdk.instrument() if variant == "on" else None
            try:
                start = time.perf_counter_ns()
                chunks = await one_stream()
                elapsed = (time.perf_counter_ns() - start) / 1e3
            finally:
                if handle is not None:
                    handle.close()
            times[variant].append(elapsed / chunks)
            await _settle()
    sdk.exported_spans()
    return times


def _paired(on: list[float], off: list[float], seed: int) -> tuple[float, tuple[float, float]]:
    n = min(len(on), len(off))
    diffs = [a - b for a, b in zip(on[:n], off[:n], strict=True)]
    median = statistics.median(diffs)
    return median, bootstrap_ci(n, lambda idx: statistics.median([diffs[i] for i in idx]), seed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer blocks and streams")
    parser.add_argument("--seed", type=int, default=20261124)
    args = parser.parse_args()
    blocks, block, rounds = (6, 30, 6) if args.quick else (16, 50, 16)
    load = _load()
    print(
        f"latencykit telemetry benchmark: Python {sys.version.split()[0]}, litellm "
        f"{_version('litellm')}, opentelemetry-sdk {_version('opentelemetry-sdk')}, "
        f"load average {load}",
        flush=True,
    )
    calls = asyncio.run(per_call(blocks, block, args.seed))
    with provider_process(PROVIDER) as base_url:
        chunks = asyncio.run(per_chunk(base_url, rounds))

    added, bare = calls["added"], calls["bare"]
    print(
        f"\n1. Per call (mock_response), {blocks} rounds of one block of {block} calls per "
        f"variant, shuffled; bare litellm call {bare:.0f} us (median of block medians)"
    )
    print("   variant    | lk.LLM - bare, median of blocks (us) | % of a bare call")
    for variant, values in added.items():
        median = statistics.median(values)
        print(f"   {variant:10} | {median:36.1f} | {median / bare * 100:15.1f}%")
    on_cost, on_ci = _paired(added["sdk"], added["none"], args.seed)
    noop, noop_ci = _paired(added["noop"], added["none"], args.seed)
    floor_cost, floor_cost_ci = _paired(added["sdk floor"], added["none"], args.seed)
    noise, noise_ci = _paired(added["none again"], added["none"], args.seed)
    print(
        f"   SDK - none:              {on_cost:+.1f} us [{on_ci[0]:+.1f}, {on_ci[1]:+.1f}] = "
        f"{on_cost / bare * 100:+.1f} % of a bare call; spans exported {calls['spans']}"
    )
    print(f"   no SDK (API no-op) - none: {noop:+.1f} us [{noop_ci[0]:+.1f}, {noop_ci[1]:+.1f}]")
    print(
        f"   SDK floor - none:          {floor_cost:+.1f} us [{floor_cost_ci[0]:+.1f}, "
        f"{floor_cost_ci[1]:+.1f}] = {floor_cost / bare * 100:+.1f} % (2 spans, 3 measurements, "
        "nothing else: what any GenAI instrumentation pays this SDK)"
    )
    print(f"   none again - none (noise): {noise:+.1f} us [{noise_ci[0]:+.1f}, {noise_ci[1]:+.1f}]")
    chunk_cost, chunk_ci = _paired(chunks["on"], chunks["off"], args.seed)
    print(
        f"\n2. Per streamed chunk, {rounds} 1,000-chunk streams per variant (ABBA): off "
        f"{statistics.median(chunks['off']):.1f} us, on {statistics.median(chunks['on']):.1f} "
        f"us per chunk; on - off {chunk_cost:+.2f} us [{chunk_ci[0]:+.2f}, {chunk_ci[1]:+.2f}]"
    )
    print("\nTargets")
    print(
        f"   {verdict(noise_ci[0] <= 0.0 <= noise_ci[1])}  telemetry off costs nothing "
        f"measurable: not instrumented is the code path without telemetry, and the A/A "
        f"difference between two such variants, {noise:+.1f} us, has 0 in its interval"
    )
    print(
        f"   {verdict(on_cost / bare <= 0.10)}  telemetry on <= 10 % of a mock litellm call: "
        f"{on_cost / bare * 100:.1f} %"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
