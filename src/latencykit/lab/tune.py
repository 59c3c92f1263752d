"""What-if tuning: one policy parameter swept over a trace replay, and the cheapest setting that
meets a p99 target.

Each value of the parameter replays the same trace with the same seed (:mod:`.replay`), so
rows differ only by the parameter; the trace replayed with no policy (``bare``) is shown above
them, for reference. The cost of a setting is its extra attempts per request
(hedges, retries, failovers), then the output tokens of the attempts it abandoned (from the
trace's token counts), then their seconds. A row is on the frontier
when no other row has both a lower p99 and a lower cost. The recommendation is the cheapest
row whose p99 meets the target, the lower p99 breaking ties.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..autopilot import SLO, Change, Setting
from ..config import LLMConfig
from .replay import (
    Outcome,
    ReplayRow,
    TraceRecord,
    default_policy,
    load_trace,
    replay,
    run_requests,
)

__all__ = [
    "BAD_START",
    "TRAILING",
    "AutopilotRun",
    "Minute",
    "TuneResult",
    "autopilot_run",
    "tune",
    "with_value",
]


def with_value(config: Mapping[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of ``config`` with the field at the dotted ``path`` (``"hedge.delay.q"``) set
    to ``value``; missing or scalar levels on the way become mappings."""
    found: dict[str, Any] = copy.deepcopy(dict(config))
    node = found
    *parents, last = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value
    return found


@dataclass(frozen=True, slots=True)
class TuneResult:
    """The sweep's rows, its frontier and its recommendation.

    Attributes:
        trace: the trace file's name.
        param: the dotted path swept.
        p99_target: the p99 to meet, in seconds (``None``: no recommendation asked).
        rows: one per value, in the order given.
        frontier: the names of the rows no other row beats on both p99 and cost.
        recommended: the cheapest row meeting ``p99_target`` (``None`` if none does).
        bare: the trace replayed on the same target with no policy, for reference (never on
            the frontier nor recommended; default ``None``: not replayed).
    """

    trace: str
    param: str
    p99_target: float | None
    rows: tuple[ReplayRow, ...]
    frontier: tuple[str, ...]
    recommended: ReplayRow | None
    bare: ReplayRow | None = None

    def report(self) -> str:
        """The sweep as a text table, then the recommendation."""
        streams = any(row.ttft_p99 is not None for row in self.rows)
        lines = [
            f"tuning {self.param} on {self.trace}"
            + ("" if self.p99_target is None else f", p99 target {self.p99_target:g} s"),
            f"{'setting':<28} {'p50 s':>8} {'p95 s':>8} {'p99 s':>8}"
            + (f" {'ttft p99':>8}" if streams else "")
            + f" {'extra':>7} {'wasted tok':>10} {'errors':>6}  frontier",
        ]
        shown = self.rows if self.bare is None else (self.bare, *self.rows)
        for row in shown:
            mark = "*" if row.name in self.frontier else ""
            ttft = f" {row.ttft_p99 or 0.0:>8.3f}" if streams else ""
            lines.append(
                f"{row.name:<28} {row.p50:>8.3f} {row.p95:>8.3f} {row.p99:>8.3f}{ttft} "
                f"{row.extra:>6.1%} {row.wasted_tokens:>10.1f} {row.errors:>6}  {mark}"
            )
        if self.p99_target is not None:
            if self.recommended is None:
                lines.append(f"no setting meets p99 <= {self.p99_target:g} s")
            else:
                lines.append(
                    f"recommended: {self.recommended.name} (p99 {self.recommended.p99:.3f} s, "
                    f"{self.recommended.extra:.1%} extra)"
                )
        return "\n".join(lines) + "\n"


def _cost(row: ReplayRow) -> tuple[float, float, float]:
    return (round(row.extra, 9), round(row.wasted_tokens, 9), round(row.wasted, 9))


def tune(
    trace: str | os.PathLike[str],
    param: str,
    values: Sequence[object],
    *,
    policy: Mapping[str, Any] | None = None,
    target: str | None = None,
    p99: float | None = None,
    seed: int = 0,
    rate: float | None = None,
    stream: bool = False,
) -> TuneResult:
    """Replay ``trace`` once per value of ``param`` in ``policy`` (default ``None``: the lab's
    default policy on ``target``, else the trace's first target), and recommend the cheapest
    value meeting ``p99`` seconds (default ``None``: no recommendation). ``seed``, ``rate``
    and ``stream`` are :func:`~latencykit.lab.replay.replay`'s (stream to tune the stream
    guard's ``first_token`` limit or hedging on the first chunk). The result carries the
    trace replayed bare too."""
    if not values:
        raise ValueError("tune needs at least one value")
    records = load_trace(trace)
    if not records:
        raise ValueError(f"{trace}: the trace is empty")
    base = dict(policy) if policy is not None else default_policy(target or records[0].target)
    model = LLMConfig.model_validate(base).model
    bare = replay(records, {"model": model}, name="bare", seed=seed, rate=rate, stream=stream)
    rows = tuple(
        replay(
            records,
            with_value(base, param, value),
            name=f"{param}={value}",
            seed=seed,
            rate=rate,
            stream=stream,
        )
        for value in values
    )
    frontier = tuple(
        row.name
        for row in rows
        if not any(
            other.p99 <= row.p99
            and _cost(other) <= _cost(row)
            and (other.p99, _cost(other)) != (row.p99, _cost(row))
            for other in rows
        )
    )
    meeting = [row for row in rows if p99 is not None and row.p99 <= p99]
    recommended = min(meeting, key=lambda row: (_cost(row), row.p99)) if meeting else None
    return TuneResult(
        trace=Path(trace).name,
        param=param,
        p99_target=p99,
        rows=rows,
        frontier=frontier,
        recommended=recommended,
        bare=bare,
    )


# --- the SLO autopilot on a trace ------------------------------------------------------------

TRAILING = 5
"""Minutes over which :attr:`AutopilotRun.reached` measures a p99 (a minute's p99 of a few
hundred calls is one of its slowest few: it scatters widely around the true p99)."""

BAD_START: Mapping[str, Any] = {"stream_guard": {"first_token": 30.0}}
"""Where :func:`autopilot_run` starts by default: a 30 s first-token limit and no hedging."""


@dataclass(frozen=True, slots=True)
class Minute:
    """One minute of an :func:`autopilot_run` (the calls that arrived in it).

    Attributes:
        minute: its number, from 1.
        requests: calls that arrived in it.
        ttft_p99: the p99 of their times to first chunk, a failed call counting as never
            answering (``None``: not streamed).
        p99: the p99 of their durations.
        extra: their extra attempts per call.
        changes: the autopilot's steps decided in it, applied or refused.
        trailing: ``ttft_p99``, ``total_p99`` and ``extra`` over the calls of the last
            :data:`TRAILING` minutes, this one included (fewer at the start): the p99 a
            dashboard over that window shows.
    """

    minute: int
    requests: int
    ttft_p99: float | None
    p99: float
    extra: float
    changes: tuple[Change, ...]
    trailing: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class AutopilotRun:
    """An ``LLM`` with an SLO driven by a trace on virtual time, from a start setting: what the
    autopilot did, minute by minute, and where it ended.

    Attributes:
        trace: the trace's name.
        target: whose records were replayed.
        slo: the objective.
        seed: the seed of the arrivals and draws.
        rate: calls per second (Poisson).
        start: the ``LLM`` options it started from (config form).
        minutes: one row per minute.
        history: every step, applied or refused (:attr:`Autopilot.history`).
        forecasts: each round's prediction (:attr:`Autopilot.forecasts`).
        setting: the target's setting at the end.
        measured_after: the p99s the calls measured after the last applied step (``ttft_p99``,
            ``total_p99``, ``extra``; empty when nothing was applied).
        overall: the same figures over every call of the run.
    """

    trace: str
    target: str
    slo: SLO
    seed: int
    rate: float
    start: Mapping[str, Any]
    minutes: tuple[Minute, ...]
    history: tuple[Change, ...]
    forecasts: tuple[tuple[float, str, dict[str, float]], ...]
    setting: Setting
    measured_after: Mapping[str, float]
    overall: Mapping[str, float]

    def _meets(self, figures: Mapping[str, float]) -> bool:
        return not any(
            figures.get(name, 0.0) > goal for name, goal in self.slo.objectives().items()
        )

    @property
    def reached(self) -> int | None:
        """The first minute from which the p99s over the trailing :data:`TRAILING` minutes
        meet the SLO at every minute to the end (``None``: the last one misses it)."""
        found = None
        for minute in self.minutes:
            found = (found or minute.minute) if self._meets(minute.trailing) else None
        return found

    @property
    def minutes_over(self) -> int:
        """Minutes after :attr:`reached` whose own p99 (of that minute's calls alone) misses
        the SLO: the scatter of a p99 over a few hundred calls."""
        reached = self.reached
        return sum(
            1
            for m in self.minutes
            if reached is not None
            and m.minute >= reached
            and not self._meets({"ttft_p99": m.ttft_p99 or 0.0, "total_p99": m.p99})
        )

    @property
    def extra(self) -> float:
        """Extra attempts per call over the whole run."""
        total = sum(m.requests for m in self.minutes)
        extra = sum(m.extra * m.requests for m in self.minutes)
        return extra / total if total else 0.0

    @property
    def monotone(self) -> bool:
        """Whether every setting moved one way only (no oscillation)."""
        for name in ("hedge_quantile", "first_token", "stall", "slow_call_duration"):
            # off (None) is above every quantile
            values = [
                1.0 if c.new is None else c.new
                for c in self.history
                if c.applied and c.setting == name
            ]
            ups = any(b > a for a, b in itertools.pairwise(values))
            downs = any(b < a for a, b in itertools.pairwise(values))
            if ups and downs:
                return False
        return True

    @property
    def settled(self) -> int | None:
        """The minute of the last applied step (``None``: none was)."""
        applied = [c.at for c in self.history if c.applied]
        return int(max(applied) // 60) + 1 if applied else None

    @property
    def predicted(self) -> Mapping[str, float]:
        """The replay's prediction made when the last step was applied, for the setting it
        left in force (empty when nothing was applied)."""
        applied = [c.at for c in self.history if c.applied]
        if not applied:
            return {}
        last = max(applied)
        return next(f for at, t, f in self.forecasts if at == last and t == self.target)

    def recommended(self) -> dict[str, Any]:
        """The setting reached, as ``LLM`` options in config form (with the SLO)."""
        setting, found = self.setting, dict(self.start)
        found.pop("hedge", None)
        if setting.hedge_quantile is not None:
            found["hedge"] = {
                "delay": {"q": setting.hedge_quantile},
                "max_extra_load": self.slo.max_extra_load,
            }
        guard = {k: v for k, v in (("first_token", setting.first_token), ("stall", setting.stall))}
        found["stream_guard"] = {k: round(v, 3) for k, v in guard.items() if v is not None}
        found["slo"] = {k: v for k, v in dataclasses.asdict(self.slo).items() if v is not None}
        return found

    def report(self) -> str:
        """The run as text: the minutes with their steps, then the verdict and the setting."""
        goals = ", ".join(f"{k} {v:g}s" for k, v in self.slo.objectives().items())
        lines = [
            f"autopilot on {self.trace}: target {self.target}, {goals}, max extra load "
            f"{self.slo.max_extra_load:.0%}, {self.rate:g} calls/s, seed {self.seed}",
            f"start: {self.start}",
            f"{'minute':>6} {'calls':>6} {'ttft p99':>9} {'p99':>8} {'extra':>7} "
            f"{f'last {TRAILING} min: ttft p99':>21} {'p99':>8}  steps",
        ]
        for m in self.minutes:
            ttft = "-" if m.ttft_p99 is None else f"{m.ttft_p99:.3f}"
            trailing = m.trailing.get("ttft_p99")
            lines.append(
                f"{m.minute:>6} {m.requests:>6} {ttft:>9} {m.p99:>8.3f} {m.extra:>6.1%} "
                f"{'-' if trailing is None else f'{trailing:.3f}':>21} "
                f"{m.trailing['total_p99']:>8.3f}"
            )
            for c in m.changes:
                mark = "applied" if c.applied else "refused"
                lines.append(f"{'':>32}{mark} {c.setting} {_v(c.old)} -> {_v(c.new)}: {c.reason}")
        predicted, measured = self.predicted, self.measured_after
        lines += [
            f"reached the SLO at minute {self.reached} (p99 over the last {TRAILING} minutes; "
            f"{self.minutes_over} later minutes over it on their own)"
            if self.reached is not None
            else "the SLO was not reached",
            f"extra load {self.extra:.1%}; settings {'monotone' if self.monotone else 'oscillated'}"
            + (f", last change at minute {self.settled}" if self.settled else ", no change"),
        ]
        for name in ("ttft_p99", "total_p99"):
            if name in predicted and name in measured and measured[name] > 0:
                ratio = predicted[name] / measured[name]
                lines.append(
                    f"{name}: predicted {predicted[name]:.3f}s, measured after "
                    f"{measured[name]:.3f}s (ratio {ratio:.3f})"
                )
        lines.append(f"recommended: {json.dumps(self.recommended())}")
        return "\n".join(lines) + "\n"


def _v(value: float | None) -> str:
    return "off" if value is None else f"{value:.3g}"


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else math.nan


def _figures(outcomes: Sequence[Outcome], stream: bool) -> dict[str, float]:
    found = {
        "total_p99": _p99([o.latency for o in outcomes]),
        "extra": sum(o.attempts for o in outcomes) / len(outcomes) - 1 if outcomes else 0.0,
        "failed": sum(not o.ok for o in outcomes) / len(outcomes) if outcomes else 0.0,
    }
    if stream:
        found["ttft_p99"] = _p99([o.ttft if o.ttft is not None else math.inf for o in outcomes])
    return found


def autopilot_run(
    trace: str | os.PathLike[str] | Sequence[TraceRecord],
    slo: SLO,
    *,
    target: str | None = None,
    start: Mapping[str, Any] = BAD_START,
    minutes: int = 20,
    rate: float = 5.0,
    seed: int = 0,
    stream: bool = True,
) -> AutopilotRun:
    """Drive an ``LLM`` with ``slo`` through ``minutes`` of calls at ``rate`` per second
    (Poisson), each served by a record of ``target`` (default ``None``: the trace's first)
    drawn with ``seed``, on virtual time, starting from the options ``start`` (default
    :data:`BAD_START`); the autopilot's rounds run every ``slo.every`` seconds as in
    production. Deterministic for a seed. ``stream``: streamed calls (default ``True``)."""
    records = list(trace) if not isinstance(trace, (str, os.PathLike)) else load_trace(trace)
    name = "records" if not isinstance(trace, (str, os.PathLike)) else Path(trace).name
    if not records:
        raise ValueError(f"{name}: the trace is empty")
    target = target or records[0].target
    mine = [r for r in records if r.target == target]
    if not mine:
        raise ValueError(f"the trace has no request on {target!r}")
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of calls per second, got {rate!r}")
    rng = random.Random(f"{seed}:autopilot")
    arrivals, at = [], 0.0
    while at < minutes * 60.0:
        arrivals.append(at)
        at += rng.expovariate(rate)
    requests = [rng.choice(mine) for _ in arrivals]
    options = {**start, "model": target, "slo": dataclasses.asdict(slo)}
    run = run_requests(records, requests, arrivals, LLMConfig.model_validate(options), seed, stream)
    autopilot = run.llm.autopilot
    assert autopilot is not None
    history = tuple(autopilot.history)
    rows = []
    for n in range(minutes):
        these = [o for o in run.outcomes if n * 60 <= o.at < (n + 1) * 60]
        figures = _figures(these, stream)
        steps = tuple(c for c in history if n * 60 <= c.at < (n + 1) * 60)
        recent = [o for o in run.outcomes if (n + 1 - TRAILING) * 60 <= o.at < (n + 1) * 60]
        rows.append(
            Minute(
                n + 1,
                len(these),
                figures.get("ttft_p99"),
                figures["total_p99"],
                figures["extra"],
                steps,
                _figures(recent, stream),
            )
        )
    applied = [c.at for c in history if c.applied]
    after = [o for o in run.outcomes if applied and o.at >= max(applied)]
    return AutopilotRun(
        trace=name,
        target=target,
        slo=slo,
        seed=seed,
        rate=rate,
        start=dict(start),
        minutes=tuple(rows),
        history=history,
        forecasts=tuple(autopilot.forecasts),
        setting=Setting(
            hedge_quantile=(row := run.stats[target]).hedge_quantile,
            first_token=row.first_token_limit,
            stall=row.stall_limit,
            slow_call_duration=row.slow_call_duration,
        ),
        measured_after=_figures(after, stream) if after else {},
        overall=_figures(run.outcomes, stream),
    )
