"""The fake provider's rate limits: :class:`ProviderQuota`, :class:`QuotaUsage` and the ledger.

Each API key has two token buckets, requests and tokens, that start full and refill
continuously at ``limit / 60`` per second, as OpenAI describes its limits. A request is
admitted when its key's buckets hold one request and its estimated tokens; it is then
charged at once, and its output is settled when the answer ends.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class ProviderQuota:
    """Rate limits per API key, for ``FakeProvider(quota=...)``. Both fields are required.

    Every key (``Authorization: Bearer``, ``api-key``, Anthropic's ``x-api-key``, Gemini's
    ``x-goog-api-key`` or ``?key=``; none is the key ``""``) gets its own buckets, shared
    by all models and wire formats. See ``docs/testing.md``, "Rate limits".
    """

    requests_per_minute: int
    """Requests admitted per minute and key (an int >= 1)."""
    tokens_per_minute: int
    """Tokens admitted per minute and key (an int >= 1): a request costs its prompt's
    estimated tokens plus its ``max_tokens`` (the answer's length if it sets none),
    settled to the tokens actually sent when the answer ends."""

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ProviderQuota.{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class QuotaUsage:
    """The room one API key has left, as the fake provider counts it (a snapshot)."""

    requests_limit: int
    """``ProviderQuota.requests_per_minute``."""
    requests_remaining: int
    """Whole requests in the bucket now."""
    requests_reset: float
    """Seconds until the requests bucket is full again (``0.0`` when it is)."""
    tokens_limit: int
    """``ProviderQuota.tokens_per_minute``."""
    tokens_remaining: int
    """Whole tokens in the bucket now."""
    tokens_reset: float
    """Seconds until the tokens bucket is full again (``0.0`` when it is)."""

    @property
    def requests_used(self) -> int:
        """``requests_limit - requests_remaining``: the requests not yet refilled."""
        return self.requests_limit - self.requests_remaining

    @property
    def tokens_used(self) -> int:
        """``tokens_limit - tokens_remaining``: the tokens not yet refilled."""
        return self.tokens_limit - self.tokens_remaining

    def full(self) -> QuotaUsage:
        """The same limits with all the room: what a lying ``limit_headers="full"`` says."""
        return replace(
            self,
            requests_remaining=self.requests_limit,
            requests_reset=0.0,
            tokens_remaining=self.tokens_limit,
            tokens_reset=0.0,
        )


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: the limit it would pass and how long until it fits."""

    limit_name: str
    """``"requests"`` or ``"tokens"``."""
    limit: int
    used: int
    requested: int
    wait: float
    """Seconds until the bucket holds the request (until it is full, for a request larger
    than the limit: it is never admitted)."""


_HAIR = 1e-9  # tokens: what float arithmetic may lose


class _Bucket:
    __slots__ = ("at", "level", "limit", "rate")

    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.rate = limit / 60.0
        self.level = float(limit)
        self.at = now

    def fill(self, now: float) -> None:
        self.level = min(self.limit, self.level + (now - self.at) * self.rate)
        self.at = now

    def refusal(self, name: str, amount: int) -> Refusal:
        wait = max(min(amount, self.limit) - self.level, 0.0) / self.rate
        return Refusal(name, self.limit, self.limit - self.remaining(), amount, wait)

    def has(self, amount: float) -> bool:
        # A bucket refilled for exactly the wait it told holds the amount: the clock's
        # floating-point arithmetic may leave it a hair short.
        return self.level + _HAIR >= amount

    def remaining(self) -> int:
        return max(math.floor(self.level + _HAIR), 0)

    def reset(self) -> float:
        return (self.limit - self.level) / self.rate


class Ledger:
    """Every key's buckets under one lock: the server thread charges, tests read."""

    def __init__(self, quota: ProviderQuota) -> None:
        self.quota = quota
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[_Bucket, _Bucket]] = {}
        self._offset = 0.0  # advance()d seconds: the quota's clock runs ahead of monotonic
        self._frozen_at: float | None = None  # the monotonic time the clock was frozen at

    def _now(self) -> float:
        frozen = self._frozen_at
        return (time.monotonic() if frozen is None else frozen) + self._offset

    def _buckets(self, key: str) -> tuple[_Bucket, _Bucket]:
        now = self._now()
        buckets = self._keys.get(key)
        if buckets is None:
            quota = self.quota
            buckets = _Bucket(quota.requests_per_minute, now), _Bucket(quota.tokens_per_minute, now)
            self._keys[key] = buckets
        for bucket in buckets:
            bucket.fill(now)
        return buckets

    @staticmethod
    def _usage(requests: _Bucket, tokens: _Bucket) -> QuotaUsage:
        return QuotaUsage(
            requests.limit,
            requests.remaining(),
            requests.reset(),
            tokens.limit,
            tokens.remaining(),
            tokens.reset(),
        )

    def admit(self, key: str, tokens: int) -> tuple[QuotaUsage, Refusal | None]:
        """Charge one request and ``tokens`` to ``key`` if both fit; else charge nothing.

        Returns the room left and, for a refused request, why.
        """
        with self._lock:
            requests, budget = self._buckets(key)
            refusal = None
            if not requests.has(1):
                refusal = requests.refusal("requests", 1)
            elif not budget.has(tokens):
                refusal = budget.refusal("tokens", tokens)
            else:
                requests.level -= 1.0
                budget.level -= tokens
            return self._usage(requests, budget), refusal

    def settle(self, key: str, refund: int) -> None:
        """Give back the reserved tokens the answer did not use (take more if negative)."""
        if refund:
            with self._lock:
                budget = self._buckets(key)[1]
                budget.level = min(budget.limit, budget.level + refund)

    def usage(self, key: str) -> QuotaUsage:
        with self._lock:
            return self._usage(*self._buckets(key))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds

    def freeze(self, frozen: bool) -> None:
        with self._lock:
            if frozen and self._frozen_at is None:
                self._frozen_at = time.monotonic()
            elif not frozen and self._frozen_at is not None:
                # Resume from the frozen time: the pause does not count as refill time.
                self._offset -= time.monotonic() - self._frozen_at
                self._frozen_at = None

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()
