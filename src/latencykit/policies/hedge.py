"""``hedge``: when an attempt is slower than usual, send a backup and take whichever answers first.

"The Tail at Scale": a backup request sent once the primary exceeds, say, its p90 latency cuts
the p99 for a few percent more requests. Semantics (Polly v8, Finagle, gRPC):

* the first *acceptable* outcome wins; the losers are cancelled and awaited (structured: their
  HTTP connections are closed before the call returns);
* a handled (transient) failure launches the next attempt at once, without waiting the delay;
  an unhandled one (bad request, content policy, context length, a bug) cancels everything and
  is raised at once; when every attempt fails, the primary's error is raised with the others
  attached;
* the delay is fixed, or a quantile of the target's recent successful latencies
  (:func:`quantile`), with no hedging until enough samples arrived;
* extra attempts draw from a :class:`~latencykit.RetryBudget` (``max_extra_load``), and none
  starts that the deadline cannot fit.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from .. import _validation, events
from .._cancel import backend
from .._context import deadline_var, trace_var
from ..budget import RetryBudget
from ..errors import ErrorFilter, attach_others, error_predicate
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stats import LatencyWindow
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

    Only successful attempts feed the window (fast failures would drag the delay down); an
    attempt cancelled because another won counts with the time it ran, a lower bound of its
    latency, so that hedging does not hide the slow attempts it cuts short. While no recent
    attempt took longer than the delay plus the fastest recent attempt, a hedge could not have
    won (a light tail), and none is sent; the first slow call turns hedging back on.
    """
    return Quantile(q, min_samples=min_samples, window=window, max_samples=max_samples)


@dataclass(frozen=True, slots=True)
class _Outcome:
    index: int
    result: Any = None
    error: Exception | None = None


def _errors(outcomes: list[_Outcome]) -> list[tuple[int, Exception]]:
    return sorted((o.index, o.error) for o in outcomes if o.error is not None)


class Hedge(PolicyDecorator):
    """The hedging policy; create it with :func:`hedge` (also ``LLM(hedge=lk.Hedge(...))``).

    The arguments are :func:`hedge`'s. ``budget``, ``windows`` and ``ttft_windows`` are the live
    state: the :class:`~latencykit.RetryBudget` shared by every call through this policy, the
    :class:`~latencykit.LatencyWindow` of each target's latencies, and for streaming calls the
    one of each target's times to first content chunk (a stream is hedged on its first token).
    """

    stage = Stage.HEDGE
    __slots__ = (
        "_handles",
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
        rewrite: Rewrite | None = None,
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
        self.rewrite = rewrite
        self.windows: dict[str, LatencyWindow] = {}
        self.ttft_windows: dict[str, LatencyWindow] = {}

    def __repr__(self) -> str:
        return (
            f"hedge(delay={self.delay!r}, max_attempts={self.max_attempts}, "
            f"max_extra_load={self.budget.ratio:g})"
        )

    def with_rewrite(self, rewrite: Rewrite) -> Hedge:
        """A copy sending attempt ``i`` as ``rewrite(call, i)`` (``LLM`` uses it for targets)."""
        copy = Hedge(
            self.delay,
            max_attempts=self.max_attempts,
            budget=self.budget,
            on=self.on,
            target=self.target,
            rewrite=rewrite,
        )
        copy.windows, copy.ttft_windows = self.windows, self.ttft_windows
        return copy

    def window(self, target: str, *, ttft: bool = False) -> LatencyWindow:
        """The latency window of ``target`` (created on first use); with ``ttft``, the window
        of its times to first content chunk (streaming calls)."""
        windows = self.ttft_windows if ttft else self.windows
        found = windows.get(target)
        if found is None:
            spec = self.delay if isinstance(self.delay, Quantile) else quantile(0.5)
            found = windows[target] = LatencyWindow(
                window=spec.window, max_samples=spec.max_samples
            )
        return found

    def current_delay(self, target: str, *, ttft: bool = False) -> float | None:
        """The hedging delay for ``target`` now (with ``ttft``: for a streaming call, from its
        times to first content chunk); ``None`` (no hedging) while warming up, or while the
        target's tail is too light for a hedge to win (adaptive delays only)."""
        if not isinstance(self.delay, Quantile):
            return self.delay
        window = self.window(target, ttft=ttft)
        if window.count() < self.delay.min_samples:
            return None
        delay, fastest, slowest = window.quantiles(self.delay.q, 0.0, 1.0)
        # A hedge sent at `delay` wins only if the primary outlasts `delay` plus the backup's
        # own time. If no recent call took longer than delay + the fastest call, none would
        # have won: the hedge would be pure extra load (light tails), so don't send it.
        if slowest <= delay + fastest:
            return None
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
        delay = self.current_delay(primary.target.key, ttft=ttft)
        now = backend().now
        first_error: Exception | None = None
        if delay is None or self.max_attempts == 1:
            # No hedge can fall due: run the primary inline (no task group, the common case
            # for light tails and warm-up). Only a handled failure starts the race below.
            first_started = now()
            try:
                return await self._timed(primary, next, ttft)
            except Exception as exc:
                if self.max_attempts == 1 or not self._handles(exc):
                    raise
                first_error = exc
        trace = trace_var.get()
        call_id = 0 if trace is None else trace.call_id
        outcomes: list[_Outcome] = []
        changed = anyio.Event()
        winner: list[_Outcome] = []
        starts: list[float] = []

        async def attempt(index: int, this: Call) -> None:
            started = now()
            try:
                result = await next(this)
            except Exception as exc:
                outcomes.append(_Outcome(index, error=exc))
            except BaseException:
                # Cancelled (lost the race): its running time is a lower bound of its latency.
                if winner and winner[0].index != index:
                    self.window(this.target.key, ttft=ttft).record(now() - started)
                raise
            else:
                self.window(this.target.key, ttft=ttft).record(now() - started)
                outcome = _Outcome(index, result=result)
                outcomes.append(outcome)
                if not winner:
                    winner.append(outcome)
                    group.cancel_scope.cancel()
            changed.set()

        def launch(reason: Literal["delay", "failure"] | None) -> bool:  # None: the primary
            index = len(starts)
            this = call if self.rewrite is None else self.rewrite(call, index)
            if reason is not None:
                if not self._fits_deadline(this.target.key, ttft):
                    self._skipped(call_id, index, "deadline")
                    return False
                if not self.budget.try_withdraw():
                    self._skipped(call_id, index, "budget")
                    return False
                if events.listening():
                    events.emit(
                        events.HedgeFired(
                            call_id,
                            attempt=index + 1,
                            target=this.target.key,
                            reason=reason,
                            delay=delay,
                        )
                    )
            starts.append(now())
            group.start_soon(attempt, index, this)
            return True

        hedging = True  # False once the budget or the deadline refused an attempt
        failures_seen = 0
        async with anyio.create_task_group() as group:
            if first_error is None:
                launch(None)
            else:  # the inline primary failed: the race starts with its failure on record
                starts.append(first_started)
                outcomes.append(_Outcome(0, error=first_error))
            while True:
                failures = _errors(outcomes)
                if any(not self._handles(error) for _, error in failures):
                    group.cancel_scope.cancel()  # not worth another attempt: stop them all
                    break
                running = len(starts) - len(outcomes)
                can_launch = hedging and len(starts) < self.max_attempts
                if can_launch and len(failures) > failures_seen:
                    # A failure: the next attempt goes now, not after the delay.
                    failures_seen = len(failures)
                    hedging = launch("failure")
                    continue
                if running == 0:
                    break
                wait = math.inf
                if can_launch and delay is not None:
                    wait = max(0.0, starts[-1] + delay - now())
                changed = anyio.Event()
                with anyio.move_on_after(wait) as timer:
                    await changed.wait()
                if timer.cancelled_caught:
                    hedging = launch("delay")
        for outcome in outcomes:
            # A stream that committed too late to win is closed now (its HTTP response too).
            if isinstance(outcome.result, Stream) and (not winner or outcome is not winner[0]):
                await outcome.result.aclose()
        if winner:
            won = winner[0]
            if won.index and events.listening():
                events.emit(events.HedgeWon(call_id, attempt=won.index + 1, attempts=len(starts)))
            return won.result
        failures = _errors(outcomes)
        fatal = [error for _, error in failures if not self._handles(error)]
        raised = (fatal or [error for _, error in failures])[0]
        attach_others(raised, [error for _, error in failures if error is not raised])
        raise raised

    async def _timed(self, call: Call, next: Next, ttft: bool) -> Any:
        now = backend().now
        started = now()
        result = await next(call)
        self.window(call.target.key, ttft=ttft).record(now() - started)
        return result

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

    Losers are cancelled and awaited before the call returns. When every attempt fails, the
    primary's error is raised, with the others attached (``.others`` on latencykit errors,
    ``latencykit_others`` and a note on other exceptions). Emits ``HedgeFired``, ``HedgeWon``
    and ``HedgeSkipped`` (budget empty, or the deadline cannot fit another attempt).
    """
    return Hedge(
        delay, max_attempts=max_attempts, max_extra_load=max_extra_load, budget=budget, on=on
    )
