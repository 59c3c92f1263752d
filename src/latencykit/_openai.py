"""The fast lane: OpenAI-compatible chat completions over httpx, without litellm's per-chunk work.

litellm spends about 0.5 ms of CPU per streamed chunk (building the OpenAI SDK's pydantic models,
then its own), which caps one process near 1,750 chunks/s. For providers that speak the OpenAI
chat-completions protocol (``Target(transport="openai")``), an attempt here is one HTTP request
on a shared ``httpx.AsyncClient`` (per event loop, keep-alive pool): the JSON body out, and back
either the response (a litellm ``ModelResponse``, as litellm returns) or the SSE events, each
decoded once into a :class:`Node` (a ``dict`` with attribute access: ``chunk.choices[0].delta
.content``, and what ``litellm.stream_chunk_builder`` reads). It runs natively on asyncio and
trio (no bridge). Errors become the same typed :class:`~latencykit.ProviderError` s, classified
from the status, the error's ``code``/``type`` and ``Retry-After``; keys are never shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from .errors import ProviderUnavailable, StreamBroken, is_transient, provider_error, scrub

if TYPE_CHECKING:
    from .target import Target

__all__ = ["OPENAI_CHUNKS", "HTTPError", "Node", "OpenAIChunks", "Request", "client", "complete"]

DEFAULT_BASE = "https://api.openai.com/v1"
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
_NOT_CONTENT: tuple[str | None, str | None] = (None, None)


class Node(dict[str, Any]):
    """A decoded JSON object with attribute access: ``node.choices`` is ``node["choices"]``.

    An absent field reads as ``None`` (as the OpenAI SDK's and litellm's optional fields do);
    private and special names are never looked up. Setting an attribute sets the key.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name.startswith("_"):
                raise AttributeError(name) from None
            return None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


# One decoder, built once: ``json.loads(..., object_hook=...)`` builds one per call (1.3 us).
_decode = json.JSONDecoder(object_hook=Node).decode


class _OpenAIChunkReader:
    """Reads the fast lane's :class:`Node` chunks for a :class:`~latencykit.Stream` (the same
    rules as litellm's chunks: text, tool-call or reasoning deltas are content)."""

    requires_finish = True

    def read(self, chunk: Node) -> tuple[str | None, str | None]:
        choices = chunk.get("choices")
        if not choices:
            return _NOT_CONTENT
        choice = choices[0]
        delta = choice.get("delta")
        finish = choice.get("finish_reason")
        if delta is None:
            return None, finish
        text = delta.get("content")
        if not text:
            text = (
                ""
                if delta.get("tool_calls")
                or delta.get("function_call")
                or delta.get("reasoning_content")
                else None
            )
        return text, finish

    def output_tokens(self, chunk: Node) -> int | None:
        usage = chunk.get("usage")
        tokens = None if usage is None else usage.get("completion_tokens")
        return tokens if isinstance(tokens, int) else None


OPENAI_CHUNKS = _OpenAIChunkReader()


# --- the shared client ----------------------------------------------------------------------

_clients: weakref.WeakKeyDictionary[object, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def _loop_key() -> object:
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    import asyncio

    return asyncio.get_running_loop()


def client() -> httpx.AsyncClient:
    """The event loop's shared client: one connection pool per loop (HTTP/1.1 keep-alive)."""
    key = _loop_key()
    found = _clients.get(key)
    if found is None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        found = _clients[key] = httpx.AsyncClient(limits=limits, timeout=None)
    return found


class Request:
    """One chat-completions request to a target: URL, headers and body, built once."""

    __slots__ = ("body", "headers", "timeout", "url")

    def __init__(self, target: Target, timeout: float, kwargs: Mapping[str, Any]) -> None:
        base = (target.api_base or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE).rstrip("/")
        self.url = f"{base}/chat/completions"
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
        self.body = json.dumps(body, separators=(",", ":")).encode()
        self.timeout = httpx.Timeout(timeout)

    def send(self, stream: bool) -> Awaitable[httpx.Response]:
        http = client()
        request = http.build_request(
            "POST", self.url, content=self.body, headers=self.headers, timeout=self.timeout
        )
        return http.send(request, stream=stream)


class HTTPError(Exception):
    """A provider's error answer (status >= 400, or an error event in a stream), as the error
    classifier reads it: ``status_code``, ``body`` (the decoded error) and ``response`` (its
    headers: ``Retry-After``)."""

    def __init__(
        self, message: str, status_code: int | None, body: Any, response: httpx.Response | None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.body = body
        self.response = response


def _error_of(response: httpx.Response, raw: bytes, secret: str | None) -> HTTPError:
    # Scrubbed before anything keeps it: a provider may echo the key it refused.
    text = scrub(raw.decode(errors="replace"), secret)
    try:
        body = json.loads(text)
    except ValueError:
        body = text[:2000]
    error = body.get("error") if isinstance(body, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(message, str):
        message = f"HTTP {response.status_code}"
    return HTTPError(message, response.status_code, body, response)


async def complete(target: Target, timeout: float, kwargs: Mapping[str, Any]) -> Any:
    """One non-streaming attempt: the provider's answer as a litellm ``ModelResponse``."""
    from ._litellm import litellm

    request = Request(target, timeout, kwargs)
    response = await request.send(stream=False)
    if response.status_code >= 400:
        raise _error_of(response, response.content, target.api_key)
    try:
        data = json.loads(response.content)
    except ValueError as exc:
        raise ProviderUnavailable(
            "the provider's answer is not JSON", target=target.key, status_code=200
        ) from exc
    return litellm().ModelResponse(**data)


class OpenAIChunks:
    """One streaming attempt on the fast lane, as an async iterator of :class:`Node` chunks.

    Opened on the first ``__anext__``. Each SSE event is decoded once; keep-alive comments and
    empty lines are skipped; an event that does not parse is skipped and counted
    (:attr:`malformed`); an error event raises the provider's error; ``[DONE]`` (or the end of
    the body) ends it. Like :class:`~latencykit._litellm.LitellmChunks`, its steps are exposed
    to the :class:`~latencykit.Stream` reading it (``pull``, ``wrap_error``); a finish reason is
    always the provider's own (no library makes one up for a cut connection).
    """

    chunk_reader = OPENAI_CHUNKS
    __slots__ = (
        "_closed",
        "_lines",
        "_request",
        "_response",
        "_run_soon",
        "_secrets",
        "_target",
        "malformed",
    )

    def __init__(self, request: Request, target: Target, secrets: tuple[str, ...]) -> None:
        self._request = request
        self._target = target
        self._secrets = secrets
        self._response: httpx.Response | None = None
        self._lines: Any = None
        self._closed = False
        self._run_soon: Any = None  # schedules a close on the stream's loop, from any thread
        self.malformed = 0

    def __aiter__(self) -> OpenAIChunks:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.pull()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            raise self.wrap_error(exc) from exc

    async def pull(self) -> Any:
        """The next chunk (errors unwrapped)."""
        lines = self._lines
        if lines is None:
            lines = await self._open()
        data: str | None = None
        async for line in lines:
            if line.startswith("data:"):
                payload = line[5:].lstrip()
                data = payload if data is None else f"{data}\n{payload}"
                continue
            if line or data is None:
                continue  # another field, a comment (keep-alive), or a blank line
            if data == "[DONE]":
                async for _ in lines:  # read the body to its end: the connection is reused
                    pass
                raise StopAsyncIteration
            chunk = self._event(data)
            if chunk is not None:
                return chunk
            data = None
        if data is not None and data != "[DONE]":  # the body ended without a blank line
            chunk = self._event(data)
            if chunk is not None:
                return chunk
        raise StopAsyncIteration

    def _event(self, data: str) -> Any:
        try:
            chunk = _decode(data)
        except ValueError:
            self.malformed += 1
            return None
        if not isinstance(chunk, Node):
            self.malformed += 1
            return None
        error = chunk.get("error")
        if error is not None and not chunk.get("choices"):
            message = error.get("message") if isinstance(error, Mapping) else None
            raise HTTPError(str(message or "error event"), None, chunk, None)
        return chunk

    async def _open(self) -> Any:
        if self._closed:
            raise StopAsyncIteration
        self._run_soon = _run_soon()
        response = self._response = await self._request.send(stream=True)
        if response.status_code >= 400:
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            raise _error_of(response, raw, self._target.api_key)
        self._lines = response.aiter_lines()
        return self._lines

    def wrap_error(self, error: Exception) -> Exception:
        """What ``error``, raised by :meth:`pull`, means to latencykit (keys scrubbed). Once the
        stream is open, a lost connection is a cut and a transient error event a break
        (:class:`~latencykit.StreamBroken`); other error events (a content filter, ...) keep
        their own type."""
        if isinstance(error, StreamBroken):
            return error
        wrapped = provider_error(error, target=self._target.key, secrets=self._secrets)
        if self._lines is None:
            return wrapped  # no answer yet: as any failed request
        if isinstance(error, httpx.TransportError):
            return StreamBroken(
                f"the connection was lost mid-stream ({type(error).__name__})",
                target=self._target.key,
                reason="cut",
            )
        if is_transient(wrapped):
            return StreamBroken(
                wrapped.provider_message,
                target=self._target.key,
                status_code=wrapped.status_code,
                retry_after=wrapped.retry_after,
            )
        return wrapped

    async def aclose(self) -> None:
        """Close the HTTP response (idempotent): the connection is dropped unless read to the
        end."""
        self._closed = True
        response, self._response = self._response, None
        if response is not None:
            await response.aclose()

    def close_nowait(self) -> None:
        """Schedule :meth:`aclose` on the stream's loop (from a finaliser, any thread)."""
        run_soon = self._run_soon
        if self._response is not None and run_soon is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the socket went with it
                run_soon(self.aclose)


_closing: set[Any] = set()  # strong references to asyncio close tasks until they finish


def _run_soon() -> Any:
    """A function running an async close on this event loop soon, callable from any thread."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def on_trio(close: Any) -> None:
            token.run_sync_soon(trio.lowlevel.spawn_system_task, close)

        return on_trio
    import asyncio

    loop = asyncio.get_running_loop()

    def spawn(close: Any) -> None:
        task = loop.create_task(close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    def on_asyncio(close: Any) -> None:
        loop.call_soon_threadsafe(spawn, close)

    return on_asyncio
