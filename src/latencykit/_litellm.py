"""What latencykit needs to know about litellm: its lazy import, and its streams.

litellm facts this module is built on (measured, see ../shared/DESIGN.md §6): importing it takes
seconds, so it is imported on first use; ``acompletion(stream=True)`` returns a
``CustomStreamWrapper`` that keeps its HTTP connection open until ``aclose()``; and when a
connection ends without the provider's ``finish_reason``, litellm may end the iteration normally
with a ``finish_reason="stop"`` chunk of its own making, so the end of a stream is judged from
what the provider sent (litellm records it in ``received_finish_reason``).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import types
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import ratelimit
from ._cancel import now, on_asyncio, run_soon
from .chunks import delta_content
from .errors import StreamBroken, _chain, headers_of, malformed_answer, request_id, stream_error
from .propagation import provider_headers
from .stream import ChunkSource

if TYPE_CHECKING:
    from .target import Target

__all__ = [
    "LITELLM_CHUNKS",
    "LitellmChunks",
    "LitellmTransport",
    "headers_of",
    "acompletion",
    "attempt_arguments",
    "aembedding",
    "is_set_up",
    "litellm",
    "open_connection",
    "set_up",
    "to_model_response",
]

_UNKNOWN = object()
_NOT_CONTENT: tuple[str | None, str | None] = (None, None)


GC_FREEZE_VARIABLE = "LATENCYKIT_GC_FREEZE"
_frozen = False


def litellm() -> Any:
    """Import litellm on first use (it takes seconds; ``import latencykit`` must stay fast).

    The first time, the heap is then frozen (``gc.collect(); gc.freeze()``): litellm's import
    leaves ~1 million long-lived objects, and every full garbage collection walks them all,
    a pause of ~150-200 ms that delays every timer of the loop (deadlines, hedges, stall
    guards) and so lands on the latency tail. Frozen objects are never collected, so objects
    alive at that moment that become garbage later are not reclaimed (cycles among them).
    Opt out with the environment variable ``LATENCYKIT_GC_FREEZE=0`` (read at that moment).
    """
    import litellm

    global _frozen
    if not _frozen:
        _frozen = True
        _record_gemini_finish()
        _quieten(litellm)
        import os

        if os.environ.get(GC_FREEZE_VARIABLE, "1").strip().lower() not in ("0", "false", "no"):
            import gc

            gc.collect()
            gc.freeze()
    return litellm


_GEMINI_FINISH = "latencykit_finish"
_gemini_parser: Any = None  # litellm's Gemini stream parser, once it records the finish


def _record_gemini_finish() -> None:
    """Make litellm's Gemini stream parser keep the provider's own ``finishReason`` (it puts
    ``"stop"`` on every chunk, so a Gemini stream cut cleanly looks complete): each raw event
    it parses records the finish on the parser (``latencykit_finish``), what
    :meth:`LitellmChunks.finished` reads. Nothing else about litellm's parsing changes. Without
    that parser (another litellm), Gemini streams are judged as litellm says."""
    global _gemini_parser
    try:
        from litellm.llms.vertex_ai.gemini import vertex_and_google_ai_studio_gemini as gemini
    except ImportError:
        return
    iterator = getattr(gemini, "ModelResponseIterator", None)
    parse = getattr(iterator, "chunk_parser", None)
    if iterator is None or parse is None:
        return

    def chunk_parser(self: Any, chunk: Any) -> Any:
        candidates = chunk.get("candidates") if isinstance(chunk, dict) else None
        for candidate in candidates if isinstance(candidates, list) else ():
            if isinstance(candidate, dict) and candidate.get("finishReason"):
                setattr(self, _GEMINI_FINISH, candidate["finishReason"])
        return parse(self, chunk)

    iterator.chunk_parser = _gemini_parser = chunk_parser


def to_model_response(response: Any) -> Any:
    """litellm's ``ModelResponse`` with the fields of ``response``, a fast-lane answer
    (:class:`~latencykit.chunks.Response`, or its general form, a
    :class:`~latencykit.chunks.Node`), for code that needs litellm's own type
    (``litellm.completion_cost``, ...); :func:`latencykit.report` reads it as it reads
    ``response``. Imports litellm (seconds, the first time)."""
    converted = litellm().ModelResponse(**response.model_dump())
    converted._hidden_params.update(getattr(response, "_hidden_params", {}))
    return converted


# --- quiet inside latencykit's calls -----------------------------------------------------------

_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("latencykit_quiet", default=False)
"""Set while latencykit's own litellm calls run: litellm's printed banners are for them off."""


class _QuietLitellm(types.ModuleType):
    """litellm's module, whose ``suppress_debug_info`` reads ``True`` inside latencykit's calls.

    litellm prints a "Give Feedback / Get Help" banner on every failed call, and a "Provider
    List" one for a model it cannot place, unless its global ``suppress_debug_info`` is set;
    it has no per-call switch. Setting the global would change the user's own calls, so the
    attribute becomes a property: inside latencykit's calls (the context variable ``_quiet``,
    copied by litellm into the thread where it does its set-up) it reads ``True``; elsewhere
    it reads and writes the user's value, kept where it always was (the module's dict).
    """

    @property
    def suppress_debug_info(self) -> Any:
        if _quiet.get() or _in_our_stream():
            return True
        return self.__dict__.get("suppress_debug_info", False)

    @suppress_debug_info.setter
    def suppress_debug_info(self, value: Any) -> None:
        self.__dict__["suppress_debug_info"] = value


_our_streams: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""litellm's stream wrappers that latencykit opened, by id: a chunk is read from one without
setting ``_quiet`` (a frame and a context switch per chunk, ~0.8 us); its mid-stream error
banner is found quiet by :func:`_in_our_stream` instead."""


def _in_our_stream() -> bool:
    # Read only where litellm is about to print a banner (an error): the stack is walked then,
    # never per chunk.
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__anext__":
            owner = frame.f_locals.get("self")
            if owner is not None and _our_streams.get(id(owner)) is owner:
                return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _quieten(module: Any) -> None:
    if type(module) is types.ModuleType:  # a module class of litellm's own is left alone
        module.__class__ = _QuietLitellm


async def acompletion(arguments: Mapping[str, Any]) -> Any:
    """``litellm.acompletion(**arguments, max_retries=0)``, quiet (see :class:`_QuietLitellm`)."""
    token = _quiet.set(True)
    try:
        return await litellm().acompletion(**arguments, max_retries=0)
    finally:
        _quiet.reset(token)


class _NoRetries(int):
    """``0`` that is true: litellm's OpenAI embedding handler reads ``max_retries or 2`` (and
    sets that on the client), so a plain ``max_retries=0`` still cost 3 requests for one 503
    (measured, litellm 1.110; the SDK's ``x-stainless-retry-count`` 0, 1, 2)."""

    def __bool__(self) -> bool:
        return True


_NO_RETRIES = _NoRetries(0)


async def aembedding(arguments: Mapping[str, Any]) -> Any:
    """``litellm.aembedding(**arguments, max_retries=0)`` (a ``0`` litellm keeps: see
    :class:`_NoRetries`), quiet (see :class:`_QuietLitellm`)."""
    token = _quiet.set(True)
    try:
        return await litellm().aembedding(**arguments, max_retries=_NO_RETRIES)
    finally:
        _quiet.reset(token)


# --- litellm's first call of a process ---------------------------------------------------------

_set_up: set[str] = set()  # the models whose set-up has run in this process (see set_up)
_PROBE = ({"role": "user", "content": "warm-up"},)


def is_set_up(model: str) -> bool:
    """Whether :func:`set_up` has run for ``model`` in this process."""
    return model in _set_up


async def set_up(arguments: Mapping[str, Any]) -> None:
    """Do, once per process and model, the work of litellm's first call that comes before the
    request: measured against a server answering in 20 ms, its first streamed call took
    0.2-0.9 s to the first chunk (its provider's configuration and response types built, the
    tokenizer it counts tokens with loaded: tiktoken's, 0.2 s), the next ones 5-10 ms.

    It runs through litellm with a ``mock_response``: no request is sent, and ``no-log`` keeps
    it from the user's litellm callbacks. ``arguments``: the target's litellm arguments
    (:meth:`~latencykit.Target.litellm_arguments`). An error (an unknown provider) is raised,
    and the model counts as set up all the same: the real call raises it properly.
    """
    model = arguments["model"]
    if model in _set_up:
        return
    token = _quiet.set(True)
    try:
        stream = await litellm().acompletion(
            **arguments,
            messages=list(_PROBE),
            stream=True,
            mock_response="ok",
            max_retries=0,
            **{"no-log": True},
        )
        async for _ in stream:
            pass
    except Exception:
        _set_up.add(model)
        raise
    finally:
        _quiet.reset(token)
    _set_up.add(model)


async def open_connection(arguments: Mapping[str, Any], timeout: float) -> bool:
    """Open a keep-alive connection in the HTTP client litellm will send ``arguments``' calls
    with, without a completion (it would cost tokens): ``GET {api_base}/models``, whatever its
    status. Only for targets litellm sends through its OpenAI client (provider ``openai``:
    OpenAI and OpenAI-compatible ``api_base`` s); returns whether it did. The client is
    litellm's own, cached by (key, base, timeout, ...), built as litellm builds it for a call.

    Raises what connecting raised (refused, timed out after ``timeout`` seconds, ...).
    """
    import asyncio

    module = litellm()
    token = _quiet.set(True)
    try:
        _, provider, _, _ = module.get_llm_provider(
            model=arguments["model"], api_base=arguments.get("api_base")
        )
        handler = getattr(getattr(module, "main", None), "openai_chat_completions", None)
        get_client = getattr(handler, "_get_openai_client", None)
        if provider != "openai" or get_client is None:
            return False
        import os

        env = os.environ.get
        # As litellm resolves them for an "openai" call (its main.completion): the first set.
        client = get_client(
            is_async=True,
            api_key=_first(
                arguments.get("api_key"), module.api_key, module.openai_key, env("OPENAI_API_KEY")
            ),
            api_base=_first(
                arguments.get("api_base"),
                module.api_base,
                env("OPENAI_BASE_URL"),
                env("OPENAI_API_BASE"),
                "https://api.openai.com/v1",
            ),
            api_version=None,
            timeout=float(arguments["timeout"]),
            max_retries=0,
            organization=_first(module.organization, env("OPENAI_ORGANIZATION")),
        )
        import openai

        with contextlib.suppress(openai.APIStatusError):  # it answered: the connection is open
            await asyncio.wait_for(client.models.with_raw_response.list(), timeout)
        return True
    finally:
        _quiet.reset(token)


def _first(*values: Any) -> Any:
    """The first of ``values`` that is set (truthy), else ``None``."""
    return next((value for value in values if value), None)


async def _answer(target: Target, call: Any, arguments: Mapping[str, Any]) -> Any:
    """``call`` (litellm's ``acompletion`` or ``aembedding``) on the asyncio side: its answer,
    an unreadable one as a malformed answer, its rate-limit headers heard."""
    bridge: Any = sys.modules.get("latencykit._asyncio_bridge")
    if bridge is None:  # imported on first use: asyncio stays out of `import latencykit`
        from . import _asyncio_bridge as bridge
    try:
        response = await bridge.run_on_asyncio(call(attempt_arguments(target, arguments)))
    except Exception as exc:
        if (malformed := _unreadable(exc, target)) is None:
            raise
        raise malformed from None
    ratelimit.heard(target.key, target.api_key, headers_of(response))
    return response


class LitellmTransport:
    """The litellm lane (``Target(transport="litellm")``): attempts through
    ``litellm.acompletion``, on asyncio (on trio, in the asyncio bridge). litellm's HTTP clients
    are its own, shared by every caller in the process: :meth:`aclose` leaves them open.
    ``secrets``: the keys to scrub from errors (default none)."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        self._secrets = secrets

    async def complete(self, target: Target, arguments: Mapping[str, Any]) -> Any:
        """One non-streaming attempt: litellm's ``ModelResponse``."""
        # litellm's one-time set-up, apart: a cancel landing in a real call's set-up (it runs
        # in a thread) leaves litellm's request coroutine unawaited; in the mock's, nothing.
        await self._set_up(target)
        return await _answer(target, acompletion, arguments)

    async def embed(self, target: Target, arguments: Mapping[str, Any]) -> Any:
        """One embedding attempt: litellm's ``EmbeddingResponse``."""
        return await _answer(target, aembedding, arguments)

    async def open(self, target: Target, arguments: Mapping[str, Any]) -> ChunkSource:
        """One streaming attempt's source, opened on its first read (on trio, bridged: the
        bridge's pump hands the chunks over). The process's first call of a model first does
        litellm's set-up (see :func:`set_up`): the source is ready (``ready_at``) after it."""
        ready_at = now() if await self._set_up(target) else None
        chunks = LitellmChunks(
            attempt_arguments(target, arguments), target, self._secrets, ready_at
        )
        if on_asyncio():
            return chunks
        from ._asyncio_bridge import BridgedStream

        return BridgedStream(chunks)

    @staticmethod
    async def _set_up(target: Target) -> bool:
        """:func:`set_up` for ``target``'s model unless done; whether it was done now."""
        if is_set_up(target.model):
            return False
        from ._asyncio_bridge import run_on_asyncio

        with contextlib.suppress(Exception):  # an unknown provider: the real call raises it
            await run_on_asyncio(set_up(target.litellm_arguments()))
        return True

    async def warm(self, target: Target, *, connect: bool, limit: float) -> None:
        """:func:`set_up`, then (``connect``) :func:`open_connection` within ``limit``
        seconds."""
        from ._asyncio_bridge import run_on_asyncio

        arguments = target.litellm_arguments()

        async def warm() -> None:
            await set_up(arguments)
            if connect:
                await open_connection(arguments, limit)

        await run_on_asyncio(warm())

    async def aclose(self) -> None:
        """Nothing to close: litellm's clients are litellm's."""


def _unreadable(exc: Exception, target: Target) -> Exception | None:
    """The malformed answer (as the fast lane tells it) that ``exc`` is when litellm failed to
    read a 200 answer, else ``None``: the OpenAI SDK hands litellm a body that is not JSON as
    text (then litellm's ``response.model_dump()`` fails on a ``str``), and litellm
    wraps its own failure to convert an answer ("Invalid response object", over a
    ``KeyError``) as if it were the caller's bug."""
    for link in _chain(exc):
        if isinstance(link, AttributeError) and link.name == "model_dump" and type(link.obj) is str:
            return malformed_answer("is not JSON", link.obj, target=target.key)
        if type(link) is Exception and str(link).startswith("Invalid response object"):
            return malformed_answer("is not one litellm can read", "", target=target.key)
    return None


def attempt_arguments(target: Target, call: Mapping[str, Any]) -> dict[str, Any]:
    """litellm's arguments for an attempt made now, in the caller's task (on trio the bridge's
    loop has another clock): the deadline's remainder rides in ``extra_headers``."""
    arguments = target.litellm_arguments(call)
    headers = provider_headers(arguments.get("extra_headers"))
    if headers:
        arguments["extra_headers"] = headers
    return arguments


class _LitellmChunkReader:
    """Reads litellm's ``ModelResponseStream`` chunks for a :class:`~latencykit.Stream`.

    Content is judged by the one content rule
    (:func:`~latencykit.chunks.delta_content`), read from pydantic's extra fields. A
    reader bound to its stream's :class:`LitellmChunks` (``source``) also keeps litellm's own
    inventions out: a finish reason litellm made up (for a cut connection, or on every chunk of
    a Gemini stream) is no finish, and a usage chunk litellm estimated with its tokenizer (the
    provider sent none) reports no tokens. Unbound (:data:`LITELLM_CHUNKS`), it takes the
    chunks at their word.
    """

    requires_finish = True
    __slots__ = ("_source",)

    def __init__(self, source: LitellmChunks | None = None) -> None:
        self._source = source

    def read(self, chunk: Any) -> tuple[str | None, str | None]:
        choices = chunk.choices
        if not choices:
            return _NOT_CONTENT
        choice = choices[0]
        try:  # the common text chunk, straight from pydantic's extra dicts (see _field)
            extra = choice.__pydantic_extra__
            text = extra["delta"].__pydantic_extra__["content"]
            finish = extra["finish_reason"]
            if text and finish is None:
                return text, None
        except (AttributeError, KeyError, TypeError):
            pass
        delta = _field(choice, "delta")
        text = delta_content(delta, _field(delta, "content"), _field)
        finish = _field(choice, "finish_reason")
        if finish is not None and self._source is not None and not self._source.finished():
            finish = None
        return text, finish

    def output_tokens(self, chunk: Any) -> int | None:
        usage = getattr(chunk, "usage", None)
        tokens = getattr(usage, "completion_tokens", None)
        if not isinstance(tokens, int):
            return None
        if self._source is not None and not self._source.reported_usage():
            return None
        return tokens


def _field(model: Any, name: str, default: Any = None) -> Any:
    # litellm keeps a chunk's choice and delta fields in pydantic's __pydantic_extra__, where
    # attribute access costs ~1.3 us each (pydantic's __getattr__); a dict lookup costs 0.1.
    extra = getattr(model, "__pydantic_extra__", None)
    if extra is not None and name in extra:
        return extra[name]
    return getattr(model, name, default)


LITELLM_CHUNKS = _LitellmChunkReader()


class LitellmChunks(ChunkSource):
    """One streaming attempt through litellm, as an async iterator of its chunks.

    Opened on the first ``__anext__`` (``litellm.acompletion(..., stream=True)``); provider
    errors come out as latencykit's :class:`~latencykit.ProviderError` types (keys scrubbed);
    a finish chunk litellm made up for a cut connection raises
    :class:`~latencykit.StreamBroken` instead. Runs on asyncio (on trio, inside the bridge).

    A :class:`~latencykit.Stream` reading it directly takes the steps of ``__anext__`` apart
    (``pull``, ``wrap_error``; its ``chunk_reader`` is bound to it) so that a chunk reaches it
    without a coroutine frame of ours in between (litellm's banners stay quiet for it all the
    same: see :func:`_in_our_stream`).
    """

    __slots__ = (
        "_answer",
        "_arguments",
        "_closed",
        "_content_type",
        "_parser",
        "_run_soon",
        "_secrets",
        "_target",
        "_wrapper",
        "chunk_reader",
        "ready_at",
    )

    def __init__(
        self,
        arguments: dict[str, Any],
        target: Target,
        secrets: tuple[str, ...],
        ready_at: float | None = None,
    ) -> None:
        self._arguments = arguments
        self._target = target
        self._secrets = secrets
        self._wrapper: Any = None  # litellm's stream while open
        # What the stream's judgement reads, kept past the close (a reader may lag behind:
        # on trio the bridge's pump runs ahead and closes the source first): litellm's
        # stream wrapper and the parser under it (litellm drops it at the end).
        self._answer: Any = None
        self._parser: Any = None
        self._run_soon: Callable[[Callable[[], Awaitable[object]]], None] | None = None
        self._closed = False
        self._content_type = ""  # the answer's, once open
        self.chunk_reader = _LitellmChunkReader(self)
        self.ready_at = ready_at

    def pull(self) -> Awaitable[Any]:
        """litellm's next chunk, as litellm gives it (errors unwrapped, finish unchecked)."""
        wrapper = self._wrapper
        if wrapper is not None:
            return wrapper.__anext__()  # type: ignore[no-any-return]
        return self._open()

    async def _open(self) -> Any:
        if self._closed:
            raise StopAsyncIteration

        self._run_soon = run_soon()
        token = _quiet.set(True)
        try:
            wrapper = self._wrapper = self._answer = await litellm().acompletion(
                **self._arguments, stream=True, max_retries=0
            )
            _our_streams[id(wrapper)] = wrapper  # quiet mid-stream too (see _in_our_stream)
            ratelimit.heard(self._target.key, self._target.api_key, headers_of(wrapper))
            try:
                return await wrapper.__anext__()
            finally:  # litellm drops its parser at the stream's end: what it was is kept
                self._parser = wrapper.completion_stream
                response = getattr(self._parser, "response", None)
                kind = getattr(response, "headers", {}).get("content-type", "")
                self._content_type = kind if isinstance(kind, str) else ""
        finally:
            _quiet.reset(token)

    def wrap_error(self, error: Exception) -> Exception:
        """What ``error``, raised by :meth:`pull`, means to latencykit (keys scrubbed)."""
        wrapped = stream_error(
            error, target=self._target.key, secrets=self._secrets, opened=self._answer is not None
        )
        # litellm >= 1.110 raises this itself where older ones made up a finish reason
        # (see finished()): either way the provider's connection was cut.
        if isinstance(wrapped, StreamBroken) and _ENDED_EARLY in str(error):
            wrapped.reason = "cut"
        return wrapped

    @property
    def request_id(self) -> str | None:
        """The provider's request id of the stream's answer, once it opened (kept past the
        close)."""
        return request_id(headers_of(self._answer))

    def finished(self) -> bool:
        """Whether the provider itself finished the stream (sent its finish reason): litellm
        makes one up for a cut connection (its ``received_finish_reason`` stays ``None``), and
        its Gemini parser puts ``"stop"`` on every chunk (the provider's own ``finishReason``
        is recorded by :func:`_record_gemini_finish`)."""
        wrapper, parser = self._answer, self._parser
        if getattr(type(parser), "chunk_parser", None) is _gemini_parser:
            return getattr(parser, _GEMINI_FINISH, None) is not None
        return (
            getattr(wrapper, "received_finish_reason", _UNKNOWN) is not None
            or getattr(wrapper, "intermittent_finish_reason", _UNKNOWN) is not None
        )

    def reported_usage(self) -> bool:
        """Whether the provider sent usage: litellm ends a stream with a usage chunk of its own,
        its tokenizer's estimate, when the provider sent none."""
        chunks = getattr(self._answer, "chunks", None)
        if not isinstance(chunks, list):
            return True  # a litellm that keeps no chunks: take its word
        return any(getattr(kept, "usage", None) is not None for kept in chunks)

    def end_error(self) -> Exception | None:
        """Why the stream ended without the provider's finish, when it is more than a cut: an
        answer that is not an event stream (by its content type: the body is litellm's).
        ``None``: a cut."""
        kind = self._content_type
        if not kind or "event-stream" in kind:
            return None
        return malformed_answer(
            f"is not an event stream (content-type {kind!r})", "", target=self._target.key
        )

    async def aclose(self) -> None:
        """Close the litellm stream and its HTTP response (idempotent)."""
        self._closed = True
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            token = _quiet.set(True)
            try:
                await wrapper.aclose()
            finally:
                _quiet.reset(token)

    def close_nowait(self) -> None:
        """Schedule :meth:`aclose` on the stream's loop (from a finaliser, any thread)."""
        run = self._run_soon
        if self._wrapper is not None and run is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the socket went with it
                run(self.aclose)


_ENDED_EARLY = "Stream ended before a finish_reason was received"
