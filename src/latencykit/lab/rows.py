"""The lab's rows: one way of calling the provider each (bare litellm, latencykit policies).

A row is a factory: given the lab's context it returns ``send(i) -> Sent``, the coroutine that
makes request ``i``. Later policies (hedging, failover) add rows here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import latencykit as lk
from latencykit._asyncio_bridge import run_on_asyncio

PRIMARY = "lab-primary"
"""Model name the fake provider serves with the replayed heavy-tailed profile."""
DEGRADED = "lab-degraded"
"""Model name the fake provider serves with the light profile (the cheap path)."""
REQUEST_HEADER = "x-lab-request"
"""Header carrying the request index, so every row replays the same first-attempt latencies."""

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Summarise the causes of tail latency in LLM serving."},
]


@dataclass(frozen=True, slots=True)
class Sent:
    """How one request went, as the client saw it. ``finished`` is set by the lab's runner:
    seconds from the start of the row to the request's end (default ``0.0``)."""

    latency: float
    ok: bool
    degraded: bool = False
    hedge_won: bool = False
    error_type: str | None = None
    finished: float = 0.0


@dataclass(frozen=True, slots=True)
class RowContext:
    """What a row needs to build its client."""

    base_url: str
    deadline: float
    degrade_after: float
    degraded_max_tokens: int
    hedge_quantile: float
    max_extra_load: float


Send = Callable[[int], Awaitable[Sent]]


_KEY = "lab-key-not-secret"


def _kwargs(ctx: RowContext, i: int) -> dict[str, Any]:
    return {"messages": MESSAGES, "extra_headers": {REQUEST_HEADER: str(i)}}


def bare(ctx: RowContext) -> Send:
    """litellm as most apps call it: ``litellm.acompletion`` with its defaults."""
    import litellm

    async def send(i: int) -> Sent:
        started = time.monotonic()
        try:
            # litellm runs on asyncio only: on trio, on the bridge's asyncio loop.
            await run_on_asyncio(
                litellm.acompletion(
                    model=f"openai/{PRIMARY}",
                    api_base=ctx.base_url,
                    api_key=_KEY,
                    **_kwargs(ctx, i),
                )
            )
        except Exception as exc:
            return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
        return Sent(time.monotonic() - started, ok=True)

    return send


class Through:
    """``send(i)`` through an ``lk.LLM``; ``llm`` is the client (its stats are reported)."""

    def __init__(self, llm: lk.LLM, ctx: RowContext) -> None:
        self.llm = llm
        self.ctx = ctx

    async def __call__(self, i: int) -> Sent:
        started = time.monotonic()
        try:
            response = await self.llm.acompletion(**_kwargs(self.ctx, i))
        except Exception as exc:
            return Sent(time.monotonic() - started, ok=False, error_type=type(exc).__name__)
        report = lk.report(response)
        return Sent(
            time.monotonic() - started,
            ok=True,
            degraded=report.degraded,
            hedge_won=not report.degraded and report.answering_attempt > 1,
        )


def _through(llm: lk.LLM, ctx: RowContext) -> Send:
    return Through(llm, ctx)


def deadline_degrade(ctx: RowContext) -> Send:
    """``lk.LLM`` with a total deadline and a degraded path to a cheaper model."""
    llm = lk.LLM(
        f"openai/{PRIMARY}",
        api_base=ctx.base_url,
        api_key=_KEY,
        deadline=ctx.deadline,
        degrade=lk.Degrade(
            model=f"openai/{DEGRADED}",
            max_tokens=ctx.degraded_max_tokens,
            after=ctx.degrade_after,
        ),
    )
    return _through(llm, ctx)


def hedged(ctx: RowContext) -> Send:
    """``lk.LLM`` with hedged requests after the target's recent p90 (adaptive)."""
    hedge = lk.Hedge(lk.quantile(ctx.hedge_quantile), max_extra_load=ctx.max_extra_load)
    llm = lk.LLM(f"openai/{PRIMARY}", api_base=ctx.base_url, api_key=_KEY, hedge=hedge)
    return _through(llm, ctx)


ROWS: dict[str, tuple[str, Callable[[RowContext], Send]]] = {
    "bare": ("litellm.acompletion (bare)", bare),
    "deadline+degrade": ("lk.LLM deadline + degrade", deadline_degrade),
    "hedge": ("lk.LLM hedge(quantile)", hedged),
}
"""Row key -> (label, factory), in display order."""
