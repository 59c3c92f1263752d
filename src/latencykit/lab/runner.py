"""Running the lab: the fake provider, the workload, one pass per row, the results."""

from __future__ import annotations

import json
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

from .. import _validation
from ..testing import Behavior, FakeProvider, LlmperfProfile, RequestInfo
from .fast_lane import FastLaneResult, run_fast_lane
from .outage import OutageResult, run_outage
from .report import ClientStats, percentile
from .rows import DEGRADED, PRIMARY, REQUEST_HEADER, ROWS, RowContext, Sent, Through
from .streaming import StreamingResult, run_streaming
from .turn import TurnResult, run_turns


@dataclass(frozen=True, kw_only=True)
class LabConfig:
    """What the lab runs. Every field has a default; ``latencykit lab --help`` lists them.

    Attributes:
        run: llmperf run replayed by the primary model (default ``"together/13b"``: TTFT p50
            0.55 s, p99 53 s).
        scale: time scale applied to the replayed latencies (default ``0.05``: the 100 s tail
            becomes 5 s, so the lab finishes in well under two minutes).
        requests: requests per row (default ``600``).
        concurrency: requests in flight at once (default ``20``).
        deadline: ``lk.LLM(deadline=...)`` in seconds (default ``0.5``).
        degrade_after: ``lk.Degrade(after=...)`` in seconds (default ``0.25``).
        degraded_run: llmperf run replayed by the cheap model (default ``"groq/70b"``, the
            lightest tail in the data).
        degraded_max_tokens: ``lk.Degrade(max_tokens=...)`` (default ``64``).
        hedge_quantile: the hedge row's ``lk.quantile(q)`` delay (default ``0.9``).
        max_extra_load: the hedge row's ``max_extra_load`` (default ``0.1``).
        rows: which rows to run, by key (default: all, see ``latencykit.lab.rows.ROWS``).
        outage: also run the outage scenario (failing primary, failover, breaker) (default
            ``True``).
        streaming: also run the streaming scenario (time to first token bare, guarded and
            hedged; stalls recovered) (default ``True``).
        turn: also run the turn scenario (a three-stage turn with one slow source, within a
            p95 budget: sequential, fan-out, stage budgets with fan-out) (default ``True``).
        fast_lane: also run the client-CPU scenario (many concurrent streams through litellm
            and on the fast lane: time to first chunk and gaps) (default ``True``).
        seed: seeds the workload and the fake provider (default ``7``).
    """

    run: str = "together/13b"
    scale: float = 0.05
    requests: int = 600
    concurrency: int = 20
    deadline: float = 0.5
    degrade_after: float = 0.25
    degraded_run: str = "groq/70b"
    degraded_max_tokens: int = 64
    hedge_quantile: float = 0.9
    max_extra_load: float = 0.1
    rows: tuple[str, ...] = tuple(ROWS)
    outage: bool = True
    streaming: bool = True
    turn: bool = True
    fast_lane: bool = True
    seed: int = 7

    def __post_init__(self) -> None:
        for name in ("scale", "deadline", "degrade_after"):
            _validation.seconds(f"LabConfig.{name}", getattr(self, name))
        for name in ("requests", "concurrency", "degraded_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LabConfig.{name} must be a positive int, got {value!r}")
        if not 0 < self.hedge_quantile < 1:
            raise ValueError("LabConfig.hedge_quantile must be in (0, 1)")
        if not 0 <= self.max_extra_load <= 10:
            raise ValueError("LabConfig.max_extra_load must be in [0, 10]")
        if self.degrade_after >= self.deadline:
            raise ValueError("LabConfig.degrade_after must be shorter than LabConfig.deadline")
        unknown = [row for row in self.rows if row not in ROWS]
        if unknown or not self.rows:
            raise ValueError(f"LabConfig.rows: unknown {unknown}; choose from {list(ROWS)}")
        runs = LlmperfProfile.runs()
        for name in ("run", "degraded_run"):
            if getattr(self, name) not in runs:
                raise ValueError(f"LabConfig.{name} must be one of {runs}")


@dataclass(frozen=True, kw_only=True)
class RowResult:
    """One row of the lab's table. Latencies are client-observed seconds per request."""

    key: str
    label: str
    requests: int
    p50: float
    p90: float
    p99: float
    max: float
    errors: int
    upstream_requests: int
    extra_load_pct: float
    degraded: int
    hedges_won: int
    wall_time: float
    error_types: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LabResult:
    """All rows of one lab run, with the configuration and the machine it ran on, and the
    per-target statistics of each row's ``lk.LLM`` (``stats``)."""

    config: LabConfig
    rows: tuple[RowResult, ...]
    machine: dict[str, str]
    outage: OutageResult | None = None
    streaming: StreamingResult | None = None
    turn: TurnResult | None = None
    fast_lane: FastLaneResult | None = None
    stats: tuple[ClientStats, ...] = ()

    def to_json(self) -> str:
        """The result as JSON (what ``--json`` writes)."""
        return json.dumps(asdict(self), indent=2, sort_keys=False)


class ReplayScript:
    """Fake-provider script replaying pre-drawn latencies, the same for every lab row.

    Attempt ``k`` (0 = first, 1 = second) of request ``i`` (from the ``x-lab-request`` header)
    gets ``draws[i][k]``, drawn up front with ``seed``: every row sees the same primaries and the
    same backups, and an offline model can replay them exactly. Further attempts, and requests
    without the header, draw fresh rows, as a real provider's queueing would.
    """

    def __init__(
        self, profile: LlmperfProfile, requests: int, seed: int, *, attempts: int = 2
    ) -> None:
        rng = random.Random(seed)
        self._profile = profile
        self.draws = [[profile.sample(rng) for _ in range(attempts)] for _ in range(requests)]
        self._seen: dict[int, int] = {}

    def __call__(self, request: RequestInfo) -> Behavior:
        index = int(request.headers.get(REQUEST_HEADER, "-1"))
        if 0 <= index < len(self.draws):
            attempt = self._seen.get(index, 0)
            self._seen[index] = attempt + 1
            if attempt < len(self.draws[index]):
                return self.draws[index][attempt]
        return self._profile.sample(request.rng)


async def run_requests(
    send: Callable[[int], Any],
    requests: int,
    concurrency: int,
    label: str,
    progress: TextIO | None,
) -> tuple[list[Sent], float]:
    """Send requests ``0 .. requests-1`` with ``send``, ``concurrency`` at a time; return how
    each went and the wall time. Prints a progress line every 10 % to ``progress``."""
    results: list[Sent] = []
    limiter = anyio.CapacityLimiter(concurrency)
    started = time.monotonic()

    async def one(i: int) -> None:
        async with limiter:
            results.append(await send(i))

    async def report_progress() -> None:
        assert progress is not None
        shown = -1
        while True:
            done = len(results) * 10 // requests
            if done != shown:
                shown = done
                elapsed = time.monotonic() - started
                print(f"  {label:<32} {len(results):>5}/{requests}  {elapsed:5.1f}s", file=progress)
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as tg:
        if progress is not None:
            tg.start_soon(report_progress)
        async with anyio.create_task_group() as workers:
            for i in range(requests):
                workers.start_soon(one, i)
        tg.cancel_scope.cancel()
    return results, time.monotonic() - started


def summarise(
    key: str, label: str, sent: Sequence[Sent], upstream: int, wall_time: float
) -> RowResult:
    """One table row from the requests of a pass."""
    latencies = sorted(s.latency for s in sent)
    errors: dict[str, int] = {}
    for s in sent:
        if not s.ok:
            errors[s.error_type or "?"] = errors.get(s.error_type or "?", 0) + 1
    return RowResult(
        key=key,
        label=label,
        requests=len(sent),
        p50=percentile(latencies, 0.50),
        p90=percentile(latencies, 0.90),
        p99=percentile(latencies, 0.99),
        max=latencies[-1],
        errors=sum(errors.values()),
        upstream_requests=upstream,
        extra_load_pct=100.0 * (upstream - len(sent)) / len(sent),
        degraded=sum(s.degraded for s in sent),
        hedges_won=sum(s.hedge_won for s in sent),
        wall_time=wall_time,
        error_types=errors,
    )


async def _lab(config: LabConfig, progress: TextIO | None) -> LabResult:
    primary = LlmperfProfile.load(config.run, scale=config.scale)
    cheap = LlmperfProfile.load(
        config.degraded_run, scale=config.scale, max_output_tokens=config.degraded_max_tokens
    )
    results: list[RowResult] = []
    stats: list[ClientStats] = []
    with FakeProvider(seed=config.seed) as fake:
        ctx = RowContext(
            base_url=fake.base_url,
            deadline=config.deadline,
            degrade_after=config.degrade_after,
            degraded_max_tokens=config.degraded_max_tokens,
            hedge_quantile=config.hedge_quantile,
            max_extra_load=config.max_extra_load,
        )
        for key in config.rows:
            label, factory = ROWS[key]
            send = factory(ctx)
            fake.reset()
            fake.script(DEGRADED, cheap)
            fake.script(PRIMARY, Behavior())
            for i in range(30):  # warm-up: connections, litellm's client cache, latency windows
                await send(-1 - i)
            fake.reset()
            fake.script(PRIMARY, ReplayScript(primary, config.requests, config.seed))
            fake.script(DEGRADED, cheap)
            sent, wall = await run_requests(
                send, config.requests, config.concurrency, label, progress
            )
            results.append(summarise(key, label, sent, len(fake.attempts), wall))
            if isinstance(send, Through):
                stats.append(ClientStats.of(label, send.llm))
        streaming = None
        if config.streaming:
            fake.reset()
            streaming = await run_streaming(fake, config, progress)
        turn = None
        if config.turn:
            if progress is not None:
                print("  turn scenario (stage budgets, fan-out) ...", file=progress)
            fake.reset()
            turn = await run_turns(fake, seed=config.seed)
        lanes = None
        if config.fast_lane:
            if progress is not None:
                print("  many streams: litellm and the fast lane ...", file=progress)
            fake.reset()
            lanes = await run_fast_lane(fake)
        outage = None
        if config.outage:
            if progress is not None:
                print("  outage scenario (failing primary, failover, breaker) ...", file=progress)
            fake.reset()
            outage = await run_outage(fake)
    return LabResult(
        config=config,
        rows=tuple(results),
        outage=outage,
        streaming=streaming,
        turn=turn,
        fast_lane=lanes,
        stats=tuple(stats),
        machine={
            "python": platform.python_version(),
            "platform": platform.platform(),
            "litellm": _litellm_version(),
        },
    )


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def prepare_litellm() -> None:
    """Import litellm offline and quietly (latencykit freezes the heap after it)."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from .._litellm import litellm

    litellm().suppress_debug_info = True


def run_lab(
    config: LabConfig | None = None,
    *,
    backend: str = "asyncio",
    progress: TextIO | None = sys.stderr,
) -> LabResult:
    """Run the lab and return its results (``progress=None`` keeps it silent)."""
    prepare_litellm()
    return anyio.run(_lab, config or LabConfig(), progress, backend=backend)


def write_json(result: LabResult, path: Path) -> None:
    """Write ``result`` as JSON to ``path``."""
    path.write_text(result.to_json() + "\n", encoding="utf-8")
