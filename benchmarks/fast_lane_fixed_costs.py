"""The fast lane's fixed costs against a bare httpx client: start-up, memory, CPU per call.

Run it from the repository root::

    .venv/bin/python benchmarks/fast_lane_fixed_costs.py                       # ~2 minutes
    .venv/bin/python benchmarks/fast_lane_fixed_costs.py --before /tmp/old/src  # and an older tree

The OpenAI-compatible server of ``fast_lane_throughput.py`` runs in a child process. Measured:

1. **start-up and memory**: a fresh process that imports its client, makes one non-streaming
   call and exits: wall time from spawn to exit and peak RSS, bytecode cached (one directory
   per variant, written by a run that is not counted: an installed wheel's is compiled), for
   a bare ``httpx.AsyncClient`` (+ ``json.loads``), ``lk.LLM(..., transport="openai")``,
   and (``--before``) the same ``lk.LLM`` from an older source tree; the variants take turns,
   ratios to httpx per round, medians;
2. **client CPU per non-streaming call**: in one process, rounds of ``--calls`` calls of the
   fast lane and of raw httpx + ``json.loads`` taking turns (``time.process_time``: the
   server's CPU is not counted); the median of the per-round ratios with a 95 % bootstrap
   interval. With ``--before``, the same run in child processes alternating the two trees.

Goals (issue 27, item 2): start-up and RSS within 1.2x of httpx; CPU per call <= 1.1x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
from fast_lane_throughput import KEY, MESSAGES, SERVER
from overhead import _load, bootstrap_ci, verdict
from provider import provider_process

ONE_CALL = {
    "httpx": """
import asyncio, json, sys, httpx
async def main(base):
    async with httpx.AsyncClient() as client:
        r = await client.post(base + "/chat/completions", headers={"Authorization": "Bearer k"},
                              json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert json.loads(r.content)["choices"]
asyncio.run(main(sys.argv[1]))
""",
    "fast lane": """
import asyncio, sys, latencykit as lk
async def main(base):
    async with lk.LLM("openai/m", api_base=base, api_key="k", transport="openai") as llm:
        r = await llm.acompletion(messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content
asyncio.run(main(sys.argv[1]))
""",
}


def one_process(code: str, base: str, src: str | None, cache: str) -> tuple[float, float]:
    """Seconds from spawn to exit, and peak RSS in MB, of ``python -c code base``, with
    bytecode cached in ``cache`` (as an installed wheel's is: pip compiles it)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    if src is not None:
        env["PYTHONPATH"] = src
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code, base], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"the child failed ({status})")
    return elapsed, usage.ru_maxrss / 1024


def startup(base: str, rounds: int, before: str | None) -> None:
    variants = {"httpx": (ONE_CALL["httpx"], None), "fast lane": (ONE_CALL["fast lane"], "src")}
    if before is not None:
        variants["fast lane, before"] = (ONE_CALL["fast lane"], before)
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="latencykit-startup-") as caches:
        for name, (code, src) in variants.items():  # writes each tree's bytecode: not counted
            one_process(code, base, src, os.path.join(caches, name))
        for number in range(rounds):
            names = list(variants) if number % 2 == 0 else list(reversed(variants))
            for name in names:
                code, src = variants[name]
                seen[name].append(one_process(code, base, src, os.path.join(caches, name)))
    print(f"\n1. start-up (spawn to exit, one call) and peak RSS, median of {rounds} rounds")
    bare = seen["httpx"]
    for name, samples in seen.items():
        time_ratio = statistics.median(s[0] / b[0] for s, b in zip(samples, bare, strict=True))
        rss_ratio = statistics.median(s[1] / b[1] for s, b in zip(samples, bare, strict=True))
        seconds = statistics.median(s[0] for s in samples)
        rss = statistics.median(s[1] for s in samples)
        ok = "" if name == "httpx" else " " + verdict(time_ratio <= 1.2 and rss_ratio <= 1.2)
        print(
            f"   {name:<20} {seconds * 1000:7.0f} ms {rss:7.1f} MB   "
            f"{time_ratio:5.2f}x / {rss_ratio:5.2f}x httpx{ok}"
        )


async def cpu_rounds(base: str, calls: int, rounds: int) -> list[float]:
    """Per round, the fast lane's CPU per call over raw httpx + json.loads's."""
    import httpx

    import latencykit as lk

    body = {"model": "m", "messages": MESSAGES}
    headers = {"Authorization": f"Bearer {KEY}"}
    raw = httpx.AsyncClient(timeout=60)
    fast = lk.LLM("openai/m", api_base=base, api_key=KEY, transport="openai")

    async def via_httpx() -> Any:
        response = await raw.post(f"{base}/chat/completions", json=body, headers=headers)
        return json.loads(response.content)["choices"]

    async def via_fast() -> Any:
        return (await fast.acompletion(messages=MESSAGES)).choices

    async def cpu(call: Any) -> float:
        started = time.process_time()
        for _ in range(calls):
            await call()
        return time.process_time() - started

    for _ in range(50):  # warm: connections, caches
        await via_httpx()
        await via_fast()
    ratios = []
    for number in range(rounds):
        if number % 2 == 0:
            ours, theirs = await cpu(via_fast), await cpu(via_httpx)
        else:
            theirs, ours = await cpu(via_httpx), await cpu(via_fast)
        ratios.append(ours / theirs)
    await fast.aclose()
    await raw.aclose()
    return ratios


def show_ratios(name: str, ratios: list[float]) -> None:
    ci = bootstrap_ci(len(ratios), lambda idx: statistics.median(ratios[i] for i in idx), 1)
    median = statistics.median(ratios)
    print(
        f"   {name:<20} {median:.3f}x httpx + json.loads (95 % CI {ci[0]:.3f}-{ci[1]:.3f}, "
        f"{len(ratios)} rounds) {verdict(median <= 1.1)}"
    )


def cpu_per_call(base: str, calls: int, rounds: int, before: str | None) -> None:
    print(f"\n2. client CPU per non-streaming call, rounds of {calls} calls taking turns")
    if before is None:
        show_ratios("fast lane", anyio.run(cpu_rounds, base, calls, rounds))
        return
    trees = {"fast lane": "src", "fast lane, before": before}
    found: dict[str, list[float]] = {name: [] for name in trees}
    for number in range(rounds):  # a child per tree and round, the trees taking turns
        names = list(trees) if number % 2 == 0 else list(reversed(trees))
        for name in names:
            done = subprocess.run(
                [sys.executable, __file__, "--cpu-rounds", base, str(calls)],
                env={**os.environ, "PYTHONPATH": trees[name]},
                capture_output=True,
                text=True,
                check=True,
            )
            found[name] += json.loads(done.stdout)
    for name, ratios in found.items():
        show_ratios(name, ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--before", help="an older tree's src/ to compare with")
    parser.add_argument("--rounds", type=int, default=10, help="start-up and CPU rounds")
    parser.add_argument("--calls", type=int, default=300, help="calls per CPU round")
    parser.add_argument("--cpu-rounds", nargs=2, metavar=("BASE", "CALLS"), help="internal")
    args = parser.parse_args()
    if args.cpu_rounds:
        base, calls = args.cpu_rounds
        print(json.dumps(anyio.run(cpu_rounds, base, int(calls), 4)))
        return
    print(f"python {sys.version.split()[0]}, load {_load()}")
    with provider_process(SERVER) as base:
        startup(base, args.rounds, args.before)
        cpu_per_call(base, args.calls, args.rounds, args.before)


if __name__ == "__main__":
    main()
