"""The lab's turn scenario: a three-stage turn with one slow stage, within a p95 budget.

A turn is retrieval from three sources (a keyword index, a vector store and a web search, whose
latency has a heavy tail: about one call in four takes 0.6-1.2 s), the model (an ``lk.LLM`` call
to the fake provider) and post-processing. The turn's p95 budget is ``budget`` seconds. The same
turns (same seeded latencies) run three ways:

- **sequential**: the three sources one after the other, then the model, then post-processing,
  no budget: what a first version of the code does;
- **fan-out**: the sources concurrently (``lk.gather``), still no budget: the slow source still
  sets the pace;
- **stage budgets + fan-out**: the turn in ``lk.deadline(budget)``; retrieval in
  ``lk.stage("retrieval", budget=...)`` with ``lk.gather(..., min_results=2)`` (the two first
  sources are enough; the straggler is cancelled); the model and post-processing in their own
  stages.

The report shows each row's p50/p95/p99 turn latency, the share of turns within the budget, and
for the budgeted row the stages that overran (from the ledger of the turns that failed).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

import latencykit as lk

from ..testing import Behavior, FakeProvider, Latency
from .report import percentile
from .rows import MESSAGES

MODEL = "lab-turn-model"
SOURCES = ("keyword", "vector", "web")


@dataclass(frozen=True, kw_only=True)
class TurnRow:
    """One way of running the turns. Latencies in seconds."""

    label: str
    turns: int
    p50: float
    p95: float
    p99: float
    within_budget: float
    failed: int
    overran: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """The turn scenario: its budget and one row per way of running it."""

    budget: float
    rows: tuple[TurnRow, ...]


def _source_delays(turns: int, seed: int) -> list[dict[str, float]]:
    """Per turn, each source's latency (seeded: every row replays the same turns)."""
    rng = random.Random(seed)
    delays = []
    for _ in range(turns):
        slow = rng.random() < 0.25
        delays.append(
            {
                "keyword": rng.uniform(0.01, 0.04),
                "vector": rng.uniform(0.02, 0.06),
                "web": rng.uniform(0.6, 1.2) if slow else rng.uniform(0.03, 0.08),
            }
        )
    return delays


async def _fetch(source: str, delay: float) -> str:
    await anyio.sleep(delay)
    return f"{source} results"


async def _post_process(text: str) -> str:
    await anyio.sleep(0.01)
    return text.strip()


Turn = Callable[[dict[str, float]], Awaitable[str]]


def _sequential(llm: lk.LLM) -> Turn:
    async def turn(delays: dict[str, float]) -> str:
        found = [await _fetch(source, delays[source]) for source in SOURCES]
        response = await llm.acompletion(messages=[*MESSAGES, _context(found)])
        return await _post_process(response.choices[0].message.content or "")

    return turn


def _fan_out(llm: lk.LLM) -> Turn:
    async def turn(delays: dict[str, float]) -> str:
        found = await lk.gather(*(_fetch(source, delays[source]) for source in SOURCES))
        response = await llm.acompletion(messages=[*MESSAGES, _context(found.values)])
        return await _post_process(response.choices[0].message.content or "")

    return turn


def _budgeted(llm: lk.LLM, budget: float) -> Turn:
    retrieval = lk.stage("retrieval", budget=budget * 0.25)
    model = lk.stage("model")  # what retrieval leaves, minus post-processing's share
    post = lk.stage("post-processing", budget=budget * 0.1)

    async def turn(delays: dict[str, float]) -> str:
        with lk.deadline(budget):
            async with retrieval:
                found = await lk.gather(
                    *(_fetch(source, delays[source]) for source in SOURCES), min_results=2
                )
            async with model:
                response = await llm.acompletion(messages=[*MESSAGES, _context(found.values)])
            async with post:
                answer = await _post_process(response.choices[0].message.content or "")
        return answer

    return turn


def _context(found: list[str]) -> dict[str, str]:
    return {"role": "system", "content": "; ".join(found)}


async def _run(
    label: str, turn: Turn, delays: list[dict[str, float]], budget: float, concurrency: int
) -> TurnRow:
    durations: list[float] = []
    failed = 0
    overran: Counter[str] = Counter()
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(turn_delays: dict[str, float]) -> None:
        nonlocal failed
        async with limiter:
            started = time.monotonic()
            try:
                await turn(turn_delays)
            except lk.DeadlineExceeded as error:
                failed += 1
                overran[error.stage or "(none)"] += 1
            durations.append(time.monotonic() - started)

    async with anyio.create_task_group() as group:
        for turn_delays in delays:
            group.start_soon(one, turn_delays)
    ordered = sorted(durations)
    return TurnRow(
        label=label,
        turns=len(durations),
        p50=percentile(ordered, 0.50),
        p95=percentile(ordered, 0.95),
        p99=percentile(ordered, 0.99),
        within_budget=sum(d <= budget for d in durations) / len(durations),
        failed=failed,
        overran=dict(overran),
    )


async def run_turns(
    fake: FakeProvider,
    *,
    turns: int = 60,
    budget: float = 0.6,
    concurrency: int = 10,
    seed: int = 7,
) -> TurnResult:
    """Run the turn scenario against ``fake`` and return one row per way of running it."""
    fake.script(MODEL, Behavior(ttft=Latency.uniform(0.15, 0.3), output_tokens=8))
    llm = lk.LLM(f"openai/{MODEL}", api_base=fake.base_url, api_key="lab-key-not-secret")
    await llm.acompletion(messages=MESSAGES)  # warm-up: litellm's client, the connection
    delays = _source_delays(turns, seed)
    rows = []
    for label, turn in (
        ("sequential, no budget", _sequential(llm)),
        ("fan-out (lk.gather), no budget", _fan_out(llm)),
        ("stage budgets + fan-out (min_results=2)", _budgeted(llm, budget)),
    ):
        rows.append(await _run(label, turn, delays, budget, concurrency))
    return TurnResult(budget=budget, rows=tuple(rows))


def format_turns(result: TurnResult) -> str:
    """The scenario's table as text."""
    lines = [
        f"turn scenario: retrieval from 3 sources (one with a heavy tail), the model, "
        f"post-processing; p95 budget {result.budget * 1000:.0f} ms",
        f"{'':<42} {'p50':>7} {'p95':>7} {'p99':>7} {'in budget':>10}  overran",
    ]
    for row in result.rows:
        overran = ", ".join(f"{stage} {n}" for stage, n in sorted(row.overran.items())) or "-"
        lines.append(
            f"{row.label:<42} {row.p50 * 1000:>5.0f}ms {row.p95 * 1000:>5.0f}ms "
            f"{row.p99 * 1000:>5.0f}ms {row.within_budget:>9.0%}  {overran}"
        )
    met = [row.label for row in result.rows if row.p95 <= result.budget]
    lines.append(f"meets the p95 budget: {', '.join(met) or 'none'}")
    return "\n".join(lines)
