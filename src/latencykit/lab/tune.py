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
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import LLMConfig
from .replay import ReplayRow, default_policy, load_trace, replay

__all__ = ["TuneResult", "tune", "with_value"]


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
