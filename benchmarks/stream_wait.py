"""CPU per chunk when each event arrives on its own: the fast lane against raw httpx, per backend.

Run it from the repository root::

    .venv/bin/python benchmarks/stream_wait.py                 # about a minute
    .venv/bin/python benchmarks/stream_wait.py --rounds 5 --backend trio

Method. The server of ``fast_lane_throughput.py`` runs in a child process and streams 1,000
chunks, each SSE event in an HTTP chunk of its own (as servers stream), so nearly every chunk is
a wait of its own. In this process, ``--streams`` streams at once (default 10) of each client
are read in turn, round after round in a freshly shuffled order: ``lk.LLM(...,
transport="openai")`` with its default stream guard (a stall limit: every wait is bounded), the
same inside ``lk.deadline(60)``, and raw httpx reading the lines and decoding each event with
``json.loads`` (what one writes by hand, with no timer of one's own). Each client reads each
chunk's text. A round's CPU (``time.process_time``; the server runs elsewhere) divided by its
chunks is the CPU per chunk; reported per client: the median over rounds, and the median of
the per-round ratios to raw httpx. The first round is a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import httpx
from fast_lane_throughput import KEY, MESSAGES, SERVER
from overhead import _load
from provider import provider_process

import latencykit as lk

Client = Callable[[], Awaitable[int]]


def clients(base: str) -> dict[str, Client]:
    fast = lk.LLM("openai/m", api_base=base, api_key=KEY, transport="openai", timeout=60)
    raw = httpx.AsyncClient(timeout=60)

    async def lane() -> int:
        answer = await fast.acompletion(messages=MESSAGES, stream=True)
        n = 0
        async with answer:
            async for chunk in answer:
                n += 1
                chunk.choices[0].delta.content  # noqa: B018
        return n

    async def lane_in_deadline() -> int:
        with lk.deadline(60):
            return await lane()

    async def by_hand() -> int:
        n = 0
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with raw.stream("POST", f"{base}/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and line != "data: [DONE]":
                    json.loads(line[5:])["choices"][0]["delta"].get("content")
                    n += 1
        return n

    return {"fast lane": lane, "fast lane in lk.deadline": lane_in_deadline, "raw httpx": by_hand}


async def run(base: str, args: argparse.Namespace) -> dict[str, list[float]]:
    variants = clients(base)
    per_chunk: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(args.seed)
    for round_ in range(args.rounds + 1):
        shuffle.shuffle(order)
        for name in order:
            chunks: list[int] = []

            async def one(client: Client = variants[name], chunks: list[int] = chunks) -> None:
                chunks.append(await client())

            cpu = time.process_time()
            async with anyio.create_task_group() as group:
                for _ in range(args.streams):
                    group.start_soon(one)
            if round_:  # the first round warms up
                per_chunk[name].append((time.process_time() - cpu) / sum(chunks))
    return per_chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds (default 15)")
    parser.add_argument("--streams", type=int, default=10, help="streams at once (default 10)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), action="append")
    parser.add_argument("--seed", type=int, default=20261126)
    args = parser.parse_args()
    print(f"load average {_load()}, lk from {os.path.dirname(lk.__file__)}")
    with provider_process(SERVER) as base:
        for backend in args.backend or ("asyncio", "trio"):
            per_chunk = anyio.run(run, base, args, backend=backend)
            raw = per_chunk["raw httpx"]
            print(f"\n{backend}: CPU per chunk, us (median of {args.rounds} rounds)")
            for name, values in per_chunk.items():
                ratio = statistics.median(a / b for a, b in zip(values, raw, strict=True))
                print(f"  {name:<26} {statistics.median(values) * 1e6:6.1f}  {ratio:.2f}x raw")


if __name__ == "__main__":
    main()
