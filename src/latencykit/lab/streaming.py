"""The lab's streaming scenario: time to first token, bare and guarded, and stalls recovered.

The primary replays the heavy-tailed llmperf run as streams (its time to first token is what the
user waits for); every row sends the same requests:

* ``litellm.acompletion(stream=True)`` as most apps call it;
* ``lk.LLM`` with ``StreamGuard(first_token=...)`` and a failover target: a first token that is
  late moves the call to the backup (the cheap, light-tailed model);
* ``lk.LLM`` with ``Hedge(quantile(q))``: a backup attempt after the target's recent TTFT
  quantile, the first content chunk wins.

Then stalls: streams of which one in five stalls for good after three chunks, read bare (they
hang until the lab gives up on them) and through ``StreamGuard(stall=..., on_break="continue")``
(the break is detected and the answer continued from another attempt, checked against what was
already delivered).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

import latencykit as lk

from .._asyncio_bridge import run_on_asyncio
from ..testing import Behavior, FakeProvider, Fault, LlmperfProfile, RequestInfo
from .progress import Progress
from .report import ClientStats, percentile
from .rows import _KEY, DEGRADED, MESSAGES, PRIMARY, REQUEST_HEADER, Sent

if TYPE_CHECKING:
    from .runner import LabConfig

STALLING = "lab-stalling"
"""Model name whose first answer to a request in five stalls after three chunks."""
_STALL_ANSWER = "Queueing at the provider, long outputs, and stalled streams make the tail."
_BARE_CUTOFF = 2.0  # seconds the lab waits for a stalled bare stream before giving up on it


@dataclass(frozen=True, kw_only=True)
class TtftRow:
    """Time to first content chunk of one way of streaming (seconds); ``latencies`` holds
    every request's, sorted (the CDF plots are drawn from it)."""

    label: str
    requests: int
    p50: float
    p95: float
    p99: float
    max: float
    errors: int
    extra_load_pct: float
    latencies: tuple[float, ...] = field(default=(), repr=False)


@dataclass(frozen=True, kw_only=True)
class StallRow:
    """How one way of streaming fared with streams that stall."""

    label: str
    streams: int
    stalled: int
    complete: int
    failed: int
    hung: int
    p99: float


@dataclass(frozen=True, kw_only=True)
class StreamingResult:
    """The streaming scenario's rows, and the per-target statistics of its ``lk.LLM``s."""

    first_token: float
    stall_limit: float
    ttft: tuple[TtftRow, ...]
    stalls: tuple[StallRow, ...]
    stats: tuple[ClientStats, ...] = ()


async def _first_content(stream: Any) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            return


async def run_streaming(
    fake: FakeProvider, config: LabConfig, progress: Progress | None = None
) -> StreamingResult:
    """Run the streaming scenario against ``fake`` (reset first)."""
    import litellm

    from .runner import ReplayScript, run_requests

    primary = LlmperfProfile.load(config.run, scale=config.scale, max_output_tokens=16)
    backup = LlmperfProfile.load(config.degraded_run, scale=config.scale, max_output_tokens=16)
    base = fake.base_url
    first_token = config.degrade_after
    guarded = lk.LLM(
        f"openai/{PRIMARY}",
        api_base=base,
        api_key=_KEY,
        failover=[{"model": f"openai/{DEGRADED}", "api_base": base, "api_key": _KEY}],
        stream_guard=lk.StreamGuard(first_token=first_token),
    )
    hedged = lk.LLM(
        f"openai/{PRIMARY}",
        api_base=base,
        api_key=_KEY,
        hedge=lk.Hedge(lk.quantile(config.hedge_quantile), max_extra_load=config.max_extra_load),
    )

    def headers(i: int) -> dict[str, Any]:
        return {"extra_headers": {REQUEST_HEADER: str(i)}}

    async def bare(i: int) -> Sent:
        # litellm runs on asyncio only: on trio, the whole stream is read on the bridge's loop.
        return await run_on_asyncio(_bare(i))

    async def _bare(i: int) -> Sent:
        started = time.monotonic()
        try:
            stream = await litellm.acompletion(
                model=f"openai/{PRIMARY}",
                api_base=base,
                api_key=_KEY,
                messages=MESSAGES,
                stream=True,
                max_retries=0,
                **headers(i),
            )
            try:
                await _first_content(stream)
                ttft = time.monotonic() - started
                async for _ in stream:
                    pass
            finally:
                await stream.aclose()
        except Exception as exc:
            return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
        return Sent(ttft, ok=True)

    def through(llm: lk.LLM) -> Any:
        async def send(i: int) -> Sent:
            started = time.monotonic()
            try:
                stream = await llm.acompletion(messages=MESSAGES, stream=True, **headers(i))
                ttft = time.monotonic() - started
                async with stream:
                    async for _ in stream:
                        pass
            except Exception as exc:
                return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
            return Sent(ttft, ok=True, hedge_won=lk.report(stream).answering_attempt > 1)

        return send

    # litellm spends ~20 ms of client CPU per stream here: at the lab's concurrency the client,
    # not the provider, would set the time to first token. A quarter of it keeps the client idle
    # enough for the replayed latencies to show.
    concurrency = max(1, config.concurrency // 4)
    requests = max(50, config.requests // 2)
    rows: list[TtftRow] = []
    stats: list[ClientStats] = []
    for label, send, client in (
        ("litellm stream (bare)", bare, None),
        (f"StreamGuard(first_token={first_token:g}s)+failover", through(guarded), guarded),
        (f"Hedge(quantile({config.hedge_quantile:g})) on TTFT", through(hedged), hedged),
    ):
        fake.reset()
        fake.script(PRIMARY, Behavior(output_tokens=4))
        fake.script(DEGRADED, backup)
        for i in range(30):  # warm-up: connections, litellm's client cache, TTFT windows
            await send(-1 - i)
        fake.reset()
        fake.script(PRIMARY, ReplayScript(primary, requests, config.seed))
        fake.script(DEGRADED, backup)
        sent, _ = await run_requests(send, requests, concurrency, label, progress)
        ttfts = sorted(s.latency for s in sent)
        rows.append(
            TtftRow(
                label=label,
                requests=len(sent),
                p50=percentile(ttfts, 0.50),
                p95=percentile(ttfts, 0.95),
                p99=percentile(ttfts, 0.99),
                max=ttfts[-1],
                errors=sum(not s.ok for s in sent),
                extra_load_pct=100.0 * (len(fake.attempts) - len(sent)) / len(sent),
                latencies=tuple(round(ttft, 6) for ttft in ttfts),
            )
        )
        if client is not None:
            stats.append(ClientStats.of(f"streaming: {label}", client))
    stalls, stalling = await _stalls(fake, config, progress)
    return StreamingResult(
        first_token=first_token,
        stall_limit=_stall_limit(config),
        ttft=tuple(rows),
        stalls=stalls,
        stats=(*stats, stalling),
    )


def _stall_limit(config: LabConfig) -> float:
    return config.degrade_after


class _Stalling:
    """Script: request i's first answer stalls for good after three chunks when i % 5 == 0."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def __call__(self, request: RequestInfo) -> Behavior:
        index = int(request.headers.get(REQUEST_HEADER, "-1"))
        first = index not in self._seen
        self._seen.add(index)
        if index % 5 == 0 and first:
            return Behavior(text=_STALL_ANSWER, fault=Fault.STALL, stall_after=3)
        return Behavior(text=_STALL_ANSWER)


async def _stalls(
    fake: FakeProvider, config: LabConfig, progress: Progress | None
) -> tuple[tuple[StallRow, ...], ClientStats]:
    import litellm

    streams = max(20, config.requests // 6)
    stall = _stall_limit(config)
    guarded = lk.LLM(
        f"openai/{STALLING}",
        api_base=fake.base_url,
        api_key=_KEY,
        stream_guard=lk.StreamGuard(stall=stall, on_break="continue"),
    )

    async def bare(i: int) -> tuple[str, float]:
        return await run_on_asyncio(_bare(i))  # on trio: on the bridge's asyncio loop

    async def _bare(i: int) -> tuple[str, float]:
        started = time.monotonic()
        text = ""
        with anyio.move_on_after(_BARE_CUTOFF):
            stream = await litellm.acompletion(
                model=f"openai/{STALLING}",
                api_base=fake.base_url,
                api_key=_KEY,
                messages=MESSAGES,
                stream=True,
                max_retries=0,
                extra_headers={REQUEST_HEADER: str(i)},
            )
            try:
                async for chunk in stream:
                    text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            finally:
                await stream.aclose()
            return text, time.monotonic() - started
        return "<hung>", time.monotonic() - started

    async def guarded_send(i: int) -> tuple[str, float]:
        started = time.monotonic()
        stream = await guarded.acompletion(
            messages=MESSAGES, stream=True, extra_headers={REQUEST_HEADER: str(i)}
        )
        async with stream:
            async for _ in stream:
                pass
        return stream.partial_text, time.monotonic() - started

    rows = []
    for label, send in (
        ("litellm stream (bare)", bare),
        (f"StreamGuard(stall={stall:g}s, on_break='continue')", guarded_send),
    ):
        fake.reset()
        fake.script(STALLING, _Stalling())
        with (progress or Progress()).step(f"stalls: {label}", streams) as step:
            outcomes = await _send_all(send, streams, max(1, config.concurrency // 4), step.advance)
        times = sorted(t for text, t in outcomes if text == _STALL_ANSWER)
        rows.append(
            StallRow(
                label=label,
                streams=streams,
                stalled=sum(1 for i in range(streams) if i % 5 == 0),
                complete=sum(text == _STALL_ANSWER for text, _ in outcomes),
                failed=sum(text.startswith("<") and text != "<hung>" for text, _ in outcomes),
                hung=sum(text == "<hung>" for text, _ in outcomes),
                p99=percentile(times, 0.99) if times else float("nan"),
            )
        )
    label = f"streaming: StreamGuard(stall={stall:g}s, on_break='continue')"
    return tuple(rows), ClientStats.of(label, guarded)


async def _send_all(
    send: Any, streams: int, concurrency: int, done: Callable[[], None]
) -> list[tuple[str, float]]:
    outcomes: list[tuple[str, float]] = []
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            try:
                outcomes.append(await send(i))
            except Exception as exc:
                outcomes.append((f"<{type(exc).__name__}>", 0.0))
            done()

    async with anyio.create_task_group() as group:
        for i in range(streams):
            group.start_soon(one, i)
    return outcomes


def format_streaming(result: StreamingResult) -> str:
    """The streaming scenario as text tables (milliseconds)."""
    header = (
        f"{'streaming: time to first token':<44} {'p50':>6} {'p95':>6} {'p99':>6} {'max':>6} "
        f"{'errors':>7} {'extra req':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in result.ttft:
        lines.append(
            f"{row.label:<44} {row.p50 * 1000:>6,.0f} {row.p95 * 1000:>6,.0f} "
            f"{row.p99 * 1000:>6,.0f} {row.max * 1000:>6,.0f} {row.errors:>7} "
            f"{row.extra_load_pct:>9.1f}%"
        )
    header = (
        f"{'streams that stall (1 in 5, for good)':<44} {'complete':>9} {'hung':>5} "
        f"{'failed':>7} {'p99 of complete':>16}"
    )
    lines += ["", header, "-" * len(header)]
    for stall in result.stalls:
        lines.append(
            f"{stall.label:<44} {stall.complete:>4}/{stall.streams:<4} {stall.hung:>5} "
            f"{stall.failed:>7} {stall.p99 * 1000:>13,.0f} ms"
        )
    lines.append(
        f"(bare streams that stall are given up by the lab after {_BARE_CUTOFF:g} s: without a "
        "guard they would hang until the connection dies)"
    )
    return "\n".join(lines)
