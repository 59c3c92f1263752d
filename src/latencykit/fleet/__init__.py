"""Fleet-wide state: breakers, budgets and quotas shared by every process of an app.

By default each process keeps its own state, in memory. ``lk.use_store(lk.RedisStore(url))``
moves it to a shared server, so that a provider outage seen by one process protects all of
them, a hedge budget caps the fleet's extra load, a tenant's quota is the tenant's, not each
process's, and adaptive hedging learns from the fleet's latencies. A store can also be given
to one policy or ``LLM`` (``shared=``).

The policies never wait for the store on the hot path. They read a local view that the store
refreshes in the background, and queue their outcomes, which it writes in batches. Only the
rare transitions that must be agreed by the fleet are round trips: taking a half-open probe
permit and taking from a quota. When the store is down, slow or answers garbage, every
policy goes on with its process-local state, and the store resynchronises on its own.

This module holds the interface the policies speak (:class:`SharedStore`) and the process
default; :class:`~latencykit.fleet.redis.RedisStore` implements it on Redis or Valkey.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from .. import _validation
from ..events import StoreRecovered, StoreUnavailable

__all__ = [
    "BreakerOptions",
    "BreakerView",
    "SharedBreaker",
    "SharedBudget",
    "SharedLatency",
    "SharedStore",
    "StoreRecovered",
    "StoreUnavailable",
    "current_store",
    "use_store",
]


class BreakerOptions(NamedTuple):
    """The options of a breaker that the fleet's copy of its state needs (see
    :func:`~latencykit.breaker` for each one's meaning and default)."""

    window_type: Literal["count", "time"]
    window_size: float
    minimum_calls: int
    failure_rate: float
    slow_call_rate: float
    open_duration: float
    max_open_duration: float | None
    half_open_calls: int


class BreakerView(NamedTuple):
    """A breaker's fleet state, as of the store's last refresh.

    Attributes:
        state: ``"closed"``, ``"open"``, ``"half_open"`` or ``"forced_open"`` (a
            :class:`~latencykit.policies.breaker.BreakerState` value).
        epoch: counts the fleet breaker's state changes; an outcome is counted only in the
            epoch its permit was taken in.
        opens_in: seconds, from when the view was read, until an ``"open"`` state ends (the
            fleet then hands out probe permits); ``0.0`` when it is over and in the other
            states. (The store keeps time on its own clock; a policy never reads it.)
        free_probes: probe permits left while ``"half_open"``.
        calls: calls in the fleet's window.
        failures: failed calls among them.
        slow: slow calls among them.
    """

    state: str
    epoch: int
    opens_in: float
    free_probes: int
    calls: int
    failures: int
    slow: int


@runtime_checkable
class SharedBreaker(Protocol):
    """One breaker's state in a :class:`SharedStore` (from :meth:`SharedStore.breaker`)."""

    def view(self) -> BreakerView | None:
        """The fleet's state as last refreshed, or ``None`` when the store is unavailable or
        its view is older than its staleness bound (the breaker then decides alone)."""
        ...

    def outcome(self, epoch: int, code: int) -> None:
        """Queue one call's outcome, taken in ``epoch``: ``code`` is ``1``, plus ``2`` if it
        failed, plus ``4`` if it was slow. Written with the next batch."""
        ...

    async def probe(self) -> tuple[bool, BreakerView] | None:
        """Ask the fleet for a half-open probe permit (a round trip, bounded by the store's
        timeout): ``(granted, view)``, or ``None`` if the store could not answer."""
        ...

    def probe_ended(self, epoch: int, code: int) -> None:
        """Report a probe's outcome (``code`` as for :meth:`outcome`, ``0``: ignored, the
        permit released). Written at once, in the background."""
        ...

    def force(self, op: Literal["isolate", "reset"]) -> None:
        """Force the fleet breaker open (``"isolate"``) or closed (``"reset"``), in the
        background."""
        ...


@runtime_checkable
class SharedBudget(Protocol):
    """One retry/hedge budget's state in a :class:`SharedStore` (:meth:`SharedStore.budget`)."""

    def deposit(self) -> None:
        """Count one call (written with the next batch)."""
        ...

    def try_withdraw(self) -> bool | None:
        """Take one extra request: ``True`` or ``False``, or ``None`` when the store is
        unavailable (the budget then decides alone). Never a round trip: the process spends
        tokens it leased from the fleet at the last refresh."""
        ...

    def balance(self) -> float | None:
        """The fleet's balance as last refreshed, or ``None`` when unavailable."""
        ...


@runtime_checkable
class SharedLatency(Protocol):
    """One latency window pooled by the fleet (:meth:`SharedStore.latency`)."""

    def record(self, seconds: float) -> None:
        """Queue this process's sample (negative: censored, the attempt was abandoned after
        that long); written with the next batch."""
        ...

    def follow(self) -> deque[float]:
        """A new queue that receives the other processes' samples (negative: censored) as the
        store reads them; its owner drains it into its own window."""
        ...


@runtime_checkable
class SharedStore(Protocol):
    """Where state shared by a fleet of processes lives: what the policies ask of a store."""

    def breaker(self, key: str, options: BreakerOptions) -> SharedBreaker:
        """The shared state of the breaker ``key`` (the same object for the same key)."""
        ...

    def budget(self, key: str, *, ratio: float, ttl: float, reserve: float) -> SharedBudget:
        """The shared state of the budget ``key`` (``reserve``: extra requests always allowed
        per ``ttl``)."""
        ...

    def latency(self, key: str, *, window: float) -> SharedLatency:
        """The pooled latency window ``key`` (samples count for ``window`` seconds)."""
        ...

    async def take(
        self, key: str, amount: float, *, rate: float, burst: float, max_wait: float
    ) -> float | None:
        """Take ``amount`` tokens from the token bucket ``key`` (``rate`` per second, up to
        ``burst``) if they are there within ``max_wait`` seconds, and return the wait (a round
        trip, bounded by the store's timeout); ``None`` if the store could not answer.

        As the limiter's own buckets: the tokens are taken when the wait fits (the bucket may
        go negative: the caller reserved the tokens that arrive meanwhile); a wait above
        ``max_wait`` means nothing was taken."""
        ...

    def adjust(self, key: str, amount: float, *, rate: float, burst: float) -> None:
        """Charge ``amount`` more tokens to the bucket ``key`` (into debt if need be), or give
        them back when negative; written with the next batch, never waited for."""
        ...


_current: SharedStore | None = None


def use_store(store: SharedStore | None) -> SharedStore | None:
    """Make ``store`` the process's default for every policy built without ``shared=``, and
    return the previous default.

    ``None`` (the initial default) keeps each process's state in its own memory. Policies
    look the default up at each use, so this may be called before or after they are built.
    """
    global _current
    _validation.optional("use_store", store, SharedStore, "a SharedStore such as RedisStore")
    previous, _current = _current, store
    return previous


def current_store() -> SharedStore | None:
    """The process's default store (:func:`use_store`), ``None`` for process-local state."""
    return _current
