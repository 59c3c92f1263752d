"""The lab's outage scenario: a primary that fails for a while, then recovers.

Four clients call ``lk.LLM(primary, failover=[secondary], breaker=...)`` every 50 ms for a few
seconds while the primary answers 503 during the first part. The timeline shows the answers
served by the secondary, the breaker opening (no more requests to the primary), probing in
half-open, and closing once the primary is healthy again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

import latencykit as lk

from ..testing import Behavior, FakeProvider, Fault, RequestInfo
from .report import ClientStats
from .rows import MESSAGES

PRIMARY = "lab-outage-primary"
SECONDARY = "lab-outage-secondary"


@dataclass(frozen=True, kw_only=True)
class OutageResult:
    """What happened in the outage scenario (times in seconds from its start).

    ``transitions`` lists the primary's breaker changes ``(time, from, to)``; ``timeline``
    counts the answers per second by ``"primary"``, ``"secondary"`` and ``"errors"``;
    ``log`` records every call as ``(start, latency, answered by)``, the last one of
    ``"primary"``, ``"secondary"`` or ``"error"`` (the timeline picture is drawn from it)."""

    outage: float
    duration: float
    calls: int
    errors: int
    by_secondary: int
    primary_requests_during_outage: int
    transitions: list[tuple[float, str, str]] = field(default_factory=list)
    timeline: list[dict[str, int]] = field(default_factory=list)
    stats: tuple[ClientStats, ...] = ()
    log: list[tuple[float, float, str]] = field(default_factory=list)


async def run_outage(
    fake: FakeProvider, *, outage: float = 3.0, duration: float = 7.0, clients: int = 4
) -> OutageResult:
    """Run the scenario against ``fake`` and return its timeline."""
    started = time.monotonic()
    recovered_at = started + outage

    def primary(request: RequestInfo) -> Behavior:
        if request.arrived_at < recovered_at:
            return Behavior(ttft=0.01, fault=Fault.HTTP_503)
        return Behavior(ttft=0.02, output_tokens=8)

    fake.script(PRIMARY, primary)
    fake.script(SECONDARY, Behavior(ttft=0.03, output_tokens=8))
    options = {
        "window_size": 10,
        "minimum_calls": 5,
        "failure_rate": 0.5,
        "open_duration": 1.0,
        "half_open_calls": 2,
    }
    lk.policies.breaker.reset_breakers()  # each run starts with new breakers (process-wide)
    llm = lk.LLM(
        f"openai/{PRIMARY}",
        api_base=fake.base_url,
        api_key="lab-key-not-secret",
        deadline=2.0,
        failover=[
            {"model": f"openai/{SECONDARY}", "api_base": fake.base_url, "api_key": "lab-key"}
        ],
        breaker=lambda key: lk.Breaker(key, **options),  # type: ignore[arg-type]
    )
    transitions: list[tuple[float, str, str]] = []
    buckets: dict[int, dict[str, int]] = {}
    errors = calls = by_secondary = 0
    log: list[tuple[float, float, str]] = []

    def watch(event: lk.events.Event) -> None:
        if isinstance(event, lk.policies.breaker.BreakerStateChanged) and event.key.endswith(
            PRIMARY
        ):
            transitions.append(
                (time.monotonic() - started, event.from_state.value, event.to_state.value)
            )

    async def client() -> None:
        nonlocal errors, calls, by_secondary
        while time.monotonic() - started < duration:
            at = time.monotonic() - started
            bucket = buckets.setdefault(int(at), {"primary": 0, "secondary": 0, "errors": 0})
            calls += 1
            try:
                response = await llm.acompletion(messages=MESSAGES)
            except Exception:
                errors += 1
                bucket["errors"] += 1
                who = "error"
            else:
                who = "secondary" if lk.report(response).target.endswith(SECONDARY) else "primary"
                bucket[who] += 1
                by_secondary += who == "secondary"
            log.append((round(at, 6), round(time.monotonic() - started - at, 6), who))
            await anyio.sleep(0.05)

    with lk.subscribe(watch):
        async with anyio.create_task_group() as group:
            for _ in range(clients):
                group.start_soon(client)
    during = [a for a in fake.attempts if a.model == PRIMARY and a.arrived_at < recovered_at]
    return OutageResult(
        outage=outage,
        duration=time.monotonic() - started,
        calls=calls,
        errors=errors,
        by_secondary=by_secondary,
        primary_requests_during_outage=len(during),
        transitions=transitions,
        timeline=[buckets[s] for s in sorted(buckets)],
        stats=(ClientStats.of("outage: lk.LLM failover + breaker", llm),),
        log=sorted(log),
    )


def format_outage(result: OutageResult) -> str:
    """The scenario's timeline as text."""
    lines = [
        f"outage scenario: primary answers 503 for {result.outage:g}s, then recovers; "
        "lk.LLM(failover=[secondary], breaker=...)",
        f"{'second':>6} {'primary':>8} {'secondary':>10} {'errors':>7}",
    ]
    for second, bucket in enumerate(result.timeline):
        lines.append(
            f"{second:>6} {bucket['primary']:>8} {bucket['secondary']:>10} {bucket['errors']:>7}"
        )
    for at, before, after in result.transitions:
        lines.append(f"  breaker {before} -> {after} at {at:.2f}s")
    lines.append(
        f"{result.calls} calls, {result.errors} errors, {result.by_secondary} answered by the "
        f"secondary; the primary saw {result.primary_requests_during_outage} requests during "
        "the outage (the open breaker kept the rest away)"
    )
    return "\n".join(lines)
