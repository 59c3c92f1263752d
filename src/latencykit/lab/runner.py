"""Running the lab: the fake provider, the workload, one pass per row, the results."""

from __future__ import annotations

import json
import platform
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO, get_args

import anyio
import sniffio

from .. import _validation
from ..testing import Behavior, FakeProvider, LlmperfProfile, RequestInfo
from .fast_lane import FastLaneResult, run_fast_lane
from .outage import OutageResult, run_outage
from .progress import PlainProgress, Progress, make_progress
from .report import ClientStats, percentile
from .rows import DEGRADED, PRIMARY, REQUEST_HEADER, ROWS, RowContext, Sent, Through
from .streaming import StreamingResult, run_streaming
from .turn import TurnResult, run_turns

Arrival = Literal["closed", "fixed", "poisson"]
"""How a row's requests arrive: ``"closed"`` (a closed loop of ``concurrency`` workers, each
sending its next request when the previous one ends), ``"fixed"`` (open loop, one request every
``1/rate`` s) or ``"poisson"`` (open loop, exponential gaps of mean ``1/rate`` s, seeded)."""
ARRIVALS: tuple[str, ...] = get_args(Arrival)
UNFINISHED = "Unfinished"
"""Error type of an open-loop request still in flight when its row's time was up (cancelled)."""


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
        seed: seeds the workload, the arrivals and the fake provider (default ``7``).
        arrival: how each row's requests arrive (default ``"closed"``): ``"closed"`` is a closed
            loop of ``concurrency`` workers (latency from each request's start; it hides
            queueing); ``"fixed"`` and ``"poisson"`` are open loops at ``rate`` requests/s, with
            no limit on requests in flight and latency measured from each request's scheduled
            arrival, so time spent waiting for a busy client counts. The streaming scenario
            always runs closed.
        rate: offered load of an open loop, in requests/s (default ``100.0``; unused when
            ``arrival="closed"``).
        drain: seconds an open-loop row waits, after its last scheduled arrival, for the
            requests still in flight (default ``5.0``); those still running then are cancelled
            and reported as ``Unfinished`` errors, with their time so far as latency. A row
            lasts at most ``requests / rate + drain`` seconds (fixed arrivals).
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
    arrival: Arrival = "closed"
    rate: float = 100.0
    drain: float = 5.0

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"LabConfig.arrival must be one of {list(ARRIVALS)}")
        for name in ("scale", "deadline", "degrade_after", "rate", "drain"):
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
    """One row of the lab's table. Latencies are client-observed seconds per request: from the
    request's start in a closed loop, from its scheduled arrival in an open loop.

    ``arrival`` and ``offered_rate`` (requests/s, ``None`` for a closed loop) say how the
    requests arrived; ``throughput`` is the achieved rate, successful requests per second of
    ``wall_time``; ``unfinished`` counts open-loop requests cancelled when the row's time was up
    (also counted in ``errors``); ``latencies`` holds every request's latency, sorted (the CDF
    plots are drawn from it)."""

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
    arrival: str = "closed"
    offered_rate: float | None = None
    throughput: float = 0.0
    unfinished: int = 0
    latencies: tuple[float, ...] = field(default=(), repr=False)


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


def arrival_offsets(arrival: str, rate: float, requests: int, seed: int) -> list[float]:
    """Scheduled arrival times of an open loop, in seconds from its start: every ``1/rate`` s
    for ``"fixed"``, exponential gaps of mean ``1/rate`` s (seeded with ``seed``) for
    ``"poisson"``. The first request arrives at ``0``."""
    if arrival == "fixed":
        return [i / rate for i in range(requests)]
    if arrival != "poisson":
        raise ValueError(f"no arrival offsets for a {arrival!r} loop")
    rng = random.Random(f"lab-arrivals-{seed}")
    offsets = [0.0]
    for _ in range(requests - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets


def _as_progress(progress: Progress | TextIO | None) -> Progress:
    if isinstance(progress, Progress):
        return progress
    return PlainProgress(progress) if progress is not None else Progress()


async def run_requests(
    send: Callable[[int], Any],
    requests: int,
    concurrency: int,
    label: str,
    progress: Progress | TextIO | None,
    *,
    arrivals: Sequence[float] | None = None,
    drain: float = 5.0,
) -> tuple[list[Sent], float]:
    """Send requests ``0 .. requests-1`` with ``send``; return how each went and the wall time.

    Without ``arrivals`` (the default), a closed loop: ``concurrency`` at a time. With
    ``arrivals`` (seconds from the start, one per request, ascending), an open loop: request
    ``i`` starts at ``arrivals[i]`` whatever is in flight, its latency counts from then, and
    ``drain`` seconds (default ``5.0``) after the last arrival the requests still in flight are
    cancelled and returned as ``Unfinished`` errors. ``progress`` shows a step per call (a
    text stream gets one line at the end; ``None``: silent).
    """
    display = _as_progress(progress)
    with display.step(label, requests) as step:
        if arrivals is None:
            return await _closed_loop(send, requests, concurrency, step.advance)
        return await _open_loop(send, arrivals[:requests], drain, step.advance)


async def _closed_loop(
    send: Callable[[int], Any], requests: int, concurrency: int, done: Callable[[], None]
) -> tuple[list[Sent], float]:
    results: list[Sent] = []
    limiter = anyio.CapacityLimiter(concurrency)
    started = time.monotonic()

    async def one(i: int) -> None:
        async with limiter:
            sent: Sent = await send(i)
            results.append(replace(sent, finished=time.monotonic() - started))
            done()

    async with anyio.create_task_group() as workers:
        for i in range(requests):
            workers.start_soon(one, i)
    return results, time.monotonic() - started


async def _open_loop(
    send: Callable[[int], Any], arrivals: Sequence[float], drain: float, done: Callable[[], None]
) -> tuple[list[Sent], float]:
    results: list[Sent] = []
    in_flight: dict[int, float] = {}  # request -> its scheduled arrival (event-loop clock)
    started = anyio.current_time()

    async def one(i: int, scheduled: float) -> None:
        # Latency from the scheduled arrival: a request that starts late (a busy event loop,
        # a client short of CPU) waited, as a user's would have.
        late = anyio.current_time() - scheduled
        sent: Sent = await send(i)
        del in_flight[i]
        finished = anyio.current_time() - started
        results.append(replace(sent, latency=late + sent.latency, finished=finished))
        done()

    # Bounded: what is still in flight `drain` seconds after the last arrival is cancelled.
    with anyio.CancelScope(deadline=started + arrivals[-1] + drain):
        async with anyio.create_task_group() as group:
            for i, offset in enumerate(arrivals):
                scheduled = started + offset
                await anyio.sleep_until(scheduled)
                in_flight[i] = scheduled
                group.start_soon(one, i, scheduled)
    ended = anyio.current_time()
    for scheduled in in_flight.values():
        cut = Sent(ended - scheduled, ok=False, error_type=UNFINISHED, finished=ended - started)
        results.append(cut)
    return results, ended - started


def summarise(
    key: str,
    label: str,
    sent: Sequence[Sent],
    upstream: int,
    wall_time: float,
    *,
    arrival: str = "closed",
    offered_rate: float | None = None,
    window: float | None = None,
) -> RowResult:
    """One table row from the requests of a pass (``arrival`` and ``offered_rate``: how they
    arrived; default a closed loop).

    The achieved throughput counts successful requests per second: over ``wall_time`` by
    default (a closed loop ends when its last request does), or, given ``window`` (an open
    loop's arrival span, seconds from its start), those that ended within it, per second of it:
    the heavy tail of the last arrivals would otherwise read as lost throughput.
    """
    latencies = sorted(s.latency for s in sent)
    if window is not None and window > 0:
        throughput = sum(s.ok and s.finished <= window for s in sent) / window
    else:
        throughput = sum(s.ok for s in sent) / wall_time if wall_time > 0 else 0.0
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
        arrival=arrival,
        offered_rate=offered_rate,
        throughput=throughput,
        unfinished=errors.get(UNFINISHED, 0),
        latencies=tuple(round(latency, 6) for latency in latencies),
    )


async def _lab(config: LabConfig, progress: Progress) -> LabResult:
    primary = LlmperfProfile.load(config.run, scale=config.scale)
    cheap = LlmperfProfile.load(
        config.degraded_run, scale=config.scale, max_output_tokens=config.degraded_max_tokens
    )
    open_loop = config.arrival != "closed"
    arrivals = (
        arrival_offsets(config.arrival, config.rate, config.requests, config.seed)
        if open_loop
        else None
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
                send,
                config.requests,
                config.concurrency,
                label,
                progress,
                arrivals=arrivals,
                drain=config.drain,
            )
            results.append(
                summarise(
                    key,
                    label,
                    sent,
                    len(fake.attempts),
                    wall,
                    arrival=config.arrival,
                    offered_rate=config.rate if open_loop else None,
                    window=arrivals[-1] if arrivals else None,
                )
            )
            if isinstance(send, Through):
                stats.append(ClientStats.of(label, send.llm))
        streaming = None
        if config.streaming:
            fake.reset()
            streaming = await run_streaming(fake, config, progress)
        turn = None
        if config.turn:
            with progress.step("turn scenario (stage budgets, fan-out)"):
                fake.reset()
                turn = await run_turns(fake, seed=config.seed)
        lanes = None
        if config.fast_lane:
            with progress.step("many streams: litellm and the fast lane"):
                fake.reset()
                lanes = await run_fast_lane(fake)
        outage = None
        if config.outage:
            with progress.step("outage scenario (failover, breaker)"):
                fake.reset()
                outage = await run_outage(fake)
        await _stop_litellm_logging()
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


async def _stop_litellm_logging() -> None:
    """Stop litellm's logging worker, a task on the lab's event loop (asyncio only; on trio
    litellm runs on the bridge's loop, which outlives the run). Left pending when ``anyio.run``
    closes the loop, it would make asyncio log "Task was destroyed but it is pending!"."""
    if sniffio.current_async_library() != "asyncio":
        return
    try:
        from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER
    except ImportError:  # a litellm without it has nothing to stop
        return
    with anyio.move_on_after(2.0):
        await GLOBAL_LOGGING_WORKER.stop(timeout=1.0)


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


def prepare_litellm() -> None:
    """Import litellm offline and quietly (latencykit freezes the heap after it)."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from .._litellm import litellm

    litellm().suppress_debug_info = True


@contextmanager
def quiet_litellm() -> Iterator[None]:
    """Silence litellm's one known stray warning while the lab runs (and only it).

    ``litellm.acompletion`` builds the provider call's coroutine in a worker thread
    (``run_in_executor``) and awaits it back on the loop; a call cancelled in between (a lost
    hedge, a deadline, the end of an open-loop row) leaves that coroutine unawaited, and Python
    warns "coroutine 'OpenAIChatCompletion.acompletion' was never awaited" when it is collected.
    Nothing leaks: the request was never sent. The warning cannot be prevented from outside
    litellm, so it is filtered by its exact message.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"coroutine 'OpenAIChatCompletion\.\w+' was never awaited",
            category=RuntimeWarning,
        )
        yield


def run_lab(
    config: LabConfig | None = None,
    *,
    backend: str = "asyncio",
    progress: TextIO | None = sys.stderr,
) -> LabResult:
    """Run the lab and return its results.

    ``progress`` (default ``sys.stderr``) shows how far it got: a live ``rich`` bar when it is
    a terminal and ``rich`` is installed, else one line per finished step; ``None`` keeps it
    silent.
    """
    prepare_litellm()
    with quiet_litellm(), make_progress(progress) as display:
        return anyio.run(_lab, config or LabConfig(), display, backend=backend)


def write_json(result: LabResult, path: Path) -> None:
    """Write ``result`` as JSON to ``path``."""
    path.write_text(result.to_json() + "\n", encoding="utf-8")
