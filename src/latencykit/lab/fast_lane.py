"""The lab's client-CPU scenario: many concurrent streams, through litellm and on the fast lane.

``streams`` streams at once, each sending ``chunks`` chunks ``itl`` seconds apart (by default 40
streams of 100 chunks at 100 chunks/s: 4,000 chunks/s in all, more than litellm can process in
one Python process, about 2,600/s here). Through litellm the client saturates: every stream's
gaps between chunks, and its time to first chunk, grow with the backlog on the event loop. On the
fast lane (``transport="openai"``) the same load costs a fraction of the CPU, and the gaps stay
the server's. The report shows, per lane, TTFT and inter-chunk gap p50/p99 and the chunks/s
received.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio

import latencykit as lk

from ..testing import Behavior, FakeProvider
from .report import percentile
from .rows import MESSAGES

MODEL = "lab-many-streams"


@dataclass(frozen=True, kw_only=True)
class LaneRow:
    """One lane's streams. Times in seconds."""

    label: str
    streams: int
    ttft_p50: float
    ttft_p99: float
    gap_p50: float
    gap_p99: float
    chunks_per_second: float


@dataclass(frozen=True, kw_only=True)
class FastLaneResult:
    """The scenario: its load and one row per lane."""

    streams: int
    chunks: int
    itl: float
    rows: tuple[LaneRow, ...]


async def _lane(label: str, llm: lk.LLM, streams: int) -> LaneRow:
    ttfts: list[float] = []
    gaps: list[float] = []
    received = 0

    async def one() -> None:
        nonlocal received
        started = time.monotonic()
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        last = None
        async with stream:
            async for _ in stream:
                now = time.monotonic()
                if last is None:
                    ttfts.append(now - started)
                else:
                    gaps.append(now - last)
                last = now
                received += 1

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        for _ in range(streams):
            group.start_soon(one)
    elapsed = time.monotonic() - started
    ttfts.sort()
    gaps.sort()
    return LaneRow(
        label=label,
        streams=streams,
        ttft_p50=percentile(ttfts, 0.50),
        ttft_p99=percentile(ttfts, 0.99),
        gap_p50=percentile(gaps, 0.50),
        gap_p99=percentile(gaps, 0.99),
        chunks_per_second=received / elapsed,
    )


async def run_fast_lane(
    fake: FakeProvider, *, streams: int = 40, chunks: int = 100, itl: float = 0.01
) -> FastLaneResult:
    """Run the scenario against ``fake``: the same streams through litellm, then on the fast
    lane."""
    fake.script(MODEL, Behavior(output_tokens=chunks, itl=itl))
    rows = []
    for label, transport in (("through litellm", "litellm"), ("fast lane", "openai")):
        llm = lk.LLM(
            f"openai/{MODEL}",
            api_base=fake.base_url,
            api_key="lab-key-not-secret",
            transport=transport,
            timeout=60,
        )
        warm = await llm.acompletion(messages=MESSAGES, stream=True)  # connections, clients
        async with warm:
            async for _ in warm:
                pass
        rows.append(await _lane(label, llm, streams))
    return FastLaneResult(streams=streams, chunks=chunks, itl=itl, rows=tuple(rows))


def format_fast_lane(result: FastLaneResult) -> str:
    """The scenario's table as text."""
    demand = result.streams / result.itl
    lines = [
        f"many streams: {result.streams} at once, {result.chunks} chunks each, one every "
        f"{result.itl * 1000:.0f} ms ({demand:,.0f} chunks/s asked of one client process)",
        f"{'':<18} {'ttft p50':>9} {'ttft p99':>9} {'gap p50':>8} {'gap p99':>8} {'chunks/s':>9}",
    ]
    for row in result.rows:
        lines.append(
            f"{row.label:<18} {row.ttft_p50 * 1000:>7.0f}ms {row.ttft_p99 * 1000:>7.0f}ms "
            f"{row.gap_p50 * 1000:>6.1f}ms {row.gap_p99 * 1000:>6.1f}ms "
            f"{row.chunks_per_second:>9,.0f}"
        )
    return "\n".join(lines)
