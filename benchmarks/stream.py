"""How much time latencykit's streaming adds per chunk: the Stream wrapper, and around litellm.

Run it from the repository root::

    .venv/bin/python benchmarks/stream.py            # full run, about 3 minutes
    .venv/bin/python benchmarks/stream.py --quick    # smoke run, about 1 minute
    .venv/bin/python benchmarks/stream.py --json results.json

It prints each target with PASS/FAIL and always exits 0: it reports, it does not gate. Progress
goes to stderr, the report to stdout.

Method. The machine this was written on has two noisy cores, so absolute times drift by tens of
percent between (and within) runs, and one 1,000-chunk litellm stream is +-20 % faster or slower
than the next. Every comparison is therefore made *side by side*: variants are interleaved in a
freshly shuffled order, and an overhead is always a difference between measurements taken in
the same round, never between two runs. Medians of paired differences are robust to bursts of
noise; 95 % percentile-bootstrap intervals (rounds resampled, so pairs stay paired) show how
precisely each median is known. Warm-up rounds are dropped.

1. **The Stream wrapper on a synthetic source** (no network, no litellm code on the path).
   ``chunks`` real litellm ``ModelResponseStream`` objects (one content chunk each, then a
   finish chunk), built once, are yielded by an async generator that never suspends. Variants:
   the generator iterated bare; the same with one cancel scope (deadline 30 s ahead) around
   each ``__anext__`` (a control: no latencykit code, just the mechanism any per-chunk timer
   needs; anyio's scope on asyncio, trio's on trio, as latencykit uses);
   ``lk.guard_stream(gen, reader=LITELLM_CHUNKS)`` with no limits (no timer is armed); the same
   with ``stall=30`` (a finite limit: a cancel scope is armed for each wait); and the no-limit
   guard inside ``with lk.deadline(60):`` (the deadline is the finite limit). Each round runs
   one stream of every variant in a shuffled order, each timed on its own, plus a fixed
   100-step Python loop as a machine-speed yardstick (``xref`` = overhead / that loop, which
   compares runs); the garbage collector is off within a round and collects between rounds
   (with the heap that exists before the rounds frozen); the event loop turns once (untimed)
   after each stream. Reported: median [95 % CI] and p99 over rounds of (variant - bare) /
   chunks, in microseconds per chunk. On asyncio and on trio.

2. **Against litellm for real, over loopback**: 1,000-token streams (one chunk per token,
   ``itl=0``: sent back to back) from ``latencykit.testing.FakeProvider``, run in a child
   process (in this process its Python would share the GIL with the client being measured).
   litellm's code path is its real one (``CustomStreamWrapper`` over aiohttp).

   a. **asyncio**. Variants: bare ``litellm.acompletion(..., stream=True, max_retries=0,
      timeout=600)`` (the arguments ``lk.LLM`` passes), read and ``aclose()``-d; the same again
      (an A/A control: its difference from the first is the noise floor); bare plus one anyio
      cancel scope around each ``__anext__`` (control, no latencykit code);
      ``lk.guard_stream(<bare litellm stream>, reader=LITELLM_CHUNKS)`` with no limits (the
      Stream wrapper alone); ``lk.LLM(...).acompletion(stream=True)`` with the default guard
      (``StreamGuard()``, whose stall limit is the target's 600 s attempt timeout, so a scope
      is armed for each wait); and ``lk.LLM(..., stream_guard=lk.StreamGuard(stall=30))``.
      Within a round, all variants' streams are open at once (the provider has sent all of
      each before it is read) and are read **in blocks of ``block`` chunks, interleaved block
      by block** in a freshly shuffled order, each block timed on its own, a few untimed loop
      turns after each: drift hits every variant alike within milliseconds. Under every
      variant, litellm's stream is wrapped in a ``TimedSource`` that adds up the time spent
      inside litellm's ``__anext__`` (for ``lk.LLM``, slipped under latencykit's
      ``LitellmChunks`` through private attributes), so each block splits into litellm's code
      and everything above it. Per chunk: median over full blocks of (variant - bare, same
      block round) / block, for the whole block ("added": everything, including any slowdown
      latencykit causes to litellm's own code) and for the time outside litellm's
      ``__anext__`` ("own code": latencykit's code, measured in place; much less noisy).
      Per stream: whole one-token streams (open, read, close) of each variant, interleaved
      stream by stream, paired per round; divided by the 1,000 chunks it is added to the
      per-chunk figures ("total"). litellm's own per-chunk cost is the bare variant's median
      block time per chunk; chunks/s for one stream is 1,000 / the bare stream's own time
      from the call to ``aclose()``. The garbage collector stays on (collecting is part of
      what allocation costs) with the heap that exists after warm-up frozen (a full
      collection of litellm's heap takes ~0.5 s here), and collects between rounds.

   b. **trio**. ``lk.LLM`` on trio runs litellm on an asyncio loop in a thread and hands the
      chunks over through ``BridgedStream`` (a pump buffers them; the trio side takes buffered
      chunks without a timer). The pump reads ahead, so streams cannot be interleaved block by
      block: each round reads one whole stream of each variant in a shuffled order (an
      untimed pause after each), timing from its first chunk to its last. The reference is
      litellm's own cost on the bridge's loop: a bare litellm stream consumed there and awaited
      from trio with ``run_on_asyncio`` (one thread hop per stream). Also reported: the trio
      thread's CPU time per chunk (the bare variant's trio thread only waits). Per stream: as
      in 2a, on trio.

Anomalies (warnings, unraisable exceptions, logged errors, streams that ended other than
"ok", latencykit objects still alive after the run, leftover tasks, what the provider saw)
are collected throughout and printed at the end.

Targets (from the streaming issue): ``lk.LLM`` adds <= 5 us per chunk and <= 3 % of litellm's
own per-chunk cost, at the median; checked for the total and for latencykit's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import gc
import json
import logging
import os
import platform
import random
import statistics
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import trio
from overhead import _ci, _load, _version, bootstrap_ci, percentile, verdict
from provider import provider_process

import latencykit as lk
from latencykit._asyncio_bridge import BridgedStream, run_on_asyncio
from latencykit._litellm import LITELLM_CHUNKS, LitellmChunks

# litellm fetches a model price map from the internet at import unless told not to.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

MODEL = "bench-stream"  # streams ``tokens`` chunks
SHORT_MODEL = "bench-short"  # streams one chunk: per-stream costs
SHORT_TOKENS = 1
MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "Stream."}]
API_KEY = "bench-key-not-secret"
TIMEOUT = 600.0  # what lk.LLM passes to litellm by default (and the default guard's limits)

CHUNK_TARGET_US = 5.0
CHUNK_TARGET_PCT = 3.0

SETTLE_YIELDS = 3  # untimed event-loop turns after each timed segment
OPEN_PAUSE = 0.05  # untimed seconds after opening a stream: the provider sends all of it
ROUND_PAUSE = 0.3  # untimed seconds after each round of 2a (litellm logs streams after they end)
TRIO_PAUSE = 0.2  # untimed seconds after each whole stream on trio
SHORT_PAUSE = 0.005  # untimed seconds after each one-token stream

BOOTSTRAP_RESAMPLES = 300


@dataclass(frozen=True)
class Settings:
    """How much to measure; ``--quick`` shrinks everything."""

    synth_chunks: int
    synth_rounds: int
    synth_warmup: int
    tokens: int
    block: int
    llm_rounds: int
    llm_warmup: int
    trio_rounds: int
    trio_warmup: int
    short_rounds: int
    short_warmup: int


FULL = Settings(
    synth_chunks=1000,
    synth_rounds=100,
    synth_warmup=5,
    tokens=1000,
    block=50,
    llm_rounds=10,
    llm_warmup=1,
    trio_rounds=8,
    trio_warmup=1,
    short_rounds=120,
    short_warmup=10,
)
QUICK = Settings(
    synth_chunks=1000,
    synth_rounds=30,
    synth_warmup=3,
    tokens=1000,
    block=50,
    llm_rounds=2,
    llm_warmup=1,
    trio_rounds=2,
    trio_warmup=1,
    short_rounds=20,
    short_warmup=5,
)


# --- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Median [95 % CI] and p99 of a sample, and its size."""

    median: float
    p99: float
    n: int
    median_ci95: tuple[float, float] | None = None

    @classmethod
    def of(cls, values: Sequence[float], *, ci_seed: int | None = None) -> Summary:
        ci = None
        if ci_seed is not None and len(values) > 1:
            ci = bootstrap_ci(
                len(values), lambda idx: statistics.median([values[i] for i in idx]), ci_seed
            )
        return cls(statistics.median(values), percentile(values, 99.0), len(values), ci)


# --- anomalies ------------------------------------------------------------------------------


@dataclass
class Anomalies:
    """What went wrong or looked wrong while benchmarking (latencykit's side, mostly)."""

    warnings: Counter[str] = field(default_factory=Counter)
    third_party_warnings: Counter[str] = field(default_factory=Counter)
    unraisable: Counter[str] = field(default_factory=Counter)
    log_records: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    chunk_counts: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def stream_ended(self, label: str, stream: lk.Stream[Any], expected_chunks: int) -> None:
        """Record how a latencykit stream ended."""
        self.outcomes[f"{label}: {stream.outcome}"] += 1
        if stream.chunks != expected_chunks:
            self.chunk_counts[f"{label}: {stream.chunks} content chunks"] += 1
        if stream.error is not None:
            self.notes.append(f"{label}: stream error {stream.error!r}")


class _LogCollector(logging.Handler):
    def __init__(self, anomalies: Anomalies) -> None:
        super().__init__(logging.WARNING)
        self._anomalies = anomalies

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().splitlines()[0][:160]
        self._anomalies.log_records[f"{record.name} {record.levelname}: {message}"] += 1


@contextlib.contextmanager
def collecting(anomalies: Anomalies) -> Iterator[None]:
    """Record warnings, unraisable exceptions and WARNING+ log records into ``anomalies``."""
    previous_hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        anomalies.unraisable[f"{info.exc_type.__name__}: {info.exc_value} in {info.object!r}"] += 1

    handler = _LogCollector(anomalies)
    root = logging.getLogger()
    root.addHandler(handler)
    sys.unraisablehook = unraisable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        warnings.simplefilter("always", ResourceWarning)
        warnings.simplefilter("always", RuntimeWarning)
        try:
            yield
        finally:
            gc.collect()  # finalisers of abandoned objects warn now, inside the net
            sys.unraisablehook = previous_hook
            root.removeHandler(handler)
            for w in caught:
                text = f"{w.category.__name__}: {str(w.message)[:160]} ({Path(w.filename).name})"
                ours = "latencykit" in w.filename or w.category in (
                    ResourceWarning,
                    RuntimeWarning,
                )
                (anomalies.warnings if ours else anomalies.third_party_warnings)[text] += 1


def leftovers() -> dict[str, int]:
    """Objects of the streaming machinery still alive (after a collection)."""
    import litellm

    gc.collect()
    kinds: dict[str, type] = {
        "latencykit.Stream": lk.Stream,
        "BridgedStream": BridgedStream,
        "LitellmChunks": LitellmChunks,
        "litellm CustomStreamWrapper": litellm.CustomStreamWrapper,
    }
    counts = dict.fromkeys(kinds, 0)
    for obj in gc.get_objects():
        for name, kind in kinds.items():
            if isinstance(obj, kind):
                counts[name] += 1
    return counts


# --- 1. the Stream wrapper on a synthetic source -------------------------------------------


def build_chunks(n: int) -> list[Any]:
    """``n`` litellm content chunks and a finish chunk, as litellm yields them."""
    from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

    chunks: list[Any] = [
        ModelResponseStream(
            model=MODEL,
            choices=[
                StreamingChoices(index=0, delta=Delta(content=f" tok{i}"), finish_reason=None)
            ],
        )
        for i in range(n)
    ]
    chunks.append(
        ModelResponseStream(
            model=MODEL,
            choices=[StreamingChoices(index=0, delta=Delta(), finish_reason="stop")],
        )
    )
    return chunks


async def synthetic_source(chunks: list[Any]) -> AsyncIterator[Any]:
    """The chunks, one by one, without ever suspending."""
    for chunk in chunks:
        yield chunk


class ScopedEach:
    """``source`` with one cancel scope (deadline ``ahead`` seconds on) around each ``__anext__``:
    the mechanism of a per-chunk timer, without latencykit."""

    def __init__(
        self,
        source: Any,
        now: Callable[[], float],
        scope: Callable[..., Any],
        ahead: float = 30.0,
    ) -> None:
        self._source = source
        self._now = now
        self._scope = scope
        self._ahead = ahead

    def __aiter__(self) -> ScopedEach:
        return self

    async def __anext__(self) -> Any:
        with self._scope(deadline=self._now() + self._ahead):
            return await self._source.__anext__()

    async def aclose(self) -> None:
        await self._source.aclose()


def native_scope() -> tuple[Callable[[], float], Callable[..., Any]]:
    """The clock and cancel scope a per-chunk timer uses on the running backend: anyio's
    scope on asyncio, trio's own on trio (as latencykit does)."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        return trio.current_time, trio.CancelScope
    loop = asyncio.get_running_loop()
    return loop.time, anyio.CancelScope


SYNTH_LABELS = {
    "bare": "bare async generator (absolute us/chunk)",
    "scope_control": "control: 1 cancel scope per chunk",
    "guard": "guard_stream(reader=LITELLM_CHUNKS)",
    "guard_stall": "  same, stall=30",
    "guard_deadline": "  same, inside lk.deadline(60)",
}


def synth_variants(
    chunks: list[Any], anomalies: Anomalies
) -> dict[str, Callable[[], Awaitable[int]]]:
    """One full stream per call; each returns the number of items it saw."""
    content = len(chunks) - 1

    async def bare() -> int:
        n = 0
        async for _ in synthetic_source(chunks):
            n += 1
        return n

    async def scope_control() -> int:
        now, scope = native_scope()
        n = 0
        async for _ in ScopedEach(synthetic_source(chunks), now, scope):
            n += 1
        return n

    async def guarded(label: str, stall: float | None) -> int:
        n = 0
        stream = lk.guard_stream(synthetic_source(chunks), stall=stall, reader=LITELLM_CHUNKS)
        async with stream:
            async for _ in stream:
                n += 1
        if stream.outcome != "ok" or stream.chunks != content:
            anomalies.stream_ended(f"synthetic {label}", stream, content)
        return n

    async def guard() -> int:
        return await guarded("guard", None)

    async def guard_stall() -> int:
        return await guarded("guard stall=30", 30.0)

    async def guard_deadline() -> int:
        seen = 0
        with lk.deadline(60):
            seen = await guarded("guard in deadline", None)
        return seen

    return {
        "bare": bare,
        "scope_control": scope_control,
        "guard": guard,
        "guard_stall": guard_stall,
        "guard_deadline": guard_deadline,
    }


@dataclass
class SynthResult:
    """Per-chunk costs of the Stream wrapper on one backend, in microseconds."""

    backend: str
    rounds: int
    chunks: int
    bare_per_chunk_us: Summary
    reference_us: Summary
    added_per_chunk_us: dict[str, Summary]
    added_in_reference_loops: dict[str, float]
    labels: dict[str, str]


REFERENCE_CALLS = 100  # reference loops timed per round


def reference_loop(x: int) -> int:
    """Fixed pure-Python work, no latencykit: a yardstick of how fast the machine ran
    (the 100-step loop of benchmarks/overhead.py)."""
    total = 0
    for i in range(100):
        total += i * x
    return total


async def _synth_rounds(
    settings: Settings, seed: int, anomalies: Anomalies
) -> dict[str, list[float]]:
    """Per-round us per chunk of each variant, and ``"reference"``: us per reference loop."""
    chunks = build_chunks(settings.synth_chunks)
    variants = synth_variants(chunks, anomalies)
    per_chunk: dict[str, list[float]] = {key: [] for key in [*variants, "reference"]}
    keys = [*variants, "reference"]
    rng = random.Random(seed)
    expected = len(chunks)
    # A full collection of litellm's heap takes ~0.5 s: freeze what exists (the chunks too),
    # so that the collections between rounds only see what the rounds allocated.
    gc.collect()
    gc.freeze()
    try:
        for round_number in range(settings.synth_warmup + settings.synth_rounds):
            rng.shuffle(keys)
            gc.disable()
            timings: dict[str, int] = {}
            for key in keys:
                if key == "reference":
                    start = time.perf_counter_ns()
                    for _ in range(REFERENCE_CALLS):
                        reference_loop(1)
                    timings[key] = time.perf_counter_ns() - start
                    continue
                start = time.perf_counter_ns()
                seen = await variants[key]()
                timings[key] = time.perf_counter_ns() - start
                if seen != expected:
                    anomalies.notes.append(f"synthetic {key}: {seen} items, expected {expected}")
                # The source never suspends: let the loop run once (untimed), as it would
                # between chunks of a real stream, and drop the cancelled timers.
                await anyio.lowlevel.checkpoint()
            gc.enable()
            gc.collect()
            if round_number >= settings.synth_warmup:
                for key, elapsed in timings.items():
                    count = REFERENCE_CALLS if key == "reference" else settings.synth_chunks
                    per_chunk[key].append(elapsed / count / 1000.0)
    finally:
        gc.enable()
        gc.unfreeze()
    return per_chunk


def bench_synthetic(
    backend: str, settings: Settings, seed: int, anomalies: Anomalies
) -> SynthResult:
    """The Stream wrapper over a synthetic source on ``backend`` ("asyncio" or "trio")."""

    async def main() -> dict[str, list[float]]:
        return await _synth_rounds(settings, seed, anomalies)

    per_chunk = asyncio.run(main()) if backend == "asyncio" else trio.run(main)
    bare = per_chunk["bare"]
    reference = per_chunk["reference"]
    added: dict[str, Summary] = {}
    xref: dict[str, float] = {}
    for key, values in per_chunk.items():
        if key in ("bare", "reference"):
            continue
        diffs = [v - b for v, b in zip(values, bare, strict=True)]
        added[key] = Summary.of(diffs, ci_seed=seed)
        xref[key] = statistics.median(d / r for d, r in zip(diffs, reference, strict=True))
    return SynthResult(
        backend=backend,
        rounds=settings.synth_rounds,
        chunks=settings.synth_chunks,
        bare_per_chunk_us=Summary.of(bare),
        reference_us=Summary.of(reference),
        added_per_chunk_us=added,
        added_in_reference_loops=xref,
        labels=dict(SYNTH_LABELS),
    )


# --- 2. against litellm over loopback ------------------------------------------------------

PROVIDER = """
import json, sys
from latencykit.testing import Behavior, FakeProvider
fake = FakeProvider()
fake.script(sys.argv[1], Behavior(output_tokens=int(sys.argv[2]), itl=0.0))
fake.script(sys.argv[3], Behavior(output_tokens=1, itl=0.0))
fake.start()
print(fake.base_url, flush=True)
sys.stdin.read()
attempts = fake.attempts
summary = {
    "requests": len(attempts),
    "completed": sum(a.completed for a in attempts),
    "disconnected": sum(a.disconnected for a in attempts),
    "tokens_sent": sorted({a.tokens_sent for a in attempts}),
    "connections_opened": fake.connections_opened,
    "connections_open_at_end": fake.open_connections,
}
fake.stop()
print(json.dumps(summary), flush=True)
"""


@contextlib.contextmanager
def fake_provider_process(tokens: int, server: dict[str, Any]) -> Iterator[str]:
    """A FakeProvider in a child process: model ``MODEL`` streams ``tokens`` chunks back to
    back, ``SHORT_MODEL`` one. Yields its base URL; on exit, ``server`` receives what the
    provider recorded."""
    output: list[str] = []
    try:
        with provider_process(PROVIDER, MODEL, str(tokens), SHORT_MODEL, output=output) as url:
            yield url
    finally:
        try:
            lines = "".join(output).strip().splitlines()
            if lines:
                server.update(json.loads(lines[-1]))
        except json.JSONDecodeError as exc:
            server["error"] = repr(exc)


def bare_arguments(base_url: str, model: str) -> dict[str, Any]:
    """The arguments lk.LLM hands litellm for a streaming call (and the messages)."""
    return {
        "model": f"openai/{model}",
        "messages": MESSAGES,
        "api_base": base_url,
        "api_key": API_KEY,
        "timeout": TIMEOUT,
        "max_retries": 0,
        "stream": True,
    }


def llm_for(base_url: str, model: str, stall: float | None) -> lk.LLM:
    """``lk.LLM`` on the fake provider: the default guard, or ``StreamGuard(stall=stall)``."""
    guard = None if stall is None else lk.StreamGuard(stall=stall)
    return lk.LLM(f"openai/{model}", api_base=base_url, api_key=API_KEY, stream_guard=guard)


LLM_LABELS = {
    "bare": "bare litellm stream",
    "bare_again": "  the same again (A/A: the noise floor)",
    "scope_control": "  + 1 anyio cancel scope per chunk (control)",
    "guard": "guard_stream(litellm stream), no limits",
    "llm_default": "lk.LLM stream, default guard",
    "llm_stall30": "lk.LLM stream, StreamGuard(stall=30)",
}
TRIO_LABELS = {
    "bare": "bare litellm stream on the bridge loop",
    "llm_default": "lk.LLM stream on trio, default guard",
    "llm_stall30": "lk.LLM stream on trio, StreamGuard(stall=30)",
}


class TimedSource:
    """A litellm stream that adds up the time spent inside its own ``__anext__``: litellm's
    share of each chunk, measured in place (everything else forwards to it)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.inside_ns = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __aiter__(self) -> TimedSource:
        return self

    async def __anext__(self) -> Any:
        start = time.perf_counter_ns()
        try:
            return await self.inner.__anext__()
        finally:
            self.inside_ns += time.perf_counter_ns() - start

    async def aclose(self) -> None:
        await self.inner.aclose()


def _timed_llm_source(stream: lk.Stream[Any]) -> TimedSource:
    """Put a :class:`TimedSource` under an ``lk.LLM`` stream, between latencykit's
    ``LitellmChunks`` and litellm's ``CustomStreamWrapper`` (private attributes: fails loudly
    if their layout changes)."""
    source = getattr(stream, "_source", None)
    if not isinstance(source, LitellmChunks) or source._wrapper is None:
        raise RuntimeError(f"unexpected lk.LLM stream layout: {source!r}")
    timed = TimedSource(source._wrapper)
    source._wrapper = timed
    return timed


Opened = tuple[Any, TimedSource]
"""A stream (an async iterator with ``aclose``) and the timed litellm stream under it."""
Opener = Callable[[], Awaitable[Opened]]


def asyncio_openers(base_url: str, model: str) -> dict[str, Opener]:
    """Each opens a stream of one variant, on asyncio, with a TimedSource under it."""
    import litellm

    arguments = bare_arguments(base_url, model)
    llm_default = llm_for(base_url, model, None)
    llm_stall = llm_for(base_url, model, 30.0)

    async def bare() -> Opened:
        timed = TimedSource(await litellm.acompletion(**arguments))
        return timed, timed

    async def scope_control() -> Opened:
        now, scope = native_scope()
        timed = TimedSource(await litellm.acompletion(**arguments))
        return ScopedEach(timed, now, scope), timed

    async def guard() -> Opened:
        timed = TimedSource(await litellm.acompletion(**arguments))
        return lk.guard_stream(timed, reader=LITELLM_CHUNKS), timed

    async def through(llm: lk.LLM) -> Opened:
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        return stream, _timed_llm_source(stream)

    return {
        "bare": bare,
        "bare_again": bare,
        "scope_control": scope_control,
        "guard": guard,
        "llm_default": functools.partial(through, llm_default),
        "llm_stall30": functools.partial(through, llm_stall),
    }


async def _settle(yields: int = SETTLE_YIELDS) -> None:
    for _ in range(yields):
        await anyio.lowlevel.checkpoint()


# 2a, per chunk: blocks interleaved across concurrent streams


@dataclass
class _Reading:
    """One variant's stream in a round of 2a."""

    iterator: Any
    timed: TimedSource
    items: int = 1
    own_ns: int = 0
    done: bool = False
    outer: list[float] = field(default_factory=list)  # us per chunk of each full block
    inner: list[float] = field(default_factory=list)  # of which inside litellm's __anext__


async def _read_block(iterator: Any, block: int) -> tuple[int, bool]:
    """Read up to ``block`` items (and close the stream if it ends); items read, ended."""
    n = 0
    try:
        while n < block:
            await iterator.__anext__()
            n += 1
    except StopAsyncIteration:
        await iterator.aclose()
        return n, True
    return n, False


@dataclass
class _Blocks:
    """One round of 2a: per variant, aligned per-block samples in us per chunk."""

    outer: dict[str, list[float]]
    inner: dict[str, list[float]]
    own_ms: dict[str, float]


async def _block_round(
    openers: dict[str, Opener], settings: Settings, rng: random.Random, anomalies: Anomalies
) -> _Blocks:
    """One round: every variant's stream open at once, read block by block in shuffled order.

    Keeps the blocks of block rounds where every variant read a full block, and each stream's
    own time in ms (open + blocks + end)."""
    keys = list(openers)
    rng.shuffle(keys)
    readings: dict[str, _Reading] = {}
    try:
        for key in keys:
            start = time.perf_counter_ns()
            iterator, timed = await openers[key]()
            await iterator.__anext__()
            readings[key] = _Reading(iterator, timed, own_ns=time.perf_counter_ns() - start)
            await _settle()
            await asyncio.sleep(OPEN_PAUSE)  # untimed: the provider sends the whole stream
        while not all(r.done for r in readings.values()):
            rng.shuffle(keys)
            full: dict[str, tuple[float, float]] = {}
            for key in keys:
                reading = readings[key]
                if reading.done:
                    continue
                inside = reading.timed.inside_ns
                start = time.perf_counter_ns()
                n, ended = await _read_block(reading.iterator, settings.block)
                elapsed = time.perf_counter_ns() - start
                inside = reading.timed.inside_ns - inside
                reading.items += n
                reading.own_ns += elapsed
                if ended:
                    reading.done = True
                else:
                    full[key] = (elapsed / n / 1000.0, inside / n / 1000.0)
                await _settle()
            if len(full) == len(keys):
                for key, (outer, inner) in full.items():
                    readings[key].outer.append(outer)
                    readings[key].inner.append(inner)
    finally:
        for reading in readings.values():
            if not reading.done:
                await reading.iterator.aclose()
    expected = settings.tokens + 1  # the content chunks and the finish chunk
    for key, reading in readings.items():
        if reading.items != expected:
            anomalies.notes.append(f"asyncio {key}: {reading.items} items, expected {expected}")
        if isinstance(reading.iterator, lk.Stream):
            anomalies.stream_ended(f"asyncio {key}", reading.iterator, settings.tokens)
    return _Blocks(
        outer={k: r.outer for k, r in readings.items()},
        inner={k: r.inner for k, r in readings.items()},
        own_ms={k: r.own_ns / 1e6 for k, r in readings.items()},
    )


# 2a and 2b, per stream: whole one-token streams, interleaved stream by stream

StreamRun = Callable[[], Awaitable[int]]


async def _short_rounds(
    runs: dict[str, StreamRun], rounds: int, warmup: int, seed: int, anomalies: Anomalies
) -> dict[str, list[float]]:
    """Microseconds per whole one-token stream (open, read, close) of each variant, per round."""
    rng = random.Random(seed)
    keys = list(runs)
    per_stream: dict[str, list[float]] = {key: [] for key in runs}
    for round_number in range(warmup + rounds):
        rng.shuffle(keys)
        for key in keys:
            start = time.perf_counter_ns()
            seen = await runs[key]()
            elapsed = time.perf_counter_ns() - start
            if seen != 2:
                anomalies.notes.append(f"one-token {key}: {seen} items, expected 2")
            if round_number >= warmup:
                per_stream[key].append(elapsed / 1000.0)
            await anyio.sleep(SHORT_PAUSE)  # untimed: litellm logs the stream in the background
        if round_number == warmup - 1:
            gc.collect()
            gc.freeze()
    return per_stream


async def _whole(
    open_stream: Callable[[], Awaitable[Any]], label: str, anomalies: Anomalies, tokens: int
) -> int:
    """Open a stream, read it to its end and close it; the items read."""
    iterator = await open_stream()
    n = 0
    try:
        async for _ in iterator:
            n += 1
    finally:
        await iterator.aclose()
    if isinstance(iterator, lk.Stream) and (iterator.outcome != "ok" or iterator.chunks != tokens):
        anomalies.stream_ended(label, iterator, tokens)
    return n


@dataclass
class LLMResult:
    """Costs against bare litellm over loopback, on one backend (us unless named)."""

    backend: str
    method: str
    rounds: int
    tokens: int
    samples: int
    bare_per_chunk_us: float
    bare_per_chunk_ci95: tuple[float, float] | None
    bare_stream_ms: float
    bare_chunks_per_s: float
    per_chunk_us: dict[str, float]
    added_per_chunk_us: dict[str, Summary]
    short_rounds: int
    bare_short_stream_us: float
    added_per_stream_us: dict[str, Summary]
    added_total_per_chunk_us: dict[str, float]
    added_total_ci95: dict[str, tuple[float, float]]
    pct_of_litellm: dict[str, float]
    pct_ci95: dict[str, tuple[float, float]]
    labels: dict[str, str]
    # asyncio: time outside litellm's __anext__ (latencykit's own code), and inside it
    own_code_added_us: dict[str, Summary] = field(default_factory=dict)
    own_code_pct: dict[str, float] = field(default_factory=dict)
    own_code_pct_ci95: dict[str, tuple[float, float]] = field(default_factory=dict)
    litellm_code_delta_us: dict[str, Summary] = field(default_factory=dict)
    # trio: CPU time of the trio thread per chunk
    caller_thread_cpu_per_chunk_us: dict[str, float] = field(default_factory=dict)
    caller_thread_cpu_added_us: dict[str, Summary] = field(default_factory=dict)


Samples = list[dict[str, list[float]]]
"""Per round, per variant: aligned us-per-chunk samples (blocks, or one whole stream)."""


def _paired(
    samples: Samples, key: str, seed: int, *, baseline: Samples | None = None
) -> tuple[Summary, Callable[[Sequence[int]], float]]:
    """Median [CI, rounds resampled] and p99 of ``samples[key] - baseline["bare"]`` (same
    round, same block), and the median as a function of the resampled rounds."""
    base = samples if baseline is None else baseline

    def diffs(idx: Sequence[int]) -> list[float]:
        return [v - b for i in idx for v, b in zip(samples[i][key], base[i]["bare"], strict=True)]

    def median_of(idx: Sequence[int]) -> float:
        return statistics.median(diffs(idx))

    everything = diffs(range(len(samples)))
    ci = bootstrap_ci(len(samples), median_of, seed) if len(samples) > 1 else None
    return Summary(
        statistics.median(everything), percentile(everything, 99.0), len(everything), ci
    ), median_of


def _summarise(
    backend: str,
    method: str,
    settings: Settings,
    seed: int,
    outer: Samples,
    whole_bare_ms: list[float],
    short: dict[str, list[float]],
    labels: dict[str, str],
    inner: Samples | None = None,
) -> LLMResult:
    """Per-chunk figures from ``outer`` (and, with ``inner``, the split between latencykit's
    code and litellm's), per-stream figures from ``short`` (one-token streams)."""
    n_rounds = len(outer)
    tokens = settings.tokens

    def bare_samples(idx: Sequence[int]) -> list[float]:
        return [b for i in idx for b in outer[i]["bare"]]

    def bare_median(idx: Sequence[int]) -> float:
        return statistics.median(bare_samples(idx))

    can_ci = n_rounds > 1
    everything = range(n_rounds)
    bare = bare_median(everything)
    own: Samples | None = None
    if inner is not None:
        own = [
            {k: [o - i for o, i in zip(r[k], ri[k], strict=True)] for k in r}
            for r, ri in zip(outer, inner, strict=True)
        ]
    short_bare = short["bare"]
    result = LLMResult(
        backend=backend,
        method=method,
        rounds=n_rounds,
        tokens=tokens,
        samples=len(bare_samples(everything)),
        bare_per_chunk_us=bare,
        bare_per_chunk_ci95=bootstrap_ci(n_rounds, bare_median, seed) if can_ci else None,
        bare_stream_ms=statistics.median(whole_bare_ms),
        bare_chunks_per_s=tokens / (statistics.median(whole_bare_ms) / 1000.0),
        per_chunk_us={k: statistics.median(v for r in outer for v in r[k]) for k in labels},
        added_per_chunk_us={},
        short_rounds=len(short_bare),
        bare_short_stream_us=statistics.median(short_bare),
        added_per_stream_us={},
        added_total_per_chunk_us={},
        added_total_ci95={},
        pct_of_litellm={},
        pct_ci95={},
        labels=dict(labels),
    )
    for key in labels:
        if key == "bare":
            continue
        per_stream = short.get(key, short["bare"])  # the A/A variant has no one-token run
        result.added_per_stream_us[key] = Summary.of(
            [v - b for v, b in zip(per_stream, short_bare, strict=True)], ci_seed=seed
        )
        amortised = result.added_per_stream_us[key].median / tokens
        added, median_of = _paired(outer, key, seed)
        result.added_per_chunk_us[key] = added
        result.added_total_per_chunk_us[key] = added.median + amortised
        result.pct_of_litellm[key] = 100.0 * (added.median + amortised) / bare
        if added.median_ci95 is not None:
            low, high = added.median_ci95
            result.added_total_ci95[key] = (low + amortised, high + amortised)

            def pct_of(
                idx: Sequence[int],
                median_of: Callable[[Sequence[int]], float] = median_of,
                amortised: float = amortised,
            ) -> float:
                return 100.0 * (median_of(idx) + amortised) / bare_median(idx)

            result.pct_ci95[key] = bootstrap_ci(n_rounds, pct_of, seed)
        if own is not None and inner is not None:
            own_added, own_median_of = _paired(own, key, seed)
            result.own_code_added_us[key] = own_added
            result.own_code_pct[key] = 100.0 * (own_added.median + amortised) / bare
            if can_ci:

                def own_pct_of(
                    idx: Sequence[int],
                    own_median_of: Callable[[Sequence[int]], float] = own_median_of,
                    amortised: float = amortised,
                ) -> float:
                    return 100.0 * (own_median_of(idx) + amortised) / bare_median(idx)

                result.own_code_pct_ci95[key] = bootstrap_ci(n_rounds, own_pct_of, seed)
            result.litellm_code_delta_us[key] = _paired(inner, key, seed)[0]
    return result


def bench_llm_asyncio(
    base_url: str, settings: Settings, seed: int, anomalies: Anomalies
) -> LLMResult:
    """2a: per chunk (blocks interleaved across concurrent streams) and per stream, asyncio."""

    async def main() -> tuple[Samples, Samples, list[float], dict[str, list[float]]]:
        openers = asyncio_openers(base_url, MODEL)
        rng = random.Random(seed)
        outer: Samples = []
        inner: Samples = []
        whole_bare: list[float] = []
        total = settings.llm_warmup + settings.llm_rounds
        try:
            for round_number in range(total):
                blocks = await _block_round(openers, settings, rng, anomalies)
                await asyncio.sleep(ROUND_PAUSE)  # untimed: litellm's end-of-stream logging
                if round_number == settings.llm_warmup - 1:
                    gc.collect()
                    gc.freeze()  # keep full collections of litellm's heap out of the blocks
                gc.collect()
                if round_number >= settings.llm_warmup:
                    outer.append(blocks.outer)
                    inner.append(blocks.inner)
                    whole_bare.append(blocks.own_ms["bare"])
                progress(f"  asyncio round {round_number + 1}/{total}")
        finally:
            gc.unfreeze()
        progress("  asyncio one-token streams ...")
        short_openers = asyncio_openers(base_url, SHORT_MODEL)
        del short_openers["bare_again"]

        def first(opener: Opener) -> Callable[[], Awaitable[Any]]:
            async def open_stream() -> Any:
                return (await opener())[0]

            return open_stream

        runs: dict[str, StreamRun] = {
            key: functools.partial(
                _whole, first(opener), f"asyncio one-token {key}", anomalies, SHORT_TOKENS
            )
            for key, opener in short_openers.items()
        }
        try:
            short = await _short_rounds(
                runs, settings.short_rounds, settings.short_warmup, seed, anomalies
            )
        finally:
            gc.unfreeze()
        await asyncio.sleep(0.5)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if left:
            names = sorted({t.get_coro().__qualname__ for t in left})  # type: ignore[union-attr]
            anomalies.notes.append(
                f"asyncio: {len(left)} tasks still pending at the end: {', '.join(names)}"
            )
        return outer, inner, whole_bare, short

    outer, inner, whole_bare, short = asyncio.run(main())
    return _summarise(
        "asyncio",
        f"blocks of {settings.block} chunks interleaved across concurrent streams",
        settings,
        seed,
        outer,
        whole_bare,
        short,
        LLM_LABELS,
        inner=inner,
    )


async def _consume_on_asyncio(arguments: dict[str, Any]) -> tuple[int, int, int]:
    """A bare litellm stream read to its end and closed (on the bridge's asyncio loop):
    ``(items, ns from the first item to the last, ns for all of it)``."""
    import litellm

    start = time.perf_counter_ns()
    stream = await litellm.acompletion(**arguments)
    n = 0
    first = last = 0
    try:
        async for _ in stream:
            last = time.perf_counter_ns()
            if n == 0:
                first = last
            n += 1
    finally:
        await stream.aclose()
    return n, last - first, time.perf_counter_ns() - start


def bench_llm_trio(base_url: str, settings: Settings, seed: int, anomalies: Anomalies) -> LLMResult:
    """2b: whole streams interleaved round by round (per chunk), and per stream, on trio."""
    arguments = bare_arguments(base_url, MODEL)
    llms = {
        "llm_default": llm_for(base_url, MODEL, None),
        "llm_stall30": llm_for(base_url, MODEL, 30.0),
    }

    async def bare() -> tuple[int, int, int]:
        return await run_on_asyncio(_consume_on_asyncio(arguments))

    async def through(key: str) -> tuple[int, int, int]:
        start = time.perf_counter_ns()
        stream = await llms[key].acompletion(messages=MESSAGES, stream=True)
        n = 0
        first = last = 0
        async with stream:
            async for _ in stream:
                last = time.perf_counter_ns()
                if n == 0:
                    first = last
                n += 1
        anomalies.stream_ended(f"trio {key}", stream, settings.tokens)
        return n, last - first, time.perf_counter_ns() - start

    variants: dict[str, Callable[[], Awaitable[tuple[int, int, int]]]] = {
        "bare": bare,
        "llm_default": functools.partial(through, "llm_default"),
        "llm_stall30": functools.partial(through, "llm_stall30"),
    }
    cpu: dict[str, list[float]] = {key: [] for key in variants}

    short_arguments = bare_arguments(base_url, SHORT_MODEL)
    short_llms = {
        k: llm_for(base_url, SHORT_MODEL, s)
        for k, s in (("llm_default", None), ("llm_stall30", 30.0))
    }

    async def short_bare() -> int:
        return (await run_on_asyncio(_consume_on_asyncio(short_arguments)))[0]

    async def short_llm(key: str) -> int:
        async def opener() -> Any:
            return await short_llms[key].acompletion(messages=MESSAGES, stream=True)

        return await _whole(opener, f"trio one-token {key}", anomalies, SHORT_TOKENS)

    short_runs: dict[str, StreamRun] = {
        "bare": short_bare,
        "llm_default": functools.partial(short_llm, "llm_default"),
        "llm_stall30": functools.partial(short_llm, "llm_stall30"),
    }

    async def main() -> tuple[list[dict[str, list[float]]], list[float], dict[str, list[float]]]:
        rng = random.Random(seed)
        keys = list(variants)
        samples: list[dict[str, list[float]]] = []
        whole_bare: list[float] = []
        bare_ms = 0.0
        expected = settings.tokens + 1
        total = settings.trio_warmup + settings.trio_rounds
        try:
            for round_number in range(total):
                rng.shuffle(keys)
                body: dict[str, list[float]] = {}
                for key in keys:
                    start_cpu = time.thread_time_ns()
                    seen, body_ns, whole_ns = await variants[key]()
                    elapsed_cpu = time.thread_time_ns() - start_cpu
                    if seen != expected:
                        anomalies.notes.append(f"trio {key}: {seen} items, expected {expected}")
                    body[key] = [body_ns / 1000.0 / settings.tokens]
                    if key == "bare":
                        bare_ms = whole_ns / 1e6
                    if round_number >= settings.trio_warmup:
                        cpu[key].append(elapsed_cpu / 1000.0 / settings.tokens)
                    await trio.sleep(TRIO_PAUSE)  # untimed: litellm's end-of-stream logging
                if round_number == settings.trio_warmup - 1:
                    gc.collect()
                    gc.freeze()
                gc.collect()
                if round_number >= settings.trio_warmup:
                    samples.append(body)
                    whole_bare.append(bare_ms)
                progress(f"  trio round {round_number + 1}/{total}")
        finally:
            gc.unfreeze()
        progress("  trio one-token streams ...")
        try:
            short = await _short_rounds(
                short_runs, settings.short_rounds, settings.short_warmup, seed, anomalies
            )
        finally:
            gc.unfreeze()
        await trio.sleep(0.5)
        return samples, whole_bare, short

    samples, whole_bare, short = trio.run(main)
    _bridge_tasks(anomalies)
    result = _summarise(
        "trio",
        "whole streams (first to last chunk), one of each variant per round, shuffled",
        settings,
        seed,
        samples,
        whole_bare,
        short,
        TRIO_LABELS,
    )
    result.caller_thread_cpu_per_chunk_us = {k: statistics.median(v) for k, v in cpu.items()}
    result.caller_thread_cpu_added_us = {
        k: Summary.of([v - b for v, b in zip(values, cpu["bare"], strict=True)], ci_seed=seed)
        for k, values in cpu.items()
        if k != "bare"
    }
    return result


def _bridge_tasks(anomalies: Anomalies) -> None:
    """Tasks still pending on the bridge's asyncio loop (there should be none)."""
    from latencykit import _asyncio_bridge

    loop = _asyncio_bridge._loop
    if loop is None or loop.is_closed():
        return

    async def pending() -> list[str]:
        await asyncio.sleep(0.2)
        me = asyncio.current_task()
        return sorted(
            t.get_coro().__qualname__  # type: ignore[union-attr]
            for t in asyncio.all_tasks()
            if t is not me
        )

    left = asyncio.run_coroutine_threadsafe(pending(), loop).result(timeout=10)
    if left:
        anomalies.notes.append(
            f"bridge loop: {len(left)} tasks still pending after the trio run: "
            + ", ".join(sorted(set(left)))
        )


# --- report ---------------------------------------------------------------------------------


def targets(llms: Sequence[LLMResult]) -> list[dict[str, Any]]:
    """Each target, its measured value (95 % CI) and the verdict, per lk.LLM variant."""
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float, ci: Any, unit: str, limit: float) -> None:
        checks.append(
            {
                "name": name,
                "value": round(value, 2),
                "ci95": ci,
                "unit": unit,
                "target": f"<= {limit:g} {unit}",
                "limit": limit,
                "pass": value <= limit,
            }
        )

    for llm in llms:
        for key in ("llm_default", "llm_stall30"):
            if key not in llm.added_total_per_chunk_us:
                continue
            name = f"{llm.labels[key].strip()} ({llm.backend})"
            total = llm.added_total_per_chunk_us[key]
            check(
                f"{name}: added per chunk, total",
                total,
                llm.added_total_ci95.get(key),
                "us",
                CHUNK_TARGET_US,
            )
            check(
                f"{name}: added per chunk, % of litellm's",
                llm.pct_of_litellm[key],
                llm.pct_ci95.get(key),
                "%",
                CHUNK_TARGET_PCT,
            )
            if key in llm.caller_thread_cpu_added_us:
                cpu = llm.caller_thread_cpu_added_us[key]
                amortised = llm.added_per_stream_us[key].median / llm.tokens
                ci = cpu.median_ci95
                value = cpu.median + amortised
                check(
                    f"{name}: trio thread CPU per chunk (latencykit's trio side)",
                    value,
                    None if ci is None else (ci[0] + amortised, ci[1] + amortised),
                    "us",
                    CHUNK_TARGET_US,
                )
                check(
                    f"{name}: trio thread CPU, % of litellm's",
                    100.0 * value / llm.bare_per_chunk_us,
                    None
                    if ci is None
                    else tuple(100.0 * (c + amortised) / llm.bare_per_chunk_us for c in ci),
                    "%",
                    CHUNK_TARGET_PCT,
                )
            if key in llm.own_code_added_us:
                own = llm.own_code_added_us[key]
                amortised = llm.added_per_stream_us[key].median / llm.tokens
                ci = own.median_ci95
                check(
                    f"{name}: latencykit's own code per chunk",
                    own.median + amortised,
                    None if ci is None else (ci[0] + amortised, ci[1] + amortised),
                    "us",
                    CHUNK_TARGET_US,
                )
                check(
                    f"{name}: latencykit's own code, % of litellm's",
                    llm.own_code_pct[key],
                    llm.own_code_pct_ci95.get(key),
                    "%",
                    CHUNK_TARGET_PCT,
                )
    return checks


def render(
    meta: Mapping[str, Any],
    synths: Sequence[SynthResult],
    llms: Sequence[LLMResult],
    checks: Sequence[Mapping[str, Any]],
    anomalies: Anomalies,
    server: Mapping[str, Any],
    alive: Mapping[str, int],
) -> str:
    """The human-readable report."""
    lines: list[str] = []
    add = lines.append
    add(
        f"latencykit {meta['latencykit']} streaming benchmark, {meta['date']}, {meta['mode']} "
        f"run: Python {meta['python']}, litellm {meta['litellm']}, anyio {meta['anyio']}, "
        f"trio {meta['trio']}, {meta['cpus']} CPUs"
    )
    add(f"load average (1 min) at start {meta['load_start']}, at end {meta['load_end']}")
    add("")

    if synths:
        first = synths[0]
        add(
            f"1. Stream wrapper on a synthetic source: {first.chunks} prebuilt litellm chunks per "
            "stream from a non-suspending async generator;"
        )
        add(
            f"   us per chunk added over the bare generator, paired per round ({first.rounds} "
            "rounds, variants shuffled); median [95% CI], p99;"
        )
        add(
            "   xref = median of added / machine-speed loop in the same round (comparable across "
            "runs)"
        )
        header = f"   {'variant':<42}"
        for result in synths:
            header += f" | {result.backend + ' median':>14} {'95% CI':>14} {'p99':>6} {'xref':>5}"
        add(header)
        add("   " + "-" * (len(header) - 3))
        absolute = (
            ("bare", "bare async generator (absolute us/chunk)"),
            ("reference", "machine speed: 100-step loop, abs us"),
        )
        for key, label in absolute:
            row = f"   {label:<42}"
            for result in synths:
                s = result.bare_per_chunk_us if key == "bare" else result.reference_us
                row += f" | {s.median:>14.2f} {'':>14} {s.p99:>6.2f} {'':>5}"
            add(row)
        for key, label in first.labels.items():
            if key == "bare":
                continue
            row = f"   {label:<42}"
            for result in synths:
                s = result.added_per_chunk_us[key]
                row += (
                    f" | {s.median:>+14.2f} {_ci(s.median_ci95, '.2f'):>14} {s.p99:>+6.1f}"
                    f" {result.added_in_reference_loops[key]:>5.2f}"
                )
            add(row)
        add("")

    for llm in llms:
        part = "a" if llm.backend == "asyncio" else "b"
        add(
            f"2{part}. {llm.tokens}-chunk streams from the fake provider (child process) "
            f"over loopback, {llm.backend}: {llm.rounds} rounds, {llm.method}"
        )
        bare_ci = _ci(llm.bare_per_chunk_ci95, ".0f")
        add(
            f"   litellm's own cost: {llm.bare_per_chunk_us:.0f} us per chunk {bare_ci} "
            f"(= {1e6 / llm.bare_per_chunk_us:,.0f} chunks/s); one whole bare stream, open to "
            f"close, {llm.bare_stream_ms:.0f} ms = {llm.bare_chunks_per_s:,.0f} chunks/s"
        )
        if llm.backend == "asyncio":
            add(
                "   us/chunk = median of full blocks; added = median of (variant - bare) over "
                f"{llm.samples} paired blocks [95% CI, rounds resampled];"
            )
            add(
                "   own code = the same for the time outside litellm's __anext__ (latencykit's "
                "code, or the control's); litellm = inside it"
            )
        else:
            add(
                "   us/chunk = median over rounds of (first to last chunk) / chunks; added = "
                f"median of (variant - bare) over {llm.samples} paired streams [95% CI];"
            )
            add(
                "   trio cpu = CPU time of the trio thread per chunk, whole stream (the rest "
                "runs on the bridge's asyncio thread)"
            )
        add(
            f"   per stream = median of (variant - bare) over {llm.short_rounds} interleaved "
            f"one-token streams, open to close (bare: {llm.bare_short_stream_us / 1000:.2f} ms);"
        )
        add(
            f"   total = added + per stream / {llm.tokens}; % = total / litellm's own per-chunk "
            "cost (own code %: own code + per stream / chunks)"
        )
        asyncio_mode = llm.backend == "asyncio"
        header = f"   {'variant':<44} | {'us/chunk':>8}"
        header += " | own code      95% CI | litellm" if asyncio_mode else f" {'trio cpu':>8}"
        header += (
            f" | {'added':>6} {'95% CI':>14} | {'per stream':>10} {'95% CI':>14} | "
            f"{'total':>6} {'95% CI':>14} | {'% of litellm':>12} {'95% CI':>12}"
        )
        if asyncio_mode:
            header += f" | {'own %':>6}"
        add(header)
        add("   " + "-" * (len(header) - 3))
        for key, label in llm.labels.items():
            row = f"   {label:<44} | {llm.per_chunk_us[key]:>8.1f}"
            if not asyncio_mode:
                row += f" {llm.caller_thread_cpu_per_chunk_us[key]:>8.1f}"
            if key == "bare":
                add(row)
                continue
            if asyncio_mode:
                o = llm.own_code_added_us[key]
                d = llm.litellm_code_delta_us[key]
                row += f" | {o.median:>+8.1f} {_ci(o.median_ci95, '.1f'):>11} | {d.median:>+7.1f}"
            a = llm.added_per_chunk_us[key]
            f = llm.added_per_stream_us[key]
            total_ci = _ci(llm.added_total_ci95.get(key), ".1f")
            per_stream = (
                f"{'':>10} {'':>14}"  # the A/A variant has no one-token run of its own
                if key == "bare_again"
                else f"{f.median:>+8.0f}us {_ci(f.median_ci95, '.0f'):>14}"
            )
            row += (
                f" | {a.median:>+6.1f} {_ci(a.median_ci95, '.1f'):>14}"
                f" | {per_stream}"
                f" | {llm.added_total_per_chunk_us[key]:>+6.1f} {total_ci:>14}"
                f" | {llm.pct_of_litellm[key]:>+11.1f}% {_ci(llm.pct_ci95.get(key), '.1f'):>12}"
            )
            if asyncio_mode:
                row += f" | {llm.own_code_pct[key]:>+5.1f}%"
            add(row)
        add("")

    add("Targets (lk.LLM streams: <= 5 us per chunk and <= 3 % of litellm's per-chunk cost)")
    for check in checks:
        shown = f"{check['value']} {check['unit']}".strip()
        ci = check["ci95"]
        note = ""
        if ci is not None:
            shown += f" (95% CI {ci[0]:.1f} to {ci[1]:.1f})"
            if ci[0] <= check["limit"] <= ci[1]:
                note = " (inconclusive: the 95% CI includes the target)"
        add(
            f"   {verdict(bool(check['pass']))}  {check['name']}: {shown}; target "
            f"{check['target']}{note}"
        )
    add("")

    add("Anomalies")
    found = False
    for title, counter in (
        ("warning", anomalies.warnings),
        ("unraisable", anomalies.unraisable),
        ("log", anomalies.log_records),
        ("chunk count", anomalies.chunk_counts),
    ):
        for text, count in counter.most_common():
            add(f"   {title} x{count}: {text}")
            found = True
    for note in anomalies.notes[:20]:
        add(f"   note: {note}")
        found = True
    if len(anomalies.notes) > 20:
        add(f"   ... and {len(anomalies.notes) - 20} more notes")
    if any(not key.endswith(": ok") for key in anomalies.outcomes):
        found = True
    outcomes = ", ".join(f"{k} x{v}" for k, v in sorted(anomalies.outcomes.items()))
    add(f"   latencykit stream outcomes: {outcomes or 'none recorded'}")
    add(f"   alive after the run (after gc): {', '.join(f'{k} {v}' for k, v in alive.items())}")
    if any(alive.values()):
        found = True
    add(
        f"   fake provider: {json.dumps(dict(server))} (connections open at the end: litellm's "
        "pooled keep-alive connections)"
    )
    if (
        server.get("disconnected")
        or server.get("error")
        or server.get("completed") != server.get("requests")
    ):
        found = True
    third = sum(anomalies.third_party_warnings.values())
    if third:
        add(
            f"   ({third} warnings from third-party code, e.g. "
            f"{next(iter(anomalies.third_party_warnings))})"
        )
    add(f"   {'see above' if found else 'none found'}")
    return "\n".join(line.rstrip() for line in lines)


_started = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _started:5.1f} s] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, for smoke tests")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write results as JSON")
    parser.add_argument("--seed", type=int, default=20261123, help="shuffle seed")
    parser.add_argument(
        "--skip",
        choices=("synthetic", "asyncio", "trio"),
        action="append",
        default=[],
        help="leave a section out (repeatable)",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL

    import litellm

    litellm.suppress_debug_info = True
    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "mode": "quick" if args.quick else "full",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "latencykit": lk.__version__,
        "litellm": _version("litellm"),
        "anyio": _version("anyio"),
        "trio": _version("trio"),
        "settings": asdict(settings),
        "load_start": _load(),
    }
    anomalies = Anomalies()
    sections: dict[str, float] = {}
    synths: list[SynthResult] = []
    llms: list[LLMResult] = []
    server: dict[str, Any] = {}
    with collecting(anomalies):
        if "synthetic" not in args.skip:
            for backend in ("asyncio", "trio"):
                progress(f"Stream wrapper on a synthetic source, {backend} ...")
                begin = time.perf_counter()
                synths.append(bench_synthetic(backend, settings, args.seed, anomalies))
                sections[f"synthetic_{backend}"] = round(time.perf_counter() - begin, 1)
        with fake_provider_process(settings.tokens, server) as base_url:
            if "asyncio" not in args.skip:
                progress("litellm streams over loopback, asyncio ...")
                begin = time.perf_counter()
                llms.append(bench_llm_asyncio(base_url, settings, args.seed, anomalies))
                sections["llm_asyncio"] = round(time.perf_counter() - begin, 1)
            if "trio" not in args.skip:
                progress("litellm streams over loopback, trio ...")
                begin = time.perf_counter()
                llms.append(bench_llm_trio(base_url, settings, args.seed, anomalies))
                sections["llm_trio"] = round(time.perf_counter() - begin, 1)
    from latencykit import _cancel

    if _cancel._detached:
        anomalies.notes.append(f"{len(_cancel._detached)} background tasks still pending")
    alive = leftovers()
    threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    meta["threads_at_end"] = threads
    meta["section_seconds"] = sections
    meta["load_end"] = _load()
    meta["elapsed_s"] = round(time.perf_counter() - _started, 1)
    checks = targets(llms)

    print(render(meta, synths, llms, checks, anomalies, server, alive))
    timing = ", ".join(f"{name} {seconds} s" for name, seconds in sections.items())
    print(f"\n(took {meta['elapsed_s']} s: {timing}; threads at the end: {', '.join(threads)})")
    if args.json is not None:
        payload = {
            "meta": meta,
            "synthetic": [asdict(result) for result in synths],
            "llm": [asdict(result) for result in llms],
            "targets": checks,
            "anomalies": {
                "warnings": dict(anomalies.warnings),
                "third_party_warnings": dict(anomalies.third_party_warnings),
                "unraisable": dict(anomalies.unraisable),
                "log_records": dict(anomalies.log_records),
                "outcomes": dict(anomalies.outcomes),
                "notes": anomalies.notes,
                "alive": dict(alive),
                "server": dict(server),
            },
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
