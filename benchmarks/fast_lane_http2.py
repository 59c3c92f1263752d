"""The fast lane over HTTP/1.1 (its keep-alive pool) against HTTP/2, to one HTTP/2-capable server.

Run it from the repository root (it needs ``hypercorn`` and ``h2``, which httpx's
``http2=True`` uses)::

    .venv/bin/pip install hypercorn h2
    .venv/bin/python benchmarks/fast_lane_http2.py            # about a minute
    .venv/bin/python benchmarks/fast_lane_http2.py --quick    # smoke run

A tiny OpenAI-compatible ASGI app runs under hypercorn in a child process (so that its work does
not share this process's CPU or GIL) on one cleartext port that speaks both protocols (HTTP/2
with prior knowledge, "h2c"). A streaming request gets 1,000 one-word chunks (the SSE body in
one piece, so the client is what is measured), a plain one a short completion. In this process,
``lk.LLM(..., transport="openai")`` runs once on the fast lane's own client (HTTP/1.1) and once
on an httpx client with ``http1=False, http2=True`` put in its place, the two taking turns:

1. **chunks/s** with 1, 10 and 50 concurrent streams (median of ``--rounds``);
2. **non-streaming calls**: calls/s with 1 and 50 at once, and client CPU per call
   (``time.process_time``).

HTTP/2 would pay off where connections are scarce or costly (TLS handshakes to a remote
provider, per-connection limits); on loopback it measures what the client spends per request
and per chunk, which is what a fast lane is for. The script reports; it exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import httpx
from overhead import _load, _version
from provider import provider_process

import latencykit as lk
from latencykit import _cancel

SERVER = r"""
import asyncio, json, socket, sys
from hypercorn.asyncio import serve
from hypercorn.config import Config

CHUNKS = 1000
def event(obj):
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

def chunk(i, content, finish=None):
    delta = {"content": content} if content is not None else {}
    if i == 0:
        delta["role"] = "assistant"
    return event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

BURST = b"".join(chunk(i, f" w{i}") for i in range(CHUNKS))
BURST += chunk(CHUNKS, None, "stop") + b"data: [DONE]\n\n"
COMPLETION = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}).encode()

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    streaming = json.loads(body or b"{}").get("stream")
    kind = b"text/event-stream" if streaming else b"application/json"
    payload = BURST if streaming else COMPLETION
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": payload})

async def main():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_max_requests = 10**9
    config.backlog = 1024
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)))
    server = asyncio.ensure_future(serve(app, config, shutdown_trigger=stop.wait))
    for _ in range(200):  # wait until it accepts connections, then say where
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    await server

asyncio.run(main())
"""

MESSAGES = [{"role": "user", "content": "count"}]
KEY = "sk-bench-not-a-real-key"
LANES = ("HTTP/1.1 (the fast lane's pool)", "HTTP/2 (h2c, one client)")


def use(llm: lk.LLM, clients: dict[str, httpx.AsyncClient], lane: str) -> None:
    """Make ``lane``'s client ``llm``'s fast-lane client on this event loop."""
    llm._transports["openai"]._by_loop[_cancel.loop_key()] = clients[lane]  # type: ignore[attr-defined]


async def throughput(llm: lk.LLM, concurrency: int) -> float:
    """Chunks per second of ``concurrency`` streams at once through ``llm``."""
    total = 0

    async def one() -> None:
        nonlocal total
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        n = 0
        async with stream:
            async for _ in stream:
                n += 1
        total += n

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(one)
    return total / (time.perf_counter() - started)


async def calls(llm: lk.LLM, concurrency: int, count: int) -> tuple[float, float]:
    """Non-streaming calls: (calls/s, client CPU microseconds per call)."""

    async def worker(n: int) -> None:
        for _ in range(n):
            await llm.acompletion(messages=MESSAGES)

    cpu, wall = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker, count // concurrency)
    done = count // concurrency * concurrency
    return done / (time.perf_counter() - wall), (time.process_time() - cpu) / done * 1e6


async def main(quick: bool, rounds: int, count: int) -> None:
    with provider_process(SERVER) as base:
        llm = lk.LLM(
            "openai/m", api_base=base, api_key=KEY, transport="openai", deadline=120, timeout=60
        )
        clients = {
            LANES[0]: llm._transports["openai"].client(),  # type: ignore[attr-defined]  # the fast lane's HTTP/1.1 client on this loop
            LANES[1]: httpx.AsyncClient(
                http1=False, http2=True, limits=httpx.Limits(max_connections=None), timeout=None
            ),
        }
        for lane in LANES:  # warm each client and check that it speaks what it says
            use(llm, clients, lane)
            await throughput(llm, 2)
            response = await clients[lane].post(f"{base}/chat/completions", json={"model": "m"})
            print(f"   {lane}: the server answered over {response.http_version}")

        levels = (1, 10) if quick else (1, 10, 50)
        print("\n1. chunks/s per process (median of rounds; 1,000 chunks per stream)")
        print(f"   {'client':<34}" + "".join(f"{f'{c} stream(s)':>14}" for c in levels))
        rates: dict[str, dict[int, float]] = {lane: {} for lane in LANES}
        for level in levels:
            samples: dict[str, list[float]] = {lane: [] for lane in LANES}
            for _ in range(rounds):
                for lane in LANES:
                    use(llm, clients, lane)
                    samples[lane].append(await throughput(llm, level))
            for lane in LANES:
                rates[lane][level] = statistics.median(samples[lane])
        for lane in LANES:
            print(f"   {lane:<34}" + "".join(f"{rates[lane][c]:>14,.0f}" for c in levels))

        print(f"\n2. non-streaming calls ({count} per run; median of rounds)")
        print(f"   {'client':<34}{'at once':>8}{'calls/s':>10}{'CPU/call':>12}")
        for concurrency in (1, 50):
            measured: dict[str, list[tuple[float, float]]] = {lane: [] for lane in LANES}
            for _ in range(rounds):
                for lane in LANES:
                    use(llm, clients, lane)
                    measured[lane].append(await calls(llm, concurrency, count))
            for lane in LANES:
                rate = statistics.median(r for r, _ in measured[lane])
                cpu = statistics.median(c for _, c in measured[lane])
                print(f"   {lane:<34}{concurrency:>8}{rate:>10,.0f}{cpu:>9,.0f} us")
        use(llm, clients, LANES[0])
        await clients[LANES[1]].aclose()
        await llm.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, for smoke tests")
    args = parser.parse_args()
    rounds, count = (1, 100) if args.quick else (5, 500)
    print(
        f"latencykit {lk.__version__}, httpx {_version('httpx')}, h2 {_version('h2')}, "
        f"hypercorn {_version('hypercorn')}, python {sys.version.split()[0]}, load {_load()}"
    )
    anyio.run(main, args.quick, rounds, count)
