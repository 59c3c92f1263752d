"""Streams with a lifetime: first-chunk commit, timing, stall and deadline guards, close callbacks.

A stream attempt is an ordinary attempt until its first **content** chunk arrives (text, a
tool-call delta or reasoning text; role-only chunks, empty deltas and SSE keep-alives are not
content): only then is it *committed*, and the attempt "returns" to the policies around it. So
deadline, degrade, hedge, failover, breaker and retry act on "opened and produced a first content
chunk" exactly as they act on a response.

A committed :class:`Stream` outlives the pipeline run that produced it. What must happen when it
ends (the attempt record, the breaker's outcome, ``CallEnded``, closing the HTTP response) is
registered on it with :meth:`Stream.on_close` and runs exactly once, in the order registered
(the attempt's first, the call's last: as nested ``with`` blocks unwind): on
normal end, error, ``aclose()``, ``break`` out of ``async with``, cancellation, and garbage
collection (with a ``ResourceWarning``, like an unclosed file).

After commit, every ``__anext__`` waits at most until the earlier of the call's absolute deadline
and the stall limit (the last content chunk plus ``stall``); a timer is armed only for waits
that have such a limit. The per-chunk path reads the clock, classifies the chunk and hands it on.
"""

from __future__ import annotations

import abc
import logging
import math
import sys
import warnings
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from . import events
from ._cancel import Expired as _Expired
from ._cancel import Interrupt, Watchdog, backend, loop_clock, watchdog_for
from ._response import Summary
from ._response import summary as _summary
from .chunks import OPENAI_CHUNKS, Node
from .errors import (
    AttemptTimeout,
    DeadlineExceeded,
    FirstTokenTimeout,
    OutputTruncated,
    ProviderError,
    StreamBroken,
    StreamStalled,
    is_transient,
)

if TYPE_CHECKING:
    from ._context import Trace

__all__ = [
    "NOTHING",
    "ChunkReader",
    "ChunkSource",
    "LazyStream",
    "Limit",
    "LimitSource",
    "SkipPrefix",
    "Stream",
    "StreamOutcome",
]

T = TypeVar("T")
_Self = TypeVar("_Self", bound="_ClosedOnExit")
logger = logging.getLogger("latencykit")

StreamOutcome = Literal["open", "ok", "error", "closed", "cancelled", "abandoned"]
"""How a stream ended: ``"ok"`` (complete), ``"error"`` (broke or failed), ``"closed"`` (the
consumer closed it before the end), ``"cancelled"`` (the consumer was cancelled), ``"abandoned"``
(garbage-collected unclosed); ``"open"`` until then."""

_CLOSE_GRACE = 5.0  # seconds a close may take to release the HTTP response before we move on

LimitSource = Literal["configured", "learned", "timeout", "slo"]
"""Where a stream's first-token or stall limit came from: set by the user (``"configured"``),
by the SLO autopilot (``"slo"``, see :mod:`latencykit.autopilot`),
learned from the target's recent streams (``"learned"``, see
:class:`~latencykit.StreamGuard`), or the target's attempt ``timeout`` (``"timeout"``)."""


class Limit(float):
    """A first-token or stall limit in seconds that says where it came from (``source``, a
    :data:`LimitSource`; default ``"configured"``): what the stream guard gives a stream, so
    that the error and the event of a stream abandoned at its limit can tell why."""

    source: LimitSource

    def __new__(cls, seconds: float, source: LimitSource = "configured") -> Limit:
        limit = super().__new__(cls, seconds)
        limit.source = source
        return limit

    def __repr__(self) -> str:
        return f"Limit({float(self)!r}, {self.source!r})"


def _source(limit: float | None) -> LimitSource:
    return limit.source if isinstance(limit, Limit) else "configured"


class ChunkReader(Protocol):
    """How a stream's items are read: which are content, and how the provider ended it."""

    requires_finish: bool
    """Whether a stream is complete only when the provider said so (a ``finish_reason``):
    an LLM stream that just stops was cut. Plain iterators are complete when they end."""

    def read(self, item: Any) -> tuple[str | None, str | None]:
        """``(content, finish_reason)`` of ``item``: its content text (``""`` for content
        without text, such as a tool-call delta; ``None`` when it is not content) and the
        finish reason it carries, if any."""
        ...

    def output_tokens(self, item: Any) -> int | None:
        """Output tokens reported in ``item`` (a usage chunk), else ``None``."""
        ...


class _AnyItem:
    """Items of any async iterator, read by their shape: a chat-completion chunk (an object or
    a mapping with ``choices``: litellm's, the OpenAI SDK's, the fast lane's, a dict) by the
    one content rule (:func:`~latencykit.chunks.delta_content`: a role-only chunk or
    an empty delta is not content), a string when it is not empty, anything else always. The
    end of iteration completes them (no finish is required)."""

    requires_finish = False
    _READ: tuple[str | None, str | None] = ("", None)

    def read(self, item: Any) -> tuple[str | None, str | None]:
        if isinstance(item, str):
            return (item or None), None
        chunk = _chat_chunk(item)
        return self._READ if chunk is None else OPENAI_CHUNKS.read(chunk)

    def output_tokens(self, item: Any) -> int | None:
        chunk = _chat_chunk(item)
        return None if chunk is None else OPENAI_CHUNKS.output_tokens(chunk)


def _chat_chunk(item: Any) -> Any:
    """``item`` as a chat-completion chunk with attribute access, or ``None`` if it is not
    one (a dict is read through a :class:`~latencykit.chunks.Node`)."""
    if getattr(item, "choices", None) is not None:
        return item
    if isinstance(item, dict) and "choices" in item:
        return Node(item)
    return None


ANY_ITEM: ChunkReader = _AnyItem()


CloseCallback = Callable[["Stream[Any]", StreamOutcome, "BaseException | None"], object]
"""``callback(stream, outcome, error)``, registered with :meth:`Stream.on_close`."""

Resume = Callable[["Stream[Any]", Exception], Awaitable["Stream[Any] | SkipPrefix | None"]]
"""``resume(broken, error)``: a source continuing ``broken`` (already committed), or ``None``:
what a stream is built with when a broken stream may be continued (the stream guard's
``on_break="continue"``)."""


NOTHING: Any = object()
"""What :meth:`ChunkSource.buffered` returns when no item is buffered."""


class ChunkSource(abc.ABC):
    """What a :class:`Stream` reads: an async iterator of chunks and what the stream may ask of
    it. Each lane's source (and the asyncio bridge's) is one; any other async iterator is read
    through a plain one (its items read by :data:`ANY_ITEM`).

    A source is read without a coroutine frame of the stream's own per item: :meth:`pull` (the
    next raw item; errors unwrapped), :meth:`wrap_error` (what such an error means), and
    :meth:`buffered` (an item the source already holds, read without an await). Iterating a
    source directly (``__anext__``) pulls and wraps.
    """

    __slots__ = ()
    chunk_reader: ChunkReader = ANY_ITEM
    """How its items are read (default :data:`ANY_ITEM`)."""
    ready_at: float | None = None
    """When it was ready to send its request, if set-up of its own came first (the loop's first
    HTTP client, litellm's first call of a model): the attempt's first-token clock starts there
    (default ``None``: the attempt's start)."""
    guards_itself = False
    """Whether it enforces its own limits (a :class:`Stream`): a stream reading it must not race
    it with a timer of its own (default ``False``)."""
    buffered_with_read = True
    """Whether a :meth:`buffered` item arrived with the last read (the rest of one network
    read: it carries that read's time) rather than on its own (a bridge's buffer: it arrives when
    taken) (default ``True``)."""
    skipped = 0
    """Events it skipped because they did not parse (default ``0``)."""

    def __aiter__(self) -> ChunkSource:
        return self

    @property
    def request_id(self) -> str | None:
        """The provider's request id of the answer it reads, once the answer's headers arrived
        (default ``None``: none known)."""
        return None

    async def __anext__(self) -> Any:
        try:
            return await self.pull()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            raise self.wrap_error(exc) from exc

    @abc.abstractmethod
    def pull(self) -> Awaitable[Any]:
        """An awaitable of the next raw item (``StopAsyncIteration`` at the end)."""

    def wrap_error(self, error: Exception) -> Exception:
        """What ``error``, raised by :meth:`pull`, means to latencykit (default: itself)."""
        return error

    def buffered(self) -> Any:
        """The next item the source already holds, read: ``(item, text, finish_reason)`` (see
        :meth:`ChunkReader.read`), or :data:`NOTHING` (default): then :meth:`pull` reads on."""
        return NOTHING

    def end_error(self) -> Exception | None:
        """Why it ended without the provider's finish when that is more than a cut (an answer
        that is not an event stream); ``None`` (default): a cut."""
        return None

    async def aclose(self) -> None:
        """Close it and its HTTP response (default: nothing to close)."""
        return None

    def close_nowait(self) -> None:
        """Schedule its close without waiting, from a finaliser (default: nothing)."""
        return None

    def interrupter(self) -> Interrupt | None:
        """On trio: a function that makes a pending :meth:`pull` raise at once, called by the
        stream's stall and deadline timer (so no cancel scope is entered per wait); ``None``
        (default) when it has none yet (then each wait enters a scope)."""
        return None


class _Iterated(ChunkSource):
    """Any other async iterator, as a source."""

    __slots__ = ("_iterator",)

    def __init__(self, iterator: AsyncIterator[Any]) -> None:
        self._iterator = iterator

    def pull(self) -> Awaitable[Any]:
        return self._iterator.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._iterator, "aclose", None)  # an async generator has one
        if aclose is not None:
            await aclose()


class _ClosedOnExit:
    """``async with`` closes the stream (``aclose()``) however the block ends."""

    __slots__ = ()
    aclose: Callable[[], Awaitable[None]]  # defined by each stream class

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Stream(_ClosedOnExit, ChunkSource, Generic[T]):
    """An async iterator of chunks with a lifetime: use ``async for``, ``async with``, and
    ``aclose()``.

    Returned by ``await llm.acompletion(..., stream=True)`` (items are litellm's own chunk
    objects, so ``litellm.stream_chunk_builder(chunks)`` works on them), by a latencykit-decorated
    async-generator function, and by :func:`~latencykit.guard_stream`. Errors it raises after
    the first content chunk: :class:`~latencykit.StreamBroken` (or
    :class:`~latencykit.StreamStalled`) for a stream that broke, a
    :class:`~latencykit.ProviderError` for a provider error sent mid-stream that is not
    transient (a content filter), :class:`~latencykit.DeadlineExceeded` when the call's
    deadline expires; each carries the text delivered so far (``partial_text``) and the attempt
    history. A stream is never ended silently short of its end.

    The pipeline builds it over an attempt's source with the stream guard's limits and what the
    guard decides for a break and for the end: ``resume`` (default ``None``: a break is raised)
    continues a broken stream from another attempt (:data:`Resume`), and ``raise_truncated``
    (default ``False``) makes an answer cut at its output cap raise
    :class:`~latencykit.errors.OutputTruncated` after its last chunk. Nothing is set on a stream
    after it is built.

    Attributes:
        target: the key of the target that is answering.
        outcome: ``"open"`` until the stream ends, then how it ended (:data:`StreamOutcome`).
        error: the exception it ended with, if any.
        ttft: seconds from the start of the attempt to its first content chunk (``None``
            before it).
        chunks: content chunks received so far.
        finish_reason: the provider's finish reason, once sent.
        output_tokens: output tokens the provider reported (``None`` until a usage chunk).
    """

    guards_itself = True  # a stream reading this one (a continuation) must not time it

    __slots__ = (
        "__weakref__",
        "_batched",
        "_budget",
        "_buffer",
        "_buffered",
        "_callbacks",
        "_committed",
        "_deadline",
        "_first_at",
        "_first_item",
        "_gaps",
        "_guarded",
        "_last_at",
        "_live",
        "_now",
        "_pieces",
        "_pull_next",
        "_read",
        "_read_at",
        "_reader",
        "_resume",
        "_scope",
        "_source",
        "_started",
        "_trace",
        "_truncation",
        "_usage_item",
        "_watchdog",
        "_wrap_error",
        "attempt",
        "chunks",
        "error",
        "finish_reason",
        "first_token",
        "outcome",
        "output_tokens",
        "resumes",
        "stall",
        "target",
    )

    def __init__(
        self,
        source: AsyncIterator[T],
        *,
        reader: ChunkReader = ANY_ITEM,
        first_token: float | None = None,
        stall: float | None = None,
        deadline: float = math.inf,
        started: float | None = None,
        target: str = "",
        trace: Trace | None = None,
        attempt: int = 0,
        resume: Resume | None = None,
        raise_truncated: bool = False,
    ) -> None:
        loop = backend()
        self._reader = reader
        self._use(source)
        self._now = _clock()
        self._scope = loop.scope
        self.first_token = first_token
        self.stall = stall
        self._deadline = deadline
        self._started = loop.now() if started is None else started
        self._budget = (
            deadline - (trace.origin if trace is not None else self._started)
            if deadline != math.inf
            else math.inf
        )
        self.target = target
        self._trace = trace
        self.attempt = attempt
        self._buffer: deque[T] = deque()
        self._callbacks: list[tuple[CloseCallback, bool]] = []
        self._committed = False
        self._live = False  # committed and open: __anext__'s hot path applies
        self._first_at: float | None = None
        self._first_item: Any = None  # what summary() reads the model and id from
        self._usage_item: Any = None  # and the token counts
        self._last_at = self._started  # the last content chunk (or the start, or a resume)
        self._read_at = self._started  # when the last item was read (after an await)
        self._gaps: list[float] = []
        self._pieces: list[str] = []
        self.chunks = 0
        self.finish_reason: str | None = None
        self.output_tokens: int | None = None
        self.outcome: StreamOutcome = "open"
        self.error: BaseException | None = None
        self._resume = resume
        self._truncation = raise_truncated
        self.resumes = 0

    def _use(self, source: AsyncIterator[T]) -> None:
        """Read from ``source`` (at the start, and when a continuation goes on with the stream):
        a :class:`ChunkSource`'s items are read with its ``chunk_reader``; any other async
        iterator's with the constructor's ``reader``."""
        if isinstance(source, ChunkSource):
            self._reader = source.chunk_reader
        else:
            source = _Iterated(source)
        self._source = source
        self._read = self._reader.read
        # A continuation is itself a guarded Stream (stall, deadline): it ends itself, with
        # its attempt's outcome, and this stream must not race it with a timer of its own.
        self._guarded = source.guards_itself
        self._pull_next: Callable[[], Awaitable[T]] = source.pull
        self._watchdog: Watchdog | None = None  # made for this source at its first bounded wait
        self._wrap_error = source.wrap_error
        self._buffered: Callable[[], Any] = source.buffered
        self._batched = source.buffered_with_read

    def pull(self) -> Awaitable[T]:
        """The next chunk (what ``__anext__`` returns): a stream is a source too."""
        return self.__anext__()

    def _wrapped(self, error: Exception) -> Exception:
        wrapped = self._wrap_error(error)
        if type(wrapped) is AttemptTimeout and wrapped.status_code is None:
            # The HTTP read timeout of a stream is the silence the guards watch for, whichever
            # fires first: it means what their own limit would.
            wrapped = self._expired_error()
        if wrapped is not error:
            wrapped.__cause__ = error
        return wrapped

    def __repr__(self) -> str:
        return f"<latencykit.Stream {self.target!r} {self.outcome}, {self.chunks} chunks>"

    @property
    def trace(self) -> Trace | None:
        """The trace of the call this stream answers (``None``: none, outside a pipeline)."""
        return self._trace

    @property
    def chunk_reader(self) -> ChunkReader:  # type: ignore[override]
        """How this stream's items are read (a stream reading this one reads them the same
        way: a continuation)."""
        return self._reader

    @property
    def skipped(self) -> int:  # type: ignore[override]
        """Events the source skipped because they did not parse (the fast lane's SSE reader
        skips and counts them; through litellm a malformed event breaks the stream: ``0``)."""
        return self._source.skipped

    # --- what the stream measured -------------------------------------------------------------

    @property
    def ttft(self) -> float | None:
        """Seconds from the attempt's start to the first content chunk (``None`` before it)."""
        return None if self._first_at is None else self._first_at - self._started

    @property
    def deadline(self) -> float:
        """The call's absolute deadline on the event loop's clock (``inf``: none)."""
        return self._deadline

    @property
    def started_at(self) -> float:
        """When the answering attempt started, on the event loop's clock."""
        return self._started

    @property
    def gaps(self) -> tuple[float, ...]:
        """The gaps between consecutive content chunks' arrivals, in seconds. A chunk arrives
        when the read that brought it returns, so on the fast lane chunks of one network read
        arrive together and the consumer's own time between chunks is not in the gaps;
        through litellm, a chunk arrives when the consumer takes it from the bridge."""
        return tuple(self._gaps)

    @property
    def longest_gap(self) -> float | None:
        """The longest gap between two content chunks so far, in seconds (``None`` with fewer
        than two chunks): what a learned stall limit is learned from."""
        return max(self._gaps, default=None)

    @property
    def time_per_output_token(self) -> float | None:
        """Seconds per output token after the first content chunk, so far (the provider's
        ``output_tokens`` once reported, else content chunks); ``None`` with fewer than two."""
        tokens = self.output_tokens if self.output_tokens is not None else self.chunks
        if self._first_at is None or tokens < 2:
            return None
        return (self._last_at - self._first_at) / (tokens - 1)

    @property
    def partial_text(self) -> str:
        """The content text received so far (all of it once the stream is complete)."""
        return "".join(self._pieces)

    @property
    def elapsed(self) -> float:
        """Seconds from the attempt's start to the last content chunk (or to now, before one)."""
        return (self._last_at if self._first_at is not None else self._now()) - self._started

    def summary(self) -> Summary:
        """What the stream's chunks said about the response: the model and id (from its first
        content chunk), the finish reason and the token usage (from a usage chunk)."""
        first = _summary(self._first_item)
        usage = _summary(self._usage_item)
        return Summary(
            model=first.model,
            id=first.id,
            finish_reasons=() if self.finish_reason is None else (self.finish_reason,),
            input_tokens=usage.input_tokens,
            output_tokens=self.output_tokens,
        )

    @property
    def request_id(self) -> str | None:
        """The provider's request id of the answering attempt's answer (``None``: none known):
        also on the errors the stream raises (:attr:`~latencykit.ProviderError.request_id`)."""
        return self._source.request_id

    def timing(self) -> dict[str, Any]:
        """The stream's measurements as the fields of an :class:`~latencykit.Attempt`."""
        gaps = self._gaps
        return {
            "ttft": self.ttft,
            "chunks": self.chunks,
            "gap_p50": sorted(gaps)[len(gaps) // 2] if gaps else None,
            "gap_max": max(gaps) if gaps else None,
            "output_tokens": self.output_tokens,
        }

    # --- lifetime --------------------------------------------------------------------------------

    def on_close(self, callback: CloseCallback, *, attempt: bool = False) -> None:
        """Run ``callback(stream, outcome, error)`` once when the stream ends, however it ends.

        ``attempt=True`` scopes the callback to the attempt that is answering (an attempt
        record, a breaker permit): if a broken stream is continued by another attempt
        (``StreamGuard(on_break="continue")``), it runs at the break, with outcome ``"error"``;
        other callbacks run when the stream the consumer holds ends.

        Callbacks run in the order registered: the policies register theirs as the stream
        travels out of the pipeline, so the attempt's runs first and the call's last, as
        nested ``with`` blocks unwind. One that raises is logged and the others still run.
        Callbacks are synchronous: they may run from a garbage-collection finaliser."""
        if self.outcome != "open":
            self._run_callback(callback, self.outcome, self.error)
        else:
            self._callbacks.append((callback, attempt))

    def _run_callback(
        self, callback: CloseCallback, outcome: StreamOutcome, error: BaseException | None
    ) -> None:
        try:
            callback(self, outcome, error)
        except Exception:
            logger.exception("latencykit stream close callback %r failed", callback)

    def _tag(self, error: BaseException | None) -> None:
        """Give a provider error that ends the attempt the request id of its answer, when the
        error itself did not carry one (a cut, a stall, an error event: no headers of their
        own)."""
        if isinstance(error, ProviderError) and error.request_id is None:
            error.request_id = self._source.request_id

    def _settle(self, outcome: StreamOutcome, error: BaseException | None) -> None:
        if self.outcome != "open":
            return
        self._tag(error)
        self._live = False
        self.outcome, self.error = outcome, error
        callbacks, self._callbacks = self._callbacks, []
        for callback, _ in callbacks:
            self._run_callback(callback, outcome, error)

    def _settle_attempt(self, error: BaseException) -> None:
        """The answering attempt broke and another continues: settle the attempt's callbacks."""
        self._tag(error)
        kept: list[tuple[CloseCallback, bool]] = []
        for callback, attempt in self._callbacks:
            if attempt:
                self._run_callback(callback, "error", error)
            else:
                kept.append((callback, attempt))
        self._callbacks = kept

    async def _release(self) -> None:
        """Close the source (the HTTP response), shielded and bounded: cancellation must not
        leave a connection open, and a hung close must not hang the caller."""
        self._buffer.clear()
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        with self._scope(shield=True, deadline=self._now() + _CLOSE_GRACE):
            try:
                await self._source.aclose()
            except Exception:
                logger.debug("latencykit: closing a stream's source failed", exc_info=True)

    async def _end(self, outcome: StreamOutcome, error: BaseException | None) -> None:
        if self.outcome != "open":
            return
        try:
            await self._release()
        finally:
            self._settle(outcome, error)

    async def aclose(self) -> None:
        """Close the stream and its HTTP response now; idempotent. Closing before the end is
        not an error (outcome ``"closed"``)."""
        await self._end("closed", None)

    def __del__(self) -> None:
        if getattr(self, "outcome", "ok") != "open":
            return
        warnings.warn(
            f"latencykit stream for {self.target!r} was never closed; closing it now "
            "(use `async with` or aclose())",
            ResourceWarning,
            source=self,
            stacklevel=1,
        )
        try:
            self._source.close_nowait()
        except Exception:
            logger.debug("latencykit: closing an abandoned stream failed", exc_info=True)
        self._settle("abandoned", None)

    # --- reading ---------------------------------------------------------------------------------

    def __aiter__(self) -> Stream[T]:
        return self

    async def _take(self, limit: float) -> tuple[Any, str | None, str | None, float]:
        """The source's next item, read, and when it arrived; waiting until ``limit`` at most
        (``_Expired`` after) unless the source holds one already."""
        read = self._buffered()
        if read is not NOTHING:
            item, text, finish = read
            return item, text, finish, self._read_at if self._batched else self._arrived()
        item = await self._wait(limit)
        now = self._read_at = self._now()
        text, finish = self._read(item)
        return item, text, finish, now

    def _arrived(self) -> float:
        """An item arrived on its own (a bridge's buffer): it arrives when taken, now."""
        now = self._read_at = self._now()
        return now

    async def _wait(self, limit: float) -> T:
        """Wait for the source's next item until ``limit`` at most (``_Expired`` after)."""
        if limit == math.inf:
            return await self._pull_next()
        watchdog = self._watchdog = self._watchdog or watchdog_for(self._source.interrupter)
        if watchdog is not None:
            return await watchdog.wait(self._pull_next(), limit)
        with self._scope(deadline=limit):
            return await self._pull_next()
        raise _Expired

    def _observe(self, item: T, text: str | None, finish: str | None, now: float) -> bool:
        """Take the measurements of one item, read as ``(text, finish)``, that arrived at
        ``now``; whether it is content."""
        if finish is not None:
            self.finish_reason = finish
        if text is None:
            tokens = self._reader.output_tokens(item)
            if tokens is not None:
                self.output_tokens = tokens
                self._usage_item = item
            return False
        if self._first_at is None:
            self._first_at = now
            self._first_item = item
        else:
            self._gaps.append(now - self._last_at)
        self.chunks += 1
        if text:
            self._pieces.append(text)
        self._moved(now)
        return True

    def _moved(self, now: float) -> None:
        """Content arrived (or a continuation started) at ``now``: the stall limit counts
        from there."""
        self._last_at = self._read_at = now

    def _limit(self) -> float:
        """The next wait's limit after commit: the stall limit from the last content chunk's
        arrival, or the deadline if that is earlier. Computed when a wait needs it, not per
        chunk. The time the consumer held the stream since the last read (over chunks
        already received) is not the provider's: the limit moves by it."""
        if self._guarded:
            return math.inf
        stall = self.stall
        if stall is not None:
            limit = self._last_at + stall + (self._now() - self._read_at)
            if limit < self._deadline:
                return limit
        return self._deadline

    async def commit(self, *, within_deadline: bool = False) -> None:
        """Read until the first content chunk (kept for the consumer) or the end of the stream.

        Raises :class:`~latencykit.FirstTokenTimeout` when none arrived within ``first_token``
        seconds of the start, and what the source raised (wrapped) otherwise; the stream is
        closed before any error leaves. ``within_deadline``: also bound the wait by the
        deadline (when no enclosing deadline scope does it: a lazily started stream).
        """
        if self._committed:
            return
        limit = math.inf if self.first_token is None else self._started + self.first_token
        try:
            await self._read_to_content(min(limit, self._deadline) if within_deadline else limit)
        except BaseException as exc:
            await self._end("error" if isinstance(exc, Exception) else "cancelled", exc)
            raise
        self._committed = True
        self._live = self.outcome == "open"
        if self._first_at is not None and events.listening():
            events.emit(
                events.FirstToken(
                    self._call_id(), attempt=self.attempt, target=self.target, ttft=self.ttft or 0.0
                )
            )

    async def _read_to_content(self, limit: float) -> None:
        """Read, keeping the items for the consumer, until a content chunk or the end of the
        stream; raises what the source raised (wrapped), the expiry's error past ``limit``."""
        while True:
            try:
                item, text, finish, now = await self._take(limit)
            except StopAsyncIteration:
                self._check_complete()
                return
            except _Expired:
                break
            except Exception as exc:
                raise self._wrapped(exc)  # noqa: B904 (the cause is set when wrapped)
            self._buffer.append(item)
            if self._observe(item, text, finish, now):
                return
        raise self._expired_error()  # out of the handler (see __anext__)

    def _call_id(self) -> int:
        return 0 if self._trace is None else self._trace.call_id

    def _check_complete(self) -> None:
        if self._reader.requires_finish and self.finish_reason is None:
            end_error = self._source.end_error()
            if end_error is not None:
                raise end_error
            raise StreamBroken(
                "the stream ended without a finish_reason: the connection was cut",
                target=self.target,
                reason="cut",
            )

    async def __anext__(self) -> T:
        # The per-chunk path of a committed stream is kept short: it is paid on every chunk.
        if self._buffer or not self._live:
            return await self._next_uncommitted()
        try:
            # An item the source already holds is taken without a timer or an await.
            read = self._buffered()
            if read is not NOTHING:
                item, text, finish = read
                now = self._read_at if self._batched else self._arrived()
            else:
                limit = self._limit()
                watchdog = self._watchdog
                if watchdog is not None:
                    # The per-stream timer around the source's own awaitable, without a
                    # coroutine frame of ours (Watchdog.wait, unrolled).
                    task = watchdog.arm(limit)
                    try:
                        item = await self._pull_next()
                    except BaseException as exc:
                        watchdog.raised(task, exc)
                        raise
                    watchdog.returned(task)
                elif limit == math.inf:
                    item = await self._pull_next()
                else:
                    item = await self._wait(limit)
                now = self._read_at = self._now()
                text, finish = self._read(item)
        except StopAsyncIteration:
            return await self._ended()
        except _Expired:
            pass  # raised below, out of this handler: no context chain to keep alive
        except Exception as exc:
            return await self._broken(self._wrapped(exc))
        except BaseException as exc:
            await self._end("cancelled", exc)
            raise
        else:
            if text and finish is None and self._first_at is not None:
                # The common chunk (text, no finish, after the first): _observe's work, inline.
                self._gaps.append(now - self._last_at)
                self._last_at = now
                self.chunks += 1
                self._pieces.append(text)
            else:
                self._observe(item, text, finish, now)
            return item  # type: ignore[no-any-return]
        # The error raised in an except clause would hold the expiry, and through it the
        # cancelled read's frames (the HTTP response, its connection) until a full collection.
        return await self._broken(self._expired_error())

    async def _next_uncommitted(self) -> T:
        """The next item of a stream that is not open and committed: the chunks kept at
        commit, the end, or (a lazily started stream: guard_stream) its commit first."""
        if self._buffer:
            return self._buffer.popleft()
        if self.outcome != "open":
            raise StopAsyncIteration
        await self.commit(within_deadline=True)
        return await self.__anext__()

    async def _ended(self) -> T:
        """The source ended: the stream is complete unless it was cut. An answer stopped at
        its output cap raises :class:`~latencykit.errors.OutputTruncated` after its last
        chunk when the stream was built with ``raise_truncated``."""
        try:
            self._check_complete()
        except Exception as exc:
            return await self._broken(exc)
        await self._end("ok", None)
        if self._truncation and self.finish_reason == "length":
            raise OutputTruncated(None, self.partial_text, max_tokens=None, budget_capped=False)
        raise StopAsyncIteration

    def _expired_error(self) -> Exception:
        """What a wait past its limit (or the HTTP read timeout) means: the deadline expired,
        else the first content chunk is late (before the commit) or the stream stalled."""
        now = self._now()
        quiet = now - self._last_at
        if now >= self._deadline:
            if events.listening():
                events.emit(
                    events.DeadlineExpired(
                        self._call_id(), budget=self._budget, elapsed=now - self._started
                    )
                )
            return DeadlineExceeded(self._budget, now - self._started)
        if not self._committed:
            source = _source(self.first_token)
            if events.listening():
                events.emit(
                    events.FirstTokenMissed(
                        self._call_id(),
                        attempt=self.attempt,
                        target=self.target,
                        first_token=float(self.first_token or quiet),
                        source=source,
                    )
                )
            return FirstTokenTimeout(
                f"no content chunk within {quiet:.3g}s (first-token limit: {source})",
                target=self.target,
            )
        source = _source(self.stall)
        if events.listening():
            events.emit(
                events.StallDetected(
                    self._call_id(),
                    attempt=self.attempt,
                    target=self.target,
                    stall=float(self.stall or 0.0),  # a plain float: events are encoded
                    chunks=self.chunks,
                    source=source,
                )
            )
        return StreamStalled(
            f"no content chunk for {quiet:.3g}s after {self.chunks} chunks (stall limit: {source})",
            target=self.target,
            reason="stall",
        )

    async def _broken(self, error: Exception) -> T:
        """The stream broke after commit: continue it from another attempt if it may (a
        ``resume`` was given and the break is transient), else end it and raise ``error``
        with the partial answer attached."""
        resume = self._resume
        if resume is not None and _recoverable(error) and self.outcome == "open":
            await self._release()
            self._settle_attempt(error)
            try:
                source = await resume(self, error)
            except Exception as failed:
                # The continuation failed too: the original break is what the consumer sees.
                source = None
                error.__context__ = failed
            if source is not None:
                self.resumes += 1
                self.target, self.attempt = source.target, source.attempt
                self._use(source)
                self._moved(self._now())
                return await self.__anext__()
        _attach_partial(error, self)
        await self._end("error", error)
        raise error


def _recoverable(error: Exception) -> bool:
    return (
        is_transient(error)
        and not isinstance(error, DeadlineExceeded)
        and getattr(error, "reason", None) != "recovery_diverged"
    )


def _attach_partial(error: BaseException, stream: Stream[Any]) -> None:
    for name, value in (
        ("partial_text", stream.partial_text),
        ("finish_reason", stream.finish_reason),
        ("chunks", stream.chunks),
    ):
        try:
            setattr(error, name, value)
        except AttributeError:  # an exception type with __slots__
            return


def _clock() -> Callable[[], float]:
    """The running loop's clock (:func:`~latencykit._cancel.loop_clock`), read per chunk: on
    trio, the run's clock object's own method (``trio.current_time()`` reaches it through
    three Python calls; the same reading)."""
    now = loop_clock()
    trio = sys.modules.get("trio")
    if trio is not None and now is trio.current_time:
        return trio.lowlevel.current_clock().current_time  # type: ignore[no-any-return]
    return now


class SkipPrefix(ChunkSource):
    """A regenerated answer with the text already delivered skipped: what continues a broken
    stream on a target that cannot take an assistant prefill.

    The regeneration must repeat ``prefix`` exactly; its chunks inside the prefix are dropped,
    the one across its end is cut to what is new. If it says anything else, it raises
    :class:`~latencykit.StreamBroken` with ``reason="recovery_diverged"``: two different
    answers are never spliced.
    """

    __slots__ = ("_rest", "_stream", "attempt", "target")
    guards_itself = True  # the regenerated stream does

    def __init__(self, stream: Stream[Any], prefix: str) -> None:
        self._stream = stream
        self._rest = prefix
        self.target = stream.target
        self.attempt = stream.attempt

    @property
    def chunk_reader(self) -> ChunkReader:  # type: ignore[override]
        """The regenerated stream's reader."""
        return self._stream.chunk_reader

    async def pull(self) -> Any:
        """The regenerated stream's next chunk past the prefix."""
        read = self._stream.chunk_reader.read
        while True:
            chunk = await self._stream.__anext__()
            rest = self._rest
            if not rest:
                return chunk
            text, finish = read(chunk)
            if text is None and finish is None:
                continue  # a role-only or empty chunk: the consumer has had one
            if not text or not rest.startswith(text[: len(rest)]):
                raise StreamBroken(
                    "the regenerated answer does not repeat the text already delivered",
                    target=self.target,
                    reason="recovery_diverged",
                )
            if len(text) <= len(rest):
                self._rest = rest[len(text) :]
                continue
            self._rest = ""
            chunk.choices[0].delta.content = text[len(rest) :]
            return chunk

    async def aclose(self) -> None:
        """Close the regenerated stream."""
        await self._stream.aclose()


class LazyStream(_ClosedOnExit, Generic[T]):
    """A stream that starts on its first ``__anext__``: what a latencykit-decorated
    async-generator function returns (``async for chunk in ask(q)``), since the policies must
    run inside the consumer's iteration. It behaves as the :class:`Stream` it opens; ``stream``
    is that stream once started."""

    __slots__ = ("_closed", "_open", "stream")

    def __init__(self, open: Callable[[], Awaitable[Stream[T]]]) -> None:
        self._open = open
        self._closed = False
        self.stream: Stream[T] | None = None

    def __aiter__(self) -> LazyStream[T]:
        return self

    async def __anext__(self) -> T:
        stream = self.stream
        if stream is None:
            if self._closed:
                raise StopAsyncIteration
            stream = self.stream = await self._open()
        return await stream.__anext__()

    async def aclose(self) -> None:
        """Close the stream (before it started: it never will)."""
        self._closed = True
        if self.stream is not None:
            await self.stream.aclose()
