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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import msgspec
from cachetools import TLRUCache

from . import _validation, events
from ._cancel import backend, clock, spawn_detached
from ._context import Trace, deadline_var, trace_var
from ._litellm import LITELLM_CHUNKS, litellm
from .chunks import EmbeddingResponse, Node, Response, decode_embeddings
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

_VERSION: Literal[1] = 1  # of the key and of the stored envelope: a change makes old entries misses

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
        self.max_entries = _validation.count("MemoryStore.max_entries", max_entries)
        _validation.function("MemoryStore.clock", clock)
        # Each entry is (ttl, value); it expires ttl seconds after it was stored.
        self._entries: TLRUCache[str, tuple[float, bytes]] = TLRUCache(
            maxsize=max_entries, ttu=lambda key, entry, now: now + entry[0], timer=clock
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
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 0 and 0.0 key alike
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, Mapping):
        return _canonical_mapping(value, where, drop_none)
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]", drop_none=drop_none) for i, v in enumerate(value)]
    return _canonical_object(value, where)


def _canonical_mapping(value: Mapping[Any, Any], where: str, drop_none: bool) -> Any:
    return {
        _string_key(name, where): _canonical(item, f"{where}[{name!r}]", drop_none=drop_none)
        for name, item in value.items()
        if item is not None or not drop_none
    }


def _canonical_object(value: Any, where: str) -> Any:
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


def _string_key(name: object, where: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"ResponseCache cannot key {where}: its keys must be strings, got {name!r}")
    return name


def _normalize_messages(messages: Any) -> None:
    """Normalise, in place, the text of canonical messages (a string, or text parts)."""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            message["content"] = normalize_text(content)
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                part["text"] = normalize_text(part["text"])


def _function_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


# --- values -------------------------------------------------------------------------------


class _Entry(msgspec.Struct, frozen=True):
    """A stored answer, as the store keeps it (JSON): a response's data (``kind="response"``),
    an embedding response's (``"embeddings"``) or the JSON data a function returned, with who
    answered and whether it was degraded."""

    version: Literal[1] = msgspec.field(name="latencykit.cache")
    kind: Literal["response", "embeddings", "data"]
    target: str
    degraded: bool
    fallback_reason: str | None
    value: Any


def _entry(
    kind: Literal["response", "embeddings", "data"], value: Any, target: str, trace: Trace | None
) -> bytes:
    degraded = trace is not None and trace.degraded
    reason = None if trace is None else trace.fallback_reason
    return msgspec.json.encode(_Entry(_VERSION, kind, target, degraded, reason, value))


def _answer_kind(result: Any) -> Literal["response", "embeddings"] | None:
    """What kind of answer ``result`` is, on either lane (``None``: neither)."""
    module = sys.modules.get("litellm")  # a litellm answer implies litellm is imported
    for kind, fast_lane, name in _ANSWERS:
        if isinstance(result, (fast_lane, getattr(module, name, ()))):
            return kind
    return None


_ANSWERS: tuple[tuple[Literal["response", "embeddings"], Any, str], ...] = (
    ("response", (Response, Node), "ModelResponse"),
    ("embeddings", EmbeddingResponse, "EmbeddingResponse"),
)


def _encode(result: Any, target: str, trace: Trace | None) -> bytes:
    """``result`` (a litellm response or JSON data) as an entry; ``TypeError`` for anything
    that would not come back the same (a tuple, a non-string key, NaN, an object)."""
    if (kind := _answer_kind(result)) is not None:
        return _entry(kind, result.model_dump(mode="json"), target, trace)
    try:
        raw = _entry("data", result, target, trace)
        same = msgspec.json.decode(raw, type=_Entry).value == result
    except (TypeError, OverflowError):
        same = False
    if not same:
        raise TypeError(
            "ResponseCache stores a litellm ModelResponse or JSON data (str, int, float, bool, "
            f"None, lists, dicts with string keys); {target} returned {type(result).__name__}"
        )
    return raw


def _finish_reasons(result: Any) -> list[Any]:
    choices = getattr(result, "choices", None)
    if not isinstance(choices, (list, tuple)):
        return []
    return [getattr(choice, "finish_reason", None) for choice in choices]


def _offers_tools(call: Call) -> bool:
    arguments = {**call.target.arguments, **call.kwargs}
    return bool(arguments.get("tools") or arguments.get("functions"))


def _streamed_response(stream: Stream[Any], model: str) -> dict[str, Any]:
    """The response a complete text stream amounts to, as ``ModelResponse`` data: its text,
    finish reason, model, id and reported token usage (all a stream keeps of its chunks)."""
    summary = stream.summary()
    # The usage the stream reported (stream_options={"include_usage": True}), else zeros.
    prompt, completion = summary.input_tokens or 0, summary.output_tokens or 0
    return {
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
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


async def _replay(response: Any) -> AsyncIterator[Any]:
    """A streaming hit's source: the response as litellm stream chunks: per choice, one delta
    with all of its message (text, tool calls, reasoning), then one with its finish reason; the
    usage rides on the last."""
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
    for piece in chunks:
        yield piece


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


def _flag(name: str, value: object) -> bool:
    return _validation.instance(f"ResponseCache.{name}", value, bool, "a bool")


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
    empty, ``answering_attempt`` ``0``); a call that could be stored but was not in the store says
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
        if store is not None and max_entries is not None:
            raise ValueError(
                "ResponseCache.max_entries bounds the default in-memory store; "
                "with store=, bound the store itself"
            )
        if store is None:
            bound = 1024 if max_entries is None else max_entries
            store = MemoryStore(_validation.count("ResponseCache.max_entries", bound))
        what = "a CacheStore (async get and set)"
        self._store = _validation.instance("ResponseCache.store", store, CacheStore, what)
        self.cache_degraded = _flag("cache_degraded", cache_degraded)
        self.cache_truncated = _flag("cache_truncated", cache_truncated)
        self.normalize_whitespace = _flag("normalize_whitespace", normalize_whitespace)
        self._key = _validation.function("ResponseCache.key", key)
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
            request.update(model=target.model, api_base=target.api_base)
        else:
            request["fn"] = _function_name(call.fn)
        if self._key is not None:
            request["key"] = _canonical(self._key(*call.args, **call.kwargs), "key(...)")
        else:
            request["args"] = _canonical(call.args, "the arguments")
            request["kwargs"] = (
                self._llm_arguments(call)
                if target.model
                else _canonical(dict(call.kwargs), "the argument")
            )
        text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def _llm_arguments(self, call: Call) -> Any:
        """The arguments of an LLM call that can change its answer, canonical."""
        arguments = {
            name: value
            for name, value in {**call.target.arguments, **call.kwargs}.items()
            if name not in IGNORED_ARGUMENTS and value is not None
        }
        if arguments.get("n") == 1:
            del arguments["n"]
        canonical = _canonical(arguments, "the argument", drop_none=True)
        if self.normalize_whitespace:
            _normalize_messages(canonical.get("messages"))
        return canonical

    # --- the policy ---------------------------------------------------------------------------

    async def handle(self, call: Call, next: Next) -> Any:
        """Answer ``call`` from the store, or run it and store its answer when it may be."""
        if not self.applies_to(call):
            return await next(call)
        key = self.key_for(call)
        trace = trace_var.get()
        entry = await self._lookup(key, call.target.key, trace)
        if entry is not None:
            return await self._answer(entry, call, trace)
        if trace is not None:
            trace.cache = "miss"
        result = await next(call)
        if not isinstance(result, Stream):
            await self._keep(key, result, call, trace)
        elif call.target.model:
            degraded = trace is not None and trace.degraded
            result.on_close(functools.partial(self._stream_ended, key, call, trace, degraded))
        return result

    async def _keep(self, key: str, result: Any, call: Call, trace: Trace | None) -> None:
        """Store ``result`` if it may be, and report it."""
        answered = call.target.key if trace is None or trace.answered is None else trace.answered[1]
        reason = self._refused(trace is not None and trace.degraded, _finish_reasons(result))
        if reason is not None:
            self._report_stored(trace, answered, reason)
            return
        value = _encode(result, answered, trace)
        await self._write(key, value, trace, answered, deadline_var.get())

    def _failed(self, what: str, exc_info: bool = False) -> None:
        """A store failed (or an entry is unreadable): counted and logged, never raised."""
        self._errors += 1
        logger.warning("latencykit: ResponseCache %s", what, exc_info=exc_info)

    async def _bounded(
        self, what: Literal["get", "set"], operation: Awaitable[Any], deadline: float
    ) -> tuple[bool, Any]:
        """Whether the store's ``operation`` succeeded within ``store_timeout`` and
        ``deadline``, and what it returned. A write is shielded (the answer is in hand: the
        call's cancellation must not lose it); a lookup is not (the call's deadline bounds it)."""
        loop = backend()
        limit = min(loop.now() + self.store_timeout, deadline)
        with loop.scope(shield=what == "set", deadline=limit):
            try:
                return True, await operation
            except Exception:
                self._failed(f"store {what} failed", exc_info=True)
                return False, None
        self._failed(f"store {what} took over {self.store_timeout:g}s: a miss, or not stored")
        return False, None

    async def _get(self, key: str) -> _Entry | None:
        raw = await self._store.get(key)
        return None if raw is None else msgspec.json.decode(raw, type=_Entry)

    async def _lookup(self, key: str, target: str, trace: Trace | None) -> _Entry | None:
        """The entry stored for ``key`` (counted as a hit), or ``None`` (a miss: absent, or
        the store failed, or the entry is unreadable)."""
        entry: _Entry | None = (await self._bounded("get", self._get(key), math.inf))[1]
        self._hits += entry is not None
        self._misses += entry is None
        if events.listening():
            call_id = 0 if trace is None else trace.call_id
            hit, rate = entry is not None, self.hit_rate
            events.emit(CacheLookup(call_id, target=target, hit=hit, hit_rate=rate))
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
        embeddings = entry.kind == "embeddings"
        if call.stream is None or embeddings:  # the lane's type, as a miss would answer
            answer: Any
            if call.target.transport == "openai":  # the fast lane's (its general form)
                answer = (
                    decode_embeddings(msgspec.json.encode(entry.value))
                    if embeddings
                    else Node(entry.value)
                )
                answer._hidden_params = {}
            else:
                made = litellm().EmbeddingResponse if embeddings else litellm().ModelResponse
                answer = made(**entry.value)
            # What LLM reads for report(): no attempt answered, this target did.
            answer._hidden_params["latencykit.attempt"] = (0, entry.target)
            return answer
        stream: Stream[Any] = Stream(
            _replay(litellm().ModelResponse(**entry.value)),
            reader=LITELLM_CHUNKS,
            deadline=deadline_var.get(),
            target=entry.target,
            trace=trace,
            attempt=0,
        )
        await stream.commit()
        return stream

    def _refused(self, degraded: bool, finish_reasons: list[Any]) -> SkipReason | None:
        """Why an answer is not stored (``None``: it is)."""
        if None in finish_reasons:
            return "incomplete"
        if degraded and not self.cache_degraded:
            return "degraded"
        if not self.cache_truncated and not _TRUNCATED.isdisjoint(finish_reasons):
            return "truncated"
        return None

    async def _write(
        self, key: str, value: bytes, trace: Trace | None, target: str, deadline: float = math.inf
    ) -> None:
        """Store ``value`` (bounded by ``store_timeout`` and ``deadline``) and report it."""
        stored, _ = await self._bounded("set", self._store.set(key, value, self.ttl), deadline)
        self._stored += stored
        self._report_stored(trace, target, None if stored else "store_error")

    def _stream_ended(
        self,
        key: str,
        call: Call,
        trace: Trace | None,
        degraded: bool,
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        """A streamed miss ended: store its answer if it is complete and may be stored."""
        if outcome == "error":
            return  # errors are never cached, and not worth an event
        finish = stream.finish_reason if outcome == "ok" else None
        reason = self._refused(degraded, [finish])
        if reason is None and (finish in _TOOL_CALLS or _offers_tools(call)):
            # A stream keeps the text it delivered, not tool-call deltas: an answer that may
            # have called tools cannot be rebuilt from it.
            reason = "tool_calls"
        target = stream.target
        if reason is None:
            response = _streamed_response(stream, call.target.model)
            value = _entry("response", response, target, trace)
            set_nowait = getattr(self._store, "set_nowait", None)
            if set_nowait is None:  # close callbacks are synchronous: write in a task
                spawn_detached(functools.partial(self._write, key, value, trace, target))
                return
            try:
                set_nowait(key, value, self.ttl)
                self._stored += 1
            except Exception:
                self._failed("store set failed", exc_info=True)
                reason = "store_error"
        self._report_stored(trace, target, reason)

    def _report_stored(self, trace: Trace | None, target: str, reason: SkipReason | None) -> None:
        if events.listening():
            call_id = 0 if trace is None else trace.call_id
            events.emit(CacheStored(call_id, target=target, stored=reason is None, reason=reason))
