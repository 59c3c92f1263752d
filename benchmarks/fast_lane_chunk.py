"""What one streamed chunk costs on the fast lane, by layer, in process (no network).

Run it from the repository root::

    .venv/bin/python benchmarks/fast_lane_chunk.py     # about ten seconds

The 1,000-chunk SSE body of ``fast_lane_throughput.py`` (all events in one HTTP chunk) is fed
from memory in 64 KiB pieces to each layer in turn: an httpx response's ``aiter_lines`` (the
work of the throughput benchmark's ceiling), the fast lane's SSE splitting, splitting and
decoding, the source's ``buffered`` (what a ``Stream`` takes without an await), the source
iterated alone, a ``Stream`` over it, and a ``Stream`` whose consumer reads each chunk's text.
Nanoseconds per chunk, the median of 30 rounds taking turns.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
from fast_lane_throughput import SERVER

from latencykit import _openai
from latencykit.chunks import OPENAI_CHUNKS, decode_chunk
from latencykit.stream import NOTHING, Stream
from latencykit.target import Target

# The server script's events, built by its own code (one source for both benchmarks).
_scope: dict[str, Any] = {}
exec(SERVER.split("def head")[0], _scope)
BODY: bytes = b"".join(_scope["EVENTS"])
PIECES = [BODY[i : i + 65536] for i in range(0, len(BODY), 65536)]
TARGET = Target(
    "openai/m", api_base="http://127.0.0.1:9/v1", api_key="k", timeout=60, transport="openai"
)


CLIENT = httpx.AsyncClient()  # never sends: the body is read from memory


async def body() -> AsyncIterator[bytes]:
    for piece in PIECES:
        yield piece


def source() -> Any:
    """An ``OpenAIChunks`` reading the body from memory (as if its response had opened)."""
    request = _openai.Request(TARGET, {"messages": [], "stream": True}, CLIENT)
    chunks = _openai.OpenAIChunks(request, TARGET, ())
    chunks._body = body()
    return chunks


async def httpx_lines() -> int:
    import httpx

    response, n = httpx.Response(200, content=body()), 0
    async for line in response.aiter_lines():
        n += line.startswith("data:")
    return n


async def split() -> int:
    chunks = source()
    async for piece in chunks._body:
        chunks._split(piece)
    return len(chunks._events) - 1  # [DONE] is not a chunk


async def split_and_decode() -> int:
    chunks = source()
    async for piece in chunks._body:
        chunks._split(piece)
    events = list(chunks._events)[:-1]
    for event in events:
        decode_chunk(event)
    return len(events)


async def buffered() -> int:
    chunks, n = source(), 0
    async for piece in chunks._body:
        chunks._split(piece)
    while chunks.buffered() is not NOTHING:
        n += 1
    return n


async def source_alone() -> int:
    n = 0
    async for _ in source():
        n += 1
    return n


async def stream(read_text: bool = False) -> int:
    chunks = Stream(source(), reader=OPENAI_CHUNKS)
    n = 0
    await chunks.commit()
    async for chunk in chunks:
        n += 1
        if read_text:
            chunk.choices[0].delta.content  # noqa: B018
    return n


async def stream_read() -> int:
    return await stream(read_text=True)


LAYERS: dict[str, Callable[[], Awaitable[int]]] = {
    "httpx aiter_lines (the ceiling's work)": httpx_lines,
    "SSE split": split,
    "SSE split + decode (typed chunks)": split_and_decode,
    "split + buffered (what a Stream takes)": buffered,
    "OpenAIChunks iterated alone": source_alone,
    "Stream over OpenAIChunks": stream,
    "Stream, the consumer reading each text": stream_read,
}


def one_event() -> None:
    """One event decoded into a typed chunk, and into a dict made a ``Node`` (the form for
    events the schema does not fit, and the only one before 2026-11-25), then its text read."""
    import timeit

    from latencykit.chunks import Node, decode_node

    event = _scope["EVENTS"][500][6:-2]  # the JSON of one text chunk
    typed: Callable[[bytes], Any] = decode_chunk
    ways: dict[str, Callable[[], Any]] = {
        "typed chunk: decode": lambda: typed(event),
        "typed chunk: decode, read the text": lambda: typed(event).choices[0].delta.content,
        "Node: decode": lambda: Node(decode_node(event)),
        "Node: decode, read the text": lambda: Node(decode_node(event)).choices[0].delta.content,
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(9):  # the ways take turns: the machine's drift hits them alike
        for name, way in ways.items():
            samples[name].append(timeit.timeit(way, number=50_000) / 50_000 * 1e9)
    print("ns per event, one event (median of 9 turns of 50,000)")
    for name, values in samples.items():
        print(f"   {name:<50} {statistics.median(values):>7,.0f}")


async def main() -> None:
    samples: dict[str, list[float]] = {name: [] for name in LAYERS}
    for layer in LAYERS.values():
        await layer()  # warm
    for _ in range(30):
        for name, layer in LAYERS.items():
            started = time.perf_counter()
            n = await layer()
            samples[name].append((time.perf_counter() - started) / n * 1e9)
    backend = sys.argv[1] if len(sys.argv) > 1 else "asyncio"
    print(f"ns per chunk on {backend} (median of 30 rounds, min in brackets)")
    for name, values in samples.items():
        print(f"   {name:<50} {statistics.median(values):>7,.0f}  ({min(values):,.0f})")


if __name__ == "__main__":
    one_event()
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
