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

import datetime
import functools
import hashlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ._cancel import process_clock

__all__ = [
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


def _wait(value: str | None) -> float | None:
    return None if value is None else parse_wait(value)


# Go durations, as OpenAI's ``x-ratelimit-reset-*`` headers ("1s", "6m0s", "20ms") and
# Google's ``RetryInfo.retryDelay`` ("2s", "0.5s") write them.
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)"
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_wait(value: str) -> float | None:
    """Seconds to wait, from a number of seconds, a Go duration ("6m0s"), an RFC 3339 time or
    an HTTP date (the time until then, at least 0); ``None`` if ``value`` is none of them."""
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
            seconds = when - time.time()
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
    headers: Mapping[str, str], families: tuple[tuple[str, ...], ...]
) -> tuple[int | None, int | None, float | None]:
    """The limit, remaining and reset of the family told with the least room left (Anthropic
    tells its token limits three ways)."""
    told = [
        (_count(headers.get(limit)), _count(headers.get(left)), _wait(headers.get(reset)))
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
    retry_ms = _wait(h.get("retry-after-ms"))
    limits = RateLimits(
        *_tightest(h, _REQUESTS),
        *_tightest(h, _TOKENS),
        retry_ms / 1000.0 if retry_ms is not None else _wait(h.get("retry-after")),
    )
    return None if limits == _NOTHING else limits


_NOTHING = RateLimits()


@functools.lru_cache(maxsize=256)
def key_hash(api_key: str | None) -> str:
    """A short hash naming an API key in state and output (never the key itself)."""
    return hashlib.sha256((api_key or "").encode()).hexdigest()[:12]


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

    def wait(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (an amount over the limit: until the room is full)."""
        if self.limit is None:
            return 0.0
        short = min(amount, self.limit) - self.left(now)
        return 0.0 if short <= 0 else short / self.rate


class Room:
    """One (target, API key)'s rate limits as the provider last told them, and the calls in
    flight since. Per process: every :class:`~latencykit.policies.governor.Governor` of the
    process shares it (:func:`room_for`), as they share the provider's quota.

    Nothing is paced until an answer told the limits (:meth:`read`).
    """

    __slots__ = ("_pending", "paused_until", "requests", "tokens", "waited", "waits")

    def __init__(self) -> None:
        self.requests = _Level()
        self.tokens = _Level()
        self.paused_until = 0.0  # a retry-after: no request before then
        self._pending: RateLimits | None = None  # heard by a transport, not yet read
        self.waits = 0  # calls that waited for room
        self.waited = 0.0  # seconds they waited, in all

    def read(self, limits: RateLimits, now: float) -> list[tuple[Limit, int, int | None]]:
        """Take in what an answer said at ``now``; returns the limits learned or changed:
        ``(limit, value, previous value)``."""
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

    def read_pending(self, now: float) -> list[tuple[Limit, int, int | None]]:
        """Take in what a transport heard since (see :func:`heard`); see :meth:`read`."""
        pending, self._pending = self._pending, None
        return [] if pending is None else self.read(pending, now)

    def wait(self, tokens: float, now: float) -> tuple[float, Limit]:
        """Seconds a call needing one request and ``tokens`` must wait, and for which limit."""
        requests = max(self.requests.wait(1.0, now), self.paused_until - now)
        by_tokens = self.tokens.wait(tokens, now)
        return (by_tokens, "tokens") if by_tokens > requests else (requests, "requests")

    def reserve(self, tokens: float) -> None:
        """Count a call about to be sent against the room."""
        self.requests.reserved += 1.0
        self.tokens.reserved += tokens

    def release(self, tokens: float) -> None:
        """The call's answer (or failure) came: the provider's count has it now."""
        self.requests.reserved -= 1.0
        self.tokens.reserved -= tokens

    def refund(self, tokens: float, now: float) -> None:
        """Give back the tokens a call reserved and did not use (as the provider does)."""
        level = self.tokens
        if level.limit is not None and tokens > 0:
            level.level = min(level.limit, level.left(now) + level.reserved + tokens)
            level.at = now

    def left(self, now: float) -> tuple[float | None, float | None]:
        """Requests and tokens left now (``None``: not learned)."""
        found = (self.requests.left(now), self.tokens.left(now))
        return tuple(None if x == math.inf else max(x, 0.0) for x in found)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class RoomStats:
    """A target's rate-limit room at one moment (a column group of ``LLM.stats()``).

    Attributes:
        requests_left, tokens_left: room left now, reservations in flight deducted
            (``None``: not told yet).
        requests_limit, tokens_limit: the limits learned (``None``: not told yet).
        waits: attempts that waited for room; waited: the seconds they waited, in all.
    """

    requests_left: float | None
    tokens_left: float | None
    requests_limit: float | None
    tokens_limit: float | None
    waits: int
    waited: float


_rooms: dict[tuple[str, str], Room] = {}


def room_of(target: Any, key: str) -> RoomStats | None:
    """The room of ``target`` (a :class:`~latencykit.Target`, or ``None``: the one named
    ``key`` without an API key) now, if a governor made one."""
    api_key = None if target is None else target.api_key
    found = _rooms.get((key, key_hash(api_key)))
    if found is None:
        return None
    requests, tokens = found.left(process_clock())
    return RoomStats(
        requests, tokens, found.requests.limit, found.tokens.limit, found.waits, found.waited
    )


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
