"""The fast lane: OpenAI-compatible chat completions over httpx, without litellm's per-chunk work.

litellm spends about 0.5 ms of CPU per streamed chunk (building the OpenAI SDK's pydantic models,
then its own), which caps one process near 1,750 chunks/s. For providers that speak the OpenAI
chat-completions protocol (``Target(transport="openai")``), an attempt here is one HTTP request
on a shared ``httpx.AsyncClient`` (per event loop, keep-alive pool): the JSON body out, and back
either the response or the SSE events, split from the body's bytes; each is decoded once
(msgspec, from bytes) into a typed response or chunk that reads like litellm's
(``response.choices[0].message.content``, ``chunk.choices[0].delta.content``, and what
``litellm.stream_chunk_builder`` reads; see :mod:`latencykit.chunks`), without importing
litellm. It runs natively on asyncio and trio (no bridge).
Errors become the same typed :class:`~latencykit.ProviderError` s, classified from the status,
the error's ``code``/``type`` and ``Retry-After``; keys are never shown.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
import msgspec

from . import ratelimit
from ._cancel import loop_key, now, run_soon
from .chunks import (
    OPENAI_CHUNKS,
    EmbeddingResponse,
    Node,
    Response,
    decode_chunk,
    decode_embeddings,
    decode_node,
    decode_response,
)
from .errors import (
    HTTPError,
    body_message,
    malformed_answer,
    not_json_event,
    request_id,
    scrub,
    stream_error,
)
from .propagation import provider_headers
from .stream import NOTHING, ChunkSource
from .target import without_credentials

if TYPE_CHECKING:
    from .target import Target

__all__ = ["HTTPError", "OpenAIChunks", "OpenAITransport", "Request"]

DEFAULT_BASE = "https://api.openai.com/v1"
_BOM = b"\xef\xbb\xbf"  # may start a body (JSON or an event stream), and is no part of it
# litellm arguments that are not part of the request body.
_NOT_SENT = frozenset(
    {
        "extra_headers",
        "extra_body",
        "api_base",
        "base_url",
        "api_key",
        "timeout",
        "max_retries",
        "num_retries",
        "custom_llm_provider",
        "mock_response",
        "litellm_metadata",
    }
)


class OpenAITransport:
    """The fast lane, as the transport of one owner (an :class:`~latencykit.LLM`): a connection
    pool (HTTP/1.1 keep-alive) per event loop, built on the first request made on that loop,
    closed by :meth:`aclose`. ``secrets``: the keys to scrub from errors (default none);
    ``keepalive``: idle connections kept for reuse (default ``500``, a host's connection slots:
    see :mod:`latencykit._slots`; ``None``: all). It never queues a request itself (no limit
    on connections): the slots do, where latencykit measures the wait."""

    __slots__ = ("_by_loop", "_keepalive", "_secrets")

    def __init__(self, secrets: tuple[str, ...] = (), keepalive: int | None = 500) -> None:
        self._secrets = secrets
        self._keepalive = keepalive
        self._by_loop: weakref.WeakKeyDictionary[object, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx.AsyncClient:
        """This event loop's client (building the first one imports httpcore and makes an SSL
        context: ~0.1 s)."""
        key = loop_key()
        found = self._by_loop.get(key)
        if found is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=self._keepalive)
            found = self._by_loop[key] = httpx.AsyncClient(limits=limits, timeout=None)
        return found

    def ready(self) -> bool:
        """Whether this event loop's client exists."""
        return loop_key() in self._by_loop

    async def complete(self, target: Target, arguments: Mapping[str, Any]) -> Response | Node:
        """One non-streaming attempt: the provider's answer (see :func:`_answer`)."""
        request = Request(target, arguments, self.client())
        response = await request.send(stream=False)
        ratelimit.heard(target.key, target.api_key, response.headers)
        if response.status_code >= 400:
            raise _error_of(response, response.content, target.api_key)
        return _answer(response, target)

    async def embed(self, target: Target, arguments: Mapping[str, Any]) -> EmbeddingResponse:
        """One embedding attempt: ``POST {api_base}/embeddings``, its answer an
        :class:`~latencykit.chunks.EmbeddingResponse` (errors as :meth:`complete` raises
        them)."""
        request = Request(target, arguments, self.client(), path="/embeddings")
        response = await request.send(stream=False)
        ratelimit.heard(target.key, target.api_key, response.headers)
        if response.status_code >= 400:
            raise _error_of(response, response.content, target.api_key)
        raw = response.content.removeprefix(_BOM)  # a BOM is no part of JSON text
        try:
            answer = decode_embeddings(raw)
        except msgspec.ValidationError:  # an error object in its place, or another shape
            data = decode_node(raw)
            error = data.get("error") if type(data) is dict else None
            if error:
                message = error.get("message") if isinstance(error, Mapping) else error
                raise HTTPError(str(message or "an error object"), None, data) from None
            raise malformed_answer("is not an embedding list", raw, target=target.key) from None
        except msgspec.DecodeError:
            raise malformed_answer("is not JSON", raw, target=target.key) from None
        # what report() reads; the headers where litellm keeps them (errors.headers_of)
        answer._hidden_params = {"additional_headers": response.headers}  # type: ignore[attr-defined]
        return answer

    def open(self, target: Target, arguments: Mapping[str, Any]) -> OpenAIChunks:
        """One streaming attempt's source, opened on its first read. The loop's first client is
        set-up, not the provider's time: the source is ready (``ready_at``) after it."""
        ready = self.ready()
        request = Request(target, {**arguments, "stream": True}, self.client())
        return OpenAIChunks(request, target, self._secrets, None if ready else now())

    async def warm(self, target: Target, *, connect: bool, limit: float) -> None:
        """Build this loop's client, then (``connect``) open a keep-alive connection to
        ``target``'s host, without a completion (it would cost tokens): ``GET
        {api_base}/models`` with its key, whatever its status, read to the end so that the
        connection goes back to the pool. Raises what connecting raised (refused, timed out
        after ``limit`` seconds, ...)."""
        client = self.client()
        if connect:
            request = Request(target, {}, client)
            url = str(request.url).removesuffix("/chat/completions") + "/models"
            headers = {k: v for k, v in request.headers.items() if k != "Content-Type"}
            await client.get(url, headers=headers, timeout=limit)

    async def aclose(self) -> None:
        """Close this event loop's client and its connections (a client of another loop
        closes with its loop). A later request builds a new one."""
        found = self._by_loop.pop(loop_key(), None)
        if found is not None:
            await found.aclose()


class Request:
    """One request to a target (chat completions, or ``path``): URL, headers and body, built
    once.

    Its auth is the litellm lane's: ``Authorization: Bearer`` with the target's ``api_key``
    (default ``OPENAI_API_KEY``). Credentials in ``api_base`` are left out of the URL, as
    :meth:`~latencykit.Target.litellm_arguments` leaves them out of litellm's (httpx would
    send them as Basic auth in place of the key).
    """

    __slots__ = ("body", "client", "headers", "timeout", "url")

    def __init__(
        self,
        target: Target,
        kwargs: Mapping[str, Any],
        client: httpx.AsyncClient,
        path: str = "/chat/completions",
    ) -> None:
        self.client = client
        base = target.api_base or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE
        self.url = _url(base, path)
        key = target.api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        arguments = {**target.arguments, **kwargs}
        extra_headers = arguments.get("extra_headers")
        if extra_headers:
            headers.update(extra_headers)
        body = {k: v for k, v in arguments.items() if k not in _NOT_SENT and v is not None}
        body["model"] = target.endpoint.model
        extra_body = arguments.get("extra_body")
        if extra_body:
            body.update(extra_body)
        self.headers = headers
        self.body = msgspec.json.encode(body)
        self.timeout = httpx.Timeout(target.timeout)

    def send(self, stream: bool) -> Awaitable[httpx.Response]:
        http = self.client
        # The deadline's remainder is read as the request leaves (see latencykit.propagation).
        headers = provider_headers(self.headers)
        request = http.build_request(
            "POST", self.url, content=self.body, headers=headers, timeout=self.timeout
        )
        return http.send(request, stream=stream)


@functools.lru_cache(maxsize=64)
def _url(base: str, path: str) -> httpx.URL:
    """The URL of ``path`` under ``base``, parsed once (httpx parses a string URL on every
    request: ~10 us)."""
    return httpx.URL(f"{without_credentials(base).rstrip('/')}{path}")


def _error_of(response: httpx.Response, raw: bytes, secret: str | None) -> HTTPError:
    # Scrubbed before anything keeps it: a provider may echo the key it refused.
    text = scrub(raw.decode(errors="replace"), secret)
    try:
        body = json.loads(text)
    except ValueError:
        body = text[:2000]
    # The status is shown by the ProviderError already: without a message, its reason phrase.
    message = body_message(body) or response.reason_phrase or "no error message"
    return HTTPError(message, response.status_code, body, response)


def _answer(response: httpx.Response, target: Target) -> Response | Node:
    """A 200 answer's body as a :class:`~latencykit.chunks.Response` (a :class:`Node` if it has
    fields the schema does not name), if it is one: an error object in its place raises as that
    error; anything else (not JSON, not an object, no choices, a choice without a message) is
    a malformed answer, never a made-up success."""
    raw = response.content.removeprefix(_BOM)  # a BOM is no part of JSON text
    try:
        answer: Any = decode_response(raw)
    except msgspec.ValidationError:
        data = decode_node(raw)
        if type(data) is not dict:
            raise malformed_answer("is not a JSON object", raw, target=target.key) from None
        error = data.get("error")
        if error:
            message = error.get("message") if isinstance(error, Mapping) else error
            raise HTTPError(str(message or "an error object"), None, data) from None
        answer = Node(data)
    except msgspec.DecodeError:
        raise malformed_answer("is not JSON", raw, target=target.key) from None
    choices = answer.choices
    if not isinstance(choices, list) or not choices:
        raise malformed_answer("has no choices", raw, target=target.key)
    if getattr(choices[0], "message", None) is None:
        raise malformed_answer("has a choice without a message", raw, target=target.key)
    # What report() reads, where litellm's ModelResponse keeps it; the headers as litellm
    # keeps them (errors.headers_of: the attempt's request id).
    answer._hidden_params = {"additional_headers": response.headers}
    return answer  # type: ignore[no-any-return]


_LAST = b"\n\n"  # what ends the last event of a body that did not


def sse_data(events: bytes) -> list[bytes]:
    """The data of each of ``events``, complete SSE events (LF line ends, separated by a blank
    line): data lines joined by LF; comments (keep-alives) and other fields skipped; a block
    without a data line is no event; a byte-order mark before the first is skipped."""
    if events.startswith(b"data: "):
        # The common case: every event is one "data: " line. Then each newline is in a
        # separator, and each separator is followed by "data: ".
        found = events[6:].split(b"\n\ndata: ")
        if events.count(b"\n", 6) == 2 * (len(found) - 1):
            return found
    found = []
    for block in events.removeprefix(_BOM).split(b"\n\n"):
        lines = [line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if lines:
            found.append(b"\n".join(lines))
    return found


class OpenAIChunks(ChunkSource):
    """One streaming attempt on the fast lane, as an async iterator of chunks
    (:mod:`latencykit.chunks`: typed :class:`~latencykit.chunks.Chunk` s, or
    :class:`~latencykit.chunks.Node` s for events the typed schema does not fit).

    Opened on the first ``__anext__``. The body is read as bytes and split into SSE events
    here; each event is decoded once; keep-alive comments, other fields and empty events are
    skipped; an event that does not parse is skipped and counted (:attr:`skipped`); an error
    event raises the provider's error; ``[DONE]`` (then the rest of the body is read, so the
    connection is reused) or the end of the body ends it. A finish reason is always the
    provider's own (no library makes one up for a cut connection).
    """

    chunk_reader = OPENAI_CHUNKS
    __slots__ = (
        "_body",
        "_closed",
        "_done",
        "_events",
        "_headers",
        "_pending",
        "_request",
        "_response",
        "_run_soon",
        "_sample",
        "_secrets",
        "_target",
        "_typed",
        "ready_at",
        "skipped",
    )

    def __init__(
        self,
        request: Request,
        target: Target,
        secrets: tuple[str, ...],
        ready_at: float | None = None,
    ) -> None:
        self._request = request
        self._target = target
        self._secrets = secrets
        self._response: httpx.Response | None = None
        self._headers: httpx.Headers | None = None  # the answer's, kept past the close
        self._body: AsyncIterator[bytes] | None = None  # the body's bytes, once open
        self._events: deque[bytes] = deque()  # the data of events received, not yet decoded
        self._pending = b""  # the start of an event whose end has not arrived
        self._done = False  # [DONE] seen
        self._closed = False
        self._run_soon: Any = None  # schedules a close on the stream's loop, from any thread
        self._typed = True  # events decode as typed Chunks until one does not fit
        self._sample: bytes | None = b""  # the body's start, until an event arrives
        self.skipped = 0
        self.ready_at = ready_at

    def buffered(self) -> Any:
        """The next chunk among the events already received, decoded and read as the
        :class:`~latencykit.Stream` reads it: ``(chunk, text, finish_reason)`` (see
        :data:`~latencykit.chunks.OPENAI_CHUNKS`); else :data:`~latencykit.stream.NOTHING`
        (then :meth:`pull` reads on). Raises an error event's error."""
        events = self._events
        while events:
            data = events.popleft()
            if self._typed:
                try:
                    chunk = decode_chunk(data)
                except msgspec.ValidationError:
                    # A field the schema does not name (or an error event): this event, and
                    # the rest of the stream, are decoded as Nodes, which keep everything.
                    self._typed = False
                except msgspec.DecodeError:
                    pass  # not JSON: [DONE], or malformed (read below)
                else:
                    # The common chunk (text), read here: what OPENAI_CHUNKS.read would say,
                    # without its call.
                    choices = chunk.choices
                    if choices:
                        choice = choices[0]
                        delta = choice.delta
                        if delta is not None and (text := delta.content):
                            return chunk, text, choice.finish_reason
                    return (chunk, *OPENAI_CHUNKS.read(chunk))
            node = self._node(data)
            if node is not None:
                return (node, *OPENAI_CHUNKS.read(node))
        return NOTHING

    def _node(self, data: bytes) -> Node | None:
        """An event's data decoded as a :class:`Node`; ``None`` for ``[DONE]`` (then the
        stream ends) and for an event that is not a JSON object (counted in
        :attr:`skipped`). Raises an error event's error."""
        try:
            decoded = decode_node(data)
        except msgspec.DecodeError:
            if data.lstrip() == b"[DONE]":
                self._events.clear()
                self._done = True
            else:
                self.skipped += 1
            return None
        if type(decoded) is not dict:
            self.skipped += 1
            return None
        node = Node(decoded)
        error = node.get("error")
        if error is not None and not node.get("choices"):
            message = error.get("message") if isinstance(error, Mapping) else None
            raise HTTPError(str(message or "error event"), None, node, None)
        return node

    async def pull(self) -> Any:
        """The next chunk (errors unwrapped)."""
        while (read := self.buffered()) is NOTHING:
            data = await self._next_bytes()
            self._split(data)
            if self._sample is not None and data is not _LAST:
                # No event yet: keep what came, to say what it was.
                self._sample = None if self._events else (self._sample + data)[:200]
        return read[0]

    async def _next_bytes(self) -> bytes:
        """The body's next bytes (opening it first); at its end, what completes an event left
        open (``StopAsyncIteration`` after that, and after ``[DONE]``, once the rest of the
        body is read: then the connection is reused)."""
        body = self._body or await self._open()
        if self._done:
            async for _ in body:
                pass
            raise StopAsyncIteration
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            if not self._pending:
                raise
            return _LAST  # the body ended without a blank line after its last event

    def _split(self, data: bytes) -> None:
        """Queue the data of the events completed by ``data``, the body's next bytes."""
        if self._pending:
            data = self._pending + data
        keep = b""
        if b"\r" in data:  # CR or CRLF line ends: made LF (a CR at the end may start a CRLF)
            keep = b"\r" if data.endswith(b"\r") else b""
            data = data[: len(data) - len(keep)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n\n")  # the events before it are complete
        if end < 0:
            self._pending = data + keep
            return
        self._pending = data[end + 2 :] + keep
        self._events.extend(sse_data(data[:end]))

    async def _open(self) -> AsyncIterator[bytes]:
        if self._closed:
            raise StopAsyncIteration
        self._run_soon = run_soon()
        response = self._response = await self._request.send(stream=True)
        self._headers = response.headers
        ratelimit.heard(self._target.key, self._target.api_key, response.headers)
        if response.status_code >= 400:
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            raise _error_of(response, raw, self._target.api_key)
        body = self._body = response.aiter_bytes()
        return body

    @property
    def request_id(self) -> str | None:
        """The provider's request id of the stream's answer, once it opened (kept past the
        close)."""
        return request_id(self._headers)

    def wrap_error(self, error: Exception) -> Exception:
        """What ``error``, raised by :meth:`pull`, means to latencykit (keys scrubbed). Once the
        stream is open, a lost connection is a cut and a transient error event a break
        (:class:`~latencykit.StreamBroken`); other error events (a content filter, ...) keep
        their own type."""
        return stream_error(
            error, target=self._target.key, secrets=self._secrets, opened=self._body is not None
        )

    def end_error(self) -> Exception | None:
        """Why the body ended without the provider's finish, when it is more than a cut: an
        answer that is not an event stream (no event in it: a proxy's HTML page), or events
        that are not JSON. ``None``: a cut."""
        if self._sample:
            response = self._response
            kind = "" if response is None else response.headers.get("content-type", "")
            return malformed_answer(
                f"is not an event stream (content-type {kind!r})",
                self._sample,
                target=self._target.key,
            )
        if self.skipped:
            return not_json_event(self.skipped, target=self._target.key)
        return None

    async def aclose(self) -> None:
        """Close the HTTP response (idempotent): the connection is dropped unless read to the
        end."""
        self._closed = True
        response, self._response = self._response, None
        if response is not None:
            await response.aclose()

    def interrupter(self) -> Callable[[], None] | None:
        """Once the response is open: its socket's ``close``, which makes a pending read raise
        at once (on trio, what a stream's stall or deadline timer calls instead of entering a
        cancel scope per read); ``None`` before."""
        response = self._response
        network = None if response is None else response.extensions.get("network_stream")
        socket = None if network is None else network.get_extra_info("socket")
        return None if socket is None else socket.close

    def close_nowait(self) -> None:
        """Schedule :meth:`aclose` on the stream's loop (from a finaliser, any thread)."""
        run_soon = self._run_soon
        if self._response is not None and run_soon is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the socket went with it
                run_soon(self.aclose)
