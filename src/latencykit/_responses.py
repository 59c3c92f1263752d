"""OpenAI's Responses API through litellm (``litellm.aresponses``), read by the rules that read
chat completions.

An answer is complete only when the provider says so: a ``response.completed`` event ends a
stream (an event stream that stops before it was cut, whatever litellm makes of it), a
``response`` object has ``status == "completed"``. The other endings are typed errors: an
answer stopped at ``max_output_tokens`` (``status == "incomplete"``, a ``response.incomplete``
event) raises :class:`~latencykit.errors.OutputTruncated` with the text so far, one stopped
by the content filter :class:`~latencykit.ContentPolicyViolation`, a failed one
(``response.failed``, an ``error`` event) the :class:`~latencykit.ProviderError` its error
object says, classified by the one table. Content is the output text (and a refusal, and a
tool call's arguments, as a chat delta's ``tool_calls`` are); reasoning is not.

litellm facts this is built on: for a model its map does not know, litellm would not stream
natively (it asks for the whole answer and replays it as events: no first-token time to guard
or hedge on), so such a model is registered as streaming natively on its first stream; with
native streaming litellm raises when the events stop before a terminal one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from . import ratelimit
from ._cancel import on_asyncio, run_soon
from ._litellm import attempt_arguments, headers_of, litellm
from .errors import (
    ContentPolicyViolation,
    HTTPError,
    OutputTruncated,
    ProviderError,
    StreamBroken,
    provider_error,
    stream_error,
)
from .stream import ChunkSource

if TYPE_CHECKING:
    from .target import Target

__all__ = ["RESPONSE_EVENTS", "ResponseEvents", "open_events", "respond"]

_TEXT = frozenset({"response.output_text.delta", "response.refusal.delta"})
_TOOL = "response.function_call_arguments.delta"
_COMPLETED = "response.completed"
_INCOMPLETE = "response.incomplete"
_FAILED = "response.failed"
_NOT_CONTENT: tuple[str | None, str | None] = (None, None)
_ENDED_EARLY = "before any terminal event"  # litellm's words for events that stopped short


class _EventReader:
    """Reads Responses stream events for a :class:`~latencykit.Stream`: the text deltas (and
    a refusal's) are content, a tool call's argument deltas content without text, the
    ``response.completed`` event the provider's finish (``"stop"``)."""

    requires_finish = True

    def read(self, event: Any) -> tuple[str | None, str | None]:
        kind = getattr(event, "type", None)
        if kind in _TEXT:
            return getattr(event, "delta", "") or "", None
        if kind == _TOOL:
            return "", None
        if kind == _COMPLETED:
            return None, "stop"
        return _NOT_CONTENT

    def output_tokens(self, event: Any) -> int | None:
        if getattr(event, "type", None) != _COMPLETED:
            return None
        tokens = getattr(getattr(event.response, "usage", None), "output_tokens", None)
        return tokens if isinstance(tokens, int) else None


RESPONSE_EVENTS = _EventReader()


def _unfinished(response: Any, text: str, target: str) -> Exception | None:
    """Why a ``response`` (an object, or a terminal event's) is not a complete answer, else
    ``None``: truncated, filtered or failed, as a typed error."""
    status = getattr(response, "status", None)
    if status == "incomplete":
        reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
        if reason == "content_filter":
            return ContentPolicyViolation(
                "the answer was stopped by the provider's content filter", target=target
            )
        cap = getattr(response, "max_output_tokens", None)
        return OutputTruncated(
            response, text, max_tokens=cap if isinstance(cap, int) else None, budget_capped=False
        )
    if status == "failed":
        error: Any = getattr(response, "error", None)
        body = error.model_dump() if hasattr(error, "model_dump") else error
        message = str(getattr(error, "message", None) or "the response failed")
        return provider_error(HTTPError(message, None, {"error": body}), target=target)
    return None


async def respond(target: Target, arguments: Mapping[str, Any], secrets: tuple[str, ...]) -> Any:
    """One non-streaming attempt: litellm's ``ResponsesAPIResponse``, complete (else a typed
    error, see the module)."""
    from ._asyncio_bridge import run_on_asyncio  # here: asyncio stays out of import

    call = litellm().aresponses(**attempt_arguments(target, arguments), max_retries=0)
    try:
        response = await run_on_asyncio(call)
    except Exception as exc:
        raise provider_error(exc, target=target.key, secrets=secrets) from exc
    ratelimit.heard(target.key, target.api_key, headers_of(response))
    unfinished = _unfinished(response, str(getattr(response, "output_text", "") or ""), target.key)
    if unfinished is not None:
        raise unfinished
    return response


class ResponseEvents(ChunkSource):
    """One streaming attempt through ``litellm.aresponses(stream=True)``, as its events.

    Opened on the first read; errors come out as latencykit's types (keys scrubbed); a
    ``response.incomplete`` or ``response.failed`` event raises its typed error (see the
    module); events that stop before a terminal one are a cut (:class:`StreamBroken`,
    ``reason="cut"``). Runs on asyncio (on trio, inside the asyncio bridge).
    """

    __slots__ = (
        "_arguments",
        "_closed",
        "_events",
        "_opened",
        "_run_soon",
        "_secrets",
        "_target",
        "_text",
    )
    chunk_reader = RESPONSE_EVENTS

    def __init__(self, arguments: dict[str, Any], target: Target, secrets: tuple[str, ...]) -> None:
        self._arguments = arguments
        self._target = target
        self._secrets = secrets
        self._events: Any = None  # litellm's iterator while open
        self._opened = False
        self._closed = False
        self._run_soon: Any = None
        self._text: list[str] = []  # the text so far, for a truncation's error

    def pull(self) -> Awaitable[Any]:
        return self._next()

    async def _next(self) -> Any:
        if self._events is None:
            if self._closed:
                raise StopAsyncIteration
            self._run_soon = run_soon()
            self._events = await litellm().aresponses(**self._arguments, stream=True, max_retries=0)
            self._opened = True
            ratelimit.heard(self._target.key, self._target.api_key, headers_of(self._events))
        event = await self._events.__anext__()
        kind = getattr(event, "type", None)
        if kind in _TEXT:
            self._text.append(getattr(event, "delta", "") or "")
        elif kind in (_INCOMPLETE, _FAILED):
            unfinished = _unfinished(event.response, "".join(self._text), self._target.key)
            if unfinished is not None:
                raise unfinished
        return event

    def wrap_error(self, error: Exception) -> Exception:
        """What ``error``, raised by :meth:`pull`, means to latencykit (keys scrubbed)."""
        if isinstance(error, (ProviderError, OutputTruncated)):
            return error
        wrapped = stream_error(
            error, target=self._target.key, secrets=self._secrets, opened=self._opened
        )
        if self._opened and _ENDED_EARLY in str(error):
            return StreamBroken(
                "the event stream ended before its terminal event: the connection was cut",
                target=self._target.key,
                reason="cut",
            )
        return wrapped

    async def aclose(self) -> None:
        """Close litellm's iterator and its HTTP response (idempotent)."""
        self._closed = True
        events, self._events = self._events, None
        if events is not None:
            await events.aclose()

    def close_nowait(self) -> None:
        """Schedule :meth:`aclose` on the stream's loop (from a finaliser, any thread)."""
        if self._events is not None and self._run_soon is not None:
            self._run_soon(self.aclose)


_native: set[str] = set()  # models litellm was told to stream natively


def _stream_natively(model: str) -> None:
    """Have litellm stream ``model`` natively: for a model its map does not know (a model of
    one's own on an OpenAI-compatible server), litellm would ask for the whole answer and
    replay it as events, with no first-token time to guard or hedge on. A model the map knows
    keeps what the map says."""
    if model in _native:
        return
    module = litellm()
    try:
        module.get_model_info(model=model)
    except Exception:  # not in the map
        provider = module.get_llm_provider(model)[1]
        module.register_model(
            {model: {"litellm_provider": provider, "supports_native_streaming": True}}
        )
    _native.add(model)


def open_events(target: Target, arguments: Mapping[str, Any], secrets: tuple[str, ...]) -> Any:
    """A streaming attempt's source (on trio, bridged), opened on its first read."""
    _stream_natively(target.model)
    events = ResponseEvents(attempt_arguments(target, arguments), target, secrets)
    if on_asyncio():
        return events
    from ._asyncio_bridge import BridgedStream

    return BridgedStream(events)
