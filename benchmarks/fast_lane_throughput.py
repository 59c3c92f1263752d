"""Client throughput per process: litellm, the openai SDK, latencykit's fast lane, raw httpx.

Run it from the repository root::

    .venv/bin/python benchmarks/fast_lane_throughput.py            # about five minutes
    .venv/bin/python benchmarks/fast_lane_throughput.py --quick    # smoke run, under 30 seconds

A minimal OpenAI-compatible server runs in a child process (so that its work does not share this
process's CPU or GIL): a streaming request gets 1,000 one-word chunks back to back (the whole
SSE body written at once; different words, as litellm fails a stream that repeats one chunk),
a non-streaming one a short completion. The chunks are sent two ways: each SSE event in an HTTP
chunk of its own, as servers stream (each event is flushed as it is made), and all of them in
one HTTP chunk ("coalesced"), where a client's work is its parsing alone. Then, in this process,
on asyncio:

1. **chunks/s** with 1, 10 and 50 concurrent streams (each of 1,000 chunks; each of the
   concurrent workers streams one answer after another for 0.5 s, 0.1 s with ``--quick``), for
   ``litellm.acompletion(stream=True)``, the openai SDK's ``AsyncOpenAI``, ``lk.LLM(...,
   transport="openai")`` (the fast lane, every policy's machinery included: a deadline, the
   stream guard, the statistics recorder) and raw httpx reading the SSE lines without parsing
   them (the ceiling); every client but the ceiling reads each chunk's text
   (``chunk.choices[0].delta.content``), as a consumer does; each client runs in a process
   of its own (litellm's background work would otherwise run in the next client's turn),
   the clients take turns, three times (once with ``--quick``), and the median is reported;
2. **client CPU per non-streaming call** (``time.process_time`` over ``--calls`` calls, the
   server's CPU excluded), litellm against the fast lane;
3. **inter-chunk gap p99** of 50 concurrent streams sending 60 chunks/s each (the server paces
   them), through litellm and through the fast lane: what the saturated client adds.

4. **on trio**, chunks/s with 10 streams: ``lk.LLM`` through litellm (an asyncio loop in a
   thread, chunks handed over by the bridge), the fast lane (native on trio), raw httpx.

Goals (from the issue): the fast lane >= 10x litellm's chunks/s and within 2x of the raw
ceiling; >= 3x less client CPU per non-streaming call. The script reports; it exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
from overhead import _load, _version, percentile, verdict
from provider import provider_process

import latencykit as lk

SERVER = r"""
import asyncio, json, sys

CHUNKS = 1000
def event(obj):
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

def chunk(i, content, finish=None):
    delta = {"content": content} if content is not None else {}
    if i == 0:
        delta["role"] = "assistant"
    return event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

# Different words: litellm fails a stream that repeats one chunk many times.
EVENTS = [chunk(i, f" w{i}") for i in range(CHUNKS)]
EVENTS += [chunk(CHUNKS, None, "stop"), b"data: [DONE]\n\n"]
COMPLETION = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}).encode()

def head(length=None):
    h = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    if length is None:
        return h + b"transfer-encoding: chunked\r\n\r\n"
    h = h.replace(b"text/event-stream", b"application/json")
    return h + b"content-length: %d\r\n\r\n" % length

def piece(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"

async def handle(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            length = 0
            while True:
                header = await reader.readline()
                if header in (b"\r\n", b"", b"\n"):
                    break
                name, _, value = header.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if not body.get("stream"):
                writer.write(head(len(COMPLETION)) + COMPLETION)
            elif body.get("model", "").endswith("paced"):
                writer.write(head())
                for i in range(60):
                    writer.write(piece(chunk(i, f" w{i}")))
                    await writer.drain()
                    await asyncio.sleep(1 / 60)
                writer.write(piece(chunk(60, None, "stop") + b"data: [DONE]\n\n") + b"0\r\n\r\n")
            else:
                if body["model"].endswith("coalesced"):  # the whole body in one HTTP chunk
                    writer.write(head() + piece(b"".join(EVENTS)) + b"0\r\n\r\n")
                else:  # an HTTP chunk per event
                    writer.write(head() + b"".join(map(piece, EVENTS)) + b"0\r\n\r\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
        pass  # the client went, or the server is stopping
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""

MESSAGES = [{"role": "user", "content": "count"}]
KEY = "sk-bench-not-a-real-key"

Streamer = Callable[[str], Awaitable[int]]


def read(chunk: Any) -> Any:
    """What a consumer reads of every chunk: its text (as every client but the ceiling does)."""
    choices = chunk.choices
    return choices[0].delta.content if choices else None


def clients(base: str) -> dict[str, Callable[[str], Awaitable[int]]]:
    """Each client's "stream one answer to model ``m``, return the chunks read"."""
    import httpx
    import litellm
    import openai

    sdk = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=60)
    raw = httpx.AsyncClient(timeout=60)
    fast = lk.LLM(
        "openai/m", api_base=base, api_key=KEY, transport="openai", deadline=120, timeout=60
    )
    body = {"model": "m", "messages": MESSAGES, "stream": True}

    async def via_litellm(model: str) -> int:
        stream = await litellm.acompletion(
            model=f"openai/{model}", api_base=base, api_key=KEY, messages=MESSAGES, stream=True
        )
        n = 0
        async for chunk in stream:
            n += 1
            read(chunk)
        return n

    async def via_sdk(model: str) -> int:
        stream: Any = await sdk.chat.completions.create(
            model=model,
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
        )
        n = 0
        async for chunk in stream:
            n += 1
            read(chunk)
        return n

    async def via_fast_lane(model: str) -> int:
        stream = await fast.acompletion(model=f"openai/{model}", messages=MESSAGES, stream=True)
        n = 0
        async with stream:
            async for chunk in stream:
                n += 1
                read(chunk)
        return n

    async def via_httpx(model: str) -> int:
        n = 0
        async with raw.stream(
            "POST", f"{base}/chat/completions", json={**body, "model": model}
        ) as r:
            async for line in r.aiter_lines():
                n += line.startswith("data:")
        return n

    return {
        "litellm": via_litellm,
        "openai SDK": via_sdk,
        "latencykit fast lane": via_fast_lane,
        "httpx, lines only (ceiling)": via_httpx,
    }


async def throughput(stream: Streamer, concurrency: int, model: str, window: float) -> float:
    """Chunks per second with ``concurrency`` streams at once, each worker streaming answers
    of ``model`` one after another until ``window`` seconds have passed (a steady rate, not
    the first milliseconds after another client ran)."""
    total = 0
    started = time.perf_counter()

    async def one() -> None:
        nonlocal total
        while time.perf_counter() - started < window:
            chunks = await stream(model)  # not `total += await ...`: reads total before
            total += chunks

    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(one)
    return total / (time.perf_counter() - started)


async def cpu_of(name: str, base: str, calls: int) -> float:
    """Client CPU microseconds per non-streaming call of one client (run in a process of its
    own: litellm's background workers would otherwise bill their CPU to whichever client is
    measured after it)."""
    import httpx
    import litellm
    import openai

    litellm.suppress_debug_info = True
    fast = lk.LLM("openai/m", api_base=base, api_key=KEY, transport="openai")
    sdk = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=60)
    raw = httpx.AsyncClient(timeout=60)
    body = {"model": "m", "messages": MESSAGES}

    async def via_litellm() -> Any:
        return await litellm.acompletion(
            model="openai/m", api_base=base, api_key=KEY, messages=MESSAGES
        )

    async def via_sdk() -> Any:
        return await sdk.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

    async def via_fast() -> Any:
        return await fast.acompletion(messages=MESSAGES)

    async def via_httpx() -> Any:
        return (await raw.post(f"{base}/chat/completions", json=body)).json()

    call = {
        "litellm": via_litellm,
        "openai SDK": via_sdk,
        "latencykit fast lane": via_fast,
        "httpx + json (floor)": via_httpx,
    }[name]
    for _ in range(20):
        await call()  # warm
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) / calls * 1e6


CPU_VARIANTS = ("litellm", "openai SDK", "latencykit fast lane", "httpx + json (floor)")


def cpu_per_call(base: str, calls: int) -> dict[str, float]:
    """Each client's CPU per call, each in a child process, three times in turn; medians."""
    import subprocess

    results: dict[str, list[float]] = {name: [] for name in CPU_VARIANTS}
    for _ in range(3):
        for name in CPU_VARIANTS:
            done = subprocess.run(
                [sys.executable, __file__, "--cpu-of", name, base, str(calls)],
                capture_output=True,
                text=True,
                check=True,
            )
            results[name].append(float(done.stdout.strip().splitlines()[-1]))
    return {name: statistics.median(values) for name, values in results.items()}


async def gaps(stream_of: Callable[[], Awaitable[Any]], streams: int) -> float:
    """p99 of the gaps between chunks of ``streams`` paced streams at once, in ms."""
    seen: list[float] = []

    async def one() -> None:
        stream = await stream_of()
        last = None
        async for _ in stream:
            now = time.perf_counter()
            if last is not None:
                seen.append(now - last)
            last = now
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()

    async with anyio.create_task_group() as group:
        for _ in range(streams):
            group.start_soon(one)
    return percentile(seen, 99) * 1000


def trio_clients(base: str) -> dict[str, Streamer]:
    """On trio: ``lk.LLM`` through litellm (which runs on an asyncio loop in a thread, the
    chunks handed over by the bridge), on the fast lane (native), and raw httpx."""
    import httpx

    through = lk.LLM("openai/m", api_base=base, api_key=KEY, timeout=60)
    fast = lk.LLM("openai/m", api_base=base, api_key=KEY, transport="openai", timeout=60)
    raw = httpx.AsyncClient(timeout=60)

    def via(llm: lk.LLM) -> Streamer:
        async def stream(model: str) -> int:
            answer = await llm.acompletion(model=f"openai/{model}", messages=MESSAGES, stream=True)
            n = 0
            async with answer:
                async for chunk in answer:
                    n += 1
                    read(chunk)
            return n

        return stream

    async def via_httpx(model: str) -> int:
        n = 0
        body = {"model": model, "messages": MESSAGES, "stream": True}
        async with raw.stream("POST", f"{base}/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                n += line.startswith("data:")
        return n

    return {
        "lk.LLM through litellm (bridge)": via(through),
        "latencykit fast lane": via(fast),
        "httpx, lines only (ceiling)": via_httpx,
    }


async def throughput_of(
    name: str, base: str, model: str, levels: list[int], window: float
) -> dict[int, float]:
    """One client's chunks/s at each level (run in a process of its own, as the CPU figures:
    litellm's background logging work would otherwise run during the next client's turn)."""
    import litellm
    import sniffio

    litellm.suppress_debug_info = True
    on_trio = sniffio.current_async_library() == "trio"
    stream = (trio_clients(base) if on_trio else clients(base))[name]
    await stream(model)  # warm: imports, connection
    return {level: await throughput(stream, level, model, window) for level in levels}


def measure(
    names: list[str],
    base: str,
    model: str,
    levels: list[int],
    window: float,
    rounds: int,
    backend: str = "asyncio",
) -> dict[str, dict[int, float]]:
    """Each client's chunks/s per level: a child process per client and round, the clients
    taking turns; the median of the rounds."""
    import json
    import subprocess

    samples: dict[str, dict[int, list[float]]] = {n: {c: [] for c in levels} for n in names}
    for _ in range(rounds):
        for name in names:
            argv = [name, base, model, ",".join(map(str, levels)), str(window), backend]
            done = subprocess.run(
                [sys.executable, __file__, "--throughput-of", *argv],
                capture_output=True,
                text=True,
                check=True,
            )
            rates = json.loads(done.stdout.strip().splitlines()[-1])
            for level in levels:
                samples[name][level].append(rates[str(level)])
    return {
        name: {level: statistics.median(values) for level, values in per.items()}
        for name, per in samples.items()
    }


REGIMES = (
    ("an HTTP chunk per event (as servers stream)", "m"),
    ("all events in one HTTP chunk (coalesced: parsing only)", "m-coalesced"),
)


async def main(quick: bool, rounds: int, calls: int, window: float) -> None:
    import litellm

    litellm.suppress_debug_info = True
    with provider_process(SERVER) as base:
        levels = [1, 10] if quick else [1, 10, 50]
        for number, (regime, model) in enumerate(REGIMES):
            print(f"\n1{'ab'[number]}. chunks/s per process, {regime} (median of rounds)")
            print(f"   {'client':<30}" + "".join(f"{f'{c} stream(s)':>16}" for c in levels))
            variants = list(clients(base))
            measured = measure(variants, base, model, levels, window, rounds)
            for name in variants:
                print(f"   {name:<30}" + "".join(f"{measured[name][c]:>16,.0f}" for c in levels))
            lite = measured["litellm"]
            lane = measured["latencykit fast lane"]
            ceiling = measured["httpx, lines only (ceiling)"]
            for level in levels:
                ratio, of_ceiling = lane[level] / lite[level], ceiling[level] / lane[level]
                print(
                    f"   {level} stream(s): fast lane {ratio:.1f}x litellm "
                    f"{verdict(ratio >= 10)}; the ceiling is {of_ceiling:.2f}x the fast lane "
                    f"{verdict(of_ceiling <= 2)}"
                )

        print("\n2. client CPU per non-streaming call (each client in a process of its own, x3)")
        cpu = cpu_per_call(base, calls)
        for name, us in cpu.items():
            print(f"   {name:<30} {us:>10,.0f} us")
        ratio = cpu["litellm"] / cpu["latencykit fast lane"]
        print(f"   litellm / fast lane: {ratio:.1f}x {verdict(ratio >= 3)}")

        print("\n3. inter-chunk gap p99, 50 concurrent streams at 60 chunks/s each")
        fast = lk.LLM("openai/m", api_base=base, api_key=KEY, transport="openai", timeout=60)

        async def litellm_stream() -> Any:
            return await litellm.acompletion(
                model="openai/paced", api_base=base, api_key=KEY, messages=MESSAGES, stream=True
            )

        async def fast_stream() -> Any:
            return await fast.acompletion(model="openai/paced", messages=MESSAGES, stream=True)

        streams = 20 if quick else 50
        for name, opener in (("litellm", litellm_stream), ("latencykit fast lane", fast_stream)):
            await gaps(opener, 2)  # warm: parts 1 and 2 ran in other processes
            p99 = await gaps(opener, streams)
            print(f"   {name:<30} {p99:>8.1f} ms (the server paces at {1000 / 60:.1f} ms)")

        for regime, model in REGIMES:
            print(f"\n4. on trio: chunks/s per process, 10 streams at once, {regime}")
            names = list(trio_clients(base))
            on_trio = measure(names, base, model, [10], window, rounds, backend="trio")
            for name in names:
                rate = on_trio[name][10]
                print(f"   {name:<34} {rate:>10,.0f}  ({1e6 / rate:.1f} us per chunk)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, for smoke tests")
    parser.add_argument("--cpu-of", nargs=3, metavar=("CLIENT", "BASE", "CALLS"), help="internal")
    parser.add_argument("--throughput-of", nargs=6, help="internal")
    args = parser.parse_args()
    if args.cpu_of:
        name, base, count = args.cpu_of
        print(anyio.run(cpu_of, name, base, int(count)))
        raise SystemExit(0)
    if args.throughput_of:
        import json

        name, base, model, levels, window, backend = args.throughput_of
        rates = anyio.run(
            throughput_of,
            name,
            base,
            model,
            [int(level) for level in levels.split(",")],
            float(window),
            backend=backend,
        )
        print(json.dumps(rates))
        raise SystemExit(0)
    rounds, calls, window = (1, 50, 0.1) if args.quick else (3, 300, 0.5)
    print(
        f"latencykit {lk.__version__}, litellm {_version('litellm')}, openai "
        f"{_version('openai')}, httpx {_version('httpx')}, python {sys.version.split()[0]}, "
        f"load {_load()}"
    )
    anyio.run(main, args.quick, rounds, calls, window)
