"""Connection slots: the queue in front of each lane's connection pool, where latencykit sees it.

Each lane sends its requests through a pool of connections per host: litellm's (aiohttp, at
most ``AIOHTTP_CONNECTOR_LIMIT_PER_HOST`` connections, default 500) and the fast lane's (httpx).
A request beyond the pool's size waits inside the client library, where nothing measures it:
with 1,000 concurrent calls through the litellm lane, 500 waited in litellm's pool for up to
30 s, and the wait counted as the provider's latency.

So each pool has a gate here, on the caller's side (on trio too, where the litellm lane runs in
the asyncio bridge): one per event loop, lane and host, sized to match the pool under it. An
attempt takes a slot before its request and holds it until its response is done (a response:
its body read; a stream: closed, however it ends); beyond the size, attempts wait here, first
come first served, cancellable by the call's deadline. The wait is not the provider's latency:
an attempt starts once it has its slot (its duration, time to first chunk and the latency
windows the hedge reads leave the wait out, and so does the time a breaker judges the provider
by), and the wait is recorded apart (:attr:`~latencykit.Attempt.queued` and
:class:`~latencykit.events.AttemptStarted`, which telemetry reads,
:meth:`~latencykit.stats.Recorder.connection_wait`); :func:`waiting` counts the attempts waiting
now. A deadline that ends a wait says so (:class:`~latencykit.DeadlineExceeded`'s
``queued_for``): no request was sent.

The size, per host and lane, is litellm's: its environment variable
``AIOHTTP_CONNECTOR_LIMIT_PER_HOST`` (default ``500``; ``0``: no limit), read by litellm when it
is imported and here when a lane's first gate is built; the fast lane's httpx client keeps as
many connections alive.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from ._cancel import loop_key, now, threadsafe_caller
from ._context import deadline_var, queued_total_var, queued_var, trace_var
from .pipeline import Call, Next, Stage
from .stream import Stream, StreamOutcome

if TYPE_CHECKING:
    from .stats import Recorder
    from .target import Target

__all__ = [
    "PER_HOST_VARIABLE",
    "ConnectionSlots",
    "host_of",
    "per_host",
    "waiting",
]

PER_HOST_VARIABLE = "AIOHTTP_CONNECTOR_LIMIT_PER_HOST"
"""litellm's environment variable for its connections per host, which both lanes follow."""
DEFAULT_PER_HOST = 500
"""litellm's default for it (``litellm.constants``)."""


def per_host(lane: str) -> int | None:
    """The slots per host of ``lane`` (``"litellm"`` or ``"openai"``; ``None``: no limit): the
    fast lane reads ``AIOHTTP_CONNECTOR_LIMIT_PER_HOST`` from the environment (default
    ``500``), the litellm lane takes the value litellm read at its import (capped by its total,
    ``AIOHTTP_CONNECTOR_LIMIT``)."""
    limits: tuple[int, ...] = (int(os.environ.get(PER_HOST_VARIABLE, DEFAULT_PER_HOST)),)
    if lane == "litellm" and (constants := sys.modules.get("litellm.constants")) is not None:
        limits = (constants.AIOHTTP_CONNECTOR_LIMIT_PER_HOST, constants.AIOHTTP_CONNECTOR_LIMIT)
    return min((limit for limit in limits if limit > 0), default=None)


class _Gate:
    """The slots of one pool (an event loop's, for one lane and host)."""

    __slots__ = ("__weakref__", "host", "lane", "semaphore")

    def __init__(self, lane: str, host: str, size: int) -> None:
        self.lane, self.host = lane, host
        self.semaphore = anyio.Semaphore(size, fast_acquire=True)

    def stream_ended(
        self,
        soon: Callable[[Callable[[], object]], object],
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        """A stream holding a slot ended: give the slot back (``soon``: on its loop, from a
        garbage-collection finaliser, which may run in any thread at any allocation)."""
        if outcome != "abandoned":
            self.semaphore.release()
            return
        with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting any more
            soon(self.semaphore.release)


# Each event loop's gates: by (lane, model, api_base), and by (lane, host), which they share.
_gates: weakref.WeakKeyDictionary[object, dict[tuple[str, ...], _Gate | None]] = (
    weakref.WeakKeyDictionary()
)
_last: tuple[weakref.ref[object], dict[tuple[str, ...], _Gate | None]] | None = None
"""The last loop's entry: calls come from one loop, and a weak dict's lookup costs ~0.5 us."""
_all: weakref.WeakSet[_Gate] = weakref.WeakSet()


def _gate(target: Target) -> _Gate | None:
    """This loop's gate for ``target``'s lane and host (``None``: the lane has no limit)."""
    global _last
    loop = loop_key()
    if _last is not None and _last[0]() is loop:
        gates = _last[1]
    else:
        gates = _gates.setdefault(loop, {})
        _last = (weakref.ref(loop), gates)
    key = (target.transport, target.model, target.api_base or "")
    try:
        return gates[key]
    except KeyError:
        pass
    host = host_of(target)
    if host not in gates:
        size = per_host(target.transport)
        gate = gates[host] = None if size is None else _Gate(*host, size)
        if gate is not None:
            _all.add(gate)
    found = gates[key] = gates[host]
    return found


def host_of(target: Target) -> tuple[str, str]:
    """``(lane, host)``: where a target's connections go, as stats and telemetry may show it
    (never a credential): ``host:port`` of its ``api_base``, else its model's provider prefix
    (the provider's default host; ``"default"`` without a prefix)."""
    return target.transport, _host(target.model, target.api_base)


@functools.lru_cache(maxsize=256)
def _host(model: str, api_base: str | None) -> str:
    # Read from the strings alone: litellm's provider lookup prints a banner for a model it
    # cannot place, and the fast lane never loads litellm.
    if api_base is not None:
        from urllib.parse import urlsplit

        with contextlib.suppress(ValueError):  # not a URL we can read: by the prefix
            parts = urlsplit(api_base)
            if parts.hostname:
                port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
                return f"{parts.hostname}:{port}"
    return model.split("/", 1)[0] if "/" in model else "default"


def waiting() -> dict[tuple[str, str], int]:
    """Attempts waiting for a connection slot now, by ``(lane, host)`` (every event loop
    together)."""
    found: dict[tuple[str, str], int] = {}
    for gate in list(_all):
        key = (gate.lane, gate.host)
        found[key] = found.get(key, 0) + gate.semaphore.statistics().tasks_waiting
    return found


class ConnectionSlots:
    """The innermost stage of :class:`~latencykit.LLM`: each attempt takes a slot of its
    target's pool (lane and host) before its request, and gives it back when its response is
    done. ``recorder``: where each wait is recorded (default ``None``: nowhere)."""

    stage = Stage.ATTEMPT + 5  # around the attempt itself: the guard's limits are set
    __slots__ = ("_recorder",)

    def __init__(self, recorder: Recorder | None = None) -> None:
        self._recorder = recorder

    def __repr__(self) -> str:
        return "ConnectionSlots()"

    async def handle(self, call: Call, next: Next) -> Any:
        gate = _gate(call.target)
        if gate is None:
            return await next(call)
        semaphore = gate.semaphore
        token = None
        try:
            semaphore.acquire_nowait()
        except anyio.WouldBlock:
            waited = await self._wait(gate, call.target.key)
            token = queued_var.set(waited)
            queued_total_var.set(queued_total_var.get() + waited)  # left in: the breaker reads it
        try:
            result = await next(call)
        except BaseException:
            semaphore.release()
            raise
        finally:
            if token is not None:
                queued_var.reset(token)
        if isinstance(result, Stream):
            ended = functools.partial(gate.stream_ended, threadsafe_caller())
            result.on_close(ended, attempt=True)
        else:
            semaphore.release()
        return result

    async def _wait(self, gate: _Gate, target: str) -> float:
        """Wait for a slot (first come, first served); the seconds waited."""
        started = now()
        recorder = self._recorder
        try:
            await gate.semaphore.acquire()
        except BaseException:
            ended = now()
            if recorder is not None:
                recorder.connection_wait(target, ended - started, censored=True)
            # The deadline ended it (its timer may fire a hair early): the error says so.
            if ended >= deadline_var.get() - 1e-3:
                trace = trace_var.get()
                while trace is not None:
                    trace.queued_for = (f"{gate.host} ({gate.lane} lane)", ended - started)
                    trace = trace.parent
            raise
        waited = now() - started
        if recorder is not None:
            recorder.connection_wait(target, waited)
        return waited
