"""``ResponseCache``: an exact-match cache of answers, keyed by the normalised request.

A policy at ``Stage.CACHE``: inside the deadline (which bounds a slow shared store's lookup),
outside the fallback (so that it sees whether the answer was degraded). A hit answers without
any attempt; a miss goes on through the pipeline and its answer is stored when it may be:

* the **key** is a SHA-256 of canonical JSON: the target (key, model, endpoint), the messages
  with their text whitespace-normalised, and every argument that can change the answer (all
  but a known few such as ``user``, ``metadata`` and ``extra_headers``). Dict order, ``0`` vs
  ``0.0`` and the JSON formatting of the request make no difference;
* the **value** is serialised (the ``ModelResponse``'s JSON, in a small versioned envelope), so
  every hit is a fresh object and the same bytes can live in a shared store;
* **never stored**: errors, truncated answers (``finish_reason`` ``"length"`` or
  ``"content_filter"``) unless ``cache_truncated``, degraded answers unless ``cache_degraded``,
  and a streamed answer that may call tools (a :class:`~latencykit.Stream` keeps the text it
  delivered, not the tool-call deltas);
* a **stream** is stored when it ends complete; a streaming hit replays the answer as a
  :class:`~latencykit.Stream` of litellm chunk objects. A streaming and a non-streaming call of
  the same request share the entry.

The store is pluggable (:class:`CacheStore`, async); the default :class:`MemoryStore` is an LRU
map bounded by ``max_entries`` whose entries expire on the event loop's clock.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from cachetools import TLRUCache

from . import _validation, events
from ._cancel import backend, clock, spawn_detached
from ._context import Trace, deadline_var, trace_var
from ._litellm import LITELLM_CHUNKS, litellm
from .events import CacheLookup, CacheStored, SkipReason
from .pipeline import Call, Next, PolicyDecorator, Stage
from .stream import Stream, StreamOutcome

__all__ = [
    "CacheLookup",
    "CacheStats",
    "CacheStore",
    "CacheStored",
    "IGNORED_ARGUMENTS",
    "MemoryStore",
    "ResponseCache",
    "normalize_text",
]

logger = logging.getLogger("latencykit")

_VERSION = 1  # of the key and of the stored envelope: a change makes old entries misses

# litellm arguments that do not change the answer: left out of the key.
IGNORED_ARGUMENTS = frozenset(
    {
        "user",
        "metadata",
        "litellm_metadata",
        "tags",
        "stream",
        "stream_options",
        "extra_headers",
        "headers",
        "timeout",
        "request_timeout",
        "max_retries",
        "num_retries",
        "api_key",
    }
)
"""litellm arguments left out of a key: they do not change the answer (credentials, tracing,
headers, how the answer is delivered). Every other argument, known or not, is keyed."""
_TRUNCATED = frozenset({"length", "content_filter"})
_TOOL_CALLS = frozenset({"tool_calls", "function_call"})


# --- stores -------------------------------------------------------------------------------


@runtime_checkable
class CacheStore(Protocol):
    """Where a :class:`ResponseCache` keeps its entries: an async map of ``str`` to ``bytes``.

    Both methods may be slow (a network store): the cache bounds each call by its
    ``store_timeout`` and by the call's deadline. An exception (or a timeout) counts as a miss
    on ``get`` and as not stored on ``set``: it is logged and counted in
    :attr:`CacheStats.errors`, and the call goes on.

    A store may also offer ``set_nowait(key, value, ttl)``, a synchronous write: the cache
    uses it when a stream ends (close callbacks are synchronous); without it, that write runs
    in a task of its own.
    """

    async def get(self, key: str) -> bytes | None:
        """The value stored for ``key``, or ``None`` (absent or expired)."""
        ...

    async def set(self, key: str, value: bytes, ttl: float | None) -> None:
        """Store ``value`` for ``key``, for ``ttl`` seconds (``None``: until evicted)."""
        ...


class MemoryStore:
    """The default :class:`CacheStore`: in this process, least recently used first out.

    Args:
        max_entries: the most entries kept; storing one more evicts the least recently used
            (default ``1024``).
        clock: what TTLs are measured on (default: the event loop's clock, as every latencykit
            duration; tests may pass a fake).

    A ``cachetools.TLRUCache`` (an LRU whose entries each have their own expiry) on that clock.
    Values are the stored ``bytes`` themselves (immutable, so never copied). Not thread-safe:
    use it from one event loop.
    """

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int = 1024, *, clock: Callable[[], float] = clock) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"MemoryStore.max_entries must be an int >= 1, got {max_entries!r}")
        if not callable(clock):
            raise TypeError(f"MemoryStore.clock must be a function, got {clock!r}")
        self.max_entries = max_entries
        # Each entry is (ttl, value); it expires ttl seconds after it was stored.
        self._entries: TLRUCache[str, tuple[float, bytes]] = TLRUCache(
            maxsize=max_entries, ttu=_expiry, timer=clock
        )

    def __repr__(self) -> str:
        return f"MemoryStore({len(self)}/{self.max_entries} entries)"

    def __len__(self) -> int:
        self._entries.expire()
        return len(self._entries)

    def get_nowait(self, key: str) -> bytes | None:
        """:meth:`get`, synchronously."""
        found = self._entries.get(key)
        return None if found is None else found[1]

    def set_nowait(self, key: str, value: bytes, ttl: float | None) -> None:
        """:meth:`set`, synchronously."""
        self._entries[key] = (math.inf if ttl is None else ttl, value)

    async def get(self, key: str) -> bytes | None:
        """The value stored for ``key``, or ``None`` (absent or expired)."""
        return self.get_nowait(key)

    async def set(self, key: str, value: bytes, ttl: float | None) -> None:
        """Store ``value`` for ``key`` for ``ttl`` seconds (``None``: until evicted)."""
        self.set_nowait(key, value, ttl)

    def clear(self) -> None:
        """Remove every entry."""
        self._entries.clear()


def _expiry(key: str, entry: tuple[float, bytes], now: float) -> float:
    return now + entry[0]


# --- keys ---------------------------------------------------------------------------------

_NEWLINES = re.compile(r"\r\n?")
_TRAILING = re.compile(r"[^\S\n]+(?=\n|$)")
_INNER_RUN = re.compile(r"(?<=\S)[^\S\n]+(?=\S)")
_BLANK_RUN = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """``text`` as the cache keys it with ``normalize_whitespace=True``: CRLF and CR become
    LF; whitespace at the end of each line goes; a run of spaces and tabs between two words
    becomes one space (indentation at the start of a line is kept); runs of blank lines
    become one blank line; and the whole text is stripped."""
    text = _NEWLINES.sub("\n", text)
    text = _TRAILING.sub("", text)
    text = _INNER_RUN.sub(" ", text)
    text = _BLANK_RUN.sub("\n\n", text)
    return text.strip()


def _canonical(value: Any, where: str, *, drop_none: bool = False) -> Any:
    """``value`` as deterministic JSON data, or ``TypeError`` naming ``where``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value  # 0 and 0.0 key alike
    if isinstance(value, Mapping):
        result = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise TypeError(
                    f"ResponseCache cannot key {where}: its keys must be strings, got {name!r}"
                )
            if item is None and drop_none:
                continue
            result[name] = _canonical(item, f"{where}[{name!r}]", drop_none=drop_none)
        return result
    if isinstance(value, (list, tuple)):
        return [
            _canonical(item, f"{where}[{index}]", drop_none=drop_none)
            for index, item in enumerate(value)
        ]
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        # A pydantic model class (response_format=MyModel): keyed by the schema it asks for.
        return {"$schema": _canonical(value.model_json_schema(), where)}
    if hasattr(value, "model_dump"):  # a pydantic object (litellm's Message, a tool)
        return _canonical(value.model_dump(mode="json"), where, drop_none=True)
    raise TypeError(
        f"ResponseCache cannot key {where} of type {type(value).__name__}: only JSON data "
        "(str, int, float, bool, None, lists and dicts with string keys) and pydantic objects "
        "are keyed; pass ResponseCache(key=...) to key such calls yourself"
    )


def _normalize_messages(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = normalize_text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part["text"] = normalize_text(part["text"])
    return messages


def _function_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


# --- values -------------------------------------------------------------------------------


class _Entry(NamedTuple):
    """What a hit answers with: a response (``kind="response"``) or JSON data."""

    kind: Literal["response", "data"]
    value: Any
    target: str
    degraded: bool
    fallback_reason: str | None


def _is_response(result: Any) -> bool:
    module = sys.modules.get("litellm")  # a litellm response implies litellm is imported
    return module is not None and isinstance(result, module.ModelResponse)


def _is_json_data(value: Any) -> bool:
    """Whether ``value`` round-trips through JSON unchanged (no tuple, no non-str key...)."""
    if value is None or isinstance(value, (bool, str, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json_data(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_data(v) for k, v in value.items())
    return False


def _encode(kind: str, value: Any, target: str, trace: Trace | None) -> bytes:
    envelope = {
        "latencykit.cache": _VERSION,
        "kind": kind,
        "target": target,
        "degraded": bool(trace is not None and trace.degraded),
        "fallback_reason": None if trace is None else trace.fallback_reason,
        "value": value,
    }
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode()


def _decode(raw: bytes) -> _Entry:
    envelope = json.loads(raw)
    if envelope.get("latencykit.cache") != _VERSION:
        raise ValueError(f"unknown cache entry version {envelope.get('latencykit.cache')!r}")
    kind = envelope["kind"]
    if kind not in ("response", "data"):
        raise ValueError(f"unknown cache entry kind {kind!r}")
    return _Entry(
        kind,
        envelope["value"],
        str(envelope["target"]),
        bool(envelope["degraded"]),
        envelope["fallback_reason"],
    )


def _finish_reasons(result: Any) -> list[Any]:
    choices = getattr(result, "choices", None)
    if not isinstance(choices, (list, tuple)):
        return []
    return [getattr(choice, "finish_reason", None) for choice in choices]


def _streamed_response(stream: Stream[Any], model: str) -> dict[str, Any]:
    """The response a complete text stream amounts to, as ``ModelResponse`` data: its text,
    finish reason, model, id and reported token usage (all a stream keeps of its chunks)."""
    summary = stream.summary()
    response: dict[str, Any] = {
        "id": summary.id or "",
        "created": int(time.time()),
        "model": summary.model or model,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": stream.finish_reason,
                "message": {"role": "assistant", "content": stream.partial_text},
            }
        ],
    }
    # The usage the stream reported (stream_options={"include_usage": True}), else zeros.
    prompt, completion = summary.input_tokens or 0, summary.output_tokens or 0
    response["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return response


def _replay_chunks(response: Any) -> list[Any]:
    """A response as litellm stream chunks: per choice, one delta with all of its message (text,
    tool calls, reasoning), then one with its finish reason; the usage rides on the last."""
    module = litellm()
    from litellm.types.utils import Delta, StreamingChoices

    def chunk(choice: Any, **fields: Any) -> Any:
        return module.ModelResponseStream(
            id=response.id,
            created=response.created,
            model=response.model,
            choices=[StreamingChoices(index=choice.index, **fields)],
        )

    chunks = []
    for choice in response.choices:
        message = choice.message
        delta: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            delta["tool_calls"] = [
                {**call.model_dump(mode="json"), "index": index}
                for index, call in enumerate(message.tool_calls)
            ]
        reasoning = getattr(message, "reasoning_content", None)
        if reasoning:
            delta["reasoning_content"] = reasoning
        chunks.append(chunk(choice, delta=Delta(**delta), finish_reason=None))
    for choice in response.choices:
        chunks.append(chunk(choice, delta=Delta(), finish_reason=choice.finish_reason))
    usage = getattr(response, "usage", None)
    if chunks and usage is not None:
        chunks[-1].usage = usage
    return chunks


class _StreamedMiss(NamedTuple):
    """What the end of a streamed miss needs to store its answer."""

    key: str
    trace: Trace | None
    degraded: bool
    model: str
    offers_tools: bool


class _Replay:
    """An async iterator over a list of chunks (a streaming hit's source)."""

    __slots__ = ("_chunks",)

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = iter(chunks)

    def __aiter__(self) -> _Replay:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None


# --- the policy ---------------------------------------------------------------------------


class CacheStats(NamedTuple):
    """A :class:`ResponseCache`'s counters, from :meth:`ResponseCache.stats`.

    Attributes:
        hits: lookups the cache answered.
        misses: lookups it did not (the call went on).
        stored: answers written to the store.
        errors: store failures and timeouts, and unreadable entries (each logged).
    """

    hits: int
    misses: int
    stored: int
    errors: int

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, ``0.0`` before any lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class ResponseCache(PolicyDecorator):
    """An exact-match cache of answers: a policy for ``lk.LLM(cache=...)`` and
    :func:`~latencykit.compose`, and a decorator of any async function.

    Args:
        ttl: seconds (or ``timedelta``) an entry is served (default ``300.0``; ``None``: until
            evicted).
        max_entries: the bound of the default in-memory store (default ``None``: ``1024``);
            refused with ``store=``, which bounds itself.
        store: where entries live (default ``None``: a :class:`MemoryStore` of
            ``max_entries``); any :class:`CacheStore`, e.g. a shared Redis one.
        cache_degraded: also store answers of the degraded path (``lk.Degrade``, a fallback);
            a hit of one reports ``degraded=True`` (default ``False``).
        cache_truncated: also store answers cut short (``finish_reason`` ``"length"`` or
            ``"content_filter"``) (default ``False``).
        normalize_whitespace: key message text by :func:`normalize_text` (default ``True``);
            ``False`` keys it exactly.
        key: ``key(*args, **kwargs) -> JSON data`` identifying a call in place of its
            arguments, for arguments the cache cannot key itself (default ``None``: the
            arguments). The target is always part of the key.
        store_timeout: seconds a store's ``get`` or ``set`` may take before the cache gives up
            on it (a miss, or not stored), within the call's deadline (default ``1.0``).

    A hit makes no attempt: :func:`~latencykit.report` says ``cache="hit"`` (``attempts``
    empty, ``answered_by`` ``0``); a call that could be stored but was not in the store says
    ``"miss"``. Calls the cache never stores pass it by (``cache=None``): requests for
    several choices (``n > 1``), and streams of a decorated async-generator function (their
    items are opaque). Keys, values and what is never stored are described in the module
    documentation and ``docs/cache.md``. Identical calls that miss at the same time each make
    their own request (no coalescing).

    Raises:
        ValueError, TypeError: an invalid option, naming it (``ResponseCache.ttl must be
            ...``).
    """

    stage = Stage.CACHE
    __slots__ = (
        "_errors",
        "_hits",
        "_key",
        "_misses",
        "_store",
        "_stored",
        "cache_degraded",
        "cache_truncated",
        "normalize_whitespace",
        "store_timeout",
        "ttl",
    )

    def __init__(
        self,
        *,
        ttl: float | datetime.timedelta | None = 300.0,
        max_entries: int | None = None,
        store: CacheStore | None = None,
        cache_degraded: bool = False,
        cache_truncated: bool = False,
        normalize_whitespace: bool = True,
        key: Callable[..., Any] | None = None,
        store_timeout: float | datetime.timedelta = 1.0,
    ) -> None:
        self.ttl = None if ttl is None else _validation.seconds("ResponseCache.ttl", ttl)
        if store is None:
            if max_entries is not None and (
                isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1
            ):
                raise ValueError(
                    f"ResponseCache.max_entries must be an int >= 1, got {max_entries!r}"
                )
            store = MemoryStore(1024 if max_entries is None else max_entries)
        elif max_entries is not None:
            raise ValueError(
                "ResponseCache.max_entries bounds the default in-memory store; "
                "with store=, bound the store itself"
            )
        elif not isinstance(store, CacheStore):
            raise TypeError(
                f"ResponseCache.store must be a CacheStore (async get and set), got {store!r}"
            )
        for name, flag in (
            ("cache_degraded", cache_degraded),
            ("cache_truncated", cache_truncated),
            ("normalize_whitespace", normalize_whitespace),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"ResponseCache.{name} must be a bool, got {flag!r}")
        if key is not None and not callable(key):
            raise TypeError(f"ResponseCache.key must be a function, got {key!r}")
        self._store = store
        self.cache_degraded = cache_degraded
        self.cache_truncated = cache_truncated
        self.normalize_whitespace = normalize_whitespace
        self._key = key
        self.store_timeout = _validation.seconds("ResponseCache.store_timeout", store_timeout)
        self._hits = self._misses = self._stored = self._errors = 0

    def __repr__(self) -> str:
        return f"ResponseCache(ttl={self.ttl}, store={self._store!r})"

    @property
    def store(self) -> CacheStore:
        """Where the entries live."""
        return self._store

    @property
    def hits(self) -> int:
        """Lookups the cache answered."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups it did not answer."""
        return self._misses

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``, ``0.0`` before any lookup."""
        return self.stats().hit_rate

    def stats(self) -> CacheStats:
        """The cache's counters, now."""
        return CacheStats(self._hits, self._misses, self._stored, self._errors)

    # --- keys -------------------------------------------------------------------------------

    def applies_to(self, call: Call) -> bool:
        """Whether ``call`` goes through the cache: not a request for several choices
        (``n > 1``), nor a stream of a function target (its items are opaque)."""
        if not call.target.model:
            return call.stream is None
        n = call.kwargs.get("n")
        return n is None or n == 1

    def key_for(self, call: Call) -> str:
        """The cache key of ``call``: the SHA-256 hex digest of its canonical JSON.

        Raises:
            TypeError: an argument is not JSON data nor a pydantic object (pass ``key=``).
        """
        target = call.target
        request: dict[str, Any] = {"v": _VERSION, "target": target.key}
        if target.model:
            request["model"] = target.model
            request["api_base"] = target.api_base
        else:
            request["fn"] = _function_name(call.fn)
        if self._key is not None:
            request["key"] = _canonical(self._key(*call.args, **call.kwargs), "key(...)")
        elif target.model:
            arguments = {
                name: value
                for name, value in {**target.arguments, **call.kwargs}.items()
                if name not in IGNORED_ARGUMENTS and value is not None
            }
            if arguments.get("n") == 1:
                del arguments["n"]
            request["args"] = _canonical(call.args, "the arguments")
            request["kwargs"] = canonical = _canonical(arguments, "the argument", drop_none=True)
            if self.normalize_whitespace:
                _normalize_messages(canonical.get("messages"))
        else:
            request["args"] = _canonical(call.args, "the arguments")
            request["kwargs"] = _canonical(dict(call.kwargs), "the argument")
        text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    # --- the policy ---------------------------------------------------------------------------

    async def handle(self, call: Call, next: Next) -> Any:
        """Answer ``call`` from the store, or run it and store its answer when it may be."""
        if not self.applies_to(call):
            return await next(call)
        key = self.key_for(call)
        trace = trace_var.get()
        entry = await self._lookup(key)
        if events.listening():
            lookups = self._hits + self._misses
            events.emit(
                CacheLookup(
                    0 if trace is None else trace.call_id,
                    target=call.target.key,
                    hit=entry is not None,
                    hit_rate=self._hits / lookups,
                )
            )
        if entry is not None:
            return await self._answer(entry, call, trace)
        if trace is not None:
            trace.cache = "miss"
        result = await next(call)
        if isinstance(result, Stream):
            if call.target.model:
                arguments = {**call.target.arguments, **call.kwargs}
                miss = _StreamedMiss(
                    key,
                    trace,
                    degraded=trace is not None and trace.degraded,
                    model=call.target.model,
                    offers_tools=bool(arguments.get("tools") or arguments.get("functions")),
                )
                result.on_close(functools.partial(self._stream_ended, miss))
            return result
        answered = call.target.key if trace is None or trace.answered is None else trace.answered[1]
        reason = self._not_storable(result, trace)
        if reason is None:
            if _is_response(result):
                value = _encode("response", result.model_dump(mode="json"), answered, trace)
            elif _is_json_data(result):
                value = _encode("data", result, answered, trace)
            else:
                raise TypeError(
                    "ResponseCache stores a litellm ModelResponse or JSON data (str, int, "
                    "float, bool, None, lists, dicts with string keys); "
                    f"{call.target.key} returned {type(result).__name__}"
                )
            deadline = deadline_var.get()
            reason = None if await self._write(key, value, deadline) else "store_error"
        self._report_stored(trace, answered, reason)
        return result

    async def _lookup(self, key: str) -> _Entry | None:
        """The entry stored for ``key`` (counted as a hit), or ``None`` (a miss)."""
        loop = backend()
        raw: bytes | None = None
        with loop.scope(deadline=loop.now() + self.store_timeout) as scope:
            try:
                raw = await self._store.get(key)
            except Exception:
                self._errors += 1
                logger.warning("latencykit: ResponseCache store get failed", exc_info=True)
        if scope.cancelled_caught:
            self._errors += 1
            logger.warning(
                "latencykit: ResponseCache store get took over %gs: a miss", self.store_timeout
            )
        entry = None
        if raw is not None:
            try:
                entry = _decode(raw)
            except Exception:
                self._errors += 1
                logger.warning("latencykit: unreadable ResponseCache entry: a miss", exc_info=True)
        if entry is None:
            self._misses += 1
        else:
            self._hits += 1
        return entry

    async def _answer(self, entry: _Entry, call: Call, trace: Trace | None) -> Any:
        """A hit: a fresh answer from ``entry`` (a replayed stream for a streaming call)."""
        if trace is not None:
            trace.cache = "hit"
            trace.answered = (0, entry.target)
            trace.degraded = entry.degraded
            trace.fallback_reason = entry.fallback_reason
        if entry.kind == "data":
            return entry.value
        response = litellm().ModelResponse(**entry.value)
        if call.stream is None:
            # What LLM.acompletion reads for report(): no attempt answered, this target did.
            response._hidden_params["latencykit.attempt"] = (0, entry.target)
            return response
        stream: Stream[Any] = Stream(
            _Replay(_replay_chunks(response)),
            reader=LITELLM_CHUNKS,
            deadline=deadline_var.get(),
            target=entry.target,
            trace=trace,
            attempt=0,
        )
        await stream.commit()
        return stream

    def _not_storable(self, result: Any, trace: Trace | None) -> SkipReason | None:
        if trace is not None and trace.degraded and not self.cache_degraded:
            return "degraded"
        reasons = _finish_reasons(result)
        if any(reason is None for reason in reasons):
            return "incomplete"
        if not self.cache_truncated and any(reason in _TRUNCATED for reason in reasons):
            return "truncated"
        return None

    async def _write(self, key: str, value: bytes, deadline: float = math.inf) -> bool:
        """Store ``value``, shielded (the answer is in hand: the call's cancellation must not
        lose it) but bounded by ``store_timeout`` and ``deadline``; whether it was."""
        loop = backend()
        limit = min(loop.now() + self.store_timeout, deadline)
        with loop.scope(shield=True, deadline=limit) as scope:
            try:
                await self._store.set(key, value, self.ttl)
            except Exception:
                self._errors += 1
                logger.warning("latencykit: ResponseCache store set failed", exc_info=True)
                return False
        if scope.cancelled_caught:
            self._errors += 1
            logger.warning("latencykit: ResponseCache store set did not finish in time: not stored")
            return False
        self._stored += 1
        return True

    def _stream_ended(
        self,
        miss: _StreamedMiss,
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        """A streamed miss ended: store its answer if it is complete and may be stored."""
        if outcome == "error":
            return  # errors are never cached, and not worth an event
        trace = miss.trace
        reason: SkipReason | None = None
        finish = stream.finish_reason
        if outcome != "ok" or finish is None:
            reason = "incomplete"
        elif miss.degraded and not self.cache_degraded:
            reason = "degraded"
        elif finish in _TRUNCATED and not self.cache_truncated:
            reason = "truncated"
        elif miss.offers_tools or finish in _TOOL_CALLS:
            # A stream keeps the text it delivered, not tool-call deltas: an answer that may
            # have called tools cannot be rebuilt from it.
            reason = "tool_calls"
        if reason is not None:
            self._report_stored(trace, stream.target, reason)
            return
        response = _streamed_response(stream, miss.model)
        value = _encode("response", response, stream.target, trace)
        set_nowait = getattr(self._store, "set_nowait", None)
        if set_nowait is None:
            write = functools.partial(self._write_later, miss.key, value, trace, stream.target)
            spawn_detached(write)
            return
        try:
            set_nowait(miss.key, value, self.ttl)
        except Exception:
            self._errors += 1
            logger.warning("latencykit: ResponseCache store set failed", exc_info=True)
            reason = "store_error"
        else:
            self._stored += 1
        self._report_stored(trace, stream.target, reason)

    async def _write_later(self, key: str, value: bytes, trace: Trace | None, target: str) -> None:
        stored = await self._write(key, value)
        self._report_stored(trace, target, None if stored else "store_error")

    def _report_stored(self, trace: Trace | None, target: str, reason: SkipReason | None) -> None:
        if events.listening():
            events.emit(
                CacheStored(
                    0 if trace is None else trace.call_id,
                    target=target,
                    stored=reason is None,
                    reason=reason,
                )
            )
