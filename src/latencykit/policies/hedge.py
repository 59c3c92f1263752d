"""``hedge``: when an attempt is slower than usual, send a backup and take whichever answers first.

"The Tail at Scale": a backup request sent once the primary exceeds, say, its p90 latency cuts
the p99 for a few percent more requests. Semantics (Polly v8, Finagle, gRPC):

* the first *acceptable* outcome wins; the losers are cancelled and awaited (structured: their
  HTTP connections are closed before the call returns);
* a handled (transient) failure launches the next attempt at once, without waiting the delay;
  an unhandled one (bad request, content policy, context length, a bug) cancels everything and
  is raised at once; when every attempt fails, the primary's error is raised with the others
  attached;
* the delay is fixed, or a quantile of the target's recent latencies (:func:`quantile`), with
  no hedging until enough samples arrived; while the tail is too light for a hedge at the
  quantile to win, the hedge waits until the primary itself is slow (so a hang is always
  covered);
* extra attempts draw from a :class:`~latencykit.RetryBudget` (``max_extra_load``), and none
  starts that the deadline cannot fit.

The race is lazy: the primary runs in the caller's task, in a cancel scope, with a loop timer
armed at the delay (asyncio's ``call_at``; on trio, one timer task per run serves every hedge).
No task group is entered: only when the timer fires, or the primary fails with a handled error,
does another attempt start, in a task of its own (an asyncio task, or a trio system task) that
the caller cancels and awaits before it returns. The primary keeps running where it is and
joins the race. A call that is never hedged pays for a cancel scope and a timer, not for a task
group, a task and the wake-ups of a race (docs/benchmarks.md, "Hedging against real tails").
"""

from __future__ import annotations

import contextvars
import datetime
import heapq
import itertools
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, Protocol

import anyio
import anyio.lowlevel
import sniffio

from .. import _validation, events
from .._cancel import backend
from .._context import deadline_var, reason_var, trace_var
from ..budget import RetryBudget
from ..errors import ErrorFilter, attach_others, error_predicate
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stats import LatencyWindow, Recorder, StatsTable
from ..stream import Stream

__all__ = ["Hedge", "Quantile", "hedge", "quantile"]

_RESERVE_PER_SECOND = 1.0
"""Hedges a default budget allows per second on top of ``max_extra_load`` (Finagle's reserve):
lets a cold or quiet service hedge at all, and absorbs bursts of slow primaries."""

Rewrite = Callable[[Call, int], Call]
"""``rewrite(call, index)``: the call for attempt ``index`` (0 = primary) of a hedged call."""


@dataclass(frozen=True, slots=True)
class Quantile:
    """An adaptive hedging delay: the ``q``-quantile of the target's recent latencies.

    Build it with :func:`quantile`; see there for the fields and defaults.
    """

    q: float
    _: KW_ONLY
    min_samples: int = 20
    window: float = 60.0
    max_samples: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.q, bool) or not isinstance(self.q, (int, float)) or not 0 < self.q < 1:
            raise ValueError(f"quantile.q must be a number in (0, 1), got {self.q!r}")
        for name in ("min_samples", "max_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"quantile.{name} must be an int >= 1, got {value!r}")
        if self.min_samples > self.max_samples:
            raise ValueError("quantile.min_samples must not exceed quantile.max_samples")
        object.__setattr__(self, "window", _validation.seconds("quantile.window", self.window))


def quantile(
    q: float, *, min_samples: int = 20, window: float = 60.0, max_samples: int = 1000
) -> Quantile:
    """A hedging delay equal to the ``q``-quantile of the target's recent successful latencies.

    Args:
        q: the quantile, ``0 < q < 1`` (``0.9``: hedge the slowest 10 % of attempts).
        min_samples: warm-up: no hedging until the target has this many samples in the window
            (default ``20``).
        window: seconds a sample counts (default ``60``).
        max_samples: samples kept per target, newest first (default ``1000``).

    Successful attempts feed the window with their latency; failures do not (fast failures
    would drag the delay down). An attempt cancelled before it finished (a primary whose backup
    answered first, a loser, an attempt cut off by the deadline) is a *censored* sample: its
    latency is known only to exceed the time it ran, and the quantile is a Kaplan-Meier
    estimate that counts it so (:class:`~latencykit.LatencyWindow`). So hedging does not hide
    the slow attempts it cuts short, and the delay finds the slow group of a bimodal latency
    from the first hedges on. The delay is always a latency some recent attempt completed in:
    attempts that never finish (a hang, an outage) cannot push it higher.

    Light tails: while no recent attempt took longer than the quantile plus the fastest recent
    attempt, a hedge sent at the quantile could not have won, and would only add load. Then the
    hedge waits for the primary itself to run past the quantile plus the fastest attempt: by
    then it is slower than every recent attempt, the slow call that makes the tail heavy, and a
    backup can win (a hang is the extreme case: the first one is covered, with no slow call
    seen before it). Attempts that finish within the window's range are never hedged, so a
    light tail costs no extra load; once a slow attempt is in the window, the hedge goes at the
    quantile again. ``max_extra_load`` bounds the extra load either way.
    """
    return Quantile(q, min_samples=min_samples, window=window, max_samples=max_samples)


@dataclass(frozen=True, slots=True)
class _Outcome:
    index: int
    result: Any = None
    error: Exception | None = None


def _errors(outcomes: list[_Outcome]) -> list[tuple[int, Exception]]:
    return sorted((o.index, o.error) for o in outcomes if o.error is not None)


# --- timers ---------------------------------------------------------------------------------

logger = logging.getLogger("latencykit")


class _Timer(Protocol):
    def cancel(self) -> None: ...


class _TrioTimer:
    __slots__ = ("callback", "context", "owner")

    def __init__(self, callback: Callable[[], None], owner: _TrioTimers) -> None:
        self.callback: Callable[[], None] | None = callback
        self.context = contextvars.copy_context()  # as asyncio's call_at: the caller's context
        self.owner = owner

    def cancel(self) -> None:
        if self.callback is not None:
            self.callback = None
            self.owner.cancelled += 1


class _TrioTimers:
    """``call_at`` for trio, which has none: a heap of callbacks served by one system task per
    run, sleeping in a cancel scope whose deadline is the earliest callback (moving a deadline
    is cheap; spawning a task per timer, and reaping it, is not). Cancelled timers stay in the
    heap until due, as in asyncio's loop, and are swept when they are the majority."""

    __slots__ = ("cancelled", "heap", "order", "scope")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, _TrioTimer]] = []
        self.order = itertools.count()
        self.scope: Any = None
        self.cancelled = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> _TrioTimer:
        timer = _TrioTimer(callback, self)
        heapq.heappush(self.heap, (when, next(self.order), timer))
        if self.scope is not None and when < self.scope.deadline:
            self.scope.deadline = when
        if self.cancelled > 64 and self.cancelled * 2 > len(self.heap):
            self.heap = [entry for entry in self.heap if entry[2].callback is not None]
            heapq.heapify(self.heap)
            self.cancelled = 0
        return timer

    async def serve(self) -> None:
        import trio

        while True:
            heap = self.heap
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self.scope:
                await trio.sleep_forever()
            self.scope = None
            now = trio.current_time()
            while self.heap and self.heap[0][0] <= now:
                timer = heapq.heappop(self.heap)[2]
                callback = timer.callback
                if callback is None:
                    self.cancelled -= 1
                    continue
                timer.callback = None
                try:
                    timer.context.run(callback)
                except Exception:  # a timer must not take the run down with it
                    logger.exception("latencykit hedge timer callback failed")


def _as_asyncio(callback: Callable[[], None]) -> None:
    # A loop callback runs outside any task, where sniffio (so anyio, spawning a task) cannot
    # tell which library runs; say it, for the callback only (its context is a copy).
    token = sniffio.current_async_library_cvar.set("asyncio")
    try:
        callback()
    finally:
        sniffio.current_async_library_cvar.reset(token)


_trio_timers: Any = None  # a trio.lowlevel.RunVar, made on first use (trio is imported lazily)


def _call_at(when: float, callback: Callable[[], None]) -> _Timer:
    """Run ``callback()`` on the event loop at ``when`` (its clock), in the caller's context."""
    asyncio = sys.modules.get("asyncio")
    loop = None if asyncio is None else asyncio._get_running_loop()
    if loop is not None:
        handle: _Timer = loop.call_at(when, _as_asyncio, callback)
        return handle
    global _trio_timers
    import trio

    if _trio_timers is None:
        _trio_timers = trio.lowlevel.RunVar("latencykit_hedge_timers")
    try:
        timers: _TrioTimers = _trio_timers.get()
    except LookupError:
        timers = _TrioTimers()
        _trio_timers.set(timers)
        trio.lowlevel.spawn_system_task(timers.serve, name="latencykit hedge timers")
    return timers.call_at(when, callback)


# --- the race -------------------------------------------------------------------------------


class _Race:
    """The attempts of one hedged call, raced without a task group until one is needed.

    The primary runs in the caller's task, inside a cancel scope (:meth:`run`). Every other
    attempt, launched by the delay timer or at once after a handled failure, runs in a task of
    its own with its own cancel scope (an asyncio task, or a trio system task), in the caller's
    context; the caller cancels and awaits all of them before it returns or raises, so the race
    stays structured without entering a task group on every call (anyio's costs a scheduler
    round trip on exit). Outcomes are handled as they arrive (:meth:`_finished`), by whichever
    task or timer produced them: the first success wins and cancels the rest, an unhandled error
    cancels everything, a handled one launches the next attempt.
    """

    __slots__ = (
        "backups",
        "call",
        "call_id",
        "crashed",
        "delay",
        "drained",
        "fatal",
        "hedging",
        "host",
        "next",
        "now",
        "outcomes",
        "policy",
        "settled",
        "starts",
        "tasks",
        "timer",
        "ttft",
        "winner",
    )

    def __init__(
        self, policy: Hedge, call: Call, next: Next, ttft: bool, delay: float | None
    ) -> None:
        self.policy = policy
        self.call = call
        self.next = next
        self.ttft = ttft
        self.delay = delay
        self.now = backend().now
        trace = trace_var.get()
        self.call_id = 0 if trace is None else trace.call_id
        self.outcomes: list[_Outcome] = []
        self.starts: list[float] = []
        self.winner: _Outcome | None = None
        self.fatal = False
        self.crashed: BaseException | None = None  # raised by a launch inside the timer
        self.hedging = True  # False once the budget or the deadline refused an attempt
        self.host: Any = None  # the primary's cancel scope while it runs in the caller's task
        self.backups: dict[int, Any] = {}  # attempt index -> cancel scope, while running
        self.tasks: list[Any] = []  # asyncio tasks (the loop keeps only weak references)
        self.timer: _Timer | None = None
        self.settled: anyio.Event | None = None  # made only if the caller has to wait
        self.drained: anyio.Event | None = None

    def _done(self) -> bool:
        return (
            self.winner is not None
            or self.fatal
            or len(self.starts) == len(self.outcomes)  # nothing running, nothing launched
        )

    async def run(self, primary: Call | None, first: _Outcome | None = None) -> Any:
        """Run ``primary`` here and the race around it; or, with ``first`` (the primary's
        handled failure, already on record), the race that follows it. The call's outcome."""
        scope = backend().scope
        try:
            if primary is None:
                assert first is not None
                self._finished(first)
            else:
                self.starts.append(self.now())
                self._arm()
                with scope() as self.host:  # cancelled if another attempt wins first
                    await self._attempt(0, primary)
            if not self._done():
                self.settled = anyio.Event()
                await self.settled.wait()
        finally:
            self._disarm()
            if len(self.starts) > 1:  # a race: losers, or the call is cancelled or failing
                for backup in self.backups.values():
                    backup.cancel()
                with scope(shield=True):
                    while self.backups:
                        self.drained = anyio.Event()
                        await self.drained.wait()
                    # One more loop turn: a cancelled HTTP request closes its socket in a loop
                    # callback (asyncio transports close on the next iteration); the losers'
                    # connections are closed before the call returns, not just after.
                    await anyio.lowlevel.checkpoint()
        for outcome in self.outcomes:
            # A stream that committed too late to win is closed now (its HTTP response too).
            if isinstance(outcome.result, Stream) and outcome is not self.winner:
                await outcome.result.aclose()
        if self.crashed is not None:
            raise self.crashed
        won = self.winner
        if won is not None:
            if won.index and events.listening():
                events.emit(
                    events.HedgeWon(self.call_id, attempt=won.index + 1, attempts=len(self.starts))
                )
            return won.result
        failures = _errors(self.outcomes)
        fatal = [error for _, error in failures if not self.policy._handles(error)]
        raised = (fatal or [error for _, error in failures])[0]
        attach_others(raised, [error for _, error in failures if error is not raised])
        raise raised

    async def _attempt(self, index: int, this: Call) -> None:
        reason = reason_var.set("hedge") if index else None  # a backup: in a task of its own
        try:
            result = await self.policy._send(this, self.next)
        except Exception as exc:
            outcome = _Outcome(index, error=exc)
        else:
            outcome = _Outcome(index, result=result)
        finally:
            if reason is not None:
                reason_var.reset(reason)
        if index == 0:
            self.host = None  # the primary is over: nothing left to cancel in the caller's task
        self._finished(outcome)

    async def _backup(self, index: int, this: Call, scope: Any) -> None:
        try:
            with scope:
                await self._attempt(index, this)
        finally:
            del self.backups[index]
            if not self.backups and self.drained is not None:
                self.drained.set()
            if self.settled is not None and self._done():
                self.settled.set()

    def _finished(self, outcome: _Outcome) -> None:
        self.outcomes.append(outcome)
        if self.winner is not None or self.fatal:
            pass  # decided already; a late stream is closed after the race
        elif outcome.error is None:
            self.winner = outcome
            self._stop(outcome.index)
        elif not self.policy._handles(outcome.error):
            self.fatal = True  # not worth another attempt: stop them all
            self._stop(outcome.index)
        elif self.hedging and len(self.starts) < self.policy.max_attempts:
            # A failure: the next attempt goes now, not after the delay.
            self.hedging = self._launch("failure")
        if self.settled is not None and self._done():
            self.settled.set()

    def _stop(self, decided_by: int | None) -> None:
        self._disarm()
        if self.host is not None and decided_by != 0:
            self.host.cancel()  # the primary, still running in the caller's task
        for index, scope in self.backups.items():
            if index != decided_by:
                scope.cancel()

    def _arm(self) -> None:
        self._disarm()
        if self.delay is not None and self.hedging and len(self.starts) < self.policy.max_attempts:
            self.timer = _call_at(self.starts[-1] + self.delay, self._on_delay)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_delay(self) -> None:
        self.timer = None
        if self.winner is not None or self.fatal:
            return
        try:
            self.hedging = self._launch("delay")
        except BaseException as exc:  # raised in the caller's task, as if launched there
            self.crashed = exc
            self.fatal = True
            self._stop(None)
            if self.settled is not None:
                self.settled.set()

    def _launch(self, reason: Literal["delay", "failure"]) -> bool:
        policy = self.policy
        call = self.call
        index = len(self.starts)
        this = call if policy.rewrite is None else policy.rewrite(call, index)
        if not policy._fits_deadline(this.target.key, self.ttft):
            policy._skipped(self.call_id, index, "deadline")
            return False
        if not policy.budget.try_withdraw():
            policy._skipped(self.call_id, index, "budget")
            return False
        if events.listening():
            events.emit(
                events.HedgeFired(
                    self.call_id,
                    attempt=index + 1,
                    target=this.target.key,
                    reason=reason,
                    delay=self.delay,
                )
            )
        self.starts.append(self.now())
        scope = self.backups[index] = backend().scope()
        asyncio = sys.modules.get("asyncio")
        loop = None if asyncio is None else asyncio._get_running_loop()
        if loop is not None:
            self.tasks.append(loop.create_task(self._backup(index, this, scope)))
        else:
            import trio

            trio.lowlevel.spawn_system_task(
                self._backup,
                index,
                this,
                scope,
                name=f"latencykit hedge attempt {index + 1}",
                context=contextvars.copy_context(),
            )
        self._arm()  # the next delay counts from this attempt's start
        return True


class Hedge(PolicyDecorator):
    """The hedging policy; create it with :func:`hedge` (also ``LLM(hedge=lk.Hedge(...))``).

    The arguments are :func:`hedge`'s. ``budget``, ``windows`` and ``ttft_windows`` are the live
    state: the :class:`~latencykit.RetryBudget` shared by every call through this policy, the
    :class:`~latencykit.LatencyWindow` of each target's latencies, and for streaming calls the
    one of each target's times to first content chunk (a stream is hedged on its first token).
    The windows are a :class:`~latencykit.stats.Recorder`'s: the hedge's own, which the calls
    it makes report their attempts to, or in ``lk.LLM`` the LLM's (see :meth:`reading`).
    """

    stage = Stage.HEDGE
    __slots__ = (
        "_feeding",
        "_handles",
        "_memo",
        "_recorder",
        "budget",
        "delay",
        "max_attempts",
        "on",
        "rewrite",
        "target",
        "ttft_windows",
        "windows",
    )

    def __init__(
        self,
        delay: float | datetime.timedelta | Quantile,
        *,
        max_attempts: int = 2,
        max_extra_load: float = 0.1,
        budget: RetryBudget | None = None,
        on: ErrorFilter | None = None,
        target: Literal["same", "next"] = "same",
    ) -> None:
        if isinstance(delay, Quantile):
            self.delay: float | Quantile = delay
        else:
            if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay == 0:
                self.delay = 0.0
            else:
                self.delay = _validation.seconds("hedge.delay", delay)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"hedge.max_attempts must be an int >= 1, got {max_attempts!r}")
        if target not in ("same", "next"):
            raise ValueError(f"hedge.target must be 'same' or 'next', got {target!r}")
        if budget is not None and not isinstance(budget, RetryBudget):
            raise TypeError(f"hedge.budget must be a latencykit.RetryBudget, got {budget!r}")
        if budget is None:
            try:
                budget = RetryBudget(max_extra_load, min_per_second=_RESERVE_PER_SECOND)
            except ValueError:
                raise ValueError(
                    f"hedge.max_extra_load must be a number in [0, 10], got {max_extra_load!r}"
                ) from None
        self.max_attempts = max_attempts
        self.budget = budget
        self.on = on
        self._handles = error_predicate(on, "hedge.on")
        self.target = target
        self.rewrite: Rewrite | None = None  # set by with_rewrite()
        spec = self.delay if isinstance(self.delay, Quantile) else quantile(0.5)
        self._use(Recorder(window=spec.window, max_samples=spec.max_samples), feed=True)

    def _use(self, recorder: Recorder, *, feed: bool) -> None:
        self._recorder = recorder
        self.windows: dict[str, LatencyWindow] = recorder.latency
        self.ttft_windows: dict[str, LatencyWindow] = recorder.ttft
        # Who records the attempts: this hedge, around each of its attempts; or (None) the
        # owner of the recorder, once per attempt (lk.LLM, innermost), so none counts twice.
        self._feeding: Recorder | None = recorder if feed else None
        self._memo: dict[tuple[str, bool], tuple[int, float | None]] = {}

    def __repr__(self) -> str:
        return (
            f"hedge(delay={self.delay!r}, max_attempts={self.max_attempts}, "
            f"max_extra_load={self.budget.ratio:g})"
        )

    def with_rewrite(self, rewrite: Rewrite) -> Hedge:
        """A copy sending attempt ``i`` as ``rewrite(call, i)`` (``LLM`` uses it for targets)."""
        copy = self._copy()
        copy.rewrite = rewrite
        copy._use(self._recorder, feed=self._feeding is not None)
        copy._memo = self._memo
        return copy

    def reading(self, recorder: Recorder) -> Hedge:
        """A copy whose delays come from ``recorder``'s windows, which its owner feeds with
        every attempt (``lk.LLM`` does, so that its hedge and ``llm.stats()`` read one set of
        windows); the copy records nothing itself. The budget is shared with this hedge."""
        copy = self._copy()
        copy.rewrite = self.rewrite
        copy._use(recorder, feed=False)
        return copy

    def _copy(self) -> Hedge:
        return Hedge(
            self.delay,
            max_attempts=self.max_attempts,
            budget=self.budget,
            on=self.on,
            target=self.target,
        )

    def stats(self) -> StatsTable:
        """A snapshot of the targets this hedge timed: :class:`~latencykit.stats.TargetStats`
        by target key, with the budget's balance (``print()`` it for a table).

        On a decorated function, every attempt of the calls the hedge makes is counted (a retry
        inside it too). In ``lk.LLM``, call ``llm.stats()`` (every attempt, breaker states)."""
        return self._recorder.stats(hedge_budget=self.budget.balance)

    def window(self, target: str, *, ttft: bool = False) -> LatencyWindow:
        """The latency window of ``target`` (created on first use); with ``ttft``, the window
        of its times to first content chunk (streaming calls)."""
        return self._recorder.latency_window(target, ttft=ttft)

    def current_delay(self, target: str, *, ttft: bool = False) -> float | None:
        """The hedging delay for ``target`` now (with ``ttft``: for a streaming call, from its
        times to first content chunk): for an adaptive delay, the quantile, or while the
        target's tail is too light for a hedge at the quantile to win, the quantile plus the
        fastest recent attempt (:func:`quantile`); ``None`` (no hedging) while warming up or
        with no completed attempt in the window."""
        if not isinstance(self.delay, Quantile):
            return self.delay
        window = self.window(target, ttft=ttft)
        if window.count() < self.delay.min_samples:
            return None
        return self._adaptive(window, self.delay.q)

    @staticmethod
    def _adaptive(window: LatencyWindow, q: float) -> float | None:
        found = window.quantiles(q, 0.0)
        if not found:
            return None  # nothing completed recently: no delay to go by
        delay, fastest = found
        # A hedge sent at `delay` wins only if the primary outlasts `delay` plus the backup's
        # own time. If no recent call took longer than delay + the fastest call (a light
        # tail), none would have won: a hedge at `delay` would be pure extra load. The rule
        # holds only until the primary itself runs past delay + fastest: then it is the slow
        # call that makes the tail heavy (a hang is), and the hedge goes at that moment.
        slowest = window.longest()
        if slowest is None or slowest <= delay + fastest:
            return delay + fastest
        return delay

    def _delay_for(self, target: str, ttft: bool) -> float | None:
        # current_delay() for the hot path: the estimate is recomputed once the window changed
        # by 1/32 of its samples (at least one), so a Kaplan-Meier walk over censored samples
        # (tens of microseconds with many) is paid once per ~16 calls on a full window.
        spec = self.delay
        if not isinstance(spec, Quantile):
            return spec
        window = self.window(target, ttft=ttft)
        count = window.count()
        if count < spec.min_samples:
            return None
        memo = self._memo
        key = (target, ttft)
        found = memo.get(key)
        if found is not None and window.changes - found[0] < max(1, count >> 5):
            return found[1]
        delay = self._adaptive(window, spec.q)
        memo[key] = (window.changes, delay)
        return delay

    def _fits_deadline(self, target: str, ttft: bool) -> bool:
        # An attempt is worth starting only if the budget left covers the target's typical
        # (median) latency; with no samples yet, any budget will do.
        deadline = deadline_var.get()
        if deadline == math.inf:
            return True
        typical = self.window(target, ttft=ttft).quantile(0.5) or 0.0
        return deadline - backend().now() > typical

    async def handle(self, call: Call, next: Next) -> Any:
        """Run the primary, hedge it after the delay, return the first acceptable outcome."""
        self.budget.deposit_once()
        primary = call if self.rewrite is None else self.rewrite(call, 0)
        ttft = call.stream is not None  # a stream's race is decided by its first content chunk
        if self.max_attempts == 1:
            return await self._send(primary, next)
        delay = self._delay_for(primary.target.key, ttft)
        if delay is not None:
            return await _Race(self, call, next, ttft, delay).run(primary)
        # No hedge can fall due: run the primary inline, without even a task group or a timer
        # (warm-up). Only a handled failure starts a race.
        started = backend().now()
        try:
            return await self._send(primary, next)
        except Exception as exc:
            if not self._handles(exc):
                raise
            race = _Race(self, call, next, ttft, None)
            race.starts.append(started)
            return await race.run(None, _Outcome(0, error=exc))

    async def _send(self, call: Call, next: Next) -> Any:
        # The attempts a hedge makes report to its own recorder, unless the call carries one
        # already (lk.LLM's, whose windows this hedge then reads).
        feeding = self._feeding
        if feeding is not None and call.recorder is None:
            call = call._replace(recorder=feeding)
        return await next(call)

    def _skipped(self, call_id: int, index: int, reason: Literal["budget", "deadline"]) -> None:
        if events.listening():
            events.emit(events.HedgeSkipped(call_id, attempt=index + 1, reason=reason))


def hedge(
    delay: float | datetime.timedelta | Quantile,
    *,
    max_attempts: int = 2,
    max_extra_load: float = 0.1,
    budget: RetryBudget | None = None,
    on: ErrorFilter | None = None,
    target: Literal["same", "next"] = "same",
) -> Hedge:
    """Send a backup attempt when the primary is slower than ``delay``; first good answer wins.

    Args:
        delay: seconds (or ``timedelta``; ``0`` sends all attempts at once), or
            :func:`quantile` for an adaptive delay per target.
        max_attempts: attempts per call, the primary included (default ``2``; ``1`` disables
            hedging but keeps the latency window warm).
        max_extra_load: extra attempts allowed per call over a sliding 10 s window, as a
            fraction (default ``0.1``: at most +10 % requests), plus a reserve of one hedge per
            second (as Finagle's RetryBudget) so that a cold or quiet service can hedge at all;
            ignored when ``budget`` is given.
        budget: a :class:`~latencykit.RetryBudget` to draw from instead, e.g. shared with a
            retry policy (default ``None``: a new one from ``max_extra_load``).
        on: which attempt errors launch the next attempt at once (default ``None``: transient
            errors); other errors cancel every attempt and are raised at once.
        target: where backups go in ``lk.LLM`` (default ``"same"``: the primary's target;
            ``"next"``: the next failover target). Decorated functions always call themselves.

    Losers are cancelled and awaited before the call returns. When every attempt fails, the
    primary's error is raised, with the others attached (``.others`` on latencykit errors,
    ``latencykit_others`` and a note on other exceptions). Emits ``HedgeFired``, ``HedgeWon``
    and ``HedgeSkipped`` (budget empty, or the deadline cannot fit another attempt).
    """
    return Hedge(
        delay,
        max_attempts=max_attempts,
        max_extra_load=max_extra_load,
        budget=budget,
        on=on,
        target=target,
    )
