"""Hedging against real heavy tails: bare litellm vs lk.Hedge vs the ideal hedger.

Replays three llmperf runs through the fake provider on 127.0.0.1, latencies scaled down in time
so each pass takes seconds: together/13b and replicate/70b (heavy tails) and groq/70b (light).
For each run, N requests at concurrency C go through, in alternating blocks of 500 in ABBA
order (so that machine drift hits both alike),

* bare ``litellm.acompletion``;
* ``lk.LLM(..., hedge=lk.Hedge(lk.quantile(0.9), max_extra_load=0.1))``;

and the **ideal hedger** is computed offline from the very same samples: request i's primary
takes X_i and its backup Y_i (the fake provider serves exactly these to the first and second
attempt of request i, in both passes); the ideal fires the backup exactly when X_i exceeds the
delay d = the 0.9-quantile of the X's, so its latency is min(X_i, d + Y_i) and its extra load
the share of X_i > d. The client's own cost per call (litellm, loopback HTTP, the event loop:
the median of bare latency minus X_i) is added to the ideal, which cannot avoid it either.
Measured/ideal ratios show what the online policy (estimated delay,
warm-up, budget, client overhead) loses against that oracle.

    .venv/bin/python benchmarks/tail.py            # 2,000 requests per pass, a few minutes
    .venv/bin/python benchmarks/tail.py --quick    # 400 requests per pass
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

import latencykit as lk
from latencykit.lab.report import percentile
from latencykit.lab.rows import MESSAGES, PRIMARY, REQUEST_HEADER, Sent
from latencykit.lab.runner import ReplayScript, prepare_litellm, run_requests
from latencykit.testing import Behavior, FakeProvider, LlmperfProfile

RUNS = {"together/13b": 0.1, "replicate/70b": 0.015, "groq/70b": 0.2}
"""Run -> time scale: each brings the median end-to-end time to about 0.15-0.2 s."""
HEAVY = ("together/13b", "replicate/70b")
Q = 0.9
CAP = 0.1
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def e2e(behavior: Behavior) -> float:
    """Seconds the fake provider takes to answer (non-streaming): ttft + tokens x itl."""
    ttft, itl = behavior.ttft, behavior.itl
    assert isinstance(ttft, float) and isinstance(itl, float)
    return ttft + itl * behavior.output_tokens


def ideal(draws: Sequence[Sequence[Behavior]]) -> tuple[list[float], float, float]:
    """The oracle hedger on the same samples: latencies, its delay and its extra load."""
    primaries = [e2e(d[0]) for d in draws]
    delay = percentile(sorted(primaries), Q)
    latencies = [
        x if x <= delay else min(x, delay + e2e(d[1]))
        for x, d in zip(primaries, draws, strict=True)
    ]
    extra = sum(x > delay for x in primaries) / len(primaries)
    return latencies, delay, extra


def stats(latencies: Sequence[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {f"p{q * 100:g}": percentile(ordered, q) for q in QUANTILES}


def offset(
    send: Callable[[int], Awaitable[Sent]], start: int, step: int
) -> Callable[[int], Awaitable[Sent]]:
    """``send`` for request ids ``start + step * i`` (warm-up requests get negative ids)."""

    def shifted(i: int) -> Awaitable[Sent]:
        return send(start + step * i)

    return shifted


BLOCK = 500
"""Requests per block: bare and hedged blocks alternate, so machine drift hits both alike."""


async def one_run(run: str, scale: float, requests: int, concurrency: int) -> dict[str, Any]:
    import litellm

    profile = LlmperfProfile.load(run, scale=scale)
    key = "bench-key-not-secret"
    results: dict[str, Any] = {"run": run, "scale": scale}
    # Two model names with identical replay scripts (same seed): the bare and the hedged pass
    # see the same primary and backup for request i, and their blocks interleave.
    models = {"bare": f"{PRIMARY}-bare", "hedge": f"{PRIMARY}-hedge"}
    with FakeProvider(seed=11) as fake:
        hedge = lk.Hedge(lk.quantile(Q), max_extra_load=CAP)
        llm = lk.LLM(f"openai/{models['hedge']}", api_base=fake.base_url, api_key=key, hedge=hedge)
        latency: dict[str, dict[int, float]] = {"bare": {}, "hedge": {}}

        async def bare(i: int) -> Sent:
            started = time.monotonic()
            await litellm.acompletion(
                model=f"openai/{models['bare']}",
                api_base=fake.base_url,
                api_key=key,
                messages=MESSAGES,
                extra_headers={REQUEST_HEADER: str(i)},
            )
            latency["bare"][i] = time.monotonic() - started
            return Sent(latency["bare"][i], ok=True)

        async def hedged(i: int) -> Sent:
            started = time.monotonic()
            await llm.acompletion(messages=MESSAGES, extra_headers={REQUEST_HEADER: str(i)})
            latency["hedge"][i] = time.monotonic() - started
            return Sent(latency["hedge"][i], ok=True)

        sends = {"bare": bare, "hedge": hedged}
        for name in models.values():  # warm-up: fresh samples, latency window, connections
            fake.script(name, profile)
        for name, send in sends.items():
            await run_requests(offset(send, -1, -1), 60, concurrency, name, None)
        fake.reset()
        scripts = {name: ReplayScript(profile, requests, seed=5) for name in models}
        for name, model in models.items():
            fake.script(model, scripts[name])
        counts: dict[str, int] = {}

        def count(event: lk.events.Event) -> None:
            name = type(event).__name__
            if isinstance(event, lk.events.HedgeSkipped):
                name += f"({event.reason})"
            counts[name] = counts.get(name, 0) + 1

        walls = {"bare": 0.0, "hedge": 0.0}
        with lk.subscribe(count):
            for block in range(0, requests, BLOCK):
                size = min(BLOCK, requests - block)
                order = list(sends.items())
                if block // BLOCK % 2:
                    order.reverse()  # ABBA: neither variant always runs second
                for name, send in order:
                    _, wall = await run_requests(
                        offset(send, block, 1), size, concurrency, name, None
                    )
                    walls[name] += wall
        for name, model in models.items():
            upstream = sum(a.model == model for a in fake.attempts)
            results[name] = {
                **stats([latency[name][i] for i in range(requests)]),  # not the warm-up
                "extra_load": (upstream - requests) / requests,
                "wall_s": walls[name],
            }
        results["hedge"].update(
            hedges_fired=counts.get("HedgeFired", 0),
            hedges_won=counts.get("HedgeWon", 0),
            skipped_budget=counts.get("HedgeSkipped(budget)", 0),
        )
        print(f"  {run:<14} done in {sum(walls.values()):5.1f}s", file=sys.stderr, flush=True)
        draws = scripts["bare"].draws
        latencies, delay, extra = ideal(draws)
        # What the client itself adds to every call (litellm, HTTP, the event loop), measured on
        # the bare pass: the ideal hedger cannot avoid it either.
        overhead = statistics.median(latency["bare"][i] - e2e(draws[i][0]) for i in range(requests))
        latencies = [x + overhead for x in latencies]
        results["ideal"] = {
            **stats(latencies),
            "extra_load": extra,
            "delay": delay,
            "client_overhead": overhead,
        }
        results["ratios"] = {
            key: results["hedge"][key] / results["ideal"][key] for key in stats([1.0])
        }
    return results


def targets(results: Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
    checks: list[tuple[str, bool]] = []
    for r in results:
        hedge, bare, ratio = r["hedge"], r["bare"], r["ratios"]
        if r["run"] in HEAVY:
            checks.append(
                (f"{r['run']}: p99 {ratio['p99']:.2f} x ideal <= 1.2", ratio["p99"] <= 1.2)
            )
            checks.append(
                (
                    f"{r['run']}: extra load {hedge['extra_load']:.1%} <= {CAP + 0.01:.0%}",
                    hedge["extra_load"] <= CAP + 0.01,
                )
            )
        else:
            checks.append(
                (
                    f"{r['run']}: extra load {hedge['extra_load']:.1%} <= {CAP:.0%}",
                    hedge["extra_load"] <= CAP,
                )
            )
            change = hedge["p50"] / bare["p50"] - 1
            checks.append((f"{r['run']}: p50 change {change:+.1%} within 5%", abs(change) <= 0.05))
    return checks


def render(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<14} {'variant':<8} {'p50':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} {'extra':>7}",
        "-" * 64,
    ]
    for r in results:
        for name in ("bare", "hedge", "ideal"):
            row = r[name]
            lines.append(
                f"{r['run'] if name == 'bare' else '':<14} {name:<8} "
                + " ".join(f"{row[f'p{q * 100:g}'] * 1000:>7.0f}" for q in QUANTILES)
                + f" {row['extra_load']:>7.1%}"
            )
        ratio = r["ratios"]
        lines.append(
            f"{'':<14} {'h/ideal':<8} "
            + " ".join(f"{ratio[f'p{q * 100:g}']:>7.2f}" for q in QUANTILES)
        )
        hedge = r["hedge"]
        lines.append(
            f"{'':<14} hedges fired {hedge['hedges_fired']}, won {hedge['hedges_won']}, "
            f"skipped for budget {hedge['skipped_budget']}"
        )
        lines.append(
            f"{'':<14} ideal: delay {r['ideal']['delay'] * 1000:.0f} ms (p90 of primaries), plus "
            f"the client's own {r['ideal']['client_overhead'] * 1000:.1f} ms per call"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="400 requests per pass")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    requests = args.requests or (400 if args.quick else 2000)
    prepare_litellm()
    started = time.monotonic()
    results = [
        anyio.run(one_run, run, scale, requests, args.concurrency) for run, scale in RUNS.items()
    ]
    print(
        f"\nlatencies in ms; {requests} requests per pass at concurrency {args.concurrency}; "
        f"hedge = lk.Hedge(lk.quantile({Q}), max_extra_load={CAP})"
    )
    print(render(results))
    print("\nTargets")
    for name, ok in targets(results):
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    print(f"\n(took {time.monotonic() - started:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
