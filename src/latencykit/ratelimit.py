"""The room a provider says is left: its rate-limit headers, read into one state per
(target, API key).

Providers tell, in every answer, how much of their rate limits is left:

- OpenAI and compatible hosts: ``x-ratelimit-limit|remaining|reset-requests`` and ``-tokens``,
  resets as Go durations (``"6m0s"``, ``"1s"``, ``"120ms"``);
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}``, resets as RFC 3339 times (the tightest token family counts);
- Azure: ``x-ratelimit-remaining-requests|tokens`` (no limit, no reset) and ``retry-after-ms``;
- any: ``retry-after`` (seconds or an HTTP date), and a 429's body (Google's ``RetryInfo``:
  :func:`latencykit.errors.retry_after` reads it).

:func:`read_limits` parses them (pure); a :class:`Room` keeps one (target, key)'s state and
tells how long a call needing some requests and tokens must wait. Limits are taken to be per
minute, as every provider's are (RPM, TPM): the room refills continuously, at least at
``limit / 60`` per second and fully by the reset the provider told. A provider's quota refills
in real time, and a room is shared by every event loop and thread of the process: rooms keep
time with ``time.monotonic()`` (``_cancel.process_clock``), whatever an event loop's clock
says. litellm's copies of the headers (``llm_provider-x-ratelimit-...``) read as the provider's
own, so both lanes give the same state from the same bytes. The key itself is never kept:
only a hash of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import heapq
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias

from ._cancel import process_clock
from ._context import PRIORITIES

__all__ = [
    "RESERVES",
    "FleetView",
    "Lease",
    "Limit",
    "RateLimits",
    "Room",
    "RoomStats",
    "heard",
    "key_hash",
    "parse_wait",
    "read_limits",
    "room_for",
    "room_of",
]

WINDOW = 60.0
"""Seconds over which a limit refills completely at the slowest: limits are per minute."""

Limit: TypeAlias = Literal["requests", "tokens"]

_LITELLM_PREFIX = "llm_provider-"


@dataclass(frozen=True, slots=True)
class RateLimits:
    """What one answer's headers say (each field ``None`` when not said).

    Attributes:
        requests_limit, tokens_limit: the limits (per minute).
        requests_remaining, tokens_remaining: the room left when the answer was sent.
        requests_reset, tokens_reset: seconds until that room is full again.
        retry_after: seconds the provider asked to wait before the next request.
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None
    retry_after: float | None = None


def _normalised(headers: Mapping[str, Any]) -> dict[str, str]:
    """Names lower-cased, litellm's ``llm_provider-`` copies read as the provider's own (they
    win: litellm keeps only some headers unprefixed)."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        name = str(name).lower()
        if name.startswith(_LITELLM_PREFIX):
            found[name[len(_LITELLM_PREFIX) :]] = str(value)
        else:
            found.setdefault(name, str(value))
    return found


def _count(value: str | None) -> int | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number >= 0 else None


def _wait(value: str | None, now: float | None = None) -> float | None:
    return None if value is None else parse_wait(value, now)


# Go durations, as OpenAI's ``x-ratelimit-reset-*`` headers ("1s", "6m0s", "20ms") and
# Google's ``RetryInfo.retryDelay`` ("2s", "0.5s") write them.
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)"
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_wait(value: str, now: float | None = None) -> float | None:
    """Seconds to wait, from a number of seconds, a Go duration ("6m0s"), an RFC 3339 time or
    an HTTP date (the time until then, at least 0); ``None`` if ``value`` is none of them.

    ``now``: the POSIX time a time is counted from (default ``None``: this machine's clock;
    :func:`read_limits` passes the answer's ``Date``, the provider's clock, so that neither
    clock's skew matters)."""
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        if re.fullmatch(f"(?:{_DURATION_PART})+", value):
            seconds = sum(
                float(number) * _DURATION_UNITS[unit]
                for number, unit in re.findall(_DURATION_PART, value)
            )
        elif (when := _parse_time(value)) is not None:
            seconds = when - (time.time() if now is None else now)
        else:
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _parse_time(value: str) -> float | None:
    """The POSIX time of an RFC 3339 time or an HTTP date (UTC unless it says otherwise)."""
    import email.utils  # lazily: it imports socket, 15 ms off `import latencykit`

    try:
        when = datetime.datetime.fromisoformat(re.sub("[Zz]$", "+00:00", value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return when.replace(tzinfo=when.tzinfo or datetime.timezone.utc).timestamp()


_PARTS = ("limit", "remaining", "reset")
# The families of headers that tell a limit: each its limit, remaining and reset names.
_REQUESTS = tuple(
    tuple(pattern.format(part) for part in _PARTS)
    for pattern in ("x-ratelimit-{}-requests", "anthropic-ratelimit-requests-{}")
)
_TOKENS = tuple(
    tuple(pattern.format(part) for part in _PARTS)
    for pattern in (
        "x-ratelimit-{}-tokens",
        *(
            f"anthropic-ratelimit-{name}-{{}}"
            for name in ("tokens", "input-tokens", "output-tokens")
        ),
    )
)
_UNTOLD: tuple[int | None, int | None, float | None] = (None, None, None)


def _tightest(
    headers: Mapping[str, str], families: tuple[tuple[str, ...], ...], now: float | None
) -> tuple[int | None, int | None, float | None]:
    """The limit, remaining and reset of the family told with the least room left (Anthropic
    tells its token limits three ways)."""
    told = [
        (_count(headers.get(limit)), _count(headers.get(left)), _wait(headers.get(reset), now))
        for limit, left, reset in families
    ]
    return min(
        (found for found in told if found != _UNTOLD),
        key=lambda found: math.inf if found[1] is None else found[1],
        default=_UNTOLD,
    )


def read_limits(headers: Mapping[str, Any]) -> RateLimits | None:
    """The rate limits ``headers`` tell (any casing; a dict or httpx's headers), or ``None``
    when they tell none."""
    h = _normalised(headers)
    # Reset times (Anthropic's) are counted from the provider's own clock when it tells it.
    date = h.get("date")
    now = None if date is None else _parse_time(date)
    retry_ms = _wait(h.get("retry-after-ms"))
    limits = RateLimits(
        *_tightest(h, _REQUESTS, now),
        *_tightest(h, _TOKENS, now),
        retry_ms / 1000.0 if retry_ms is not None else _wait(h.get("retry-after"), now),
    )
    return None if limits == _NOTHING else limits


_NOTHING = RateLimits()


@functools.lru_cache(maxsize=256)
def key_hash(api_key: str | None) -> str:
    """A short hash naming an API key in state and output (never the key itself)."""
    return hashlib.sha256((api_key or "").encode()).hexdigest()[:12]


RESERVES: tuple[float, ...] = (0.0, 0.0, 0.2)
"""The reserve of each lane (by rank, :data:`~latencykit._context.PRIORITIES`: interactive,
default, batch): the share of a limit that a lane may not spend, kept for the lanes above it.
Interactive and default calls may spend the whole room (the line serves interactive ones
first); batch ones leave 20 % of it. An app that does not use lanes is paced as without."""


PROBE_WAIT = 0.05
"""Seconds a call looks again while the first call to a room, the one that finds out its
limits, is still out (it is woken when that call comes back)."""


class _Level:
    """One limit's room: ``level`` at time ``at``, refilling at ``rate`` up to ``limit``, less
    what calls in flight reserved."""

    __slots__ = ("at", "level", "limit", "rate", "reserved")

    def __init__(self) -> None:
        self.limit: float | None = None  # None: nothing learned, nothing paced
        self.level = 0.0
        self.at = 0.0
        self.rate = 0.0
        self.reserved = 0.0

    def read(
        self, limit: int | None, remaining: int | None, reset: float | None, now: float
    ) -> None:
        if remaining is None:
            return
        # The limit, learned: as told, else the most room ever seen.
        self.limit = float(limit if limit is not None else max(remaining, self.limit or 0))
        self.level, self.at = float(min(remaining, self.limit)), now
        missing = self.limit - self.level
        # Full again by the reset, and at least at a per-minute limit's pace (a reset in a
        # skewed clock's future would otherwise slow the pace down).
        told = missing / reset if reset else math.inf
        self.rate = max(self.limit / WINDOW, told if missing else 0.0)

    def left(self, now: float) -> float:
        if self.limit is None:
            return math.inf
        refilled = self.level + self.rate * max(0.0, now - self.at)
        return min(self.limit, refilled) - self.reserved

    def wait(self, amount: float, now: float, reserve: float = 0.0, share: float = 1.0) -> float:
        """Seconds until ``amount`` fits above the lane's ``reserve`` (a share of the limit)
        in this worker's ``share`` of the room (an amount over it: until it is full)."""
        if self.limit is None:
            return 0.0
        limit = self.limit * share
        mine = (self.left(now) + self.reserved) * share - self.reserved
        short = min(amount + reserve * limit, limit) - mine
        return 0.0 if short <= 0 else short / (self.rate * share)


class FleetView(NamedTuple):
    """A room as the fleet's store last told it (:class:`Lease`).

    Attributes:
        requests_left, tokens_left: the room not leased out to any worker.
        requests_limit, tokens_limit: the limits (``None``: not told yet).
        requests_rate, tokens_rate: their refill, per second.
        paused_until: ``process_clock()`` before which no request may be sent (a retry-after).
        workers: the workers seen lately.
        renew: seconds until the next lease at the latest.
    """

    requests_left: float
    requests_limit: float | None
    requests_rate: float
    tokens_left: float
    tokens_limit: float | None
    tokens_rate: float
    paused_until: float
    workers: int
    renew: float


class Lease(Protocol):
    """A room's share of the fleet's (:meth:`latencykit.RedisStore.room`): what this worker
    leased from the fleet's room, spent with no round trip."""

    held_requests: float
    held_tokens: float

    def view(self) -> FleetView | None:
        """The fleet's room as last refreshed; ``None`` while the store is unavailable."""

    def joining(self) -> bool:
        """Whether the store has not answered for this room yet, nor failed (a short time)."""

    def take(self, requests: float, tokens: float, rank: int, fits: bool) -> bool:
        """Spend ``requests`` and ``tokens`` of the lease if it holds them and ``fits`` (the
        lane's reserve allows it), and count them as asked for by lane ``rank`` if it fits."""

    def give(self, tokens: float) -> None:
        """Give ``tokens`` back to the lease (negative: a debt)."""

    def find_out(self) -> bool:
        """Whether this worker may send calls to find out a room the fleet was not told of:
        it holds the fleet's probe (asked for by this call), or an answer came back that
        told no limits (there are none to find out); never while limits it heard are on
        their way to the fleet (then its calls are spent from the fleet's room, as every
        worker's)."""

    def heard(self, limits: RateLimits) -> None:
        """Tell the fleet what an answer said (merged on the server with the next refresh)."""

    def came_back(self) -> None:
        """Tell the fleet an answer came back (after :meth:`heard`, if it told limits)."""

    def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` after each refresh (from the store's thread)."""


class Room:
    """One (target, API key)'s rate limits as the provider last told them, and the calls in
    flight since. Per process: every :class:`~latencykit.policies.governor.Governor` of the
    process shares it (:func:`room_for`), as they share the provider's quota. With a fleet
    :class:`Lease` attached, the fleet's room decides while its store answers; the process's
    own, divided by the workers last seen, while it does not.

    Until a first answer came back (an error that tells no limits does not count), one call
    at a time is sent (it finds out the room); then nothing is paced until an answer told the
    limits (:meth:`read`). With a lease, that call is the fleet's: only the worker holding the
    fleet's probe sends it, the others wait for the word its answer brings.
    """

    __slots__ = (
        "_fleet",
        "_line",
        "_pending",
        "_turn",
        "_wakes",
        "answered",
        "head_wait",
        "lease",
        "paused_until",
        "requests",
        "share",
        "shed",
        "tokens",
        "waited",
        "waits",
    )

    def __init__(self) -> None:
        self.requests = _Level()
        self.tokens = _Level()
        self.paused_until = 0.0  # a retry-after: no request before then
        self._pending: RateLimits | None = None  # heard by a transport, not yet read
        self.waits = [0] * len(PRIORITIES)  # calls that waited for room, by lane rank
        self.shed = [0] * len(PRIORITIES)  # calls refused for want of room, by lane rank
        self.waited = 0.0  # seconds they waited, in all
        self.lease: Lease | None = None
        self.share = 1.0  # of the room this worker may spend alone: 1 / the workers last seen
        # The waiting line: (rank, turn) in a heap, each with its waker.
        self._line: list[tuple[int, int]] = []
        self._wakes: dict[tuple[int, int], Callable[[], None]] = {}
        self._turn = 0
        self.head_wait = 0.0  # the wait the call first in line was told last
        self.answered = False  # whether an answer came back (until then, one at a time)
        self._fleet: FleetView | None = None  # the fleet's room last spent from, if in use

    def attach(self, lease: Lease) -> None:
        """Spend from ``lease`` while its store answers."""
        if self.lease is not lease:
            self.lease = lease
            lease.listen(self.wake_first)
            if self.answered:
                lease.came_back()

    # --- what the provider said ---------------------------------------------------------

    def read(self, limits: RateLimits, now: float) -> list[tuple[Limit, int, int | None]]:
        """Take in what an answer said at ``now``; returns the limits learned or changed:
        ``(limit, value, previous value)``."""
        if self.lease is not None:
            self.lease.heard(limits)
        self.came_back()
        changed: list[tuple[Limit, int, int | None]] = []
        told: tuple[tuple[Limit, _Level, int | None, int | None, float | None], ...] = (
            (
                "requests",
                self.requests,
                limits.requests_limit,
                limits.requests_remaining,
                limits.requests_reset,
            ),
            (
                "tokens",
                self.tokens,
                limits.tokens_limit,
                limits.tokens_remaining,
                limits.tokens_reset,
            ),
        )
        for name, level, limit, left, reset in told:
            before = level.limit
            level.read(limit, left, reset, now)
            if level.limit is not None and level.limit != before:
                changed.append((name, int(level.limit), None if before is None else int(before)))
        if limits.retry_after is not None:
            self.paused_until = max(self.paused_until, now + limits.retry_after)
        return changed

    def came_back(self) -> None:
        """An answer came back (an error that told no limits does not count): the room is
        found out, told or not."""
        if not self.answered:
            self.answered = True
            if self.lease is not None:
                self.lease.came_back()

    def read_pending(self, now: float) -> list[tuple[Limit, int, int | None]]:
        """Take in what a transport heard since (see :func:`heard`); see :meth:`read`."""
        pending, self._pending = self._pending, None
        return [] if pending is None else self.read(pending, now)

    # --- taking room --------------------------------------------------------------------

    def take(self, tokens: float, now: float, rank: int = 1) -> tuple[float, Limit, bool]:
        """Take one request and ``tokens`` for a call of lane ``rank`` if they fit now:
        ``(0.0, limit, fleet)``, ``fleet`` telling where they were taken from (give it back
        to :meth:`release` and :meth:`refund`); else ``(seconds to wait, the limit waited
        for, False)``, nothing taken."""
        lease = self.lease
        view = None if lease is None else lease.view()
        if view is None and lease is not None and lease.joining():
            return PROBE_WAIT, "requests", False  # the fleet's word first: woken when it comes
        if view is not None:
            self.share = 1.0 / max(1, view.workers)
        elif self._fleet is not None:
            self._alone(self._fleet, now)
        if view is None or (view.requests_limit is None and view.tokens_limit is None):
            if lease is not None and view is not None and not lease.find_out():
                return PROBE_WAIT, "requests", False  # another worker finds out: its word first
            wait, limit = self._local_wait(tokens, now, RESERVES[rank])
            if wait <= 0:
                self.requests.reserved += 1.0
                self.tokens.reserved += tokens
            return wait, limit, False
        assert lease is not None
        self._fleet = view
        reserve = RESERVES[rank]
        by_requests = _fleet_wait(
            1.0, reserve, view.requests_left, lease.held_requests, view.requests_limit,
            view.requests_rate,
        )  # fmt: skip
        by_requests = max(by_requests, view.paused_until - now, self.paused_until - now)
        by_tokens = _fleet_wait(
            tokens, reserve, view.tokens_left, lease.held_tokens, view.tokens_limit,
            view.tokens_rate,
        )  # fmt: skip
        wait, limit = (
            (by_tokens, "tokens") if by_tokens > by_requests else (by_requests, "requests")
        )
        # A limit the fleet was not told (some hosts tell only one) is not leased.
        requests = 0.0 if view.requests_limit is None else 1.0
        if lease.take(requests, 0.0 if view.tokens_limit is None else tokens, rank, wait <= 0):
            return 0.0, limit, True
        return max(wait, view.renew), limit, False

    def _alone(self, last: FleetView, now: float) -> None:
        """The store stopped answering: this worker's room goes on from the fleet's last word
        (the room not leased out, and its own lease), refilling from now. Its own levels may
        be old (a worker that got no lease for a while heard no answer): their refill since
        was the fleet's, spent by others."""
        self._fleet = None
        assert self.lease is not None
        told = (
            (self.requests, last.requests_limit, last.requests_left, last.requests_rate,
             self.lease.held_requests),
            (self.tokens, last.tokens_limit, last.tokens_left, last.tokens_rate,
             self.lease.held_tokens),
        )  # fmt: skip
        for level, limit, left, rate, held in told:
            if limit is not None:
                level.limit, level.rate, level.at = limit, rate, now
                level.level = min(limit, max(0.0, left + held))

    def _local_wait(self, tokens: float, now: float, reserve: float) -> tuple[float, Limit]:
        if not self.answered and self.requests.reserved >= 1.0:
            # Nothing known yet: one call finds out, before a burst meets an empty room.
            return PROBE_WAIT, "requests"
        share = self.share
        requests = max(self.requests.wait(1.0, now, reserve, share), self.paused_until - now)
        by_tokens = self.tokens.wait(tokens, now, reserve, share)
        return (by_tokens, "tokens") if by_tokens > requests else (requests, "requests")

    def release(self, tokens: float, fleet: bool) -> None:
        """The call's answer (or failure) came: the provider's count has it now (a lease is
        spent when taken)."""
        if not fleet:
            self.requests.reserved -= 1.0
            self.tokens.reserved -= tokens
        if self._line:
            self.wake_first()  # room freed, or the first answer came

    def refund(self, tokens: float, now: float, fleet: bool) -> None:
        """Give back the tokens a call reserved and did not use (as the provider does)."""
        if fleet and self.lease is not None:
            self.lease.give(tokens)
            return
        level = self.tokens
        if level.limit is not None and tokens > 0:
            level.level = min(level.limit, level.left(now) + level.reserved + tokens)
            level.at = now

    # --- the waiting line: highest lane first, first come first served within a lane ------

    def first_in_line(self, rank: int) -> bool:
        """Whether a call of lane ``rank`` has no one waiting ahead of it."""
        return not self._line or self._line[0][0] > rank

    def join(self, rank: int, wake: Callable[[], None]) -> tuple[int, int]:
        """Queue a call of lane ``rank`` (``wake()`` is called when it comes first); returns
        its place."""
        self._turn += 1
        place = (rank, self._turn)
        heapq.heappush(self._line, place)
        self._wakes[place] = wake
        return place

    def first(self, place: tuple[int, int]) -> bool:
        """Whether ``place`` is first in line."""
        return self._line[0] == place

    def leave(self, place: tuple[int, int]) -> None:
        """``place`` leaves the line (admitted or gone); the next one is woken."""
        self._wakes.pop(place, None)
        if self._line and self._line[0] == place:
            heapq.heappop(self._line)
            self.head_wait = 0.0  # the next one first in line tells its own
        else:
            self._line.remove(place)
            heapq.heapify(self._line)
        self.wake_first()

    def wake_first(self) -> None:
        """Wake the call first in line, if any (it looks at the room again)."""
        try:  # called from the store's thread too: the line may change meanwhile
            wake = self._wakes.get(self._line[0]) if self._line else None
        except IndexError:
            return
        if wake is not None:
            wake()

    def left(self, now: float) -> tuple[float | None, float | None]:
        """Requests and tokens left now (``None``: not learned): the fleet's, not leased out,
        plus this worker's lease, with a store; else the process's."""
        view = None if self.lease is None else self.lease.view()
        if view is not None and self.lease is not None:
            return (
                None if view.requests_limit is None
                else max(0.0, view.requests_left + self.lease.held_requests),
                None if view.tokens_limit is None
                else max(0.0, view.tokens_left + self.lease.held_tokens),
            )  # fmt: skip
        found = (self.requests.left(now), self.tokens.left(now))
        return tuple(None if x == math.inf else max(x, 0.0) for x in found)  # type: ignore[return-value]

    def stats(self) -> RoomStats:
        """The room now (see :class:`RoomStats`)."""
        requests, tokens = self.left(process_clock())
        lanes: dict[str, tuple[int, int]] = dict(
            zip(PRIORITIES, zip(self.waits, self.shed, strict=True), strict=True)
        )
        fleet = self.lease is not None and self.lease.view() is not None
        return RoomStats(
            requests, tokens, self.requests.limit, self.tokens.limit, sum(self.waits),
            self.waited, sum(self.shed), lanes, fleet,
        )  # fmt: skip


def _fleet_wait(
    amount: float, reserve: float, left: float, held: float, limit: float | None, rate: float
) -> float:
    """Seconds until ``amount`` fits above ``reserve`` in the fleet's room ``left`` plus this
    worker's ``held`` lease (``0.0``: it fits, a lease may still have to come)."""
    if limit is None:
        return 0.0
    short = min(amount + reserve * limit, limit) - left - held
    return 0.0 if short <= 0 else short / rate


@dataclass(frozen=True, slots=True)
class RoomStats:
    """A target's rate-limit room at one moment (a column group of ``LLM.stats()``).

    Attributes:
        requests_left, tokens_left: room left now, reservations in flight deducted; with a
            fleet store, the fleet's room not leased out plus this worker's lease (``None``:
            not told yet).
        requests_limit, tokens_limit: the limits learned (``None``: not told yet).
        waits: attempts that waited for room; waited: the seconds they waited, in all.
        shed: attempts refused for want of room (``LimitExceeded``), nothing sent.
        lanes: by lane (``"interactive"``, ``"default"``, ``"batch"``), the attempts that
            waited and that were shed: ``(waits, shed)``.
        fleet: whether the room is the fleet's (a store answers) rather than the process's.
    """

    requests_left: float | None
    tokens_left: float | None
    requests_limit: float | None
    tokens_limit: float | None
    waits: int
    waited: float
    shed: int = 0
    lanes: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    fleet: bool = False


_rooms: dict[tuple[str, str], Room] = {}


def room_of(target: Any, key: str) -> RoomStats | None:
    """The room of ``target`` (a :class:`~latencykit.Target`, or ``None``: the one named
    ``key`` without an API key) now, if a governor made one."""
    api_key = None if target is None else target.api_key
    found = _rooms.get((key, key_hash(api_key)))
    if found is None:
        return None
    return found.stats()


def room_for(target: str, api_key: str | None) -> Room:
    """The process's room of ``target`` with ``api_key`` (made on first use)."""
    key = (target, key_hash(api_key))
    found = _rooms.get(key)
    if found is None:
        found = _rooms[key] = Room()
    return found


def heard(target: str, api_key: str | None, headers: Mapping[str, Any] | None) -> None:
    """A transport got an answer's ``headers`` from ``target``: kept for its room's governor,
    if it has one (nothing is parsed otherwise)."""
    if not _rooms or headers is None:
        return
    found = _rooms.get((target, key_hash(api_key)))
    if found is not None and (limits := read_limits(headers)) is not None:
        found._pending = limits
