"""Trace replay: recorded per-request latencies through the real policies, on virtual time.

A trace is a list of requests, each with the target that served it, its time to first token,
its end-to-end latency and its error, and, when recorded, its arrival time. The replay sends
the requests again, at their arrival times or at a seeded Poisson rate, through an ``lk.LLM``
built from a config (:mod:`latencykit.config`), exactly as production would, but with the
provider simulated in-process on a virtual clock (:mod:`latencykit.lab.virtual`):

- a request's first attempt on its own target takes what the trace recorded for it;
- any other attempt (a hedge, a retry, a failover target, the degraded path) takes a sample
  drawn from the trace's records of the target it goes to, with a generator seeded by the
  replay's seed and the request's number, so the same trace and seed give the same report,
  byte for byte;
- an error recorded as ``429`` is :class:`~latencykit.RateLimited`, any other
  :class:`~latencykit.ProviderUnavailable` (503), raised when the recorded time has passed.

An hour of traffic replays in seconds. Calls are end to end, or streamed (``stream=True``):
the first chunk at the recorded time to first token, the rest spread until the recorded end.
"""

from __future__ import annotations

import contextvars
import csv
import functools
import json
import math
import os
import random
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from .. import errors
from ..config import LLMConfig
from ..llm import LLM
from ..stats import StatsTable
from ..target import Target
from . import virtual

__all__ = [
    "Outcome",
    "ReplayResult",
    "ReplayRow",
    "Run",
    "TraceRecord",
    "default_policy",
    "describe",
    "load_trace",
    "replay",
    "replay_rows",
    "run_requests",
]

MESSAGES = [{"role": "user", "content": "replayed"}]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One recorded request.

    Attributes:
        target: what served it (a model string, or ``provider/size`` for llmperf traces).
        ttft: seconds to its first token.
        duration: seconds to its end.
        error: ``None`` for a success, else the provider's status (``"429"``, ``"503"``) or
            another code.
        at: seconds from the trace's start at which it arrived, if recorded (default ``None``).
        output_tokens: tokens it produced, if recorded (default ``None``: wasted tokens of
            abandoned attempts are not counted).
    """

    target: str
    ttft: float
    duration: float
    error: str | None = None
    at: float | None = None
    output_tokens: int | None = None

    def tokens_by(self, elapsed: float) -> int:
        """Tokens produced ``elapsed`` seconds into the attempt (none before the first)."""
        tokens = self.output_tokens
        if not tokens or elapsed < self.ttft:
            return 0
        span = self.duration - self.ttft
        if span <= 0:
            return tokens
        return min(tokens, 1 + int((elapsed - self.ttft) / span * (tokens - 1)))


def load_trace(path: str | os.PathLike[str]) -> list[TraceRecord]:
    """The records of a trace file.

    Formats: a CSV with the columns of ``llmperf_per_request.csv`` (``provider``,
    ``model_size``, ``ttft_s``, ``e2e_s``, ``error`` as ``code:message``; the target is
    ``provider/model_size``), or with ``target``, ``ttft_s``, ``e2e_s`` and optionally ``error``
    and ``at_s``; or JSON lines with ``target``, ``ttft``, ``duration`` and optionally ``error``
    and ``at``, or the records of the slow-call log (:func:`latencykit.slow_calls.log_slow_calls`
    through a JSON log handler: its ``latencykit`` fields, ``created`` as the time), each
    attempt that ended being a record. In llmperf traces, error ``-100`` (too few output
    tokens) is a success.
    """
    path = Path(path)
    if path.suffix in (".jsonl", ".json"):
        found: list[TraceRecord] = []
        for n, line in _lines(path):
            data = json.loads(line)
            call = data.get("latencykit", data) if isinstance(data, Mapping) else data
            if isinstance(call, Mapping) and "attempts" in call:
                found += _from_slow_call(call, data, path, n)
            else:
                found.append(_from_json(data, path, n))
        return found
    with path.open(newline="", encoding="utf-8") as file:
        return [_from_csv(row, path, n) for n, row in enumerate(csv.DictReader(file), start=2)]


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    with path.open(encoding="utf-8") as file:
        for n, line in enumerate(file, start=1):
            if line.strip():
                yield n, line


def _number(value: object, where: str) -> float:
    try:
        found = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a number of seconds, got {value!r}") from None
    if not math.isfinite(found) or found < 0:
        raise ValueError(f"{where}: expected a number of seconds >= 0, got {value!r}")
    return found


def _from_csv(row: Mapping[str, str], path: Path, line: int) -> TraceRecord:
    where = f"{path}:{line}"
    if "target" in row:
        target = row["target"]
    elif "provider" in row and "model_size" in row:
        target = f"{row['provider']}/{row['model_size']}"
    else:
        raise ValueError(f"{where}: a trace needs a 'target' column (or 'provider', 'model_size')")
    error = (row.get("error") or "").split(":", 1)[0].strip() or None
    if error == "-100":  # llmperf: the answer came, shorter than asked
        error = None
    at = row.get("at_s")
    tokens = row.get("output_tokens")
    return TraceRecord(
        target=target,
        ttft=_number(row.get("ttft_s"), f"{where} ttft_s"),
        duration=_number(row.get("e2e_s"), f"{where} e2e_s"),
        error=error,
        at=None if at in (None, "") else _number(at, f"{where} at_s"),
        output_tokens=None
        if tokens in (None, "")
        else int(_number(tokens, f"{where} output_tokens")),
    )


def _from_slow_call(
    call: Mapping[str, Any], record: Mapping[str, Any], path: Path, line: int
) -> list[TraceRecord]:
    """The attempts of a slow-call log record (:mod:`latencykit.slow_calls`, written by a JSON
    log handler) that ended: what the provider did. Cancelled attempts say only that they
    took longer than they ran, and are left out."""
    where = f"{path}:{line}"
    created = record.get("created")
    base = None if created is None else _number(created, f"{where} created")
    found = []
    for attempt in call["attempts"]:
        outcome = attempt.get("outcome")
        if outcome not in ("ok", "error"):
            continue
        duration = _number(attempt.get("duration"), f"{where} attempt duration")
        start = _number(attempt.get("start", 0.0), f"{where} attempt start")
        kind = attempt.get("error_kind") or call.get("error_kind")
        found.append(
            TraceRecord(
                target=str(attempt.get("target")),
                ttft=_number(attempt.get("ttft") or duration, f"{where} attempt ttft"),
                duration=duration,
                error=None if outcome == "ok" else ("429" if kind == "rate_limited" else "503"),
                at=None if base is None else base + start,
            )
        )
    return found


def _from_json(data: object, path: Path, line: int) -> TraceRecord:
    where = f"{path}:{line}"
    if not isinstance(data, Mapping) or not isinstance(data.get("target"), str):
        raise ValueError(f"{where}: expected an object with a 'target'")
    error = data.get("error")
    at = data.get("at")
    tokens = data.get("output_tokens")
    return TraceRecord(
        target=data["target"],
        ttft=_number(data.get("ttft", data.get("duration")), f"{where} ttft"),
        duration=_number(data.get("duration"), f"{where} duration"),
        error=None if error in (None, "") else str(error),
        at=None if at is None else _number(at, f"{where} at"),
        output_tokens=None if tokens is None else int(_number(tokens, f"{where} output_tokens")),
    )


# --- the simulated provider ------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    record: TraceRecord
    rng: random.Random
    first: bool = True  # its own record not used yet
    attempts: int = 0


_request: contextvars.ContextVar[_Request] = contextvars.ContextVar("latencykit_replay_request")


@dataclass(slots=True)
class _Counts:
    attempts: int = 0
    cancelled: int = 0
    wasted: float = 0.0  # seconds of abandoned attempts
    wasted_tokens: int = 0  # tokens they had produced


_CHUNKS = 8  # a simulated stream's chunks after the first: enough for gaps, cheap to replay


class _Provider:
    """Answers attempts from the trace's records, on the loop's (virtual) clock."""

    def __init__(self, records: Sequence[TraceRecord]) -> None:
        self.by_target: dict[str, list[TraceRecord]] = {}
        for record in records:
            self.by_target.setdefault(record.target, []).append(record)
        self.counts = _Counts()
        self._serial = 0

    def _record_for(self, target: Target) -> TraceRecord:
        request = _request.get()
        request.attempts += 1
        self.counts.attempts += 1
        if request.first and target.key == request.record.target:
            request.first = False
            return request.record
        return request.rng.choice(self.by_target[target.key])

    def _abandoned(self, record: TraceRecord, elapsed: float) -> None:
        counts = self.counts
        counts.cancelled += 1
        counts.wasted += elapsed
        counts.wasted_tokens += record.tokens_by(elapsed)

    async def attempt(self, target: Target, **kwargs: Any) -> Any:
        record = self._record_for(target)
        started = anyio.current_time()
        try:
            await anyio.sleep(record.duration)
        except BaseException:
            self._abandoned(record, anyio.current_time() - started)
            raise
        if record.error is not None:
            raise _error(record.error, target.key)
        self._serial += 1
        return _litellm_response(f"replay-{self._serial}", target.key)

    def open(self, target: Target, **kwargs: Any) -> AsyncIterator[str]:
        """A streaming attempt: its first chunk at the record's TTFT, the rest spread evenly
        until its end; a recorded error comes at its time, before any chunk."""
        return self._chunks(self._record_for(target), target)

    async def _chunks(self, record: TraceRecord, target: Target) -> AsyncIterator[str]:
        started = anyio.current_time()
        done = False
        try:
            if record.error is not None:
                await anyio.sleep(record.duration)
                done = True
                raise _error(record.error, target.key)
            await anyio.sleep(record.ttft)
            yield "first"
            gap = max(0.0, record.duration - record.ttft) / _CHUNKS
            for _ in range(_CHUNKS):
                await anyio.sleep(gap)
                yield "more"
            done = True
        finally:
            if not done:
                self._abandoned(record, anyio.current_time() - started)


def _error(code: str, target: str) -> errors.ProviderError:
    if code == "429":
        return errors.RateLimited("rate limited (replayed)", target=target, status_code=429)
    return errors.ProviderUnavailable(f"error {code} (replayed)", target=target, status_code=503)


def _litellm_response(id: str, model: str) -> Any:
    from .._litellm import litellm

    return litellm().ModelResponse(
        id=id,
        model=model,
        choices=[
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        usage={"prompt_tokens": 8, "completion_tokens": 8, "total_tokens": 16},
    )


class _ReplayLLM(LLM):
    """An ``LLM`` whose attempts go to the simulated provider, every policy unchanged."""

    _provider: _Provider

    def _attempt_on(self, target: Target, streaming: bool) -> Any:
        provider = self._provider
        return functools.partial(provider.open if streaming else provider.attempt, target)


# --- the replay ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """What one policy did with the trace.

    Attributes:
        name: the row's name (``"bare"``, ``"default"``, ``"policy"``, a tuned value).
        requests: requests replayed.
        errors: requests that ended in an error.
        p50: median latency in seconds, from arrival to answer (errors included).
        p95: 95th percentile.
        p99: 99th percentile.
        extra: extra attempts per request (hedges, retries, failovers), ``0.05`` = +5 %.
        wasted: seconds of attempts abandoned (losers of races), per request.
        wasted_tokens: output tokens those attempts had produced, per request (from the
            trace's token counts; ``0`` without them).
        ttft_p99: streams: the 99th percentile of the time to first chunk (``None``
            otherwise).
        policy: what the row ran, one line (:func:`describe`; default ``""``).
        latencies: every request's latency, in arrival order (for plots).
        ttfts: streams: every answered request's time to first chunk, from its arrival, in
            arrival order (for plots; default ``()``).
    """

    name: str
    requests: int
    errors: int
    p50: float
    p95: float
    p99: float
    extra: float
    wasted: float
    wasted_tokens: float = 0.0
    ttft_p99: float | None = None
    policy: str = ""
    latencies: tuple[float, ...] = field(default=(), repr=False, compare=False)
    ttfts: tuple[float, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Rows side by side, and how they were obtained."""

    trace: str
    target: str
    seed: int
    rate: float | None
    rows: tuple[ReplayRow, ...] = field(default=())

    @property
    def streamed(self) -> bool:
        """Whether the calls were streams (the rows have times to first chunk)."""
        return any(row.ttft_p99 is not None for row in self.rows)

    @property
    def title(self) -> str:
        """What was replayed, one line (the report's first line, the plot's title)."""
        arrivals = "recorded" if self.rate is None else f"Poisson, {self.rate:g}/s"
        return (
            f"replay of {self.trace}: target {self.target}, seed {self.seed}, arrivals {arrivals}"
            + (", streamed" if self.streamed else "")
        )

    def report(self) -> str:
        """The rows as a text table, and what each row ran (the same trace and seed always
        give the same text)."""
        streams = self.streamed
        lines = [
            self.title,
            f"{'policy':<22} {'requests':>8} {'errors':>6} {'p50 s':>8} {'p95 s':>8} "
            f"{'p99 s':>8}"
            + (f" {'ttft p99':>8}" if streams else "")
            + f" {'extra':>7} {'wasted s':>9} {'wasted tok':>10}",
        ]
        for row in self.rows:
            ttft = "" if not streams else f" {row.ttft_p99 or math.nan:>8.3f}"
            lines.append(
                f"{row.name:<22} {row.requests:>8} {row.errors:>6} {row.p50:>8.3f} "
                f"{row.p95:>8.3f} {row.p99:>8.3f}{ttft} {row.extra:>6.1%} {row.wasted:>9.3f} "
                f"{row.wasted_tokens:>10.1f}"
            )
        lines += [f"  {row.name}: {row.policy}" for row in self.rows if row.policy]
        return "\n".join(lines) + "\n"


def default_policy(target: str) -> dict[str, Any]:
    """The lab's default policies for ``target``: hedging at the 90th percentile of recent
    latencies with at most 10 % extra load."""
    return {"model": target, "hedge": {"delay": {"q": 0.9}, "max_extra_load": 0.1}}


def describe(config: LLMConfig) -> str:
    """``config``'s options besides its model, as dotted ``path=value`` pairs on one line
    (the form ``lab tune --param`` takes), or ``"no policy"``."""
    pairs: list[str] = []

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                flatten(f"{prefix}.{key}", inner)
        else:
            pairs.append(f"{prefix}={value}")

    options = config.model_dump(mode="json", exclude_unset=True, exclude={"model"})
    for name, value in options.items():
        flatten(name, value)
    return ", ".join(pairs) or "no policy"


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def replay(
    records: Sequence[TraceRecord],
    policy: LLMConfig | Mapping[str, Any],
    *,
    name: str = "policy",
    seed: int = 0,
    rate: float | None = None,
    stream: bool = False,
) -> ReplayRow:
    """Replay the requests of ``records`` on ``policy``'s primary target through ``policy``.

    Args:
        records: the whole trace (other targets' records serve failovers and hedges there).
        policy: the ``LLM``'s config; its ``model`` is the target whose requests replay.
        name: the row's name (default ``"policy"``).
        seed: seeds the draws and the arrivals (default ``0``).
        rate: requests per second, Poisson, instead of recorded arrival times (default
            ``None``: recorded times; a trace without them needs a rate).
        stream: stream the calls (default ``False``): the first chunk comes at the record's
            time to first token, so hedging on the first chunk and the stream guard's
            ``first_token`` limit act as in production.
    """
    config = policy if isinstance(policy, LLMConfig) else LLMConfig.model_validate(policy)
    target = config.model
    requests = [r for r in records if r.target == target]
    if not requests:
        raise ValueError(
            f"the trace has no request on {target!r} (it has {sorted({r.target for r in records})})"
        )
    run = run_requests(records, requests, _arrivals(requests, seed, rate), config, seed, stream)
    outcomes = [(o.latency, o.ok, o.ttft) for o in run.outcomes]
    provider = run.provider
    latencies = [latency for latency, _, _ in outcomes]
    firsts = [first for _, _, first in outcomes if first is not None]
    counts = provider.counts
    n = len(requests)
    return ReplayRow(
        name=name,
        requests=n,
        errors=sum(not ok for _, ok, _ in outcomes),
        p50=_quantile(latencies, 0.5),
        p95=_quantile(latencies, 0.95),
        p99=_quantile(latencies, 0.99),
        extra=counts.attempts / n - 1,
        wasted=counts.wasted / n,
        wasted_tokens=counts.wasted_tokens / n,
        ttft_p99=_quantile(firsts, 0.99) if stream and firsts else None,
        policy=describe(config),
        latencies=tuple(latencies),
        ttfts=tuple(firsts),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replayed call: when it arrived, how long it took, whether it answered.

    Attributes:
        at: seconds from the start at which it arrived.
        latency: seconds from its arrival to its answer (or error).
        ok: whether it answered.
        ttft: streams: seconds from its arrival to its first chunk (``None``: none came).
        attempts: attempts it made (hedges, retries, failovers included).
    """

    at: float
    latency: float
    ok: bool
    ttft: float | None
    attempts: int


@dataclass(frozen=True, slots=True)
class Run:
    """What :func:`run_requests` did: each call's :class:`Outcome`, in arrival order, the
    simulated provider (its counts), the ``LLM`` that made the calls and its ``stats()`` at
    the end (read on the run's clock)."""

    outcomes: tuple[Outcome, ...]
    provider: _Provider
    llm: LLM
    stats: StatsTable


def run_requests(
    records: Sequence[TraceRecord],
    requests: Sequence[TraceRecord],
    arrivals: Sequence[float],
    config: LLMConfig,
    seed: int,
    stream: bool,
) -> Run:
    """Send ``requests`` (each served first by its own record; every other attempt by a draw
    from ``records`` of its target) at ``arrivals`` through the ``LLM`` ``config`` builds, on
    virtual time (what :func:`replay` does, with the outcomes of every call)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    target = config.model
    provider = _Provider(records)
    used = {target, *(t if isinstance(t, str) else t.name or t.model for t in config.failover)}
    if config.degrade is not None and config.degrade.model is not None:
        used.add(config.degrade.model)
    missing = sorted(used - provider.by_target.keys())
    if missing:
        raise ValueError(f"the trace has no samples of {missing}: every target must be in it")
    built: list[LLM] = []
    stats: list[StatsTable] = []

    async def main() -> list[Outcome]:
        llm = config.build(kind=_ReplayLLM)
        assert isinstance(llm, _ReplayLLM)
        llm._provider = provider
        llm._recorder.fleet = False  # simulated samples never reach the fleet's windows
        built.append(llm)
        if llm.autopilot is not None:
            llm.autopilot.blocking = True  # no virtual time passes during its rounds
        outcomes: list[Outcome] = [Outcome(0.0, 0.0, False, None, 0)] * len(requests)

        async def one(index: int, arrived: float) -> None:
            request = _Request(requests[index], random.Random(f"{seed}:{index}"))
            _request.set(request)
            first = None
            try:
                if stream:
                    async with await llm.acompletion(messages=MESSAGES, stream=True) as chunks:
                        first = anyio.current_time() - arrived
                        async for _ in chunks:
                            pass
                else:
                    await llm.acompletion(messages=MESSAGES)
                ok = True
            except errors.LatencykitError:
                ok = False
            latency = anyio.current_time() - arrived
            outcomes[index] = Outcome(arrived - start, latency, ok, first, request.attempts)

        start = anyio.current_time()
        try:
            async with anyio.create_task_group() as group:
                for index, at in enumerate(arrivals):
                    await anyio.sleep_until(start + at)
                    group.start_soon(one, index, start + at)
        finally:
            stats.append(llm.stats())
            if llm.autopilot is not None:
                await llm.autopilot.aclose()
        return outcomes

    outcomes = virtual.run(main)
    return Run(tuple(outcomes), provider, built[0], stats[0])


def _arrivals(requests: Sequence[TraceRecord], seed: int, rate: float | None) -> list[float]:
    if rate is None:
        if any(r.at is None for r in requests):
            raise ValueError("the trace has no arrival times: give a rate (requests per second)")
        first = min(r.at for r in requests if r.at is not None)
        return sorted(r.at - first for r in requests if r.at is not None)
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}")
    rng = random.Random(f"{seed}:arrivals")
    at, found = 0.0, []
    for _ in requests:
        found.append(at)
        at += rng.expovariate(rate)
    return found


def replay_rows(
    trace: str | os.PathLike[str],
    *,
    policy: LLMConfig | Mapping[str, Any] | None = None,
    target: str | None = None,
    seed: int = 0,
    rate: float | None = None,
    stream: bool = False,
) -> ReplayResult:
    """``latencykit lab replay``: the trace's requests bare, then through ``policy`` (default
    ``None``: the lab's :func:`default_policy`), side by side.

    ``target`` picks whose requests replay when there is no policy (default ``None``: the
    trace's first target); a policy replays its own ``model``'s. ``stream`` is
    :func:`replay`'s.
    """
    records = load_trace(trace)
    if not records:
        raise ValueError(f"{trace}: the trace is empty")
    config: LLMConfig
    if policy is None:
        config = LLMConfig.model_validate(default_policy(target or records[0].target))
        name = "default"
    else:
        config = policy if isinstance(policy, LLMConfig) else LLMConfig.model_validate(policy)
        name = "policy"
    bare = LLMConfig(model=config.model)
    rows = (
        replay(records, bare, name="bare", seed=seed, rate=rate, stream=stream),
        replay(records, config, name=name, seed=seed, rate=rate, stream=stream),
    )
    return ReplayResult(
        trace=Path(trace).name, target=config.model, seed=seed, rate=rate, rows=rows
    )
