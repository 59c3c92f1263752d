"""``RedisStore``: fleet-wide state on Redis (or Valkey), read from a local view.

Each process keeps a view of the fleet's state (each breaker's state, each budget's balance and
the tokens this process leased from it) that a background task refreshes every ``interval``
seconds, in one pipelined round trip that also writes the outcomes queued since the last one.
Every change of shared state happens in a Lua script on the server (``breaker.lua``,
``budget.lua``, ``quota.lua``, ``room.lua``), on the server's clock: no read-modify-write from
a client.

The background task runs on the library's own asyncio loop (a daemon thread), whatever loop or
backend the calls run on, so a busy application loop does not delay the refresh, and trio
needs nothing more. A call waits for Redis only to take a half-open probe permit or a quota,
and then at most ``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias, TypeVar, cast

from .. import _validation, events
from .._cancel import process_clock
from ..events import StoreRecovered, StoreUnavailable
from ..ratelimit import RESERVES, FleetView, RateLimits

if TYPE_CHECKING:
    import asyncio

# asyncio, the bridge to the library's loop and urllib.parse are imported by the functions that
# use them: import latencykit does not pay for them (redis imports them when a store is made).

__all__ = [
    "BreakerOptions",
    "BreakerView",
    "ConcurrencyView",
    "RedisStore",
    "SharedConcurrency",
    "SharedRoom",
]

logger = logging.getLogger("latencykit")

_SCRIPT_NAMES = ("breaker", "budget", "concurrency", "latency", "quota", "room")
_FOLLOWED = 1000  # samples a follower's queue holds until its owner drains it
_STATES = frozenset({"closed", "open", "half_open", "forced_open"})
_MAX_QUEUED = 10_000  # outcomes kept per breaker while the store is unreachable
_MAX_LEASE = 32  # most budget tokens a process holds between two refreshes
_MAX_BACKOFF = 2.0  # seconds between two attempts to reach a store that is down
_IDLE_TTL = 3600.0  # seconds a key outlives its last write, beyond its own time spans
_NO_LIMIT = "1e300"  # a quota adjustment's max wait: always taken
_LEASE_SHARE = 0.1  # most of a room's limit the workers' leases hold together
_SEEN_FOR = 10.0  # seconds a worker counts in a room's workers after its last refresh
_ROOM_TTL = 3 * 60_000  # ms a room outlives its last refresh (three windows)
_PROBE_FOR = 5.0  # seconds a room's probe stays with a worker after its calls last asked

H = TypeVar("H", bound="_Owner")
T = TypeVar("T")


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


class _Garbage(Exception):
    """The store answered something no script of ours returns."""


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class SharedBreaker:
    """One breaker's state in a :class:`RedisStore`: what :class:`~latencykit.Breaker` asks of
    the fleet."""

    def __init__(self, store: RedisStore, key: str, options: BreakerOptions) -> None:
        self._store = store
        base = f"{store.namespace}:breaker:{{{key}}}"  # {key}: both keys in one cluster slot
        self._keys = (base, f"{base}:window")
        counted = options.window_type == "count"
        span = 0.0 if counted else options.window_size
        longest = max(span, options.max_open_duration or options.open_duration)
        self._args: tuple[str | int | float, ...] = (
            options.window_type,
            int(options.window_size) if counted else 20,
            1 if counted else _ms(options.window_size / 20),
            options.minimum_calls,
            options.failure_rate,
            options.slow_call_rate,
            _ms(options.open_duration),
            0 if options.max_open_duration is None else _ms(options.max_open_duration),
            options.half_open_calls,
            _ms(2 * longest + _IDLE_TTL),
        )
        self._outcomes: deque[tuple[int, int]] = deque(maxlen=_MAX_QUEUED)
        self._ops: deque[tuple[str, int, str]] = deque()
        self._view: BreakerView | None = None
        self._until = 0.0  # process_clock() at which an open state ends

    def view(self) -> BreakerView | None:
        """The fleet's state as last refreshed, or ``None`` when the store is unavailable or
        its view is older than its staleness bound (the breaker then decides alone)."""
        now = process_clock()
        view = self._view
        if now > self._store._fresh_until or view is None:
            return None
        if view.state == "open":  # rare: the time left, as of now
            return view._replace(opens_in=max(0.0, self._until - now))
        return view

    def outcome(self, epoch: int, code: int) -> None:
        """Queue one call's outcome, taken in ``epoch``: ``code`` is ``1``, plus ``2`` if it
        failed, plus ``4`` if it was slow. Written with the next batch."""
        self._outcomes.append((epoch, code))

    async def probe(self) -> tuple[bool, BreakerView] | None:
        """Ask the fleet for a half-open probe permit (a round trip, bounded by the store's
        timeout): ``(granted, view)``, or ``None`` if the store could not answer."""
        return await self._store._round_trip(
            self._probed, "breaker", *self._script("probe", -1, "")
        )

    def _probed(self, reply: Any) -> tuple[bool, BreakerView]:
        return reply[7] == 1, self._update(reply)

    def probe_ended(self, epoch: int, code: int) -> None:
        """Report a probe's outcome (``code`` as for :meth:`outcome`, ``0``: ignored, the
        permit released). Written at once, in the background."""
        self._ops.append(("probe_end", epoch, str(code)))
        self._store._wake_soon()

    def force(self, op: Literal["isolate", "reset"]) -> None:
        """Force the fleet breaker open (``"isolate"``) or closed (``"reset"``), in the
        background."""
        self._ops.append((op, -1, ""))
        self._store._wake_soon()

    def _script(self, op: str, epoch: int, arg: str) -> tuple[Any, ...]:
        """``breaker.lua``'s keys and arguments for ``op``."""
        return (2, *self._keys, op, epoch, *self._args, arg, self._store._channel)

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The script calls to make: queued ops, then one ``sync`` (which refreshes the view)
        with the outcomes of the newest epoch queued: the script counts an outcome only in
        the fleet's current epoch, which no older one can be."""
        ops, outcomes = self._ops, self._outcomes
        calls = [ops.popleft() for _ in range(len(ops))]
        queued = [outcomes.popleft() for _ in range(len(outcomes))]
        epoch = max((at for at, _ in queued), default=-1)
        calls.append(("sync", epoch, "".join(str(code) for at, code in queued if at == epoch)))
        return [("breaker", self._script(*call)) for call in calls]

    def _lost(self) -> None:
        """The refresh failed (the outcomes it carried are dropped: the fleet's window is a
        sample)."""

    def _update(self, reply: object) -> BreakerView:
        if not isinstance(reply, list) or len(reply) != 8:
            raise _Garbage(f"breaker script returned {type(reply).__name__}")
        state = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
        numbers = reply[1:]
        if state not in _STATES or not all(type(n) is int for n in numbers):
            raise _Garbage("breaker script returned an unknown state or a non-integer")
        epoch, remaining, free, calls, failures, slow, _ = numbers
        self._until = process_clock() + remaining / 1000
        opens_in = remaining / 1000 if state == "open" else 0.0
        self._view = BreakerView(state, epoch, opens_in, free, calls, failures, slow)
        return self._view


class SharedBudget:
    """One budget's state in a :class:`RedisStore` (what :class:`~latencykit.RetryBudget`
    asks of the fleet).

    The process spends tokens it leased from the fleet at the last refresh, and leases twice
    what it asked for in the last interval, refusals included (at least one, at most
    ``_MAX_LEASE``), giving back the rest: no call waits for Redis, and an idle process holds
    one token.
    """

    def __init__(
        self, store: RedisStore, key: str, *, ratio: float, ttl: float, reserve: float
    ) -> None:
        self._store = store
        self._key = f"{store.namespace}:budget:{{{key}}}"
        self._args = (_ms(ttl / 10), ratio, reserve, _ms(2 * ttl + _IDLE_TTL))
        self._lock = threading.Lock()
        self._deposits = 0
        self._held = 0  # tokens leased from the fleet, not yet spent
        self._giving_back = 0  # tokens the refresh in progress gives back
        self._used = 0  # tokens asked for since the last refresh
        self._balance: float | None = None  # none until the first refresh

    def deposit(self) -> None:
        """Count one call (written with the next batch)."""
        with self._lock:
            self._deposits += 1

    def try_withdraw(self) -> bool | None:
        """Take one extra request: ``True`` or ``False``, or ``None`` when the store is
        unavailable (the budget then decides alone). Never a round trip: the process spends
        tokens it leased from the fleet at the last refresh."""
        if self.balance() is None:
            return None
        with self._lock:
            self._used += 1
            if self._held > 0:
                self._held -= 1
                return True
        self._store._wake_soon()  # out of tokens: lease more now rather than at the next tick
        return False

    def balance(self) -> float | None:
        """The fleet's balance as last refreshed, or ``None`` when unavailable."""
        if self._balance is None or process_clock() > self._store._fresh_until:
            return None
        return self._balance + self._held

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The script call: deposits, tokens wanted and tokens given back."""
        with self._lock:
            deposits, self._deposits = self._deposits, 0
            target = min(_MAX_LEASE, max(1, 2 * self._used))
            self._used = 0
            excess = self._held - target
            self._giving_back = max(0, excess)
            self._held -= self._giving_back
        slot_ms, ratio, reserve, ttl_ms = self._args
        args = (deposits, max(0, -excess), self._giving_back)
        return [("budget", (1, self._key, slot_ms, ratio, reserve, *args, ttl_ms))]

    def _update(self, reply: object) -> None:
        if not isinstance(reply, list) or len(reply) != 2 or type(reply[0]) is not int:
            raise _Garbage(f"budget script returned {type(reply).__name__}")
        try:
            balance = float(reply[1])
        except (TypeError, ValueError) as exc:
            raise _Garbage("budget script returned a non-number balance") from exc
        with self._lock:
            self._held += reply[0]
            self._balance = balance

    def _lost(self) -> None:
        """The refresh failed: the tokens it was to give back are still held."""
        with self._lock:
            self._held += self._giving_back


class SharedLatency:
    """One pooled latency window in a :class:`RedisStore` (what adaptive hedging's
    :class:`~latencykit.stats.Recorder` asks of the fleet): each refresh appends this
    process's new samples to the target's stream as one entry, and reads the entries the
    others appended."""

    def __init__(self, store: RedisStore, key: str, window: float) -> None:
        self._id = store._id
        self._key = f"{store.namespace}:latency:{{{key}}}"
        self._window_ms = _ms(window)
        self._outgoing: deque[float] = deque(maxlen=_MAX_QUEUED)
        self._followers: list[deque[float]] = []
        self._last = "0"  # the last stream entry read

    def record(self, seconds: float) -> None:
        """Queue this process's sample (negative: censored, the attempt was abandoned after
        that long); written with the next batch."""
        self._outgoing.append(seconds)

    def follow(self) -> deque[float]:
        """A new queue that receives the other processes' samples (negative: censored) as the
        store reads them; its owner drains it into its own window."""
        queue: deque[float] = deque(maxlen=_FOLLOWED)
        self._followers = [*self._followers, queue]  # copied: the store thread iterates it
        return queue

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        outgoing = self._outgoing
        batch = ",".join(f"{outgoing.popleft():.6g}" for _ in range(len(outgoing)))
        return [("latency", (1, self._key, self._id, self._last, self._window_ms, batch))]

    def _lost(self) -> None:
        """The refresh failed (its samples are dropped: a window is a sample)."""

    def _update(self, reply: object) -> None:
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], bytes):
            raise _Garbage(f"latency script returned {type(reply).__name__}")
        try:
            samples = [float(v) for batch in reply[1:] for v in batch.split(b",")]
        except (AttributeError, ValueError) as exc:
            raise _Garbage("latency script returned a batch that is not numbers") from exc
        self._last = reply[0].decode()
        if samples:
            for queue in self._followers:
                queue.extend(samples)


class _Adjustments:
    """The quota adjustments queued for the next refresh (``quota.lua`` never waits for
    them)."""

    def __init__(self) -> None:
        self.queue: deque[tuple[str, float, float, float]] = deque(maxlen=_MAX_QUEUED)

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        queue = self.queue
        return [("quota", (1, *queue.popleft(), _NO_LIMIT)) for _ in range(len(queue))]

    def _lost(self) -> None:
        """The refresh failed (its adjustments are dropped: the buckets refill anyway)."""

    def _update(self, reply: object) -> None:
        if not isinstance(reply, bytes):
            raise _Garbage(f"quota script returned {type(reply).__name__}")


class SharedRoom:
    """One provider rate-limit room (a target and API key hash) in a :class:`RedisStore`: what
    :class:`~latencykit.policies.governor.Governor` asks of the fleet (a
    :class:`~latencykit.ratelimit.Lease`).

    ``room.lua`` merges the answers' headers on the server and hands out leases. The process
    spends its lease with no round trip; each refresh gives back what it does not need and
    leases twice what the process asked for in the last interval (at least one attempt's
    worth, at most its share of ``_LEASE_SHARE`` of the limit), down to the reserve of the
    highest lane that asked. While nobody has told the fleet the room, one worker holds its
    probe (taken on the server, ``SET NX PX``) and finds it out, and the others wait.
    """

    def __init__(self, store: RedisStore, key: str) -> None:
        self._store = store
        base = f"{store.namespace}:room:{{{key}}}"  # {key}: both keys in one cluster slot
        self._keys = (base, f"{base}:workers", f"{base}:leases", f"{base}:probe")
        self._lock = threading.Lock()
        self.held_requests = 0.0
        self.held_tokens = 0.0
        self._asked = [0.0, 0.0]  # requests and tokens asked for since the last refresh
        self._biggest = 1.0  # tokens of the biggest attempt asked for lately
        self._rank = len(RESERVES) - 1  # the highest lane that asked since the last refresh
        self._giving = (0.0, 0.0)  # what the refresh in progress gives back
        self._told: tuple[RateLimits, float] | None = None  # newest answer, not yet sent
        self._sending: tuple[RateLimits, float] | None = None
        self._last: tuple[RateLimits, float] | None = None  # resent to a server without it
        self._view: FleetView | None = None
        self._probe = False  # whether this worker may find out the room (the server says)
        self._probing_until = 0.0  # process_clock() until which it asks for the probe
        self._answered = False  # whether an answer came back to this worker
        self._wakes: list[Callable[[], None]] = []
        self._drained_at = self._made_at = process_clock()

    def view(self) -> FleetView | None:
        """The fleet's room as last refreshed, ``None`` when the store is unavailable."""
        return None if process_clock() > self._store._fresh_until else self._view

    def joining(self) -> bool:
        """See :class:`~latencykit.ratelimit.Lease`: at most ``stale_after`` from the handle's
        making, and not once the store failed."""
        store = self._store
        return (
            store._down_since is None
            and self.view() is None  # not self._view: set before the refresh makes it fresh
            and process_clock() - self._made_at < store.stale_after
        )

    def take(self, requests: float, tokens: float, rank: int, fits: bool) -> bool:
        """See :class:`~latencykit.ratelimit.Lease`."""
        with self._lock:
            if fits:
                self._asked[0] += requests
                self._asked[1] += tokens
                self._biggest = max(self._biggest, tokens)
                self._rank = min(self._rank, rank)
                if self.held_requests >= requests and self.held_tokens >= tokens:
                    self.held_requests -= requests
                    self.held_tokens -= tokens
                    return True
        if fits:
            self._store._wake_soon()  # out of lease: lease more now, not at the next tick
        return False

    def give(self, tokens: float) -> None:
        """See :class:`~latencykit.ratelimit.Lease`."""
        with self._lock:
            self.held_tokens += tokens

    def find_out(self) -> bool:
        """See :class:`~latencykit.ratelimit.Lease`: asks the server for the probe (held while
        calls of this worker ask, and ``_PROBE_FOR`` seconds more)."""
        now = process_clock()
        if now >= self._probing_until and not self._probe:
            self._store._wake_soon()  # the probe within a round trip, not an interval
        self._probing_until = now + _PROBE_FOR
        last = self._last
        if last is not None and (
            last[0].requests_remaining is not None or last[0].tokens_remaining is not None
        ):
            return False  # the limits it heard are on their way: spent from the fleet's room
        return self._probe

    def heard(self, limits: RateLimits) -> None:
        """See :class:`~latencykit.ratelimit.Lease`."""
        self._told = self._last = (limits, process_clock())
        view = self._view
        if view is None or (view.requests_limit is None and view.tokens_limit is None):
            self._store._wake_soon()  # the fleet waits for this word: send it now

    def came_back(self) -> None:
        """See :class:`~latencykit.ratelimit.Lease`."""
        if not self._answered:
            self._answered = True
            self._store._wake_soon()

    def listen(self, wake: Callable[[], None]) -> None:
        """See :class:`~latencykit.ratelimit.Lease`."""
        if wake not in self._wakes:
            self._wakes.append(wake)

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        view = self._view
        answered = self._answered  # before what it told: an answer tells, then came back
        told, self._told = self._told, None
        if told is None and (view is None or view.requests_limit is None):
            told = self._last  # a server that lost the room (restarted) learns it again
        self._sending = told
        workers = 1 if view is None else max(1, view.workers)
        now = process_clock()
        # The pace asked for, over an interval: a refresh woken early by an empty lease
        # leases for the interval to come, not for the few milliseconds since the last one.
        scale = self._store.interval / max(now - self._drained_at, 1e-3)
        self._drained_at = now
        with self._lock:
            asked, self._asked = self._asked, [0.0, 0.0]
            rank, self._rank = self._rank, len(RESERVES) - 1
            wanted = []
            giving = []
            for i, (held, limit, least) in enumerate(
                (
                    (self.held_requests, view and view.requests_limit, 1.0),
                    (self.held_tokens, view and view.tokens_limit, self._biggest),
                )
            ):
                most = math.inf if not limit else max(least, limit * _LEASE_SHARE / workers)
                goal = min(most, max(least, 2 * asked[i] * scale))
                back = held - goal if held > goal else min(0.0, held)  # leftovers, or a debt
                giving.append(back)
                wanted.append(max(0.0, goal - (held - back)))
            self._giving = (giving[0], giving[1])
            self.held_requests -= giving[0]
            self.held_tokens -= giving[1]
            holding = (self.held_requests, self.held_tokens)
        if told is None:
            said: tuple[Any, ...] = ("",) * 8
        else:
            limits, at = told
            said = (
                *("" if x is None else x for x in dataclasses.astuple(limits)),
                max(0.0, process_clock() - at),
            )
        probing = "1" if process_clock() < self._probing_until else "0"
        args = (
            4, *self._keys, self._store._id, *said, *wanted, *giving, RESERVES[rank],
            _ROOM_TTL, _SEEN_FOR, *holding, probing, "1" if answered else "0",
            _ms(_PROBE_FOR), self._store._channel,
        )  # fmt: skip
        return [("room", args)]

    def _lost(self) -> None:
        """The refresh failed: what it gave back is still held, what it told is told again."""
        with self._lock:
            self.held_requests += self._giving[0]
            self.held_tokens += self._giving[1]
        if self._told is None:
            self._told = self._sending

    def _update(self, reply: object) -> None:
        if not isinstance(reply, list) or len(reply) != 11 or type(reply[9]) is not int:
            raise _Garbage(f"room script returned {type(reply).__name__}")
        try:
            numbers = [float(x) for x in reply[:9]]
        except (TypeError, ValueError) as exc:
            raise _Garbage("room script returned a non-number") from exc
        granted_r, granted_t, r_left, r_limit, r_rate, t_left, t_limit, t_rate, paused = numbers
        now = process_clock()
        with self._lock:
            self.held_requests += granted_r
            self.held_tokens += granted_t
        self._view = FleetView(
            r_left, None if r_limit < 0 else r_limit, r_rate,
            t_left, None if t_limit < 0 else t_limit, t_rate,
            now + paused, reply[9], self._store.interval,
        )  # fmt: skip
        self._probe = reply[10] == 1
        for wake in self._wakes:
            wake()


_Owner: TypeAlias = (
    "_Adjustments | SharedBreaker | SharedBudget | SharedConcurrency | SharedLatency | SharedRoom"
)
"""What a refresh drains and updates."""


class RedisStore:
    """Fleet-wide state on a Redis (or Valkey) server, what the policies' ``shared=`` takes
    (and :func:`~latencykit.use_store`).

    Args:
        url: the server, as the ``redis`` client takes it (``redis://[[user]:password@]host:
            port/db``, ``rediss://`` for TLS, ``unix://path``). Default
            ``"redis://127.0.0.1:6379/0"``.
        namespace: prefix of every key (default ``"latencykit"``): apps sharing a server use
            one each.
        interval: seconds between two refreshes of the local view, which also write the
            queued outcomes (default ``0.1``). A fleet breaker opens at most about one
            interval after its failure rate crosses the threshold, and every process learns
            it within one more.
        timeout: longest wait for the server, in seconds, for a call that needs it (a probe
            permit, a quota) (default ``0.1``). A refresh, which no call waits for, may take
            up to ``stale_after`` before it counts as an outage.
        stale_after: seconds after the last successful refresh from which the view is no
            longer used and policies fall back to process-local state (default ``None``:
            ``max(1.0, 5 * interval)``).

    Needs the ``redis`` package (``pip install 'latencykit[redis]'``; ``hiredis`` speeds it up
    when installed). Nothing connects until a policy first uses the store. A store that
    cannot be reached, is slow or answers garbage never fails a call: the policies go on with
    process-local state, :class:`~latencykit.fleet.StoreUnavailable` is emitted and logged
    once, and :class:`~latencykit.fleet.StoreRecovered` when it answers again.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "latencykit",
        interval: float = 0.1,
        timeout: float = 0.1,
        stale_after: float | None = None,
    ) -> None:
        try:
            import redis.asyncio  # noqa: F401  (fail now, not in the background task)
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise ImportError(
                "RedisStore needs the redis package: pip install 'latencykit[redis]'"
            ) from exc
        from urllib.parse import urlsplit

        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                "RedisStore.url must be a redis://, rediss:// or unix:// URL, got "
                f"{_redact(url) if isinstance(url, str) else url!r}"
            )
        if _validation.text("RedisStore.namespace", namespace).split() != [namespace]:
            raise ValueError(f"RedisStore.namespace must be a word, got {namespace!r}")
        self.url = url
        self.namespace = namespace
        self._channel = f"{namespace}:changes"  # where the scripts announce state changes
        self.interval = _validation.seconds("RedisStore.interval", interval, minimum=0.001)
        self.timeout = _validation.seconds("RedisStore.timeout", timeout, minimum=0.001)
        self.stale_after = (
            max(1.0, 5 * self.interval)
            if stale_after is None
            else _validation.seconds("RedisStore.stale_after", stale_after, minimum=self.interval)
        )
        # Every handle, by kind and key: each refresh writes what they queued and updates them.
        self._handles: dict[tuple[str, str], _Owner] = {}
        self._id = os.urandom(8).hex()  # this process's (this store's) name in the streams
        self._adjustments = _Adjustments()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._client: Any = None
        self._shas: dict[str, str] = {}
        self._closed = False
        self._down_since: float | None = None
        self._fresh_until = 0.0  # process_clock() until which the views may be used
        self.available = False
        """Whether the last exchange with the server succeeded (read-only)."""

    def __repr__(self) -> str:
        return f"RedisStore({_redact(self.url)!r}, namespace={self.namespace!r})"

    # --- what the policies ask of a store -------------------------------------------------------

    def breaker(self, key: str, options: BreakerOptions) -> SharedBreaker:
        """The shared state of the breaker ``key`` (the same object for the same key)."""
        return self._handle("breaker", key, lambda: SharedBreaker(self, key, options))

    def budget(self, key: str, *, ratio: float, ttl: float, reserve: float) -> SharedBudget:
        """The shared state of the budget ``key`` (``reserve``: extra requests always allowed
        per ``ttl``)."""
        return self._handle(
            "budget", key, lambda: SharedBudget(self, key, ratio=ratio, ttl=ttl, reserve=reserve)
        )

    def latency(self, key: str, *, window: float) -> SharedLatency:
        """The pooled latency window ``key`` (samples count for ``window`` seconds)."""
        return self._handle("latency", key, lambda: SharedLatency(self, key, window))

    def room(self, target: str, key_hash: str) -> SharedRoom:
        """The fleet's rate-limit room of ``target`` for the API key hashed ``key_hash``
        (:func:`latencykit.ratelimit.key_hash`; never the key itself)."""
        key = f"{target}:{key_hash}"
        return self._handle("room", key, lambda: SharedRoom(self, key))

    def concurrency(
        self,
        target: str,
        report: Callable[[], tuple[int, int, int]],
        wake: Callable[[], None],
    ) -> SharedConcurrency:
        """A new worker in the fleet's adaptive concurrency of ``target`` (see
        :class:`SharedConcurrency`: ``report`` and ``wake`` run on the store's thread)."""
        worker = f"{self._id}:{os.urandom(4).hex()}"  # a process may hold several
        return self._handle(
            "concurrency", worker, lambda: SharedConcurrency(self, target, worker, report, wake)
        )

    def _handle(self, kind: str, key: str, make: Callable[[], H]) -> H:
        """The handle of ``key``, made on first use (which starts the background task)."""
        found = self._handles.get((kind, key))
        if found is None:
            with self._lock:
                found = self._handles.setdefault((kind, key), make())
            self._start()
            self._wake_soon()  # its first view within a round trip, not an interval
        return cast(H, found)

    async def take(
        self, key: str, amount: float, *, rate: float, burst: float, max_wait: float
    ) -> float | None:
        """Take ``amount`` tokens from the token bucket ``key`` (``rate`` per second, up to
        ``burst``) if they are there within ``max_wait`` seconds, and return the wait (a round
        trip, bounded by the store's timeout); ``None`` if the store could not answer.

        As the limiter's own buckets: the tokens are taken when the wait fits (the bucket may
        go negative: the caller reserved the tokens that arrive meanwhile); a wait above
        ``max_wait`` means nothing was taken."""
        self._start()
        args = (1, self._quota_key(key), amount, rate, burst, max_wait)
        return await self._round_trip(_wait_of, "quota", *args)

    def adjust(self, key: str, amount: float, *, rate: float, burst: float) -> None:
        """Charge ``amount`` more tokens to the bucket ``key`` (into debt if need be), or give
        them back when negative; written with the next batch, never waited for."""
        self._start()
        self._adjustments.queue.append((self._quota_key(key), amount, rate, burst))

    def _quota_key(self, key: str) -> str:
        return f"{self.namespace}:quota:{{{key}}}"

    # --- lifecycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is not None or self._closed:
            return
        import asyncio

        from .._asyncio_bridge import shared_loop

        with self._lock:
            if self._task is None:
                self._loop = shared_loop()
                self._task = asyncio.run_coroutine_threadsafe(self._run(), self._loop)  # type: ignore[assignment]

    def _wake_soon(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(wake.set)

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (within ``timeout`` seconds, default ``1``), stop the
        background task and disconnect. Policies using the store then go process-local."""
        self._closed = True
        task = self._task
        if task is None:
            return
        self._wake_soon()
        with contextlib.suppress(Exception):
            task.result(timeout)  # type: ignore[call-arg]
        self.available = False

    # --- the background task (on the shared loop) ---------------------------------------------

    async def _run(self) -> None:
        import asyncio

        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No call waits for a refresh: it may take longer than a call's round trip (a busy
        # process, a big batch) before it counts as an outage, within the staleness bound.
        refresh_timeout = max(self.timeout, self.stale_after)
        self._wake = asyncio.Event()
        self._client = redis.asyncio.Redis.from_url(
            self.url,
            # The refresh's bound; calls' round trips have their own (wait_for, timeout).
            socket_timeout=refresh_timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),  # this task retries, on its own schedule
        )
        listener = asyncio.ensure_future(self._listen())
        delay = 0.0
        try:
            while True:
                if delay:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                self._wake.clear()
                closing = self._closed
                try:
                    await asyncio.wait_for(self._refresh(), refresh_timeout)
                except Exception as exc:  # never let the store fail the app
                    self._failed(exc)
                    delay = min(_MAX_BACKOFF, max(self.interval, 2 * delay))
                else:
                    self._recovered()
                    delay = self.interval
                if closing:
                    return
        finally:
            self.available = False
            listener.cancel()
            with contextlib.suppress(BaseException):
                await listener
            with contextlib.suppress(Exception):
                await self._client.aclose()

    async def _listen(self) -> None:
        """Refresh as soon as any process's script announces a state change (pub/sub), so a
        breaker opened by one process stops the others within a round trip, not an interval.
        Best effort: the periodic refresh does not depend on it."""
        import asyncio

        import redis.asyncio

        wake = self._wake
        assert wake is not None
        while True:
            # Its own connection, without a read timeout: it waits for messages.
            client = redis.asyncio.Redis.from_url(
                self.url, socket_timeout=None, socket_connect_timeout=self.timeout
            )
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self._channel)
                    async for _ in pubsub.listen():
                        wake.set()
            except Exception:  # the periodic refresh reports outages; retry quietly
                await asyncio.sleep(_MAX_BACKOFF)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _load_scripts(self) -> None:
        from importlib import resources  # ~7 ms at import: only the store needs it

        client = self._client
        for name in _SCRIPT_NAMES:
            text = resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8")
            self._shas[name] = await client.script_load(text)

    async def _refresh(self) -> None:
        """One round trip: write what is queued, read every view."""
        if not self._shas:
            await self._load_scripts()
        pipe = self._client.pipeline(transaction=False)
        plan: list[_Owner] = []
        for owner in [self._adjustments, *self._handles.values()]:
            for script, args in owner._drain():
                pipe.evalsha(self._shas[script], *args)
                plan.append(owner)
        if not plan:
            await self._client.ping()
            return
        try:
            replies = await pipe.execute()
        except BaseException:
            for owner in plan:
                owner._lost()
            raise
        fresh_until = process_clock() + self.stale_after
        for owner, reply in zip(plan, replies, strict=True):
            owner._update(reply)
        self._fresh_until = fresh_until

    async def _round_trip(self, parse: Callable[[Any], T], script: str, *args: Any) -> T | None:
        """A call's round trip (bounded by ``timeout``): the script's reply, parsed; ``None``
        when the store could not answer (the policy then decides alone)."""
        if not self.available:
            return None
        import asyncio

        from .._asyncio_bridge import run_on_shared_loop

        async def call() -> T | None:  # on the store's loop, as everything touching its state
            try:
                reply = await asyncio.wait_for(
                    self._client.evalsha(self._shas[script], *args), self.timeout
                )
                return parse(reply)
            except Exception as exc:  # never let the store fail the call
                self._failed(exc)
                return None

        return await run_on_shared_loop(call())

    # --- health --------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        # Views age out by themselves; drop them now so policies go local at once.
        self._fresh_until = 0.0
        self._shas.clear()  # a restarted server has lost them
        self.available = False
        if self._down_since is not None:
            return
        self._down_since = process_clock()
        reason = type(exc).__name__
        logger.warning(
            "latencykit: shared store %r is unavailable (%s); policies use process-local "
            "state until it answers again",
            self,
            reason,
        )
        if events.listening():
            events.emit(StoreUnavailable(call_id=0, store=repr(self), reason=reason))

    def _recovered(self) -> None:
        self.available = True
        if self._down_since is None:
            return
        down_for = process_clock() - self._down_since
        self._down_since = None
        logger.warning("latencykit: shared store %r answers again (after %.1fs)", self, down_for)
        if events.listening():
            events.emit(StoreRecovered(call_id=0, store=repr(self), down_for=down_for))


def _wait_of(reply: Any) -> float:
    """``quota.lua``'s reply: the wait, in seconds."""
    wait = float(reply)
    if not math.isfinite(wait) or wait < 0:
        raise _Garbage("quota script returned a negative or infinite wait")
    return wait


def _redact(url: str) -> str:
    """``url`` without its password (nor user name)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=f"***@{parts.netloc.rpartition('@')[2]}").geturl()


class ConcurrencyView(NamedTuple):
    """The fleet's adaptive concurrency for one target, as a :class:`SharedConcurrency` last
    refreshed it."""

    limit: float
    """The fleet's limit: the mean of the workers' estimates."""
    in_flight: int
    """The other workers' attempts in flight."""
    demand: int
    """The other workers' attempts in flight and waiting."""
    workers: int
    """The workers seen lately, this one included."""


class SharedConcurrency:
    """One worker's (an :class:`~latencykit.policies.concurrency.AdaptiveConcurrency`
    stage's) part in a target's adaptive concurrency shared by the fleet, in a
    :class:`RedisStore`.

    Each refresh tells ``concurrency.lua`` what ``report`` returns (the worker's attempts in
    flight, its demand, its estimate of the limit) and reads back the others' and the fleet's
    limit (:class:`ConcurrencyView`); then ``wake`` runs (on the store's thread). A worker not
    heard from for ``_SEEN_FOR`` seconds no longer counts.
    """

    def __init__(
        self,
        store: RedisStore,
        target: str,
        worker: str,
        report: Callable[[], tuple[int, int, int]],
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._key = f"{store.namespace}:concurrency:{{{target}}}"
        self._worker = worker
        self._report = report
        self._wake = wake
        self._view: ConcurrencyView | None = None
        self._made_at = process_clock()

    def view(self) -> ConcurrencyView | None:
        """The fleet's view as last refreshed, ``None`` when the store is unavailable."""
        return None if process_clock() > self._store._fresh_until else self._view

    def joining(self) -> bool:
        """Whether the worker has not heard the fleet yet, within ``stale_after`` of its
        making, and the store has not failed."""
        store = self._store
        return (
            self._view is None
            and store._down_since is None
            and process_clock() - self._made_at < store.stale_after
        )

    def _drain(self) -> list[tuple[str, tuple[Any, ...]]]:
        in_flight, demand, estimate = self._report()
        args = (1, self._key, self._worker, in_flight, demand, estimate, _SEEN_FOR, _ROOM_TTL)
        return [("concurrency", args)]

    def _lost(self) -> None:
        """The refresh failed (the next one tells the worker's state again)."""

    def _update(self, reply: object) -> None:
        if not isinstance(reply, list) or len(reply) != 4:
            raise _Garbage(f"concurrency script returned {type(reply).__name__}")
        try:
            in_flight, demand, workers, limit = (float(x) for x in reply)
        except (TypeError, ValueError) as exc:
            raise _Garbage("concurrency script returned a non-number") from exc
        self._view = ConcurrencyView(limit, int(in_flight), int(demand), max(1, int(workers)))
        self._wake()
