"""``Governor``: pace attempts by the room the provider says is left, so that they are not
refused with a 429.

Every answer of a provider tells its rate limits and the room left (see
:mod:`latencykit.ratelimit`). The governor keeps that room per (target, API key) for the
process, and before each attempt reserves what the attempt will cost: one request and its
estimated tokens (input: litellm's ``token_counter`` for a target on the litellm lane once
litellm is loaded, else one token per 4 characters of the messages; output: the call's
``max_tokens``/``max_completion_tokens``, else the average output of the target's recent
answers). Reservations of the attempts in flight count against the room until their answers
come back with fresh headers. When the room would be passed, the attempt waits for the room
to refill (the provider's reset), or, if that wait would pass the call's deadline, fails at
once with :class:`~latencykit.errors.LimitExceeded` before anything is sent. A 429's
``retry-after`` pauses every attempt to that target and key until then.

Waiting attempts are served highest lane first (``acompletion(priority=...)``), in arrival
order within a lane; a batch attempt leaves a reserve of the room to the lanes above
(:data:`~latencykit.ratelimit.RESERVES`); one that is shed says its lane
(``LimitExceeded.lane``). With a store (``shared=`` or ``use_store``) the room is the fleet's:
headers merged on the server, a lease per process (:class:`~latencykit.fleet.redis.SharedRoom`).

It runs per attempt (``Stage.RETRY + 5``: inside retry, before the attempt), so retries,
hedges and failover attempts are paced too. A retry or a hedge is an attempt a call adds: it is
spent only from room to spare (leaving the batch lane's reserve, whatever the call's lane), so
near the end of a quota the first attempts of calls go first. A retry waits for that room as a
batch call does (shed with ``LimitExceeded`` when the wait would pass the deadline); a hedge's
backup never waits: without room to spare it is not sent and the primary answers alone. With no
numbers configured, one attempt at a time finds out the room (with a store, one for the whole
fleet: the worker holding the room's probe sends it, the others wait for its answer's word),
and nothing is paced until an answer told the limits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

import anyio

from .. import _response, _validation, events, ratelimit
from .._cancel import now, process_clock, threadsafe_caller
from .._context import (
    PRIORITIES,
    priority_var,
    queued_total_var,
    reason_var,
    remaining,
    trace_var,
)
from ..errors import ErrorKind, LimitExceeded, _headers_of, _links, classify, retry_after
from ..fleet import SharedStore, current_store
from ..pipeline import Call, Next, Stage
from ..stats import StatsTable
from ..stream import Stream
from ..target import Target

__all__ = ["STAGE", "Governor"]

STAGE = Stage.RETRY + 5
"""Where the governor runs: per attempt, inside retry, before the attempt itself."""

CHARS_PER_TOKEN = 4
"""The input estimate without a tokenizer: one token per 4 characters (OpenAI's rule of
thumb for English)."""

_TENANT = "<default>"  # events' tenant field: the governor paces a target, not a tenant
_AVERAGE_WEIGHT = 0.2  # of the newest answer in the learned output size
_MARGIN = 0.01  # seconds: a wait must end this much before the deadline, to shed first
_POLL = 1.0  # seconds a call waiting behind others looks again, if nobody woke it


class Governor:
    """Paces a target's attempts by the rate limits its answers tell (see module docs).

    ``LLM(governor=True)`` puts one in the pipeline. The limits are learned from the provider's
    headers, one room per (target key, API key hash).

    Args:
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`): the rooms are
            the fleet's, each process spending from a lease (default ``None``: the process
            default, :func:`~latencykit.use_store`, looked up at each attempt; none: per
            process).
    """

    stage = STAGE

    def __init__(self, *, shared: SharedStore | None = None) -> None:
        _validation.optional("Governor.shared", shared, SharedStore, "a RedisStore")
        self.shared = shared
        self._output: dict[str, float] = {}  # learned average output tokens, by target

    def __repr__(self) -> str:
        return "Governor()" if self.shared is None else f"Governor(shared={self.shared!r})"

    @staticmethod
    def with_rooms(table: StatsTable, targets: Iterable[Target | None]) -> StatsTable:
        """``table`` with each target's room (``TargetStats.room``; a target not in
        ``targets`` is taken to have no API key of its own)."""
        by_key = {t.key: t for t in targets if t is not None}
        return StatsTable(
            dataclasses.replace(row, room=ratelimit.room_of(by_key.get(key), key))
            for key, row in table.items()
        )

    def estimate(self, call: Call) -> tuple[int, int | None]:
        """The tokens an attempt of ``call`` will cost (input plus output, see module docs),
        and the output cap it sets (``None``: none)."""
        kwargs = call.kwargs
        cap = kwargs.get("max_completion_tokens") or kwargs.get("max_tokens")
        cap = None if cap is None else int(cap)
        output = cap if cap is not None else round(self._output.get(call.target.key, 0.0))
        return _input_tokens(call, kwargs.get("messages") or ()) + output, cap

    async def handle(self, call: Call, next: Next) -> Any:
        target = call.target
        room = ratelimit.room_for(target.key, target.api_key)
        store = self.shared or current_store()
        if store is not None:
            room.attach(store.room(target.key, ratelimit.key_hash(target.api_key)))
        tokens, cap = self.estimate(call)
        fleet = await _take_room(room, target.key, tokens)
        try:
            result = await next(call)
        except BaseException as exc:
            room.release(tokens, fleet)
            if isinstance(exc, Exception):
                self._read_error(room, target.key, exc)
            raise
        room.release(tokens, fleet)
        _learned(target.key, room.read_pending(process_clock()))
        room.came_back()  # after what it told: the fleet must not take it for a host silent
        settle = functools.partial(self._settle, room, target.key, cap, fleet)
        if isinstance(result, Stream):
            result.on_close(lambda stream, outcome, error: settle(stream.summary()))
        else:
            settle(_response.summary(result))
        return result

    def _settle(
        self, room: ratelimit.Room, key: str, cap: int | None, fleet: bool, summary: Any
    ) -> None:
        """Learn the output size; give back the output reserved and not used (as the provider
        does: it reserves the cap, and settles to the tokens sent)."""
        output = summary.output_tokens
        if not isinstance(output, int):
            return
        average = self._output.get(key)
        self._output[key] = (
            output if average is None else average + _AVERAGE_WEIGHT * (output - average)
        )
        if cap is not None and cap > output:
            room.refund(cap - output, process_clock(), fleet)

    @staticmethod
    def _read_error(room: ratelimit.Room, target: str, exc: Exception) -> None:
        """What a failed attempt's answer told: its headers, and a 429's wait (only a 429's:
        the reset of an exhausted limit on another error is no pause, the room refills)."""
        found = next(
            (
                limits
                for link in _links(exc)
                for headers in _headers_of(link.exc)
                if (limits := ratelimit.read_limits(headers)) is not None
            ),
            None,
        )
        at = process_clock()
        if found is not None:
            _learned(target, room.read(found, at))
        # A 429 body's wait too (Google's RetryInfo).
        wait = retry_after(exc) if classify(exc) is ErrorKind.RATE_LIMITED else None
        if wait is not None:
            room.paused_until = max(room.paused_until, at + wait)


def _learned(target: str, changed: list[tuple[ratelimit.Limit, int, int | None]]) -> None:
    """Emit :class:`~latencykit.events.LimitLearned` for each limit first told or changed."""
    if changed and events.listening():
        for limit, value, previous in changed:
            events.emit(events.LimitLearned(_call_id(), target, limit, value, previous))


_EXTRA = frozenset({"hedge", "retry"})  # attempts a call adds: spent from room to spare
_SPARE = len(PRIORITIES) - 1  # ... as the lowest lane spends it (ratelimit.RESERVES)


async def _take_room(room: ratelimit.Room, target: str, tokens: int) -> bool:
    """Take the attempt's room, first waiting for it (highest lane first, in arrival order
    within a lane), or raise ``LimitExceeded`` if that wait would pass the deadline (then
    nothing is sent). Returns whether the room was the fleet's."""
    lane = priority_var.get()
    rank = PRIORITIES.index(lane)
    reason = reason_var.get()
    if reason in _EXTRA:
        # A hedge or a retry is spent only from room to spare (what the batch lane may spend):
        # near the end of a quota the first attempts of calls go first. A retry waits for it
        # as a batch call does; a hedge's backup that waited would be no hedge.
        rank = max(rank, _SPARE)
        if reason == "hedge":
            wait, limit, fleet = room.take(tokens, process_clock(), rank)
            if wait > 0:
                _shed(room, target, lane, limit, wait, 0.0)
            return fleet
    if room.first_in_line(rank):
        wait, limit, fleet = room.take(tokens, process_clock(), rank)
        if wait <= 0:
            return fleet
    waiter = _Waiter()
    place = room.join(rank, waiter.wake)
    started = now()
    try:
        while True:
            first = room.first(place)
            if first:
                wait, limit, fleet = room.take(tokens, process_clock(), rank)
                if wait <= 0:
                    break
                room.head_wait = wait
            else:  # at least the wait of the call first in line
                wait, limit = room.head_wait, "requests"
            left = remaining()
            if left is not None and (wait > left or left <= _MARGIN):
                _shed(room, target, lane, limit, wait, now() - started)
            nap = wait if first else _POLL
            await waiter.sleep(nap if left is None else min(nap, left - _MARGIN))
    finally:
        room.leave(place)
    waited = now() - started
    room.waits[rank] += 1
    room.waited += waited
    # A wait in line is no time of the attempt's: retry (its next attempt's estimate) and the
    # breaker leave it out, as a wait for a connection slot.
    queued_total_var.set(queued_total_var.get() + waited)
    if events.listening():
        events.emit(events.LimitWaited(_call_id(), target, _TENANT, limit, waited))
    return fleet


class _Waiter:
    """A call waiting in a room's line: woken from any thread (the store's refresh, another
    event loop's call leaving the line)."""

    __slots__ = ("_call", "_event")

    def __init__(self) -> None:
        self._call = threadsafe_caller()
        self._event = anyio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody to wake
            self._call(self._set)

    def _set(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._event.wait()
        self._event = anyio.Event()


def _shed(
    room: ratelimit.Room, target: str, lane: str, limit: str, wait: float, waited: float
) -> NoReturn:
    room.shed[PRIORITIES.index(lane)] += 1
    if events.listening():
        events.emit(events.LimitRefused(_call_id(), target, _TENANT, limit, wait, waited))  # type: ignore[arg-type]
    raise LimitExceeded(target, limit, wait=wait, waited=waited, lane=lane)


def _call_id() -> int:
    trace = trace_var.get()
    return 0 if trace is None else trace.call_id


def _input_tokens(call: Call, messages: Any) -> int:
    if call.target.transport == "litellm" and "litellm" in sys.modules:
        try:
            counted = sys.modules["litellm"].token_counter(
                model=call.target.model, messages=messages
            )
            return int(counted)
        except Exception:  # a model or message litellm cannot count: the estimate
            pass
    return _response.characters(messages) // CHARS_PER_TOKEN
