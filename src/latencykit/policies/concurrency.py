"""Adaptive concurrency: a limit on each target's attempts in flight, learned from their
latency and from the provider's overload signals, with a wait queue served by the call's lane.

The limit (:class:`ConcurrencyLimit`) finds the knee of the target's latency, where more
concurrency stops buying throughput and only makes requests queue at the provider:

- it learns in **rounds**: a round ends once it has ``max(round_samples, limit)`` samples of
  attempts that started under the current limit with no more than it in flight (an attempt
  that started under another limit, or beside the attempts of a higher one still running,
  says nothing about this one). A sample is an attempt's time to first content chunk (a
  stream) or its duration (a response), without latencykit's own wait for a connection slot
  (an attempt that timed out: its time until then); streams and responses keep apart
  baselines;
- the **baseline** is the no-load latency: the lowest round median seen (per kind). A **probe
  round** measures it again at half the limit (where a server past its knee is back below it),
  every ``probe_interval`` seconds and once when the latency first rises (in case the limit
  started past the knee); its median replaces the baseline, so that a provider that became
  slower for good is not taken for an overloaded one. A probe round 1.4 times faster than the
  round before it was still past the knee: the next round probes at half again;
- at the end of a round the limit moves by the **gradient** ``tolerance * baseline / median``
  (clamped to [0.5, 2]): ``new = limit + smoothing * (limit * gradient - limit)``. Below the
  knee the latency is the baseline's and the limit grows; past it the latency grows with the
  load and the limit settles where the latency is ``tolerance`` times the baseline. For a
  server that serves ``N`` at a time (latency ``max(1, k / N)`` times its own with ``k`` in
  flight), that is ``tolerance * N``: the queue allowance is ``tolerance - 1`` of the knee.
  Until the latency first rises (or an overload), the gradient is 2 (slow start: with the
  default smoothing, the limit grows by half each round). It does not grow in a round whose
  load (the median of its attempts in flight) stayed under half of it; after slow start, a
  round whose load stayed under the knee it estimates (``limit / tolerance``) only brings it
  back to where a knee was last found (slow start's first rise, or a round past the knee with
  its load at the knee): the load, not the provider, was the limit, and the lower lanes, held
  below the knee by their reserve, do not push it up;
- past the knee (a round's latency more than halfway to ``tolerance``), the limit goes at once
  (no smoothing) to ``tolerance * load * baseline / median`` (Little's law: the provider serves
  about ``load * baseline / median`` at a time), so slots kept free for the higher lanes do not
  push the lower lanes past the knee, nor does a burst above the round's load; a probe round
  goes back to where the round before it moved the limit, and while it runs the interactive
  lane keeps that limit (:attr:`ConcurrencyLimit.settled`): the probe's wait is the lower
  lanes';
- an **overload signal** (:func:`~latencykit.errors.overloaded`: a 429, a 503 or a 529)
  multiplies the limit by ``backoff`` at once, once per limit (the other attempts that
  started under the same limit and fail the same way do not cut it again).

:class:`AdaptiveConcurrency`, the stage ``LLM(governor=True)`` adds (``Stage.CONCURRENCY``:
per attempt, inside the governor, so its pacing wait is not taken for latency), holds a slot of
its target's limit for each attempt, a stream's until it ends (closed, finished, broken,
garbage-collected). Beyond the limit, attempts wait in a queue served by lane
(:data:`~latencykit._context.PRIORITIES`, the call's ``priority=``), FIFO within a lane: a freed
slot goes to the waiting lane whose turn comes first, a lane's turns coming ``1 / weight``
apart (:data:`LANE_WEIGHTS`: interactive 16, default 4, batch 1), its first one ``1 / weight``
after it starts waiting. So an interactive call goes ahead of the lower lanes' backlog, and
while all wait they share the slots 16:4:1: no lane starves. A lane takes a slot only while
its reserve (:data:`~latencykit.ratelimit.RESERVES`: batch 20 % of the limit, rounded up) stays
free for the lanes above, and at least one. As the limit settles at ``tolerance`` times the
knee, that holds a batch flood at 0.88 of the knee, and what the interactive lane adds stays
below it.

With a store (``shared=``), the processes calling a target share its limit: each refresh tells
the fleet (``concurrency.lua``, :class:`~latencykit.fleet.redis.SharedConcurrency`) this
process's attempts in flight, its demand and its estimate, and reads back the others' and the
fleet's limit (the mean of the estimates). The process uses its share, ``max(limit / workers,
limit * demand / the fleet's demand)``, at most what the others leave free, at least one slot;
its samples count the fleet's attempts in flight. A process joining adopts the fleet's limit
and uses one slot until it first hears the fleet; with the store down it keeps the share it
last knew. No round trip on the hot path: the share follows each view, and is read again when
an attempt must wait.

An attempt whose wait and its own run cannot end within the call's deadline is refused at once
with :class:`~latencykit.errors.LimitExceeded` (limit ``"concurrency"``), before anything is
sent. The wait is estimated as the waiters ahead of it (in its lane and above, itself
included) times the average time a slot is held, over the slots its lane may use (the limit
less the lane's reserve); its run as that average time.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .. import _validation, events
from .._cancel import backend, clock, now, threadsafe_caller
from .._context import (
    PRIORITIES,
    Priority,
    current_call_id,
    priority_var,
    queued_total_var,
    remaining,
)
from .._fair import FairSlots, Waiter, wait_granted
from ..errors import ErrorKind, LimitExceeded, classify, overloaded
from ..fleet import SharedStore, current_store
from ..pipeline import Call, Next, Stage
from ..ratelimit import RESERVES
from ..stats import ConcurrencyStats, StatsTable
from ..stream import Stream, StreamOutcome

if TYPE_CHECKING:
    from ..fleet.redis import SharedConcurrency

__all__ = ["LANE_WEIGHTS", "MATERIAL", "AdaptiveConcurrency", "ConcurrencyLimit"]

LANE_WEIGHTS: dict[Priority, float] = {"interactive": 16.0, "default": 4.0, "batch": 1.0}
"""The share of freed slots each lane gets while several wait (stride scheduling)."""

_RANK: dict[str, int] = {lane: rank for rank, lane in enumerate(PRIORITIES)}
_TENANT = "<default>"  # events' tenant field: the limit is a target's, not a tenant's
MATERIAL = 0.1
"""A change of the limit by this fraction of the last one told (or by 1) is told
(:class:`~latencykit.events.LimitLearned`); smaller moves are not."""

# A probe round this much faster than the round before it ran past the knee too (where the
# latency halves with the load), so the next one halves again.
_STILL_PAST = 1.4
_HOLD_WEIGHT = 0.1  # of the newest slot hold in the average hold time


def _check(name: str, value: object, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"ConcurrencyLimit.{name} must be a number, got {value!r}")
    if not (low <= value <= high):
        raise ValueError(f"ConcurrencyLimit.{name} must be in [{low:g}, {high:g}], got {value!r}")
    return float(value)


class ConcurrencyLimit:
    """A concurrency limit learned from latency samples and overload signals (the rule: see
    the module docs). Not thread-safe: its owner serialises the calls.

    Args:
        initial: the limit before anything is learned (default ``8``).
        min_limit: it never goes lower (default ``1``).
        max_limit: nor higher (default ``500``, litellm's connections per host).
        tolerance: the latency, relative to the no-load baseline, at which the limit stops
            growing: past the knee, the queue allowed (default ``1.1``; > 1).
        smoothing: the share of a round's correction applied (default ``0.5``; 1: all).
        backoff: the factor an overload signal multiplies the limit by (default ``0.5``).
        round_samples: the fewest samples a round learns from (default ``10``; a round has at
            least as many as the limit).
        probe_interval: seconds between probe rounds, which measure the baseline again at half
            the limit (default ``30.0``; ``None``: only the one when the latency first rises).
        clock: the time source (default latencykit's clock).

    Raises:
        TypeError, ValueError: an option out of range, naming it.
    """

    def __init__(
        self,
        *,
        initial: int = 8,
        min_limit: int = 1,
        max_limit: int = 500,
        tolerance: float = 1.1,
        smoothing: float = 0.5,
        backoff: float = 0.5,
        round_samples: int = 10,
        probe_interval: float | None = 30.0,
        clock: Callable[[], float] = clock,
    ) -> None:
        self.min_limit = int(_check("min_limit", min_limit, 1))
        self.max_limit = int(_check("max_limit", max_limit, self.min_limit))
        self.tolerance = _check("tolerance", tolerance, 1.0 + 1e-9)
        self.smoothing = _check("smoothing", smoothing, 1e-9, 1.0)
        self.backoff = _check("backoff", backoff, 1e-9, 1.0)
        self.round_samples = int(_check("round_samples", round_samples, 1))
        if probe_interval is not None:
            probe_interval = _check("probe_interval", probe_interval, 1e-9)
        self.probe_interval = probe_interval
        self.clock = clock
        self._value = _check("initial", initial, self.min_limit, self.max_limit)
        self.limit = int(self._value)
        """The limit now: attempts in flight allowed."""
        self.epoch = 0
        """Counts the limit's changes: a sample or an overload counts only with the epoch its
        attempt started in."""
        self._baselines: list[float | None] = [None, None]  # by kind: response, stream
        self._last: list[float | None] = [None, None]  # the last round's median, by kind
        self._samples: tuple[list[float], list[float]] = ([], [])
        self._loads: list[int] = []  # in flight when each sample of this round started
        self._slow_start = True
        self._restore: float | None = None  # the limit to go back to after a probe round
        # A load below the knee may bring the limit back up to this (where a knee was last
        # found), not above: after slow start, only a load at the knee pushes it up.
        self._ceiling = math.inf
        self._probe_at = math.inf if probe_interval is None else clock() + probe_interval

    def __repr__(self) -> str:
        return (
            f"ConcurrencyLimit(limit={self.limit}, baselines={self.baselines}, "
            f"tolerance={self.tolerance:g})"
        )

    @property
    def settled(self) -> int:
        """The limit outside a probe round: during one (at half the limit), the limit it goes
        back to."""
        return self.limit if self._restore is None else int(self._restore)

    @property
    def baselines(self) -> tuple[float | None, float | None]:
        """The no-load latency of responses and of streams, in seconds (``None``: not yet)."""
        return self._baselines[0], self._baselines[1]

    def sample(self, seconds: float, *, epoch: int, in_flight: int, stream: bool = False) -> bool:
        """Learn from an attempt that took ``seconds`` (a stream: to its first content chunk),
        started in ``epoch`` with ``in_flight`` attempts in flight (itself included). Return
        whether the limit changed."""
        if epoch != self.epoch or in_flight > self.limit:  # it ran alongside more than that
            return False
        samples = self._samples
        samples[stream].append(seconds)
        self._loads.append(in_flight)
        if len(samples[0]) + len(samples[1]) < max(self.round_samples, self.limit):
            return False
        return self._end_round()

    def overload(self, *, epoch: int) -> bool:
        """An attempt started in ``epoch`` got an overload signal: back off (once per epoch).
        Return whether the limit changed."""
        if epoch != self.epoch:
            return False
        value = self._value if self._restore is None else self._restore
        self._restore = None
        self._slow_start = False
        return self._set(value * self.backoff, force=True)

    def adopt(self, value: float) -> bool:
        """Take ``value`` as the limit learned so far (a process joining a fleet that learned
        it): no slow start from it. Return whether the limit changed."""
        self._restore = None
        self._slow_start = False
        self._ceiling = value
        return self._set(value, force=True)

    def _end_round(self) -> bool:
        probe = self._restore is not None
        weighted, count, lower = 0.0, 0, False
        for kind, samples in enumerate(self._samples):
            if samples:
                median = statistics.median(samples)
                baseline, last = self._baselines[kind], self._last[kind]
                lower = lower or (last is not None and median * _STILL_PAST < last)
                self._last[kind] = median
                if probe or baseline is None or median < baseline:
                    baseline = self._baselines[kind] = median
                weighted += len(samples) * median / baseline if baseline > 0 else len(samples)
                count += len(samples)
                samples.clear()
        ratio, load = weighted / count, statistics.median(self._loads)
        self._loads.clear()
        value = self._value
        if self._restore is not None:  # a probe round is over
            if lower and value > self.min_limit:  # half was still past the knee: half again
                return self._set(value / 2, force=True)
            value, self._restore = self._restore, None
            return self._set(value, force=True)
        rise = ratio > self.tolerance
        if rise and self._slow_start:
            # The first rise: the baseline may have been measured past the knee (the limit
            # started there): measure it again now.
            self._slow_start = False
            self._probe_at = self.clock()
            self._ceiling = value
        gradient = 2.0 if self._slow_start else min(2.0, max(0.5, self.tolerance / ratio))
        below = load < self.limit / self.tolerance  # the knee the limit estimates
        if load < value / 2:  # the load did not reach the limit: it says nothing of more
            gradient = min(gradient, 1.0)
        if ratio > (1.0 + self.tolerance) / 2 and load >= value / 2 and not self._slow_start:
            # Past the knee, what was in flight made the latency (Little's law: the knee is
            # about load / ratio), whether the rest of the limit was used or kept free for
            # the lanes above: straight there.
            value *= min(1.0, max(load, 1) / self.limit) * gradient
            if rise or not below:  # a knee found (not a noisy round below it)
                self._ceiling = value
        elif below and self._ceiling < math.inf:
            # A load below the knee says nothing of more: the lower lanes, held there by their
            # reserve, do not push the limit up, only back to where a knee was last found.
            value = max(value, self._ceiling)
        else:
            value += self.smoothing * (value * gradient - value)
        if self.clock() >= self._probe_at:
            # Probe at half the limit; then back to where this round moved it (not above the
            # limit that made the latency rise).
            self._probe_at = self.clock() + (self.probe_interval or math.inf)
            self._restore = value
            return self._set(value / 2, force=True)
        return self._set(value)

    def _set(self, value: float, *, force: bool = False) -> bool:
        """Set the limit; a new epoch if its whole part changed (or ``force``)."""
        self._value = min(self.max_limit, max(self.min_limit, value))
        limit = int(self._value)
        changed = limit != self.limit
        if changed or force:
            self.limit = limit
            self.epoch += 1
            for samples in self._samples:
                samples.clear()
            self._loads.clear()
        return changed


@dataclass(eq=False)
class _Lanes(FairSlots):
    """The slots of a target, whose queues are the lanes (stride scheduling, as
    :class:`~latencykit._fair.FairSlots`): a lane's first turn comes after ``1 / weight`` (of
    the lanes that start waiting together the higher goes first, while a lane already waiting
    keeps its turn), and a lane takes a slot only below its cap (:meth:`size`)."""

    caps: dict[str, int] = field(default_factory=dict)
    """By lane: the most slots in use with which it may take one more."""

    def __post_init__(self) -> None:
        self.size(self.limit, self.limit)

    def size(self, top: float, lower: float) -> None:
        """The interactive lane may use ``top`` slots; the others ``lower`` (less than ``top``
        during a probe round), less their reserve (:data:`~latencykit.ratelimit.RESERVES`, a
        share kept for the lanes above, rounded up), at least one."""
        self.limit, lower = top, int(lower)
        self.caps = {
            lane: int(top) if not rank else max(1, lower - math.ceil(RESERVES[rank] * lower))
            for rank, lane in enumerate(PRIORITIES)
        }

    def first_turn(self, weight: float) -> float:
        return self._vtime + 1.0 / weight

    def take(self, lane: str = "default") -> bool:
        if self.in_use < self.caps[lane]:
            self.in_use += 1
            return True
        return False

    def admits(self, key: str) -> bool:
        return self.in_use - 1 < self.caps[key]


@dataclass(eq=False)
class _Target:
    """One target's limit, its slots (the lanes are the slots' queues) and its counters; with
    a store, the fleet's view of the target and this process's share of its limit."""

    limit: ConcurrencyLimit
    slots: _Lanes
    told: int  # the limit last told by an event
    fleet: SharedConcurrency | None = None
    joined: bool = False  # the fleet was heard once
    share: float = 1.0  # of the fleet's limit, as this process last knew it
    hold: float | None = None  # average seconds a slot is held
    lock: threading.Lock = field(default_factory=threading.Lock)

    def waiting(self, up_to: int) -> int:
        """Attempts waiting in the lanes of rank ``up_to`` and above."""
        queues = self.slots.queues
        return sum(len(q.waiters) for lane in PRIORITIES[: up_to + 1] if (q := queues.get(lane)))

    def in_flight(self) -> int:
        """What the provider has in flight as far as is known: this process's attempts, and
        the fleet's others as last refreshed. Under the lock."""
        view = None if self.fleet is None else self.fleet.view()
        if view is None:
            return self.slots.in_use
        # At most the limit: a share taken under the fleet's limit is a sample of it.
        return min(self.limit.limit, self.slots.in_use + view.in_flight)

    def cap(self) -> int:
        """The slots this process may use: the limit, or with a store its share of the fleet's
        limit (see the module docs). Under the lock."""
        fleet, limit = self.fleet, self.limit.limit
        if fleet is None:
            return limit
        view = fleet.view()
        if view is None:  # not heard yet: one slot; the store is down: the share last known
            return 1 if fleet.joining() else max(1, round(limit * self.share))
        demand = self.slots.in_use + self.waiting(len(PRIORITIES))
        wanted = demand + view.demand
        fair = view.limit * max(1 / view.workers, demand / wanted if wanted else 0.0)
        cap = max(1, min(round(fair), round(view.limit) - view.in_flight))
        self.share = cap / limit
        return cap

    def resize(self) -> list[Waiter]:
        """Follow the limit (or the fleet's view): hand the slots it added to waiters (to be
        woken). Under the lock."""
        slots, lower = self.slots, self.cap()
        # During a probe round the interactive lane keeps the limit it goes back to: the
        # probe's wait is the lower lanes'.
        slots.size(lower if self.fleet is not None else self.limit.settled, lower)
        woken = []
        while slots.in_use < slots.limit:
            slots.in_use += 1  # a freed slot, handed on (or put back: nobody waits)
            waiter = slots.release()
            if waiter is None:
                break
            woken.append(waiter)
        return woken

    def release(self) -> Waiter | None:
        """Give a slot back: to the next waiter, unless the limit shrank below those in use.
        Under the lock."""
        slots = self.slots
        if slots.in_use > slots.limit:
            slots.in_use -= 1
            return None
        return slots.release()

    def report(self) -> tuple[int, int, int]:
        """What this process tells the fleet: its attempts in flight, those and the waiting
        ones (its demand), and its estimate of the fleet's limit."""
        with self.lock:
            in_use = self.slots.in_use
            return in_use, in_use + self.waiting(len(PRIORITIES)), self.limit.limit


class AdaptiveConcurrency:
    """The stage that holds each attempt to its target's learned concurrency limit (see the
    module docs). ``LLM(governor=True)`` puts one in its pipeline: the limits are that
    ``LLM``'s, one per target key.

    Args:
        limit: what makes each target's :class:`ConcurrencyLimit` (default
            ``ConcurrencyLimit``, with its defaults).
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`): each target's
            limit is the fleet's, this process using its share (default ``None``: the
            process's default store, :func:`~latencykit.use_store`, when a target is first
            used; none: the limit is this process's).
    """

    stage = Stage.CONCURRENCY

    def __init__(
        self,
        limit: Callable[[], ConcurrencyLimit] = ConcurrencyLimit,
        *,
        shared: SharedStore | None = None,
    ) -> None:
        _validation.optional("AdaptiveConcurrency.shared", shared, SharedStore, "a RedisStore")
        self._new_limit = limit
        self.shared = shared
        self._targets: dict[str, _Target] = {}

    def __repr__(self) -> str:
        return (
            "AdaptiveConcurrency()"
            if self.shared is None
            else f"AdaptiveConcurrency(shared={self.shared!r})"
        )

    def limit_of(self, target: str) -> ConcurrencyLimit | None:
        """``target``'s limit (``None``: no attempt went to it yet)."""
        found = self._targets.get(target)
        return None if found is None else found.limit

    def stats(self, target: str) -> ConcurrencyStats | None:
        """``target``'s limit, in flight and waiting now, and the fleet's view of it with a
        store (``None``: no attempt yet)."""
        found = self._targets.get(target)
        if found is None:
            return None
        with found.lock:
            in_use = found.slots.in_use
            waiting = found.waiting(len(PRIORITIES))
            limit = found.limit.limit
            view = None if found.fleet is None else found.fleet.view()
            if view is None:
                return ConcurrencyStats(limit, in_use, waiting)
            share, fleet_in_flight = int(found.slots.limit), in_use + view.in_flight
            return ConcurrencyStats(limit, in_use, waiting, share, fleet_in_flight, view.workers)

    def with_concurrency(self, table: StatsTable) -> StatsTable:
        """``table`` with each target's concurrency (``TargetStats.concurrency``)."""
        return StatsTable(replace(row, concurrency=self.stats(key)) for key, row in table.items())

    def _target(self, key: str) -> _Target:
        found = self._targets.get(key)
        if found is None:
            limit = self._new_limit()
            made = _Target(limit, _Lanes(limit.limit), limit.limit)
            found = self._targets.setdefault(key, made)
            store = self.shared or current_store()
            if found is made and store is not None:
                heard = functools.partial(self._heard, made, key)
                with made.lock:
                    made.fleet = store.concurrency(key, made.report, heard)
                    made.resize()  # one slot until the fleet is heard
        return found

    def _heard(self, state: _Target, key: str) -> None:
        """The fleet's view of ``state`` was refreshed (on the store's thread): a worker
        joining takes the fleet's limit as its own; the share follows the view."""
        with state.lock:
            view = None if state.fleet is None else state.fleet.view()
            changed = False
            if not state.joined and view is not None:
                state.joined = True
                if view.workers > 1:
                    changed = state.limit.adopt(view.limit)
            woken = state.resize()
        if changed:
            self._changed(state, key, woken)
        else:
            for waiter in woken:
                waiter.wake()

    async def handle(self, call: Call, next: Next) -> Any:
        key = call.target.key
        state = self._target(key)
        lane = priority_var.get()
        with state.lock:
            waiter = None if state.slots.take(lane) else self._enqueue(state, key, lane)
            in_flight = state.slots.in_use if state.fleet is None else state.in_flight()
            epoch = state.limit.epoch
        if waiter is not None:
            await self._wait(state, waiter, key)
            with state.lock:
                epoch, in_flight = state.limit.epoch, state.in_flight()
        queued = queued_total_var.get()
        started = now()
        try:
            result = await next(call)
        except BaseException as exc:
            self._release(state, started)
            if isinstance(exc, Exception) and classify(exc) is ErrorKind.TIMEOUT:
                # Too slow to answer in time: a sample of at least that long.
                seconds = now() - started - (queued_total_var.get() - queued)
                self._learn(state, key, seconds, epoch, in_flight, call.stream is not None)
            else:
                self._overloaded(state, key, epoch, exc)
            raise
        seconds = now() - started - (queued_total_var.get() - queued)
        stream = isinstance(result, Stream)
        self._learn(state, key, seconds, epoch, in_flight, stream)
        if stream:
            ended = functools.partial(
                self._stream_ended, state, key, epoch, started, threadsafe_caller()
            )
            result.on_close(ended, attempt=True)
        else:
            self._release(state, started)
        return result

    def _enqueue(self, state: _Target, key: str, lane: Priority) -> Waiter | None:
        """Queue the attempt in its lane, or refuse it at once if its wait cannot end within
        the call's deadline (``None``: a slot after all). Under the lock."""
        if state.fleet is not None:
            # The fleet's view may have aged out (or never come) since it last set the share.
            for waiter in state.resize():
                waiter.wake()
            if state.slots.take(lane):
                return None
        left = remaining()
        if left is not None and state.hold is not None:
            ahead = state.waiting(PRIORITIES.index(lane))
            wait = (ahead + 1) * state.hold / state.slots.caps[lane]  # the slots its lane may use
            if wait + state.hold > left:  # its own attempt must fit too
                if events.listening():
                    events.emit(
                        events.LimitRefused(
                            current_call_id(), key, _TENANT, "concurrency", wait, 0.0
                        )
                    )
                raise LimitExceeded(key, "concurrency", wait=wait)
        return state.slots.enqueue(lane, LANE_WEIGHTS[lane])

    @staticmethod
    async def _wait(state: _Target, waiter: Waiter, key: str) -> None:
        """Wait for the slot (the call's deadline or cancellation may end the wait)."""
        started = now()
        try:
            await wait_granted(waiter, math.inf, backend())
        except BaseException:
            with state.lock:  # leave the queue, or hand on the slot just granted
                if waiter.granted:
                    woken = state.release()
                else:
                    woken = None
                    waiter.queue.waiters.remove(waiter)
            if woken is not None:
                woken.wake()
            raise
        if events.listening():
            waited = now() - started
            events.emit(events.LimitWaited(current_call_id(), key, _TENANT, "concurrency", waited))

    @staticmethod
    def _release(state: _Target, started: float | None) -> None:
        """Give the slot back; learn how long it was held (since ``started``, if known)."""
        held = None if started is None else now() - started
        with state.lock:
            hold = state.hold
            if held is not None:
                state.hold = held if hold is None else hold + _HOLD_WEIGHT * (held - hold)
            woken = state.release()
        if woken is not None:
            woken.wake()

    def _stream_ended(
        self,
        state: _Target,
        key: str,
        epoch: int,
        started: float,
        soon: Callable[[Callable[[], object]], object],
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        if outcome == "error" and error is not None:
            self._overloaded(state, key, epoch, error)
        if outcome == "abandoned":
            # Garbage-collected: this may run at any allocation, even under our lock (not
            # reentrant). Release from the event loop.
            try:
                soon(functools.partial(self._release, state, started))
                return
            except RuntimeError:  # the loop is closed: its clock too; the hold is not learned
                self._release(state, None)
                return
        self._release(state, started)

    def _learn(
        self, state: _Target, key: str, seconds: float, epoch: int, in_flight: int, stream: bool
    ) -> None:
        """A sample of ``seconds`` from an attempt of ``epoch`` (see ConcurrencyLimit.sample)."""
        with state.lock:
            changed = state.limit.sample(seconds, epoch=epoch, in_flight=in_flight, stream=stream)
            woken = state.resize() if changed else []
        if changed:
            self._changed(state, key, woken)

    def _overloaded(self, state: _Target, key: str, epoch: int, error: BaseException) -> None:
        """An attempt of ``epoch`` failed with ``error``: back off if it is an overload."""
        if isinstance(error, Exception) and overloaded(error):
            with state.lock:
                changed = state.limit.overload(epoch=epoch)
                woken = state.resize()
            if changed:
                self._changed(state, key, woken)

    @staticmethod
    def _changed(state: _Target, key: str, woken: list[Waiter]) -> None:
        """The limit changed: wake the waiters it let in; tell a material change."""
        for waiter in woken:
            waiter.wake()
        value, told = state.limit.limit, state.told
        if abs(value - told) >= max(1.0, MATERIAL * told):
            state.told = value
            if events.listening():
                events.emit(events.LimitLearned(current_call_id(), key, "concurrency", value, told))
