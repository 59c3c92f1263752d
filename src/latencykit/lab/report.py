"""Summaries and the printed table of a lab run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..stats import StatsTable, TargetStats

if TYPE_CHECKING:
    from ..llm import LLM
    from .runner import LabResult


@dataclass(frozen=True, kw_only=True)
class ClientStats:
    """``llm.stats()`` of one of the lab's clients, taken right after its scenario (the
    windows are 60 s long: read at the end of the lab, the first rows' would have expired)."""

    label: str
    targets: tuple[TargetStats, ...]

    @classmethod
    def of(cls, label: str, llm: LLM) -> ClientStats:
        """Snapshot ``llm.stats()`` now, under ``label``."""
        return cls(label=label, targets=tuple(llm.stats().values()))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of already sorted values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def format_table(result: LabResult) -> str:
    """The lab's results as a fixed-width text table (latencies in milliseconds; achieved load,
    and in an open loop the offered load, in requests/s: a closed loop offers no rate)."""
    offered = any(row.offered_rate is not None for row in result.rows)
    header = (
        f"{'policy':<30} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} "
        f"{'errors':>7} {'extra req':>10} {'degraded':>9} {'hedge won':>10} "
        + (f"{'offered/s':>10} " if offered else "")
        + f"{'achieved/s':>11}"
    )
    lines = [header, "-" * len(header)]
    for row in result.rows:
        rate = "" if not offered else f"{row.offered_rate or math.nan:>10,.1f} "
        lines.append(
            f"{row.label:<30} {_ms(row.p50):>7} {_ms(row.p90):>7} {_ms(row.p99):>7} "
            f"{_ms(row.max):>7} {row.errors:>7} {row.extra_load_pct:>9.1f}% "
            f"{row.degraded:>9} {row.hedges_won:>10} {rate}{row.throughput:>11,.1f}"
        )
    config = result.config
    if config.arrival == "closed":
        load = (
            f"latencies in ms over {config.requests} requests per row, closed loop at "
            f"concurrency {config.concurrency} (latency from each request's start); "
            "achieved/s: successful requests per second of the row's run"
        )
    else:
        load = (
            f"latencies in ms over {config.requests} requests per row, open loop: "
            f"{config.arrival} arrivals at {config.rate:g} requests/s, latency from each "
            f"request's scheduled arrival; achieved/s: successful requests ended while "
            f"requests arrived, per second; requests in flight {config.drain:g}s after the "
            "last arrival are cut (Unfinished)"
        )
    lines += [
        "",
        load,
        f"primary replays llmperf {config.run} x{config.scale:g}, "
        f"degraded path {config.degraded_run} x{config.scale:g}",
        f"lk.LLM(deadline={config.deadline:g}s, degrade=Degrade(after={config.degrade_after:g}s, "
        f"max_tokens={config.degraded_max_tokens})); "
        f"lk.Hedge(quantile({config.hedge_quantile:g}), max_extra_load={config.max_extra_load:g})",
    ]
    if any(row.key == "hedge" for row in result.rows):
        lines.append(
            f"the hedge row sends a backup only once a call has run past about the recent "
            f"p{config.hedge_quantile * 100:g}: it cuts the tail (p99, max); below that it makes "
            "one attempt per call as the bare row does, and its p50/p90 differ from the bare "
            "row's by run-to-run noise (client CPU shared with litellm and the fake provider: "
            "repeat the run to see its size)"
        )
    for row in result.rows:
        if row.error_types:
            kinds = ", ".join(f"{name} x{count}" for name, count in row.error_types.items())
            lines.append(f"errors in {row.label}: {kinds}")
    return "\n".join(lines)


def format_stats(result: LabResult) -> str:
    """Every ``lk.LLM`` client's per-target statistics (``llm.stats()``), one table each."""
    clients = [*result.stats]
    if result.streaming is not None:
        clients += result.streaming.stats
    if result.outage is not None:
        clients += result.outage.stats
    lines = ["per-target statistics of each lk.LLM client (llm.stats(), after its scenario)"]
    for client in clients:
        table = str(StatsTable(client.targets))
        lines += ["", client.label, *(f"  {line}" for line in table.splitlines())]
    return "\n".join(lines)
