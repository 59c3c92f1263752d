"""Minimal HTTP/1.1 on asyncio streams: one connection, request parsing, response heads.

A :class:`Connection` runs a *pump* task that reads the socket for the whole life of the
connection into its own buffer, so the server notices a client closing the socket at once,
even while it is sleeping in the middle of a response.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024

REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",  # not in the RFCs; sent by overloaded LLM APIs
}


class PeerClosed(Exception):
    """The client closed the connection in the middle of a request."""


class BadRequest(Exception):
    """The request could not be parsed; answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """A parsed HTTP request."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes
    arrived_at: float

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept open after the response."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


class Connection:
    """One accepted TCP connection with a buffered reader and EOF watch."""

    def __init__(self, conn_id: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.id = conn_id
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self.eof_at: float | None = None
        self.gone = asyncio.Event()
        """Set when the client closed (EOF or reset) the connection."""
        self._data = asyncio.Event()

    async def pump(self) -> None:
        """Read the socket until EOF, buffering data; mark EOF as soon as it is seen."""
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.buf += data
                self._data.set()
        except OSError:
            pass
        self.eof_at = time.monotonic()
        self.eof = True
        self.gone.set()
        self._data.set()

    async def _more(self) -> None:
        self._data.clear()
        await self._data.wait()

    async def _read_line(self, limit: int) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            if len(self.buf) > limit:
                raise BadRequest(400, "line too long")
            if self.eof:
                raise PeerClosed
            await self._more()

    async def _read_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if self.eof:
                raise PeerClosed
            await self._more()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    async def read_request(self) -> Request | None:
        """The next request, or ``None`` if the client closed the idle connection."""
        while True:
            while self.buf.startswith(b"\r\n"):  # tolerated between requests (RFC 9112 2.2)
                del self.buf[:2]
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buf) > MAX_HEAD:
                raise BadRequest(431, "request head too large")
            if self.eof:
                if self.buf:
                    raise PeerClosed
                return None
            await self._more()
        head = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[: end + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(400, f"malformed request line {lines[0]!r}")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest(400, f"malformed header line {line!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if headers.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._read_chunked()
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise BadRequest(400, "invalid Content-Length") from None
            if length < 0:
                raise BadRequest(400, "invalid Content-Length")
            if length > MAX_BODY:
                raise BadRequest(413, "request body too large")
            body = await self._read_exactly(length)
        else:
            body = b""
        return Request(method, target, version, headers, body, time.monotonic())

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self._read_line(4096)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest(400, "invalid chunk size") from None
            if size == 0:
                while await self._read_line(MAX_HEAD):  # trailers, up to the empty line
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY:
                raise BadRequest(413, "request body too large")
            body += await self._read_exactly(size)
            if await self._read_exactly(2) != b"\r\n":
                raise BadRequest(400, "invalid chunk terminator")


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """Status line and headers, ending with the blank line."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(payload: bytes) -> bytes:
    """One chunk of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


LAST_CHUNK = b"0\r\n\r\n"
