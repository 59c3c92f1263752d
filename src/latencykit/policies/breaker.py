"""``breaker``: stop calling a target that is failing, and probe it before trusting it again.

A resilience4j-style circuit breaker, one per target key, shared process-wide through a small
registry (:func:`breaker`):

* **CLOSED**: calls go through; their outcomes fill a sliding window (the last ``window_size``
  calls, or the calls of the last ``window_size`` seconds). Once the window holds at least
  ``minimum_calls`` calls and the failure rate or the slow-call rate reaches its threshold, the
  breaker **opens**.
* **OPEN**: calls are refused at once with :class:`CircuitOpen` (the wrapped callable is not
  called) for ``open_duration`` seconds; then the breaker is **half-open**.
* **HALF_OPEN**: at most ``half_open_calls`` probe calls are admitted, the others refused. When
  every probe has finished and their rates are under the thresholds, the breaker closes with an
  empty window; as soon as the probes' rates are bound to reach a threshold, it opens again
  (for twice as long each time in a row when ``max_open_duration`` is set).
* **FORCED_OPEN**: :meth:`Breaker.isolate` refuses every call until :meth:`Breaker.reset`.

Only provider-health errors count as failures (by default the transient ones: 429, 5xx,
connection, timeouts, broken streams). Other errors (bad request, context length, content
policy, authentication, bugs) and cancellations are *ignored*: they neither help nor hurt.

Everything the breaker knows lives in a :class:`BreakerSnapshot` kept by a
:class:`BreakerStore` (in memory by default), so that a shared store can later spread a
breaker's state across processes.
"""

from __future__ import annotations

import datetime
import functools
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, ParamSpec, Protocol, TypeVar, runtime_checkable

from .. import _validation, events
from .. import fleet as _fleet
from .._cancel import clock as loop_clock
from .._context import probe_var, trace_var
from .._values import BreakerState
from ..errors import (
    CircuitOpen,
    ErrorFilter,
    LimitExceeded,
    error_predicate,
    is_transient,
)
from ..events import BreakerRejected, BreakerStateChanged, Event
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stream import Stream, StreamOutcome

__all__ = [
    "Breaker",
    "BreakerMetrics",
    "BreakerPermit",
    "BreakerRejected",
    "BreakerSnapshot",
    "BreakerState",
    "BreakerStateChanged",
    "BreakerStore",
    "CircuitOpen",
    "InMemoryBreakerStore",
    "breaker",
    "breakers",
    "reset_breakers",
]

P = ParamSpec("P")
R = TypeVar("R")

TIME_BUCKETS = 20
"""A time window moves in steps of ``window_size / TIME_BUCKETS`` seconds."""

# Codes of a count window's slots: 0 = empty, else _CALL plus the flags.
_CALL, _FAILED, _SLOW = 1, 2, 4

_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_FORCED_OPEN = BreakerState.FORCED_OPEN


# --- state and its store ----------------------------------------------------------------------


@dataclass(slots=True)
class BreakerSnapshot:
    """Everything a breaker knows about its key, as plain data a store can keep or serialize.

    A :class:`Breaker` reads it from its :class:`BreakerStore` at every operation, changes it,
    and writes it back. Times are on the breaker's ``clock`` (the event loop's clock by default: a
    store shared between processes needs a shared clock, such as ``time.time``).

    Attributes:
        shape: the window's layout (``"count/100"``, ``"time/60.0"``); a breaker finding
            another shape in its store starts a fresh window (the state is kept).
        state: the current :class:`BreakerState` (default ``CLOSED``).
        period: counts state changes (and resets); a :class:`BreakerPermit` taken in an earlier
            period is stale and its outcome is dropped.
        since: when the current state was entered.
        open_for: seconds the current (or last) open state lasts.
        probes: half-open probe permits taken (in flight or finished) in this period.
        probe_calls: probes finished and counted; ``probe_failures`` and ``probe_slow`` among
            them failed or were slow.
        probe_failures: counted probes that failed.
        probe_slow: counted probes that were slow.
        calls: calls in the window; ``failures`` and ``slow`` among them failed or were slow.
        failures: failed calls in the window.
        slow: slow calls in the window.
        cursor: count window: the next slot to write; time window: the number of the newest
            bucket (``floor(time / bucket width)``).
        window: the window's contents, owned by the breaker: for a count window one code per
            slot (``0`` empty, else ``1 | 2 if failed | 4 if slow``); for a time window
            ``calls, failures, slow`` per bucket.
    """

    shape: str
    state: BreakerState = _CLOSED
    period: int = 0
    since: float = 0.0
    open_for: float = 0.0
    probes: int = 0
    probe_calls: int = 0
    probe_failures: int = 0
    probe_slow: int = 0
    calls: int = 0
    failures: int = 0
    slow: int = 0
    cursor: int = 0
    window: list[int] = field(default_factory=list)


@runtime_checkable
class BreakerStore(Protocol):
    """Where breakers keep their :class:`BreakerSnapshot`, by key. Synchronous and tiny.

    A breaker calls ``get`` at each operation and ``put`` after each change, under its own lock
    (so within a process the read-modify-write is atomic; across processes a shared store is
    last-writer-wins).
    """

    def get(self, key: str) -> BreakerSnapshot | None:
        """The snapshot stored for ``key``, or ``None`` if there is none yet."""
        ...

    def put(self, key: str, snapshot: BreakerSnapshot) -> None:
        """Store ``snapshot`` for ``key``, replacing any previous one."""
        ...


class InMemoryBreakerStore:
    """A :class:`BreakerStore` in a dict, for one process (the default).

    ``get`` hands out the stored snapshot itself (no copy), so breakers sharing this store
    share their state. ``snapshots`` is a read-only view of everything stored.
    """

    __slots__ = ("_snapshots", "snapshots")

    def __init__(self) -> None:
        self._snapshots: dict[str, BreakerSnapshot] = {}
        self.snapshots: Mapping[str, BreakerSnapshot] = MappingProxyType(self._snapshots)

    def __repr__(self) -> str:
        return f"InMemoryBreakerStore(keys={sorted(self._snapshots)!r})"

    def get(self, key: str) -> BreakerSnapshot | None:
        """The snapshot stored for ``key``, or ``None``."""
        return self._snapshots.get(key)

    def put(self, key: str, snapshot: BreakerSnapshot) -> None:
        """Store ``snapshot`` for ``key``."""
        self._snapshots[key] = snapshot


class BreakerPermit(NamedTuple):
    """Permission to make one call, from :meth:`Breaker.acquire`; hand it to ``record``.

    Attributes:
        period: the breaker's period when it was taken (outcomes of stale permits are dropped).
        probe: whether it is one of the half-open probe permits.
        epoch: the fleet breaker's epoch when a shared store granted it (its outcome goes to
            the store); ``-1`` (the default) when the process-local state granted it.
    """

    period: int
    probe: bool
    epoch: int = -1


class BreakerMetrics(NamedTuple):
    """What a breaker's window holds now (see :meth:`Breaker.metrics`).

    Attributes:
        state: the current state.
        calls: calls in the window (``successes + failures``).
        successes: calls in the window that succeeded.
        failures: calls in the window that failed.
        slow_calls: calls in the window (successful or failed) that were slow.
        failure_rate: ``failures / calls`` (``0.0`` with no calls).
        slow_call_rate: ``slow_calls / calls`` (``0.0`` with no calls).
        probes: half-open probe permits taken and not yet counted (in flight).
    """

    state: BreakerState
    calls: int
    successes: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    probes: int


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _fraction(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


# --- the breaker ------------------------------------------------------------------------------


class Breaker(PolicyDecorator):
    """A circuit breaker for one target key; also a policy and a decorator.

    ``Breaker(...)`` makes a private breaker; :func:`breaker` returns the one shared
    process-wide for a key (use that unless you need an unshared one). The arguments are
    :func:`breaker`'s; each is also a read-only attribute of the same name (``counts`` is the
    predicate in force, ``store`` the store in use).

    As a policy (``stage = Stage.BREAKER``) it asks for a permit, raises :class:`CircuitOpen`
    without calling ``next`` when refused, times the call with ``clock`` and records its
    outcome. Failover and custom code can drive it directly: :meth:`allows`, :meth:`acquire`,
    :meth:`record`.
    """

    stage = Stage.BREAKER
    __slots__ = (
        "_bucket_width",
        "_closed_permit",
        "_fleet_handle",
        "_fleet_options",
        "_lock",
        "_mirrored",
        "_options",
        "_shape",
        "_size",
        "clock",
        "counts",
        "failure_rate",
        "half_open_calls",
        "key",
        "max_open_duration",
        "minimum_calls",
        "open_duration",
        "shared",
        "slow_call_duration",
        "slow_call_rate",
        "store",
        "window_size",
        "window_type",
    )

    def __init__(
        self,
        key: str,
        *,
        window_type: Literal["count", "time"] = "count",
        window_size: float | datetime.timedelta = 100,
        minimum_calls: int = 20,
        failure_rate: float = 0.5,
        slow_call_rate: float = 1.0,
        slow_call_duration: float | datetime.timedelta = 60.0,
        open_duration: float | datetime.timedelta = 30.0,
        max_open_duration: float | datetime.timedelta | None = None,
        half_open_calls: int = 3,
        counts: ErrorFilter | None = None,
        store: BreakerStore | None = None,
        shared: _fleet.SharedStore | None = None,
        clock: Callable[[], float] = loop_clock,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"breaker.key must be a non-empty string, got {key!r}")
        self.key = key
        if window_type == "count":
            self.window_size: float = _positive_int("breaker.window_size", window_size)
            self._size = int(self.window_size)
            self._bucket_width = 0.0
        elif window_type == "time":
            self.window_size = _validation.seconds("breaker.window_size", window_size)
            self._size = TIME_BUCKETS
            self._bucket_width = self.window_size / TIME_BUCKETS
        else:
            raise ValueError(f"breaker.window_type must be 'count' or 'time', got {window_type!r}")
        self.window_type: Literal["count", "time"] = window_type
        self.minimum_calls = _positive_int("breaker.minimum_calls", minimum_calls)
        if window_type == "count" and self.minimum_calls > self.window_size:
            raise ValueError(
                f"breaker.minimum_calls ({self.minimum_calls}) must not exceed "
                f"breaker.window_size ({self._size}) for a count window: it could never open"
            )
        self.failure_rate = _fraction("breaker.failure_rate", failure_rate)
        self.slow_call_rate = _fraction("breaker.slow_call_rate", slow_call_rate)
        self.slow_call_duration = _validation.seconds(
            "breaker.slow_call_duration", slow_call_duration
        )
        self.open_duration = _validation.seconds("breaker.open_duration", open_duration)
        self.max_open_duration: float | None = None
        if max_open_duration is not None:
            self.max_open_duration = _validation.seconds(
                "breaker.max_open_duration", max_open_duration
            )
            if self.max_open_duration < self.open_duration:
                raise ValueError(
                    f"breaker.max_open_duration ({self.max_open_duration:g}s) must not be "
                    f"shorter than breaker.open_duration ({self.open_duration:g}s)"
                )
        self.half_open_calls = _positive_int("breaker.half_open_calls", half_open_calls)
        self.counts: Callable[[BaseException], bool] = (
            is_transient if counts is None else error_predicate(counts, "breaker.counts")
        )
        if store is not None and not isinstance(store, BreakerStore):
            raise TypeError(f"breaker.store must be a BreakerStore (get/put), got {store!r}")
        self.store: BreakerStore = InMemoryBreakerStore() if store is None else store
        if not callable(clock):
            raise TypeError(f"breaker.clock must be a callable returning seconds, got {clock!r}")
        self.clock = clock
        if shared is not None and not isinstance(shared, _fleet.SharedStore):
            raise TypeError(f"breaker.shared must be a SharedStore (RedisStore), got {shared!r}")
        self.shared = shared
        self._fleet_options = _fleet.BreakerOptions(
            window_type,
            self.window_size,
            self.minimum_calls,
            self.failure_rate,
            self.slow_call_rate,
            self.open_duration,
            self.max_open_duration,
            self.half_open_calls,
        )
        self._fleet_handle: tuple[_fleet.SharedStore, _fleet.SharedBreaker] | None = None
        self._mirrored = -1  # the fleet epoch last copied into the local snapshot
        self._shape = f"{window_type}/{self.window_size!r}"
        self._lock = threading.Lock()
        self._closed_permit = BreakerPermit(-1, False)
        # What the registry compares: the options as given (normalised), not the defaults made.
        self._options: tuple[tuple[str, object], ...] = (
            ("window_type", window_type),
            ("window_size", self.window_size),
            ("minimum_calls", self.minimum_calls),
            ("failure_rate", self.failure_rate),
            ("slow_call_rate", self.slow_call_rate),
            ("slow_call_duration", self.slow_call_duration),
            ("open_duration", self.open_duration),
            ("max_open_duration", self.max_open_duration),
            ("half_open_calls", self.half_open_calls),
            ("counts", counts),
            ("store", store),
            ("shared", shared),
            ("clock", clock),
        )

    def __repr__(self) -> str:
        return (
            f"breaker({self.key!r}, window_type={self.window_type!r}, "
            f"window_size={self.window_size!r}, failure_rate={self.failure_rate:g})"
        )

    # --- snapshot plumbing (always under self._lock) --------------------------------------

    def _load(self) -> BreakerSnapshot:
        snap = self.store.get(self.key)
        if snap is None or snap.shape != self._shape:
            snap = self._fresh(snap)
            self.store.put(self.key, snap)
        return snap

    def _fresh(self, old: BreakerSnapshot | None) -> BreakerSnapshot:
        now = self.clock()
        snap = BreakerSnapshot(shape=self._shape, since=now, open_for=self.open_duration)
        if old is not None:  # another layout in the store: keep the state, not the window
            snap.state, snap.period, snap.since, snap.open_for = (
                old.state,
                old.period + 1,
                old.since,
                old.open_for,
            )
        if self.window_type == "count":
            snap.window = [0] * self._size
        else:
            snap.window = [0] * (3 * self._size)
            snap.cursor = math.floor(now / self._bucket_width)
        return snap

    def _clear_window(self, snap: BreakerSnapshot) -> None:
        window = snap.window
        for index in range(len(window)):
            window[index] = 0
        snap.calls = snap.failures = snap.slow = 0
        if self.window_type == "count":
            snap.cursor = 0

    def _advance(self, snap: BreakerSnapshot, now: float) -> int:
        """Time window: drop the buckets that slid out; return the newest bucket's offset."""
        bucket = math.floor(now / self._bucket_width)
        cursor = snap.cursor
        if bucket > cursor:
            window, size = snap.window, self._size
            for stale in range(cursor + 1, min(bucket, cursor + size) + 1):
                at = (stale % size) * 3
                snap.calls -= window[at]
                snap.failures -= window[at + 1]
                snap.slow -= window[at + 2]
                window[at] = window[at + 1] = window[at + 2] = 0
            snap.cursor = cursor = bucket
        return (cursor % self._size) * 3  # a clock going backwards lands in the newest bucket

    def _move(
        self, snap: BreakerSnapshot, to: BreakerState, now: float
    ) -> BreakerStateChanged | None:
        """Enter state ``to``; return the event to emit (once the lock is released)."""
        event = None
        if events.listening():
            if snap.state is _HALF_OPEN:
                calls, failed, slow = snap.probe_calls, snap.probe_failures, snap.probe_slow
            else:
                calls, failed, slow = snap.calls, snap.failures, snap.slow
            trace = trace_var.get()
            event = BreakerStateChanged(
                call_id=0 if trace is None else trace.call_id,
                key=self.key,
                from_state=snap.state,
                to_state=to,
                failure_rate=_rate(failed, calls),
                slow_call_rate=_rate(slow, calls),
                calls=calls,
            )
        if to is _OPEN:
            if snap.state is _HALF_OPEN and self.max_open_duration is not None:
                snap.open_for = min(snap.open_for * 2, self.max_open_duration)
            else:
                snap.open_for = self.open_duration
        elif to is _HALF_OPEN:
            snap.probes = snap.probe_calls = snap.probe_failures = snap.probe_slow = 0
        elif to is _CLOSED:
            self._clear_window(snap)
            snap.open_for = self.open_duration
        snap.since = now
        snap.state = to
        snap.period += 1  # after the state: the lock-free path of _admit relies on it
        return event

    def _refresh(self, snap: BreakerSnapshot, now: float) -> BreakerStateChanged | None:
        """OPEN -> HALF_OPEN once ``open_for`` has passed (lazily, when somebody looks)."""
        if snap.state is _OPEN and now >= snap.since + snap.open_for:
            event = self._move(snap, _HALF_OPEN, now)
            self.store.put(self.key, snap)
            return event
        return None

    @staticmethod
    def _emit(*pending: Event | None) -> None:
        for event in pending:
            if event is not None:
                events.emit(event)

    # --- the fleet's state (a shared store) ------------------------------------------------

    def _fleet_view(self) -> tuple[_fleet.SharedBreaker | None, _fleet.BreakerView | None]:
        """The shared store's handle and view of this breaker, ``(None, None)`` without a
        store; the view is ``None`` while the store is unavailable (decide locally)."""
        store = self.shared or _fleet._current
        if store is None:
            return None, None
        cached = self._fleet_handle
        if cached is None or cached[0] is not store:
            cached = self._fleet_handle = (store, store.breaker(self.key, self._fleet_options))
        handle = cached[1]
        return handle, handle.view()

    def _mirror(self, view: _fleet.BreakerView) -> None:
        """Copy the fleet's state into the local snapshot (what ``state`` reports, and where
        the breaker starts from if the store goes away), emitting the change."""
        with self._lock:
            snap = self._load()
            to = BreakerState(view.state)
            event = None
            if snap.state is not to:
                event = self._move(snap, to, self.clock())
            if to is _OPEN:  # open for what the fleet has left, from now
                snap.since, snap.open_for = self.clock(), view.opens_in
            self.store.put(self.key, snap)
            self._mirrored = view.epoch
        self._emit(event)

    def _synced(self) -> _fleet.BreakerView | None:
        """The fleet's view, mirrored locally; ``None`` without one."""
        view = self._fleet_view()[1]
        if view is not None and view.epoch != self._mirrored:
            self._mirror(view)
        return view

    async def _fleet_probe(self, handle: _fleet.SharedBreaker) -> BreakerPermit | CircuitOpen:
        """Ask the fleet for a probe permit; decide locally if the store cannot answer."""
        answer = await handle.probe()
        if answer is None:
            return self._admit_local()
        granted, view = answer
        if view.epoch != self._mirrored:
            self._mirror(view)
        if granted:
            return BreakerPermit(self._period(), True, view.epoch)
        return self._refused(BreakerState(view.state), None)

    def _period(self) -> int:
        snap = self.store.get(self.key)
        return -1 if snap is None else snap.period

    # --- public API -----------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an expired ``OPEN`` turns ``HALF_OPEN`` when read). With a
        shared store, the fleet's state as of the store's last refresh."""
        self._synced()
        with self._lock:
            snap = self._load()
            event = self._refresh(snap, self.clock())
            state = snap.state
        self._emit(event)
        return state

    def metrics(self) -> BreakerMetrics:
        """The window's counts and rates now (a time window first drops expired calls). With
        a shared store, the fleet's window as of the store's last refresh."""
        view = self._synced()
        if view is not None:
            calls, failures, slow = view.calls, view.failures, view.slow
            return BreakerMetrics(
                state=BreakerState(view.state),
                calls=calls,
                successes=calls - failures,
                failures=failures,
                slow_calls=slow,
                failure_rate=_rate(failures, calls),
                slow_call_rate=_rate(slow, calls),
                probes=0,
            )
        with self._lock:
            snap = self._load()
            now = self.clock()
            event = self._refresh(snap, now)
            if self.window_type == "time":
                self._advance(snap, now)
                self.store.put(self.key, snap)
            calls, failures, slow = snap.calls, snap.failures, snap.slow
            result = BreakerMetrics(
                state=snap.state,
                calls=calls,
                successes=calls - failures,
                failures=failures,
                slow_calls=slow,
                failure_rate=_rate(failures, calls),
                slow_call_rate=_rate(slow, calls),
                probes=snap.probes - snap.probe_calls if snap.state is _HALF_OPEN else 0,
            )
        self._emit(event)
        return result

    def allows(self) -> bool:
        """Whether a call would be admitted now, without taking a permit (nor emitting
        :class:`BreakerRejected`). Failover uses it to skip open targets."""
        view = self._synced()
        if view is not None:
            state = view.state
            if state == "closed":
                return True
            if state == "open":
                return view.opens_in <= 0.0  # the fleet would hand out probes
            return state == "half_open" and view.free_probes > 0
        with self._lock:
            snap = self._load()
            event = self._refresh(snap, self.clock())
            state = snap.state
            allowed = state is _CLOSED or (
                state is _HALF_OPEN and snap.probes < self.half_open_calls
            )
        self._emit(event)
        return allowed

    def _admit(self) -> BreakerPermit | CircuitOpen | _fleet.SharedBreaker:
        """A permit, a refusal, or the fleet's handle when a probe permit must be asked of it."""
        handle, view = self._fleet_view()
        if view is None or handle is None:
            return self._admit_local()
        if view.epoch != self._mirrored:
            self._mirror(view)
        state = view.state
        if state == "closed":
            return BreakerPermit(self._period(), False, view.epoch)
        if state == "forced_open":
            return self._refused(_FORCED_OPEN, None)
        if state == "open" and view.opens_in > 0:
            return self._refused(_OPEN, view.opens_in)
        return handle  # half-open, or open and over: only the fleet hands out probes

    def _refused(self, state: BreakerState, wait: float | None) -> CircuitOpen:
        if events.listening():
            trace = trace_var.get()
            events.emit(
                BreakerRejected(
                    call_id=0 if trace is None else trace.call_id, key=self.key, state=state
                )
            )
        return CircuitOpen(self.key, state, wait)

    def _admit_local(self) -> BreakerPermit | CircuitOpen:
        # The hot path, CLOSED, changes nothing and takes no lock: it reads the period, then
        # the state (``_move`` writes them in the opposite order). A state read as CLOSED was
        # CLOSED in the period read, or that period is over and the permit is merely stale.
        snap = self.store.get(self.key)
        if snap is not None and snap.shape == self._shape:
            period = snap.period
            if snap.state is _CLOSED:
                permit = self._closed_permit
                if permit.period != period:
                    permit = self._closed_permit = BreakerPermit(period, False)
                return permit
        with self._lock:
            snap = self._load()
            if snap.state is _CLOSED:
                return BreakerPermit(snap.period, False)
            now = self.clock()
            event = self._refresh(snap, now)
            state = snap.state
            if state is _HALF_OPEN and snap.probes < self.half_open_calls:
                snap.probes += 1
                self.store.put(self.key, snap)
                granted: BreakerPermit | None = BreakerPermit(snap.period, True)
            else:
                granted = None
                wait = max(0.0, snap.since + snap.open_for - now) if state is _OPEN else None
        self._emit(event)
        return self._refused(state, wait) if granted is None else granted

    def acquire(self) -> BreakerPermit | None:
        """Take permission for one call: a :class:`BreakerPermit`, or ``None`` if refused.

        Refusals emit :class:`BreakerRejected`. Every permit must be handed back exactly once
        to :meth:`record` (with ``success=None`` for a call that was cancelled or whose outcome
        says nothing about the target): in ``HALF_OPEN`` an unreturned permit holds one of
        the ``half_open_calls`` probe slots.

        With a shared store, a half-open fleet breaker's probe permits are handed out by the
        store, a round trip this synchronous method cannot make: it refuses; the breaker as
        a policy (``async``) asks the store.
        """
        result = self._admit()
        return result if isinstance(result, BreakerPermit) else None

    def record(self, permit: BreakerPermit, success: bool | None, duration: float = 0.0) -> None:
        """Report the outcome of the call made under ``permit``.

        Args:
            permit: what :meth:`acquire` returned.
            success: ``True`` (succeeded), ``False`` (failed: an error that ``counts``), or
                ``None`` (ignored: cancelled, or an error that does not count; the permit is
                released and nothing is counted).
            duration: seconds the call took; a counted call of ``slow_call_duration`` or more
                is slow (default ``0.0``).

        An outcome counts only in the state spell (period) its permit was taken in: a call
        admitted while ``CLOSED`` that ends after the breaker opened changes nothing.
        """
        if success is None and not permit.probe:
            return  # an ignored call that held no probe slot: nothing to do
        slow = duration >= self.slow_call_duration
        if permit.epoch >= 0 and self._fleet_handle is not None:
            self._record_shared(self._fleet_handle[1], permit, success, slow)
            return
        with self._lock:
            snap = self.store.get(self.key)
            if snap is None or snap.shape != self._shape:
                snap = self._load()
            if permit.period != snap.period:
                return  # stale: admitted in an earlier state spell
            if permit.probe:
                event = self._probe_ended(snap, success, slow)
            else:
                self._count(snap, success is False, slow)
                event = None
                calls = snap.calls
                if calls >= self.minimum_calls and (
                    snap.failures / calls >= self.failure_rate
                    or snap.slow / calls >= self.slow_call_rate
                ):
                    event = self._move(snap, _OPEN, self.clock())
            self.store.put(self.key, snap)
        if event is not None:
            events.emit(event)

    def _record_shared(
        self,
        handle: _fleet.SharedBreaker,
        permit: BreakerPermit,
        success: bool | None,
        slow: bool,
    ) -> None:
        """A fleet permit's outcome goes to the store, which decides the transitions; the
        local window counts it too, ready for when the store goes away."""
        code = (
            0 if success is None else _CALL | (0 if success else _FAILED) | (_SLOW if slow else 0)
        )
        if permit.probe:
            handle.probe_ended(permit.epoch, code)
            return
        handle.outcome(permit.epoch, code)
        with self._lock:
            snap = self._load()
            if permit.period == snap.period and snap.state is _CLOSED:
                self._count(snap, success is False, slow)
                self.store.put(self.key, snap)

    def _probe_ended(
        self, snap: BreakerSnapshot, success: bool | None, slow: bool
    ) -> BreakerStateChanged | None:
        if snap.probes <= snap.probe_calls:  # nothing outstanding: recorded twice
            return None
        if success is None:
            snap.probes -= 1  # released: another probe may take its place
            return None
        snap.probe_calls += 1
        snap.probe_failures += not success
        snap.probe_slow += slow
        n = self.half_open_calls
        # Reopen as soon as the rates over all n probes are bound to reach a threshold;
        # close once all n are counted and they did not.
        if (
            snap.probe_failures / n >= self.failure_rate
            or snap.probe_slow / n >= self.slow_call_rate
        ):
            return self._move(snap, _OPEN, self.clock())
        if snap.probe_calls >= n:
            return self._move(snap, _CLOSED, self.clock())
        return None

    def _count(self, snap: BreakerSnapshot, failed: bool, slow: bool) -> None:
        """Add one call to the window (updating the totals only where they change)."""
        window = snap.window
        if self._bucket_width:  # time window
            at = self._advance(snap, self.clock())
            window[at] += 1
            snap.calls += 1
            if failed:
                window[at + 1] += 1
                snap.failures += 1
            if slow:
                window[at + 2] += 1
                snap.slow += 1
            return
        at = snap.cursor
        old = window[at]
        window[at] = _CALL | (_FAILED if failed else 0) | (_SLOW if slow else 0)
        snap.cursor = at + 1 if at + 1 < self._size else 0
        if old:  # a full window: the oldest call makes room
            change = failed - ((old & _FAILED) >> 1)
            if change:
                snap.failures += change
            change = slow - ((old & _SLOW) >> 2)
            if change:
                snap.slow += change
        else:
            snap.calls += 1
            if failed:
                snap.failures += 1
            if slow:
                snap.slow += 1

    def isolate(self) -> None:
        """Force the breaker open (``FORCED_OPEN``): every call is refused until :meth:`reset`.
        With a shared store, across the fleet (within one refresh)."""
        handle = self._fleet_view()[0]
        if handle is not None:
            handle.force("isolate")
        with self._lock:
            snap = self._load()
            now = self.clock()
            pending = [self._refresh(snap, now)]
            if snap.state is not _FORCED_OPEN:
                pending.append(self._move(snap, _FORCED_OPEN, now))
            self.store.put(self.key, snap)
        self._emit(*pending)

    def reset(self) -> None:
        """Back to ``CLOSED`` with an empty window, from any state; calls in flight are then
        not counted. With a shared store, across the fleet (within one refresh)."""
        handle = self._fleet_view()[0]
        if handle is not None:
            handle.force("reset")
        with self._lock:
            snap = self._load()
            now = self.clock()
            pending = [self._refresh(snap, now)]
            if snap.state is not _CLOSED:
                pending.append(self._move(snap, _CLOSED, now))
            else:
                self._clear_window(snap)
                snap.period += 1
                snap.since = now
            self.store.put(self.key, snap)
        self._emit(*pending)

    async def handle(self, call: Call, next: Next) -> Any:
        """Run ``call`` if the breaker admits it (else raise :class:`CircuitOpen`), and record
        its outcome: success, a failure if ``counts(error)``, nothing if cancelled."""
        permit = self._admit()
        if type(permit) is not BreakerPermit:  # rare: the exact type test is the cheap one
            if not isinstance(permit, (CircuitOpen, BreakerPermit)):
                permit = await self._fleet_probe(permit)
            if isinstance(permit, CircuitOpen):
                raise permit
        clock = self.clock
        started = clock()
        probing = probe_var.set(True) if permit.probe else None
        try:
            result = await next(call)
        except Exception as exc:
            duration = clock() - started
            outcome: bool | None = None
            try:
                # A refusal from a breaker or a limiter further in says nothing about this
                # target.
                if not isinstance(exc, (CircuitOpen, LimitExceeded)) and self.counts(exc):
                    outcome = False
            finally:
                self.record(permit, outcome, duration)
            raise
        except BaseException:
            self.record(permit, None)  # cancelled: neither a success nor a failure
            raise
        finally:
            if probing is not None:
                probe_var.reset(probing)
        if isinstance(result, Stream):
            # A stream's outcome is known when it ends; its latency is its time to first chunk.
            result.on_close(
                functools.partial(self._stream_ended, permit, clock() - started), attempt=True
            )
        else:
            self.record(permit, True, clock() - started)
        return result

    def _stream_ended(
        self,
        permit: BreakerPermit,
        ttft: float,
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        if outcome == "error" and error is not None:
            failed = isinstance(error, Exception) and self.counts(error)
            self.record(permit, False if failed else None, ttft)
        elif outcome in ("ok", "closed"):
            self.record(permit, True, ttft)
        else:  # cancelled or abandoned: says nothing about the target
            self.record(permit, None)


# --- the process-wide registry ----------------------------------------------------------------

_registry: dict[str, Breaker] = {}
_registry_view: Mapping[str, Breaker] = MappingProxyType(_registry)
_registry_lock = threading.Lock()


def breaker(
    key: str,
    *,
    window_type: Literal["count", "time"] = "count",
    window_size: float | datetime.timedelta = 100,
    minimum_calls: int = 20,
    failure_rate: float = 0.5,
    slow_call_rate: float = 1.0,
    slow_call_duration: float | datetime.timedelta = 60.0,
    open_duration: float | datetime.timedelta = 30.0,
    max_open_duration: float | datetime.timedelta | None = None,
    half_open_calls: int = 3,
    counts: ErrorFilter | None = None,
    store: BreakerStore | None = None,
    shared: _fleet.SharedStore | None = None,
    clock: Callable[[], float] = loop_clock,
) -> Breaker:
    """The circuit breaker of ``key``, shared process-wide (created on first use).

    Calling it again with the same key and the same options returns the same object; with
    different options it raises ``ValueError`` naming the key and the options that differ
    (configure a breaker once, e.g. ``OPENAI = lk.breaker("openai", ...)``, and reuse it).

    Args:
        key: the target the breaker guards (``"openai"``, a model string); non-empty.
        window_type: ``"count"`` (the last ``window_size`` calls) or ``"time"`` (the calls of
            the last ``window_size`` seconds, forgotten in steps of ``window_size / 20``).
            Default ``"count"``.
        window_size: calls (an int, count window) or seconds (time window). Default ``100``.
        minimum_calls: calls the window must hold before the breaker may open (default
            ``20``; at most ``window_size`` for a count window).
        failure_rate: open when failures / calls reaches it, in ``(0, 1]`` (default ``0.5``).
        slow_call_rate: open when slow calls / calls reaches it, in ``(0, 1]`` (default
            ``1.0``: only when every call is slow).
        slow_call_duration: seconds (or ``timedelta``) from which a counted call (success or
            failure) is slow (default ``60``).
        open_duration: seconds (or ``timedelta``) calls are refused once open, before probing
            (default ``30``).
        max_open_duration: when set, each re-open straight from half-open doubles the open
            duration, up to this many seconds (default ``None``: always ``open_duration``).
        half_open_calls: probe calls admitted when half-open (default ``3``); the breaker
            closes when all have ended with rates under the thresholds, and re-opens as soon
            as their rates are bound to reach one.
        counts: which errors are failures: exception type(s) or a predicate (default
            ``None``: transient errors, :func:`~latencykit.errors.is_transient`: 429, 5xx,
            connection, timeout, broken stream). Other errors and cancellations are ignored:
            not counted at all. :class:`CircuitOpen` from a breaker further in and
            :class:`~latencykit.errors.LimitExceeded` from a limiter never count.
        store: where the process-local state lives (default ``None``: a private
            :class:`InMemoryBreakerStore`).
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`) that decides
            the breaker's state for every process (default ``None``: the process default,
            :func:`~latencykit.use_store`, looked up at each use; none unless set). While it is
            unavailable the breaker decides alone, from its local state.
        clock: time source in seconds (default: the event loop's clock); durations of calls are
            measured with it too.
    """
    candidate = Breaker(
        key,
        window_type=window_type,
        window_size=window_size,
        minimum_calls=minimum_calls,
        failure_rate=failure_rate,
        slow_call_rate=slow_call_rate,
        slow_call_duration=slow_call_duration,
        open_duration=open_duration,
        max_open_duration=max_open_duration,
        half_open_calls=half_open_calls,
        counts=counts,
        store=store,
        shared=shared,
        clock=clock,
    )
    with _registry_lock:
        existing = _registry.setdefault(key, candidate)
    if existing is not candidate and existing._options != candidate._options:
        differ = ", ".join(
            f"{name}={new!r} (registered: {old!r})"
            for (name, old), (_, new) in zip(existing._options, candidate._options, strict=True)
            if old != new
        )
        raise ValueError(
            f"breaker {key!r} is already registered with other options: {differ}; "
            "configure it once and reuse the object"
        )
    return existing


def breakers() -> Mapping[str, Breaker]:
    """A read-only, live view of the registered breakers by key."""
    return _registry_view


def reset_breakers() -> None:
    """Forget every registered breaker (for tests): the next :func:`breaker` call makes a
    new one."""
    with _registry_lock:
        _registry.clear()
