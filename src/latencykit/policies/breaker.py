"""``Breaker``: stop calling a target that is failing, and probe it before trusting it again.

A resilience4j-style circuit breaker, one per target key, shared process-wide: ``Breaker(key,
...)`` (``lk.breaker`` is the same class) returns the breaker of ``key``, made on first use.

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

With a store shared by the fleet (``shared=``, or :func:`~latencykit.use_store`), the store
decides the state for every process and each breaker mirrors it; while the store is
unavailable, each breaker decides alone, from its own window.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import math
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, ParamSpec, TypeVar

from .. import _validation, events
from .. import fleet as _fleet
from .._cancel import clock as loop_clock
from .._context import current_call_id, probe_var, queued_total_var
from .._values import BreakerState
from ..errors import (
    CircuitOpen,
    ErrorFilter,
    LimitExceeded,
    error_predicate,
    is_transient,
)
from ..events import BreakerRejected, BreakerStateChanged, Event
from ..fleet.redis import BreakerOptions, BreakerView, SharedBreaker
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stats import SlidingCounts
from ..stream import Stream, StreamOutcome

__all__ = [
    "Breaker",
    "BreakerMetrics",
    "BreakerPermit",
    "BreakerRejected",
    "BreakerState",
    "BreakerStateChanged",
    "CircuitOpen",
    "breaker",
    "breakers",
    "reset_breakers",
]

P = ParamSpec("P")
R = TypeVar("R")

TIME_BUCKETS = 20
"""A time window moves in steps of ``window_size / TIME_BUCKETS`` seconds."""

_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_FORCED_OPEN = BreakerState.FORCED_OPEN


class BreakerPermit(NamedTuple):
    """Permission to make one call, from :meth:`Breaker.acquire`; hand it to ``record``.

    Attributes:
        period: the breaker's period (it counts state changes and resets) when it was taken:
            the outcome of a permit from an earlier period is dropped.
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


def _metrics(
    state: BreakerState, calls: int, failures: int, slow: int, probes: int
) -> BreakerMetrics:
    return BreakerMetrics(
        state,
        calls,
        calls - failures,
        failures,
        slow,
        _rate(failures, calls),
        _rate(slow, calls),
        probes,
    )


class _Registered(type):
    """Calling :class:`Breaker` gives the process-wide breaker of the key: the one built
    first, once the new one's options are found the same."""

    def __call__(cls, *args: Any, **options: Any) -> Any:
        made = super().__call__(*args, **options)
        with _registry_lock:
            existing = _registry.setdefault(made.key, made)
        existing._same_options(made)
        return existing


class Breaker(PolicyDecorator, metaclass=_Registered):
    """The circuit breaker of one target key, shared process-wide; a policy and a decorator.

    ``Breaker(key, ...)`` returns the breaker registered for ``key``, made on first use.
    Called again with the same key and the same options it returns the same object; with
    other options it raises ``ValueError`` naming the key and the options that differ
    (configure a breaker once, e.g. ``OPENAI = lk.Breaker("openai", ...)``, and reuse it).
    ``lk.breaker`` is this class. Each argument is also a read-only attribute of the same name
    (``counts`` is the predicate in force).

    As a policy (``stage = Stage.BREAKER``) it asks for a permit, raises :class:`CircuitOpen`
    without calling ``next`` when refused, times the call with ``clock`` and records its
    outcome. Failover and custom code can drive it directly: :meth:`allows`, :meth:`acquire`,
    :meth:`record`.

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
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`) that decides
            the breaker's state for every process (default ``None``: the process default,
            :func:`~latencykit.use_store`, looked up at each use; none unless set). While it is
            unavailable the breaker decides alone, from its local state.
        clock: time source in seconds (default: the event loop's clock); durations of calls are
            measured with it too (less any wait for a connection slot in an ``LLM``'s queue:
            not the provider's time).
    """

    stage = Stage.BREAKER
    window_size: float  # an int for a count window

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
        shared: _fleet.SharedStore | None = None,
        clock: Callable[[], float] = loop_clock,
    ) -> None:
        self.key = _validation.text("breaker.key", key)
        self.window_type = window_type
        self.minimum_calls = _validation.count("breaker.minimum_calls", minimum_calls)
        self._set_window(window_size)
        self.failure_rate = _validation.number(
            "breaker.failure_rate", failure_rate, 0, 1, above=True
        )
        self.slow_call_rate = _validation.number(
            "breaker.slow_call_rate", slow_call_rate, 0, 1, above=True
        )
        self.slow_call_duration = _validation.seconds(
            "breaker.slow_call_duration", slow_call_duration
        )
        self.open_duration = _validation.seconds("breaker.open_duration", open_duration)
        self.max_open_duration = None
        if max_open_duration is not None:
            self.max_open_duration = _validation.seconds(
                "breaker.max_open_duration", max_open_duration, minimum=self.open_duration
            )
        self.half_open_calls = _validation.count("breaker.half_open_calls", half_open_calls)
        self.counts = is_transient if counts is None else error_predicate(counts, "breaker.counts")
        _validation.optional(
            "breaker.shared", shared, _fleet.SharedStore, "a SharedStore (RedisStore)"
        )
        self.shared = shared
        _validation.function("breaker.clock", clock)
        self.clock = clock
        self._options = {name: getattr(self, name) for name in _OPTIONS} | {"counts": counts}
        # The state of a new breaker: closed, with an empty window.
        self._lock = threading.Lock()
        self._state, self._period, self._since, self._open_for = _CLOSED, 0, 0.0, self.open_duration
        self._probes = self._probe_calls = self._probe_failures = self._probe_slow = 0
        self._closed_permit = BreakerPermit(0, False)
        fields = BreakerOptions._fields
        self._fleet_options = BreakerOptions(*(getattr(self, name) for name in fields))
        self._mirrored = -1  # the fleet epoch last copied into the local state

    def _set_window(self, size: object) -> None:
        """Both windows are rings of buckets of (calls, failures, slow calls): a count
        window's bucket holds one call, a time window's ``window_size / TIME_BUCKETS``
        seconds of calls."""
        if self.window_type == "count":
            self.window_size = calls = _validation.count("breaker.window_size", size)
            if self.minimum_calls > calls:
                raise ValueError(
                    f"breaker.minimum_calls ({self.minimum_calls}) must not exceed "
                    f"breaker.window_size ({calls}) for a count window: it could never open"
                )
            self._window, self._bucket_width = SlidingCounts(calls, 3), 0.0
        elif self.window_type == "time":
            self.window_size = _validation.seconds("breaker.window_size", size)
            self._window = SlidingCounts(TIME_BUCKETS, 3)
            self._bucket_width = self.window_size / TIME_BUCKETS
        else:
            raise ValueError(
                f"breaker.window_type must be 'count' or 'time', got {self.window_type!r}"
            )

    def _same_options(self, other: Breaker) -> None:
        """Raise unless ``other`` (a new breaker of this key) was given the same options."""
        if other is self or other._options == self._options:
            return
        differ = ", ".join(
            f"{name}={new!r} (registered: {self._options[name]!r})"
            for name, new in other._options.items()
            if new != self._options[name]
        )
        raise ValueError(
            f"breaker {self.key!r} is already registered with other options: {differ}; "
            "configure it once and reuse the object"
        )

    def __repr__(self) -> str:
        return (
            f"Breaker({self.key!r}, window_type={self.window_type!r}, "
            f"window_size={self.window_size!r}, failure_rate={self.failure_rate:g})"
        )

    # --- the local state (always under self._lock) ------------------------------------------

    def _bucket(self) -> int:
        """The bucket of a time window a call ending now goes to."""
        return math.floor(self.clock() / self._bucket_width)

    def _move(self, to: BreakerState, now: float) -> BreakerStateChanged | None:
        """Enter state ``to``; return the event to emit (once the lock is released)."""
        event = None
        if events.listening():
            if self._state is _HALF_OPEN:
                calls, failed, slow = self._probe_calls, self._probe_failures, self._probe_slow
            else:
                calls, failed, slow = self._window.totals
            event = BreakerStateChanged(
                call_id=current_call_id(),
                key=self.key,
                from_state=self._state,
                to_state=to,
                failure_rate=_rate(failed, calls),
                slow_call_rate=_rate(slow, calls),
                calls=calls,
            )
        if to is _OPEN:
            if self._state is _HALF_OPEN and self.max_open_duration is not None:
                self._open_for = min(self._open_for * 2, self.max_open_duration)
            else:
                self._open_for = self.open_duration
        elif to is _HALF_OPEN:
            self._probes = self._probe_calls = self._probe_failures = self._probe_slow = 0
        elif to is _CLOSED:
            self._window.clear()
            self._open_for = self.open_duration
        self._since = now
        self._state = to
        self._period += 1  # after the state: the lock-free path of _admit_local relies on it
        return event

    def _refresh(self) -> None:
        """OPEN -> HALF_OPEN once ``open_for`` has passed (lazily, when somebody looks)."""
        if self._state is not _OPEN:
            return
        with self._lock:
            now = self.clock()
            expired = self._state is _OPEN and now >= self._since + self._open_for
            event = self._move(_HALF_OPEN, now) if expired else None
        self._emit(event)

    @staticmethod
    def _emit(event: Event | None) -> None:
        if event is not None:
            events.emit(event)

    # --- the fleet's state (a shared store) ------------------------------------------------

    def _fleet_handle(self) -> SharedBreaker | None:
        """This breaker's state in the shared store, ``None`` without a store."""
        store = self.shared or _fleet._current
        return None if store is None else store.breaker(self.key, self._fleet_options)

    def _fleet_view(self) -> tuple[SharedBreaker | None, BreakerView | None]:
        """The shared store's handle and view of this breaker (the view mirrored locally),
        ``(None, None)`` without a store; the view is ``None`` while the store is unavailable
        (decide locally)."""
        handle = self._fleet_handle()
        if handle is None:
            return None, None
        view = handle.view()
        if view is not None:
            self._mirror(view)
        return handle, view

    def _mirror(self, view: BreakerView) -> None:
        """Copy the fleet's state into the local state (what ``state`` reports, and where
        the breaker starts from if the store goes away), emitting the change."""
        if view.epoch == self._mirrored:
            return
        with self._lock:
            to = BreakerState(view.state)
            event = None if self._state is to else self._move(to, self.clock())
            if to is _OPEN:  # open for what the fleet has left, from now
                self._since, self._open_for = self.clock(), view.opens_in
            self._mirrored = view.epoch
        self._emit(event)

    async def _permit(self, admitted: BreakerPermit | CircuitOpen | SharedBreaker) -> BreakerPermit:
        """The permit :meth:`_admit` gave, or asked of the fleet (a probe; decided locally if
        the store cannot answer); raise :class:`CircuitOpen` if refused."""
        if isinstance(admitted, (BreakerPermit, CircuitOpen)):
            permit = admitted
        elif (answer := await admitted.probe()) is None:
            permit = self._admit_local()
        else:
            granted, view = answer
            self._mirror(view)
            permit = (
                BreakerPermit(self._period, True, view.epoch)
                if granted
                else self._refused(BreakerState(view.state), None)
            )
        if isinstance(permit, CircuitOpen):
            raise permit
        return permit

    # --- public API -----------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an expired ``OPEN`` turns ``HALF_OPEN`` when read). With a
        shared store, the fleet's state as of the store's last refresh."""
        self._fleet_view()
        self._refresh()
        return self._state

    def metrics(self) -> BreakerMetrics:
        """The window's counts and rates now (a time window first drops expired calls). With
        a shared store, the fleet's window as of the store's last refresh."""
        view = self._fleet_view()[1]
        if view is not None:
            state = BreakerState(view.state)
            return _metrics(state, view.calls, view.failures, view.slow, 0)
        self._refresh()
        with self._lock:
            if self._bucket_width:  # a time window: drop the calls that slid out
                self._window.advance(self._bucket())
            in_flight = self._probes - self._probe_calls if self._state is _HALF_OPEN else 0
            calls, failures, slow = self._window.totals
            return _metrics(self._state, calls, failures, slow, in_flight)

    def allows(self) -> bool:
        """Whether a call would be admitted now, without taking a permit (nor emitting
        :class:`BreakerRejected`). Failover uses it to skip open targets."""
        view = None if self.shared is None and _fleet._current is None else self._fleet_view()[1]
        if view is not None:
            return (
                view.state == "closed"
                or (view.state == "open" and view.opens_in <= 0.0)  # the fleet would probe
                or (view.state == "half_open" and view.free_probes > 0)
            )
        state = self._state
        if state is _CLOSED:
            return True  # the hot path: nothing to refresh
        self._refresh()
        state = self._state
        return state is _CLOSED or (state is _HALF_OPEN and self._probes < self.half_open_calls)

    def _admit(self) -> BreakerPermit | CircuitOpen | SharedBreaker:
        """A permit, a refusal, or the fleet's handle when a probe permit must be asked of it."""
        if self.shared is None and _fleet._current is None:
            return self._admit_local()  # no fleet: the hot path, without a look for one
        handle, view = self._fleet_view()
        if view is None or handle is None:
            return self._admit_local()
        state = view.state
        if state == "closed":
            return BreakerPermit(self._period, False, view.epoch)
        if state == "forced_open":
            return self._refused(_FORCED_OPEN, None)
        if state == "open" and view.opens_in > 0:
            return self._refused(_OPEN, view.opens_in)
        return handle  # half-open, or open and over: only the fleet hands out probes

    def _refused(self, state: BreakerState, wait: float | None) -> CircuitOpen:
        if events.listening():
            events.emit(BreakerRejected(call_id=current_call_id(), key=self.key, state=state))
        return CircuitOpen(self.key, state, wait)

    def _admit_local(self) -> BreakerPermit | CircuitOpen:
        # The hot path, CLOSED, changes nothing and takes no lock: it reads the period, then
        # the state (``_move`` writes them in the opposite order). A state read as CLOSED was
        # CLOSED in the period read, or that period is over and the permit is merely stale.
        period = self._period
        if self._state is _CLOSED:
            permit = self._closed_permit
            if permit.period != period:
                permit = self._closed_permit = BreakerPermit(period, False)
            return permit
        self._refresh()
        with self._lock:
            now = self.clock()
            state = self._state
            granted = None
            if state is _CLOSED:
                granted = BreakerPermit(self._period, False)
            elif state is _HALF_OPEN and self._probes < self.half_open_calls:
                self._probes += 1
                granted = BreakerPermit(self._period, True)
            wait = max(0.0, self._since + self._open_for - now) if state is _OPEN else None
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
        if permit.epoch >= 0 and (handle := self._fleet_handle()) is not None:
            self._record_shared(handle, permit, success, slow)
            return
        with self._lock:
            if permit.period != self._period:
                return  # stale: admitted in an earlier state spell
            if permit.probe:
                event = self._probe_ended(success, slow)
            else:  # a closed call: counted; open if the window's rates reach a threshold
                self._tally(success is False, slow)
                calls, failures, slow_calls = self._window.totals
                event = None
                if calls >= self.minimum_calls and self._trips(calls, failures, slow_calls):
                    event = self._move(_OPEN, self.clock())
        if event is not None:
            events.emit(event)

    def _record_shared(
        self,
        handle: SharedBreaker,
        permit: BreakerPermit,
        success: bool | None,
        slow: bool,
    ) -> None:
        """A fleet permit's outcome goes to the store, which decides the transitions; the
        local window counts it too, ready for when the store goes away."""
        code = 0 if success is None else 1 + 2 * (not success) + 4 * slow
        if permit.probe:
            handle.probe_ended(permit.epoch, code)
            return
        handle.outcome(permit.epoch, code)
        with self._lock:
            if permit.period == self._period and self._state is _CLOSED:
                self._tally(success is False, slow)

    def _probe_ended(self, success: bool | None, slow: bool) -> BreakerStateChanged | None:
        if self._probes <= self._probe_calls:  # nothing outstanding: recorded twice
            return None
        if success is None:
            self._probes -= 1  # released: another probe may take its place
            return None
        self._probe_calls += 1
        self._probe_failures += not success
        self._probe_slow += slow
        # Reopen as soon as the rates over all the probes are bound to reach a threshold;
        # close once all are counted and they did not.
        if self._trips(self.half_open_calls, self._probe_failures, self._probe_slow):
            return self._move(_OPEN, self.clock())
        if self._probe_calls >= self.half_open_calls:
            return self._move(_CLOSED, self.clock())
        return None

    def _tally(self, failed: bool, slow: bool) -> None:
        """Add one call to the window (its counters: calls, failures, slow calls)."""
        window = self._window
        if not self._bucket_width:  # a count window: the call is a bucket of its own
            window.push((1, int(failed), int(slow)))
            return
        bucket = self._bucket()
        window.add(bucket, 0)
        if failed:
            window.add(bucket, 1)
        if slow:
            window.add(bucket, 2)

    def _trips(self, calls: int, failures: int, slow: int) -> bool:
        """Whether these rates reach a threshold."""
        return failures / calls >= self.failure_rate or slow / calls >= self.slow_call_rate

    def isolate(self) -> None:
        """Force the breaker open (``FORCED_OPEN``): every call is refused until :meth:`reset`.
        With a shared store, across the fleet (within one refresh)."""
        self._force("isolate", _FORCED_OPEN)

    def reset(self) -> None:
        """Back to ``CLOSED`` with an empty window, from any state; calls in flight are then
        not counted. With a shared store, across the fleet (within one refresh)."""
        self._force("reset", _CLOSED)

    def _force(self, op: Literal["isolate", "reset"], to: BreakerState) -> None:
        handle = self._fleet_handle()
        if handle is not None:
            handle.force(op)
        self._refresh()
        with self._lock:
            now = self.clock()
            event = None
            if self._state is not to:
                event = self._move(to, now)
            elif to is _CLOSED:  # a new period with an empty window
                self._window.clear()
                self._period += 1
                self._since = now
        self._emit(event)

    async def handle(self, call: Call, next: Next) -> Any:
        """Run ``call`` if the breaker admits it (else raise :class:`CircuitOpen`), and record
        its outcome: success, a failure if ``counts(error)``, nothing if cancelled."""
        # no fleet (the usual case): straight to the local state
        no_fleet = self.shared is None and _fleet._current is None
        permit = self._admit_local() if no_fleet else self._admit()
        if type(permit) is not BreakerPermit:  # rare: the exact type test is the cheap one
            permit = await self._permit(permit)
        clock = self.clock
        # The provider is judged on its own time: the waits for a connection slot in
        # latencykit's queue (their total in this task only grows) are taken out.
        started = clock() - queued_total_var.get()
        probing = probe_var.set(True) if permit.probe else None
        try:
            result = await next(call)
        except BaseException as exc:  # cancelled: neither a success nor a failure
            duration = clock() - started - queued_total_var.get()
            outcome = None
            try:
                outcome = self._failed(exc)
            finally:
                self.record(permit, outcome, duration)
            raise
        finally:
            if probing is not None:
                probe_var.reset(probing)
        if isinstance(result, Stream):
            # A stream's outcome is known when it ends; its latency is its time to first chunk.
            ttft = clock() - started - queued_total_var.get()
            result.on_close(functools.partial(self._stream_ended, permit, ttft), attempt=True)
        else:
            self.record(permit, True, clock() - started - queued_total_var.get())
        return result

    def _failed(self, error: BaseException) -> Literal[False] | None:
        """``False`` (a failure) if ``error`` counts, ``None`` (ignored) if not. A refusal
        from a breaker or a limiter further in says nothing about this target."""
        if not isinstance(error, Exception) or isinstance(error, (CircuitOpen, LimitExceeded)):
            return None
        return False if self.counts(error) else None

    def _stream_ended(
        self,
        permit: BreakerPermit,
        ttft: float,
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        if outcome == "error" and error is not None:
            self.record(permit, self._failed(error), ttft)
        elif outcome in ("ok", "closed"):
            self.record(permit, True, ttft)
        else:  # cancelled or abandoned: says nothing about the target
            self.record(permit, None)


breaker = Breaker
"""The same class as :class:`Breaker` (``@lk.breaker("openai")``)."""

# --- the process-wide registry ----------------------------------------------------------------

# What help(), the docs and the config read: the constructor's options (not the registry's
# call, which only passes them on).
_init = inspect.signature(Breaker.__init__)
_signature = _init.replace(parameters=tuple(_init.parameters.values())[1:])
Breaker.__signature__ = _signature  # type: ignore[attr-defined]
# The options the registry compares (all but the key): normalised, and ``counts`` as given.
_OPTIONS = tuple(_signature.parameters)[1:]

_registry: dict[str, Breaker] = {}
_registry_view: Mapping[str, Breaker] = MappingProxyType(_registry)
_registry_lock = threading.Lock()


def breakers() -> Mapping[str, Breaker]:
    """A read-only, live view of the registered breakers by key."""
    return _registry_view


def reset_breakers() -> None:
    """Forget every registered breaker (for tests): the next ``Breaker(key, ...)`` makes a
    new one."""
    with _registry_lock:
        _registry.clear()
