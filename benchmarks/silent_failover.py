"""Out of the box, a provider that goes silent (issue 25): ``lk.LLM`` with its defaults and a
failover target, after warm-up, when the primary then (a) never answers, (b) sends its first
token after 20 s, (c) stalls mid-stream. Two source trees side by side, in turns, each run in a
fresh interpreter on the fake provider over loopback HTTP::

    git archive 381a6e5 | tar -x -C /tmp/base381d     # the tree before learned limits
    .venv/bin/python benchmarks/silent_failover.py --base /tmp/base381d [--rounds 3] [--lane openai]

The LLM is ``lk.LLM("openai/primary", failover=[backup], timeout=30)``: no stream guard, no
SLO (the issue's benchmark used the 30 s attempt timeout). The primary's healthy time to first
token is log-normal (median 0.35 s, sigma 0.25); 40 streams warm it (10 at a time). Each
scenario then runs on a freshly warmed LLM; printed per tree: the seconds to the answer's first
chunk (or to the error), who answered, the primary's attempt's duration (where it gave up), and
that as a multiple of the primary's healthy p99 time to first token as its recorder measured it
(the issue's bound: at most 3x). Ranges are over the rounds (min-max): the machine is shared.

``--cost`` times instead what working out an attempt's limits costs (this tree only): the
prompt's length and ``StreamGuard.limits`` for a target with a warm window, next to a guard
whose limits are both set (nothing learned), in one run::

    .venv/bin/python benchmarks/silent_failover.py --cost
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "sk-bench"
SCENARIOS = ("silent", "first token 20 s", "stall mid-stream")


async def _scenario(fake: Any, lane: str, name: str) -> dict[str, Any]:
    """One scenario on a freshly warmed LLM: what the caller saw."""
    import anyio

    import latencykit as lk
    from latencykit.testing import Behavior, Fault, Latency

    backup = {"model": "openai/backup", "api_base": fake.base_url, "api_key": KEY}
    llm = lk.LLM(
        "openai/primary",
        api_base=fake.base_url,
        api_key=KEY,
        failover=[{**backup, "transport": lane}],
        timeout=30.0,
        transport=lane,
    )
    fake.script("primary", Behavior(ttft=Latency.lognormal(0.35, 0.25), output_tokens=8))
    fake.script("backup", Behavior(ttft=0.2, output_tokens=8))

    async def healthy() -> None:
        async with await llm.acompletion(messages=MESSAGES, stream=True) as stream:
            async for _ in stream:
                pass

    for _ in range(4):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(healthy)
    row = llm.stats()["openai/primary"]
    fault = {
        "silent": Behavior(fault=Fault.HANG),
        "first token 20 s": Behavior(ttft=20.0, output_tokens=8),
        "stall mid-stream": Behavior(fault=Fault.STALL, stall_after=3, output_tokens=8),
    }[name]
    fake.script("primary", fault)
    started = time.monotonic()
    outcome = "answered"
    try:
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        first = time.monotonic() - started
        async with stream:
            async for _ in stream:
                pass
    except lk.LatencykitError as exc:
        first = time.monotonic() - started
        outcome = type(exc).__name__
        stream = None
    report = None if stream is None else lk.report(stream)
    primary = next(
        (a for a in (report.attempts if report else ()) if a.target == "openai/primary"), None
    )
    return {
        "scenario": name,
        "to_answer": first,
        "outcome": outcome if report is None else f"{outcome} by {report.target.split('/')[1]}",
        "gave_up": None if primary is None or primary.outcome == "ok" else primary.duration,
        "p99": row.ttft.p99,
        "limit": getattr(row, "first_token_limit", None),
    }


async def _child(lane: str) -> None:
    import latencykit as lk
    from latencykit.testing import FakeProvider

    with FakeProvider() as fake:
        # litellm's first call in a process is slow (imports, clients): keep it out of the runs.
        warm = lk.LLM("openai/warm-up", api_base=fake.base_url, api_key=KEY, transport=lane)
        await warm.acompletion(messages=MESSAGES)
        for name in SCENARIOS:
            print(json.dumps(await _scenario(fake, lane, name)), flush=True)


def _cost() -> None:
    """Microseconds per attempt to work out its limits: set vs learned (warm window)."""
    import timeit

    import anyio

    import latencykit as lk
    from latencykit import _response
    from latencykit.stats import Recorder

    async def measure() -> None:
        target = lk.Target("openai/primary", timeout=30.0)
        recorder = Recorder()
        for i in range(200):
            recorder.first_chunk(target.key, 0.3 + i / 1000)
            recorder.longest_gap(target.key, 0.05 + i / 10000)

        async def never(*args: Any) -> Any:
            raise AssertionError

        def bound(guard: lk.StreamGuard) -> lk.StreamGuard:
            return guard.bound((), lambda t: never, never, raise_truncated=False, recorder=recorder)

        messages = [{"role": "system", "content": "x" * 2000}] + MESSAGES * 10
        guards = {
            "set (first_token=10, stall=10)": bound(lk.StreamGuard(first_token=10.0, stall=10.0)),
            "learned (warm window)": bound(lk.StreamGuard()),
        }
        for label, guard in guards.items():
            learns = guard.first_token is None

            def work(guard: lk.StreamGuard = guard, learns: bool = learns) -> None:
                size = _response.characters(messages) if learns else 0
                guard.limits(target, input_size=size)

            best = min(timeit.repeat(work, number=20_000, repeat=5)) / 20_000
            print(f"  {label:<32} {best * 1e6:6.2f} us per attempt")

    for backend in ("asyncio", "trio"):
        print(f"{backend}:")
        anyio.run(measure, backend=backend)


def _run_tree(tree: Path, lane: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--lane", lane],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _range(values: Sequence[float | None], unit: str = "s") -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    lo, hi = min(known), max(known)
    return f"{lo:.2f}{unit}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}{unit}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--base", type=Path, help="a source tree to compare (its src/)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lane", choices=("litellm", "openai"), default="litellm")
    parser.add_argument("--cost", action="store_true", help="time the limits' work instead")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost:
        _cost()
        return 0
    if args.child:
        import anyio

        anyio.run(_child, args.lane)
        return 0
    trees = {"branch": Path(__file__).resolve().parent.parent}
    if args.base is not None:
        trees = {"base": args.base.resolve(), **trees}
    results: defaultdict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for _ in range(args.rounds):
        for label, tree in trees.items():  # in turns: a noisy spell hits both
            for row in _run_tree(tree, args.lane):
                results[label, row["scenario"]].append(row)
    print(f"lane {args.lane}, {args.rounds} rounds (ranges: min-max)")
    header = f"{'scenario':<18} {'tree':<7} {'to answer/error':>16} {'gave up after':>14}"
    header += f" {'/ healthy p99':>14} {'healthy p99':>12}  outcome"
    print(header)
    print("-" * len(header))
    for scenario in SCENARIOS:
        for label in trees:
            rows = results[label, scenario]
            ratios = [r["gave_up"] / r["p99"] if r["gave_up"] and r["p99"] else None for r in rows]
            outcomes = sorted({r["outcome"] for r in rows})
            print(
                f"{scenario:<18} {label:<7} {_range([r['to_answer'] for r in rows]):>16} "
                f"{_range([r['gave_up'] for r in rows]):>14} {_range(ratios, 'x'):>14} "
                f"{_range([r['p99'] for r in rows]):>12}  {', '.join(outcomes)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
