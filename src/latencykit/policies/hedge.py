"""``hedge``: when an attempt is slower than usual, send a backup and take whichever answers first.

"The Tail at Scale": a backup request sent once the primary exceeds, say, its p90 latency cuts
the p99 for a few percent more requests. Semantics (Polly v8, Finagle, gRPC):

* the first *acceptable* outcome wins; the losers are cancelled and awaited (structured: their
  HTTP connections are closed before the call returns);
* a handled (transient) failure launches the next attempt at once, without waiting the delay;
  an unhandled one (bad request, content policy, context length, a bug) cancels everything and
  is raised at once; when every attempt fails, the primary's error is raised with the others
  attached;
* the delay is fixed, or a quantile of the target's recent latencies (:class:`quantile`), with
  no hedging until enough samples arrived; while the tail is too light for a hedge at the
  quantile to win, the hedge waits until the primary itself is slow (so a hang is always
  covered);
* extra attempts draw from a :class:`~latencykit.RetryBudget` (``max_extra_load``), and none
  starts that the deadline cannot fit.

The race is :mod:`latencykit._race`'s (``lk.first``'s too): the primary runs in the caller's
task and keeps running there when a backup starts; a call that is never hedged pays for a
cancel scope and a timer, not for a task group (and for neither while no backup could start
before the deadline or the delay is not known yet).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from .. import _validation, events
from .._cancel import now
from .._context import current_call_id, deadline_var, reason_var
from .._race import Race, Reason
from ..budget import RetryBudget
from ..errors import ErrorFilter, attach_others, error_predicate
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stats import LatencyWindow, Recorder, StatsTable

__all__ = ["Hedge", "Quantile", "hedge", "quantile"]

_RESERVE_PER_SECOND = 1.0
"""Hedges a default budget allows per second on top of ``max_extra_load`` (Finagle's reserve):
lets a cold or quiet service hedge at all, and absorbs bursts of slow primaries."""

Rewrite = Callable[[Call, int], Call]
"""``rewrite(call, index)``: the call for attempt ``index`` (0 = primary) of a hedged call."""


@dataclass(frozen=True, slots=True)
class Quantile:
    """An adaptive hedging delay: the ``q``-quantile of the target's recent successful
    latencies (``lk.quantile(0.9)``; ``lk.quantile`` is this class).

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

    q: float
    _: KW_ONLY
    min_samples: int = 20
    window: float = 60.0
    max_samples: int = 1000

    def __post_init__(self) -> None:
        _validation.number("quantile.q", self.q, low=0.0, high=1.0, open=True)
        _validation.count("quantile.min_samples", self.min_samples)
        _validation.count("quantile.max_samples", self.max_samples)
        if self.min_samples > self.max_samples:
            raise ValueError("quantile.min_samples must not exceed quantile.max_samples")
        object.__setattr__(self, "window", _validation.seconds("quantile.window", self.window))


quantile = Quantile
"""The same class: ``lk.quantile(0.9)`` reads as the delay it is."""


class _Attempts(Race):
    """The attempts of one hedged call as a :class:`~latencykit._race.Race`: where each backup
    goes, whether budget and deadline allow it, what stops the race, what is raised at the end."""

    __slots__ = ("call", "next", "policy", "ttft")

    def __init__(
        self, policy: Hedge, call: Call, next: Next, ttft: bool, delay: float | None
    ) -> None:
        super().__init__(delay, limit=policy.max_attempts)
        self.policy = policy
        self.call = call
        self.next = next
        self.ttft = ttft

    @property
    def call_id(self) -> int:
        """The hedged call's id (read in the events only: every contender's context has the
        call's trace)."""
        return current_call_id()

    def contender(self, index: int, reason: Reason) -> Awaitable[Any] | None:
        policy = self.policy
        this = self.call if policy.rewrite is None else policy.rewrite(self.call, index)
        if not policy._fits_deadline(this.target.key, self.ttft):
            policy._skipped(self.call_id, index, "deadline")
            return None
        if not policy.budget.try_withdraw():
            policy._skipped(self.call_id, index, "budget")
            return None
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
        return self._attempt(this)

    async def _attempt(self, call: Call) -> Any:
        reason_var.set("hedge")  # in the backup's own task, whose context is a copy
        return await self.next(call)

    def handled(self, error: Exception) -> bool:
        return self.policy._handles(error)

    def outcome(self) -> Any:
        """The winner's result; or, when every attempt failed, the primary's error (the first
        unhandled one, if any) raised with the others attached."""
        if self.won < 0:
            raise self._failure()
        if self.won and events.listening():
            events.emit(
                events.HedgeWon(self.call_id, attempt=self.won + 1, attempts=len(self.starts))
            )
        return self.winner

    def _failure(self) -> Exception:
        """The primary's error (the first unhandled one, if any), the others attached."""
        by_attempt = sorted(self.lost, key=lambda lost: lost.index)
        errors = [lost.error for lost in by_attempt if lost.error is not None]
        fatal = [error for error in errors if not self.policy._handles(error)]
        raised = (fatal or errors)[0]
        attach_others(raised, [error for error in errors if error is not raised])
        return raised


class Hedge(PolicyDecorator):
    """Send a backup attempt when the primary is slower than ``delay``; first good answer wins:
    a policy and a decorator (``@lk.hedge(delay=lk.quantile(0.9))``; ``lk.hedge`` is this class,
    also ``LLM(hedge=lk.Hedge(...))``).

    Args:
        delay: seconds (or ``timedelta``; ``0`` sends all attempts at once), or
            :class:`quantile` for an adaptive delay per target.
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

    Each option is an attribute of the same name (``max_extra_load``: the budget's ratio).
    ``budget``, ``windows`` and ``ttft_windows`` are the live state: the
    :class:`~latencykit.RetryBudget` shared by every call through this policy, the
    :class:`~latencykit.LatencyWindow` of each target's latencies, and for streaming calls the
    one of each target's times to first content chunk (a stream is hedged on its first token).
    The windows are a :class:`~latencykit.stats.Recorder`'s: the hedge's own, which the calls
    it makes report their attempts to, or in ``lk.LLM`` the LLM's (see :meth:`reading`).
    ``tuned`` (default ``None``) holds the quantile per target key that the SLO autopilot set
    (:meth:`set_quantile`), which wins over ``delay``.
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
        "tuned",
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
        self.delay: float | Quantile = (
            delay if isinstance(delay, Quantile) else _validation.wait("hedge.delay", delay)
        )
        self.max_attempts = _validation.count("hedge.max_attempts", max_attempts)
        self.target = _validation.choice("hedge.target", target, ("same", "next"))
        self.budget = _validation.optional("hedge.budget", budget, RetryBudget) or RetryBudget(
            _validation.number("hedge.max_extra_load", max_extra_load, low=0.0, high=10.0),
            min_per_second=_RESERVE_PER_SECOND,
        )
        self.on = on
        self._handles = error_predicate(on, "hedge.on")
        self.rewrite: Rewrite | None = None  # set by with_rewrite()
        # The SLO autopilot's quantile per target key (None: no hedge), over ``delay``.
        self.tuned: dict[str, float | None] | None = None
        spec = self.delay if isinstance(self.delay, Quantile) else Quantile(0.5)
        self._use(Recorder(window=spec.window, max_samples=spec.max_samples), feed=True)

    @property
    def max_extra_load(self) -> float:
        """The budget's ratio: extra attempts allowed per call."""
        return self.budget.ratio

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
        copy = Hedge(
            self.delay,
            max_attempts=self.max_attempts,
            budget=self.budget,
            on=self.on,
            target=self.target,
        )
        copy.tuned = self.tuned
        return copy

    def set_quantile(self, target: str, q: float | None) -> None:
        """Hedge ``target``'s calls at its ``q``-quantile from now on, whatever ``delay`` says
        (``None``: do not hedge them); what the SLO autopilot sets (:mod:`latencykit.autopilot`)."""
        if self.tuned is None:
            self.tuned = {}
        self.tuned[target] = q
        self._memo.pop((target, False), None)
        self._memo.pop((target, True), None)

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
        fastest recent attempt (:class:`quantile`); ``None`` (no hedging) while warming up or
        with no completed attempt in the window. An adaptive delay is estimated again once
        the window changed by 1/32 of its samples (at least one): a Kaplan-Meier walk over
        censored samples (tens of microseconds with many) is paid once per ~16 calls on a
        full window."""
        spec = self.delay
        tuned = self.tuned
        if tuned is not None and target in tuned:  # the SLO autopilot's
            q = tuned[target]
            if q is None:
                return None
        elif isinstance(spec, Quantile):
            q = spec.q
        else:
            return spec
        window = self.window(target, ttft=ttft)
        count = window.count()
        if count < (spec.min_samples if isinstance(spec, Quantile) else 20):
            return None
        key = (target, ttft)
        found = self._memo.get(key)
        if found is not None and window.changes - found[0] < max(1, count >> 5):
            return found[1]
        delay = self._adaptive(window, q)
        self._memo[key] = (window.changes, delay)
        return delay

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

    def _fits_deadline(self, target: str, ttft: bool) -> bool:
        # An attempt is worth starting only if the budget left covers the target's typical
        # (median) latency; with no samples yet, any budget will do.
        deadline = deadline_var.get()
        if deadline == math.inf:
            return True
        typical = self.window(target, ttft=ttft).quantile(0.5) or 0.0
        return deadline - now() > typical

    async def handle(self, call: Call, next: Next) -> Any:
        """Run the primary, hedge it after the delay, return the first acceptable outcome."""
        self.budget.deposit_once()
        # The attempts a hedge makes report to its own recorder, unless the call carries one
        # already (lk.LLM's, whose windows this hedge then reads).
        if self._feeding is not None and call.recorder is None:
            call = call._replace(recorder=self._feeding)
        primary = call if self.rewrite is None else self.rewrite(call, 0)
        ttft = call.stream is not None  # a stream's race is decided by its first content chunk
        started = now()
        delay = self.current_delay(primary.target.key, ttft=ttft) if self.max_attempts > 1 else None
        if delay is not None and started + delay < deadline_var.get():
            race = _Attempts(self, call, next, ttft, delay)
            await race.run(next(primary), started)
            return race.outcome()
        # No hedge can fall due (one attempt, warm-up, or a delay the deadline ends first): the
        # primary runs inline, without a cancel scope or a timer. Only a handled failure starts
        # a race.
        try:
            return await next(primary)
        except Exception as exc:
            if self.max_attempts == 1 or not self._handles(exc):
                raise
            race = _Attempts(self, call, next, ttft, None)
            race.first_failed(started, exc)
            await race.run(None)
            return race.outcome()

    def _skipped(self, call_id: int, index: int, reason: Literal["budget", "deadline"]) -> None:
        if events.listening():
            events.emit(events.HedgeSkipped(call_id, attempt=index + 1, reason=reason))


hedge = Hedge
"""The same class: ``@lk.hedge(delay=0.5)`` reads as the decorator it is."""
