"""Servers this project did not script: exact bytes on a raw socket, for tests of what arrives
on the wire (a provider's quirks, a proxy's HTML page, a cut in the middle of a chunk).

``async with raw_server(answer) as api_base:`` serves every request (on 127.0.0.1) with the
bytes ``answer`` returns, written in order, then closes the connection. :func:`http` builds an
answer: a status, headers and body pieces, the body close-delimited or chunked (optionally cut
before the chunked body's end, or inside its last chunk). A :data:`RESET` piece resets the
connection (a TCP RST, not a clean close).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import anyio.abc

Answer = Sequence["bytes | tuple[bytes, float]"]
"""The pieces written in order: bytes (then a 1 ms pause), or ``(bytes, pause after)``."""

RESET = b"<reset>"
"""A piece that resets the connection (``SO_LINGER`` 0, then close: the peer reads a RST)."""


def http(
    status: int,
    body: Sequence[bytes] | bytes,
    *,
    content_type: str = "application/json",
    headers: Sequence[tuple[str, str]] = (),
    chunked: bool = False,
    cut: bool = False,
    cut_inside: bool = False,
) -> Answer:
    """An HTTP/1.1 answer as the pieces written: with ``chunked``, each body piece is one HTTP
    chunk and ``cut`` leaves out the last (zero-length) chunk, ``cut_inside`` the second half
    of the last piece's chunk too; otherwise the body ends when the connection closes (as many
    SSE servers do)."""
    pieces: list[bytes | tuple[bytes, float]] = [body] if isinstance(body, bytes) else [*body]
    head = [f"HTTP/1.1 {status} X", f"content-type: {content_type}", "connection: close"]
    head += [f"{name}: {value}" for name, value in headers]
    if chunked:
        head.append("transfer-encoding: chunked")
    out = ["\r\n".join(head).encode() + b"\r\n\r\n"]
    if not chunked:
        return [*out, *pieces]
    out += [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces if piece]
    if cut_inside:
        out[-1] = out[-1][: len(out[-1]) // 2]
    if not (cut or cut_inside):
        out.append(b"0\r\n\r\n")
    return out


def sse(*events: bytes) -> list[bytes]:
    """Each event as one body piece (``data: ...`` lines, as given), with its blank line."""
    return [event + b"\n\n" for event in events]


def chunk(content: str | None = None, finish: str | None = None, **delta: str) -> bytes:
    """One ``data:`` event of a chat-completion chunk (the content and other delta fields)."""
    import json

    fields = dict(delta)
    if content is not None:
        fields["content"] = content
    payload = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": fields, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode()


@contextlib.asynccontextmanager
async def raw_server(answer: Callable[[bytes], Answer] | Answer) -> AsyncIterator[str]:
    """Serve every request with ``answer`` (or ``answer(request_bytes)``); yields the
    ``api_base`` (``http://127.0.0.1:PORT/v1``). The server reads the whole request first."""

    async def handle(client: anyio.abc.SocketStream) -> None:
        async with client:
            received = b""
            while b"\r\n\r\n" not in received:
                received += await client.receive()
            head, _, rest = received.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(rest) < length:
                rest += await client.receive()
            pieces = answer(head + b"\r\n\r\n" + rest) if callable(answer) else answer
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                for piece in pieces:
                    data, pause = piece if isinstance(piece, tuple) else (piece, 0.001)
                    if data is RESET:
                        raw = client.extra(anyio.abc.SocketAttribute.raw_socket)
                        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        break
                    await client.send(data)
                    await anyio.sleep(pause)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        yield f"http://127.0.0.1:{port}/v1"
        group.cancel_scope.cancel()
