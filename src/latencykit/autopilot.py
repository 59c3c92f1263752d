"""The SLO autopilot: an ``LLM``'s limits set from live measurements, bounded by an objective.

``lk.LLM(..., slo=lk.SLO(ttft_p99=2.0, total_p99=20.0, max_extra_load=0.05))`` declares what
the calls must achieve; the autopilot then sets, per target, the stream guard's first-token
and stall limits, the hedge's quantile and the breaker's slow-call threshold:

- **measure**: each target's recent windows (the ``LLM``'s recorder: fleet-wide with a shared
  store) give the p99 of its times to first chunk, of its longest gaps and of its latencies;
- **propose** (:func:`propose`, pure): one small step per setting toward what the
  measurements and the SLO ask (a limit moves at most by half or by half again per round, and
  only when it is more than 25 % off; the hedge walks a ladder of quantiles, tightening while
  the predicted p99 is over 90 % of the objective, loosening only once it is under 75 %: the
  hysteresis band);
- **check**: the recent attempts (at most :data:`MAX_REPLAYED`, the last ``SLO.window``
  seconds) are replayed on virtual time (:mod:`latencykit.lab.replay`, a fixed seed) with the
  current setting and with each step; a step is applied only if the replay predicts it within
  the extra-load budget, failing no more calls, and either meeting the SLO or no further from
  it than the current setting (while the SLO is missed); a slow-call threshold step is
  replayed through the breaker's own window and rule instead, and refused when the same
  attempts would open the breaker where the old threshold would not;
- **explain**: every step, applied or refused, is an :class:`~latencykit.events.AutopilotChanged`
  event (old and new value, reason, the measurements and predictions behind it), kept in
  :attr:`Autopilot.history`; ``llm.stats()`` shows the current values and who set them.

The loop runs every ``SLO.every`` seconds in a background task of the ``LLM``'s event loop,
started by its first attempt and ended by ``LLM.aclose()``; the replays run in a worker thread
(about 0.3 s of CPU per thousand attempts replayed), never on the event loop. Without ``slo=``
nothing of this runs: the policies read the values the autopilot sets from one attribute each,
and this module's replay machinery is imported on the first round.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from . import _validation, events
from ._cancel import clock, spawn_detached
from .errors import ErrorKind

if TYPE_CHECKING:
    from ._context import Attempt
    from .lab.replay import ReplayRow, TraceRecord
    from .policies.breaker import Breaker
    from .policies.guard import StreamGuard
    from .policies.hedge import Hedge
    from .stats import Recorder, StatsTable
    from .target import Target

__all__ = [
    "BAND",
    "HEADROOM",
    "LADDER",
    "MAX_REPLAYED",
    "MIN_SAMPLES",
    "SLO",
    "Autopilot",
    "Change",
    "Measured",
    "Setting",
    "SettingName",
    "propose",
]

_logger = logging.getLogger("latencykit")

MAX_REPLAYED = 2000
"""The most recent attempts a round replays (all targets together): bounds a round's CPU work
(about 0.3 ms per attempt replayed)."""
MIN_SAMPLES = 50
"""Attempts a target needs in the replayed window before the autopilot tunes it."""
LADDER = (0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.92, 0.91, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
"""The hedge quantiles the autopilot steps through, one rung per round (above the top rung:
no hedging); only rungs with ``1 - q <= max_extra_load`` are used."""
HEADROOM = 0.9
"""The autopilot tightens while a predicted p99 is over this fraction of its objective: a p99
measured over a minute of calls scatters around its true value, so it aims a little under."""
BAND = 0.25
"""Hysteresis: a limit changes only when it is more than this far (relative) from its goal;
hedging loosens only once every p99 is under ``1 - BAND`` of its objective."""
_DOWN, _UP = 0.5, 1.5  # a limit's largest step per round: halved, or half again
_FIRST_TOKEN_FLOOR, _STALL_FLOOR, _SLOW_FLOOR = 1.0, 2.0, 1.0
_MORE_FAILED = 0.001  # a step may not fail more calls than this (0.1 % of them)
_MULTIPLE = 3.0  # a limit is this multiple of the measured p99 (as the guard learns it)

SettingName = Literal["hedge_quantile", "first_token", "stall", "slow_call_duration"]
"""What the autopilot sets, per target."""


@dataclasses.dataclass(frozen=True, slots=True)
class SLO:
    """A service-level objective for an ``LLM``'s calls, which its autopilot tunes toward
    (``lk.LLM(..., slo=lk.SLO(ttft_p99=2.0))``; see docs/autopilot.md).

    Args:
        ttft_p99: the 99th percentile of the time to first content chunk of streamed calls, in
            seconds (default ``None``: no objective). A call that fails counts as never
            answering.
        total_p99: the 99th percentile of a call's whole duration, in seconds (default
            ``None``: no objective). At least one of the two is required.
        max_extra_load: the extra attempts (hedges) the autopilot may add, as a fraction of
            calls (default ``0.05``: +5 %); also the budget of the hedge it creates.
        every: seconds between two rounds of tuning (default ``120``).
        window: seconds of recent attempts a round replays (default ``600``; at most
            :data:`MAX_REPLAYED` attempts).

    Invalid values raise ``ValueError`` naming the field.
    """

    ttft_p99: float | None = None
    total_p99: float | None = None
    max_extra_load: float = 0.05
    every: float = 120.0
    window: float = 600.0

    def __post_init__(self) -> None:
        for name in ("ttft_p99", "total_p99"):
            value = _validation.optional_seconds(f"SLO.{name}", getattr(self, name))
            object.__setattr__(self, name, value)
        if self.ttft_p99 is None and self.total_p99 is None:
            raise ValueError("SLO needs an objective: SLO.ttft_p99 or SLO.total_p99 (seconds)")
        load = _validation.number("SLO.max_extra_load", self.max_extra_load, 0.0, 1.0)
        object.__setattr__(self, "max_extra_load", load)
        object.__setattr__(self, "every", _validation.seconds("SLO.every", self.every))
        object.__setattr__(self, "window", _validation.seconds("SLO.window", self.window))

    def objectives(self) -> dict[str, float]:
        """The declared objectives by name (``{"ttft_p99": 2.0}``)."""
        found = {"ttft_p99": self.ttft_p99, "total_p99": self.total_p99}
        return {name: value for name, value in found.items() if value is not None}


class Setting(NamedTuple):
    """What the autopilot controls on one target (``None``: off, or no limit of its own).

    Attributes:
        hedge_quantile: the hedge's delay, a quantile of the target's recent latencies (times
            to first chunk, for a stream); ``None``: no hedging.
        first_token: the stream guard's first-token limit, in seconds.
        stall: the stream guard's stall limit, in seconds.
        slow_call_duration: the breaker's slow-call threshold, in seconds (``None``: no
            breaker).
    """

    hedge_quantile: float | None = None
    first_token: float | None = None
    stall: float | None = None
    slow_call_duration: float | None = None


class Measured(NamedTuple):
    """What a round knows of one target: its attempts' p99s from the recorder's windows, and
    the replay's prediction of the calls' p99s with the current setting (``None``: unknown).

    Attributes:
        samples: attempts of the target in the replayed window.
        ttft_p99: the p99 of its attempts' times to first chunk.
        gap_p99: the p99 of its complete streams' longest gaps.
        latency_p99: the p99 of its attempts' latencies.
        predicted: the replay's call-level figures for the current setting: ``ttft_p99``,
            ``total_p99`` and ``extra`` (extra attempts per call).
    """

    samples: int
    ttft_p99: float | None = None
    gap_p99: float | None = None
    latency_p99: float | None = None
    predicted: Mapping[str, float] = {}


class Change(NamedTuple):
    """One step of one setting on one target, applied or refused (:attr:`Autopilot.history`).

    Attributes:
        at: the loop's clock when it was decided.
        target: the target's key.
        setting: which setting.
        old: its value before.
        new: the value proposed.
        reason: why it was proposed, and for a refused step why the replay refused it.
        applied: whether it was applied.
        measurements: the figures behind it: the window's p99s, the replay's predictions for
            the old (``before_*``) and the new (``after_*``) value.
    """

    at: float
    target: str
    setting: SettingName
    old: float | None
    new: float | None
    reason: str
    applied: bool = True
    measurements: Mapping[str, float] = {}


def _toward(current: float | None, goal: float) -> float | None:
    """One step of a limit from ``current`` toward ``goal`` (``None``: it is close enough)."""
    if current is None or not math.isfinite(current):
        return goal
    if abs(goal / current - 1.0) <= BAND:
        return None
    return min(max(goal, current * _DOWN), current * _UP)


def _rungs(max_extra_load: float) -> tuple[float, ...]:
    return tuple(q for q in LADDER if 1.0 - q <= max_extra_load + 1e-9)


def _missing(
    slo: SLO, predicted: Mapping[str, float], streaming: bool, within: float = 1.0
) -> dict[str, float]:
    """The objectives the prediction misses (over ``within`` of them), with their values."""
    return {
        name: predicted[name]
        for name, goal in slo.objectives().items()
        if (streaming or name != "ttft_p99") and predicted.get(name, 0.0) > within * goal
    }


def _hedge_step(
    slo: SLO, q: float | None, predicted: Mapping[str, float], streaming: bool
) -> tuple[SettingName, float | None, str] | None:
    """One rung of the hedge's ladder: tighter while the prediction misses the SLO (by
    :data:`HEADROOM`) within the budget, looser once it is comfortably under (the band)."""
    rungs = _rungs(slo.max_extra_load)
    missing = _missing(slo, predicted, streaming, HEADROOM)
    if missing and predicted.get("extra", 0.0) < slo.max_extra_load:
        tighter = [rung for rung in rungs if q is None or rung < q - 1e-9]
        if not tighter:
            return None
        said = ", ".join(f"{name} {_s(value)}" for name, value in missing.items())
        return ("hedge_quantile", tighter[0], f"predicted {said}: over the SLO")
    if missing or q is None or not predicted:
        return None
    if _missing(slo, predicted, streaming, 1.0 - BAND):
        return None  # under the SLO, but not comfortably: hold (hysteresis)
    looser = [rung for rung in rungs if rung > q + 1e-9]
    return ("hedge_quantile", looser[-1] if looser else None, "well under the SLO")


def _limit_goals(
    slo: SLO, current: Setting, measured: Measured, streaming: bool
) -> list[tuple[SettingName, float | None, float, str]]:
    """Each limit's goal: ``(setting, current value, goal, why)``, for the limits that apply."""
    goals: list[tuple[SettingName, float | None, float, str]] = []
    bound = slo.ttft_p99 if slo.ttft_p99 is not None else slo.total_p99
    if streaming and measured.ttft_p99 is not None and bound is not None:
        goal = max(_FIRST_TOKEN_FLOOR, min(bound, _MULTIPLE * measured.ttft_p99))
        goals.append(("first_token", current.first_token, goal, "3x the p99, within the SLO"))
    if streaming and measured.gap_p99 is not None:
        goal = min(_MULTIPLE * measured.gap_p99, slo.total_p99 or math.inf)
        goal = max(_STALL_FLOOR, goal)
        goals.append(("stall", current.stall, goal, "3x the p99 of the longest gaps"))
    if (
        current.slow_call_duration is not None
        and slo.total_p99 is not None
        and measured.latency_p99 is not None
    ):
        goal = max(_SLOW_FLOOR, min(slo.total_p99, _MULTIPLE * measured.latency_p99))
        goals.append(("slow_call_duration", current.slow_call_duration, goal, "within total_p99"))
    return goals


def propose(
    slo: SLO, current: Setting, measured: Measured, *, streaming: bool
) -> list[tuple[SettingName, float | None, str]]:
    """The next step of each setting of one target: ``(setting, new value, reason)``, at most
    one per setting, none while the target has fewer than :data:`MIN_SAMPLES` samples.

    Pure: the same inputs give the same steps (``streaming``: the target's calls are streams,
    so the first-token and stall limits apply and ``ttft_p99`` is an objective)."""
    if measured.samples < MIN_SAMPLES:
        return []
    hedge = _hedge_step(slo, current.hedge_quantile, measured.predicted, streaming)
    steps = [] if hedge is None else [hedge]
    for setting, value, goal, why in _limit_goals(slo, current, measured, streaming):
        step = _toward(value, goal)
        if step is not None:
            steps.append((setting, step, f"goal {goal:.3g}s: {why}"))
    return steps


# --- the recent attempts, as a trace -------------------------------------------------------------


class _Seen(NamedTuple):
    at: float
    attempt: Attempt


def _records(seen: Sequence[_Seen], seed: int) -> list[TraceRecord]:
    """The attempts as trace records. An attempt cut short (cancelled, or past a time limit)
    says only that it would have taken longer: it is given a completed attempt of the same
    target that took longer (drawn with ``seed``; Kaplan-Meier's reading of a censored
    sample), or its own time when none did."""
    import bisect
    import random

    from .lab.replay import TraceRecord

    rng = random.Random(seed)
    done = [
        TraceRecord(a.target, a.ttft if a.ttft is not None else a.duration, a.duration)
        for _, a in seen
        if a.outcome == "ok"
    ]
    # Each target's completed records by time to first chunk, and by duration.
    by_ttft: dict[str, list[TraceRecord]] = {}
    for record in sorted(done, key=lambda r: r.ttft):
        by_ttft.setdefault(record.target, []).append(record)
    by_end: dict[str, list[TraceRecord]] = {}
    for record in sorted(done, key=lambda r: r.duration):
        by_end.setdefault(record.target, []).append(record)
    found = []
    completed = iter(done)
    for _, a in seen:
        if a.outcome == "ok":
            found.append(next(completed))
        elif a.outcome == "cancelled" or a.error_kind is ErrorKind.TIMEOUT:
            if a.ttft is None:  # cut before its first chunk: a longer time to it
                pool = by_ttft.get(a.target, [])
                at = bisect.bisect_right(pool, a.duration, key=lambda r: r.ttft)
            else:  # cut after it: only its end is unknown
                pool = by_end.get(a.target, [])
                at = bisect.bisect_right(pool, a.duration, key=lambda r: r.duration)
            if at < len(pool):
                pick = pool[rng.randrange(at, len(pool))]
                ttft = a.ttft if a.ttft is not None else pick.ttft
                found.append(TraceRecord(a.target, ttft, max(ttft, pick.duration)))
            else:
                found.append(TraceRecord(a.target, a.ttft or a.duration, a.duration))
        elif a.error_kind is not None and a.error_kind.value in _PROVIDER_FAILURES:
            code = "429" if a.error_kind is ErrorKind.RATE_LIMITED else "503"
            found.append(TraceRecord(a.target, a.duration, a.duration, error=code))
    return found


_PROVIDER_FAILURES = frozenset(
    kind.value
    for kind in (
        ErrorKind.RATE_LIMITED,
        ErrorKind.SERVER_ERROR,
        ErrorKind.CONNECTION,
        ErrorKind.STREAM_BROKEN,
    )
)


def _figures(row: ReplayRow) -> dict[str, float]:
    """A replay's call-level figures: the p99 of the time to first chunk (a call that never
    answered counts as infinitely late), of the duration, and the extra load."""
    firsts = sorted(row.ttfts) + [math.inf] * (row.requests - len(row.ttfts))
    found = {"total_p99": row.p99, "extra": row.extra, "failed": row.errors / row.requests}
    if row.ttft_p99 is not None:
        found["ttft_p99"] = firsts[max(0, math.ceil(0.99 * len(firsts)) - 1)]
    return found


def _run_aside(work: Callable[[], Any]) -> Any:
    """``work()`` in a thread of its own, waited for here (blocking): a replay runs its own
    event loop, which cannot run in a thread whose loop is running."""
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="latencykit autopilot replay")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


# --- the autopilot -------------------------------------------------------------------------------


class Autopilot:
    """One ``LLM``'s autopilot (``llm.autopilot``; built by ``LLM(slo=...)``).

    Args:
        slo: the objective.
        targets: the ``LLM``'s targets (each tuned on its own).
        recorder: the ``LLM``'s record of every attempt (the measurements).
        hedge: the ``LLM``'s hedge, whose quantile per target this sets (its ``tuned``).
        guard: the ``LLM``'s bound stream guard, whose limits per target this sets.
        breaker_of: each target's breaker (default ``None``: no breakers).
        owns_hedge: the hedge was made for the autopilot (no hedging until it turns it on).

    Attributes:
        history: every step decided so far, applied or refused (:class:`Change`).
        forecasts: each round's prediction for each target it tuned, with the setting then
            in force: ``(at, target, figures)``, the figures as in :class:`Change`'s
            ``measurements`` (``ttft_p99``, ``total_p99``, ``extra``).
        blocking: run a round's replays in a thread *waited for on the event loop* (default
            ``False``: a worker thread the loop does not wait for). A virtual-time run (the
            lab) sets it, so that no virtual time passes during a round.
    """

    def __init__(
        self,
        slo: SLO,
        *,
        targets: Sequence[Target],
        recorder: Recorder,
        hedge: Hedge,
        guard: StreamGuard,
        breaker_of: Callable[[str], Breaker] | None = None,
        owns_hedge: bool = False,
    ) -> None:
        self.slo = slo
        self.targets = tuple(targets)
        self._recorder = recorder
        self._hedge, self._guard, self._breaker_of = hedge, guard, breaker_of
        self._owns_hedge = owns_hedge
        self._quantiles: dict[str, float | None] = hedge.tuned if hedge.tuned is not None else {}
        hedge.tuned = self._quantiles
        self._limits: dict[tuple[str, bool], float] = {}
        guard.tuned = self._limits
        if owns_hedge:
            self._quantiles.update((t.key, None) for t in self.targets)
            hedge.max_attempts = 1
        self._set: set[tuple[str, SettingName]] = set()  # what the autopilot set
        self._seen: deque[_Seen] = deque(maxlen=MAX_REPLAYED)
        self.history: list[Change] = []
        self.forecasts: list[tuple[float, str, dict[str, float]]] = []
        self.blocking = False
        self.rounds = 0
        self._started = False
        self._scope: Any = None
        self._done: Any = None
        recorder.on_record = self._observe

    def __repr__(self) -> str:
        return f"Autopilot({self.slo!r}, rounds={self.rounds}, changes={len(self.history)})"

    # -- the values, as the policies read them ----------------------------------------------------

    def setting(self, target: str) -> Setting:
        """``target``'s current setting (the values its calls use now)."""
        known = next((t for t in self.targets if t.key == target), None)
        first, stall = (None, None) if known is None else self._guard.limits(known)
        breaker = None if self._breaker_of is None else self._breaker_of(target)
        return Setting(
            hedge_quantile=self._quantile(target),
            first_token=None if first is None else float(first),
            stall=None if stall is None else float(stall),
            slow_call_duration=None if breaker is None else breaker.slow_call_duration,
        )

    def _quantile(self, target: str) -> float | None:
        if target in self._quantiles:
            return self._quantiles[target]
        from .policies.hedge import Quantile

        delay = self._hedge.delay
        return delay.q if isinstance(delay, Quantile) else None

    def sources(self, target: str) -> dict[SettingName, str]:
        """Where each of ``target``'s values comes from: ``"slo"`` (the autopilot set it),
        ``"learned"``, ``"configured"`` or ``"timeout"`` (a limit), ``"off"``."""
        known = next((t for t in self.targets if t.key == target), None)
        first, stall = (None, None) if known is None else self._guard.limits(known)
        found: dict[SettingName, str] = {
            # a hedge you gave with a fixed delay is configured, with no quantile
            "hedge_quantile": "off"
            if self._quantile(target) is None and self._owns_hedge
            else "configured",
            "first_token": "off" if first is None else getattr(first, "source", "configured"),
            "stall": "off" if stall is None else getattr(stall, "source", "configured"),
            "slow_call_duration": "off" if self._breaker_of is None else "configured",
        }
        for name in found:
            if (target, name) in self._set:
                found[name] = "slo"
        return found

    def _apply(self, target: str, name: SettingName, value: float | None) -> None:
        self._set.add((target, name))
        if name == "hedge_quantile":
            self._hedge.set_quantile(target, value)
            if self._owns_hedge:  # off for every target: no backup on failures either
                self._hedge.max_attempts = 2 if any(self._quantiles.values()) else 1
        elif name == "slow_call_duration":
            assert self._breaker_of is not None and value is not None
            self._breaker_of(target).slow_call_duration = value
        else:
            assert value is not None
            self._limits[target, name == "stall"] = value

    def with_settings(self, table: StatsTable) -> StatsTable:
        """``table`` with each known target's current setting and its sources."""
        from .stats import StatsTable

        rows = []
        for key, row in table.items():
            if all(t.key != key for t in self.targets):
                rows.append(row)
                continue
            setting = self.setting(key)
            rows.append(
                dataclasses.replace(
                    row,
                    first_token_limit=setting.first_token,
                    stall_limit=setting.stall,
                    hedge_quantile=setting.hedge_quantile,
                    slow_call_duration=setting.slow_call_duration,
                    sources={str(k): v for k, v in self.sources(key).items()},
                )
            )
        return StatsTable(rows)

    # -- the loop ---------------------------------------------------------------------------------

    def _observe(self, attempt: Attempt) -> None:
        """Every attempt of the ``LLM`` (the recorder's hook); the first starts the loop."""
        self._seen.append(_Seen(clock(), attempt))
        if not self._started:
            self._started = True
            spawn_detached(self._serve)

    async def _serve(self) -> None:
        import anyio

        self._done = anyio.Event()
        try:
            with anyio.CancelScope() as self._scope:
                while True:
                    await anyio.sleep(self.slo.every)
                    try:
                        await self.step()
                    except Exception:  # a round that fails is logged; the next one runs
                        _logger.exception("latencykit autopilot: a round failed")
        finally:
            self._done.set()

    async def aclose(self) -> None:
        """Stop the loop and wait for it to end (a round under way finishes first)."""
        self._started = True  # no loop starts after this
        if self._scope is not None:
            self._scope.cancel()
            await self._done.wait()

    async def step(self) -> list[Change]:
        """One round now: measure, propose, check by replay, apply; returns its steps (also
        appended to :attr:`history` and emitted as events)."""
        import anyio

        now = clock()
        seen = [s for s in self._seen if s.at >= now - self.slo.window]
        settings = {t.key: self.setting(t.key) for t in self.targets}
        measured = {t.key: self._measure(t.key, seen) for t in self.targets}
        self.rounds += 1
        round_ = self.rounds

        def decide() -> tuple[list[Change], list[tuple[float, str, dict[str, float]]]]:
            events._muted.set(True)  # the replays' own events are not the application's
            return self._decide(now, seen, settings, measured, round_)

        changes: list[Change]
        if self.blocking:
            changes, forecasts = _run_aside(decide)
        else:
            changes, forecasts = await anyio.to_thread.run_sync(decide)
        self.forecasts += forecasts
        for change in changes:
            if change.applied:
                self._apply(change.target, change.setting, change.new)
            self.history.append(change)
            if events.listening():
                events.emit(
                    events.AutopilotChanged(
                        0,
                        target=change.target,
                        setting=change.setting,
                        old=change.old,
                        new=change.new,
                        reason=change.reason,
                        applied=change.applied,
                        measurements=dict(change.measurements),
                    )
                )
        return changes

    def _measure(self, target: str, seen: Sequence[_Seen]) -> Measured:
        recorder = self._recorder
        gaps = recorder.gaps.get(target)
        return Measured(
            samples=sum(s.attempt.target == target for s in seen),
            ttft_p99=recorder.latency_window(target, ttft=True).quantile(0.99),
            gap_p99=None if gaps is None else gaps.quantile(0.99),
            latency_p99=recorder.latency_window(target).quantile(0.99),
        )

    # -- a round's decisions (in a worker thread: no shared state is written) ---------------

    def _decide(
        self,
        now: float,
        seen: Sequence[_Seen],
        settings: Mapping[str, Setting],
        measured: Mapping[str, Measured],
        round_: int,
    ) -> tuple[list[Change], list[tuple[float, str, dict[str, float]]]]:
        records = _records(seen, seed=round_)
        forecasts: list[tuple[float, str, dict[str, float]]] = []
        primaries = [s for s in seen if s.attempt.reason == "primary"]
        span = (seen[-1].at - seen[0].at) if len(seen) > 1 else 0.0
        changes: list[Change] = []
        for target in self.targets:
            mine = [s for s in primaries if s.attempt.target == target.key]
            found = measured[target.key]
            if found.samples < MIN_SAMPLES or span <= 0 or not mine:
                continue
            streaming = any(s.attempt.ttft is not None for s in mine)
            replay = _Replayer(self, target, records, len(mine) / span, streaming, round_)
            base = settings[target.key]
            before = replay(base)
            found = found._replace(predicted=before)
            window = {k: v for k, v in found._asdict().items() if isinstance(v, (int, float))}
            for name, new, reason in propose(self.slo, base, found, streaming=streaming):
                old = getattr(base, name)
                figures = {**_named(window), **_named(before, "before_")}
                if name == "slow_call_duration":  # the breaker's own rule, on the same attempts
                    refusal = self._breaker_refusal(target.key, seen, old, new)
                    if refusal is not None:
                        reason = f"{reason}; refused: {refusal}"
                    applied = refusal is None
                    changes.append(
                        Change(now, target.key, name, old, new, reason, applied, figures)
                    )
                    continue
                candidate = base._replace(**{name: new})
                after = replay(candidate)
                figures.update(_named(after, "after_"))
                refusal = self._refusal(before, after, streaming)
                if refusal is None:
                    base, before = candidate, after
                else:
                    reason = f"{reason}; refused: {refusal}"
                changes.append(
                    Change(now, target.key, name, old, new, reason, refusal is None, figures)
                )
            forecasts.append((now, target.key, before))
        return changes, forecasts

    def _breaker_refusal(
        self, target: str, seen: Sequence[_Seen], old: float | None, new: float | None
    ) -> str | None:
        """Why the target's breaker refuses a slow-call threshold of ``new`` (``None``: it may
        go): replayed through the breaker's window and rule, the recent attempts would open
        it where ``old`` would not (a healthy target cut off by its own tail)."""
        assert self._breaker_of is not None and new is not None
        breaker = self._breaker_of(target)
        mine = [(s.at, s.attempt) for s in seen if s.attempt.target == target]
        if not _opens(breaker, mine, new) or (old is not None and _opens(breaker, mine, old)):
            return None
        return f"its breaker would open on the recent attempts (slow calls >= {new:.3g}s)"

    def _refusal(
        self, before: Mapping[str, float], after: Mapping[str, float], streaming: bool
    ) -> str | None:
        """Why the replay refuses a step from ``before`` to ``after`` (``None``: it may go)."""
        slo = self.slo
        if after["extra"] > slo.max_extra_load + 1e-9 and after["extra"] > before["extra"]:
            return f"extra load {after['extra']:.1%} over the budget {slo.max_extra_load:.1%}"
        if after["failed"] > before["failed"] + _MORE_FAILED:
            return f"it would fail more calls ({before['failed']:.1%} -> {after['failed']:.1%})"
        missed = _missing(slo, after, streaming)
        if not missed:
            return None
        worse = [name for name in missed if after[name] > before.get(name, math.inf) + 1e-9]
        if not _missing(slo, before, streaming):
            said = ", ".join(f"{name} {_s(after[name])}" for name in missed)
            return f"it would miss the SLO ({said})"
        if worse:
            said = ", ".join(f"{name} {_s(before[name])} -> {_s(after[name])}" for name in worse)
            return f"it would move away from the SLO ({said})"
        return None


def _opens(breaker: Breaker, attempts: Sequence[tuple[float, Attempt]], slow: float) -> bool:
    """Whether ``breaker``'s rule (its window, minimum calls and rates) opens on ``attempts``
    (``(when, attempt)`` in order) when calls of ``slow`` seconds or more count as slow. The
    attempts cut short (a hedge's loser) are left out, as the breaker leaves them."""
    window: deque[tuple[float, bool, bool]] = deque()  # (when, failed, slow)
    failed = slowed = 0
    by_count = breaker.window_type == "count"
    for at, attempt in attempts:
        if attempt.outcome == "cancelled":
            continue
        entry = (at, attempt.outcome == "error", attempt.duration >= slow)
        window.append(entry)
        failed, slowed = failed + entry[1], slowed + entry[2]
        while (
            len(window) > breaker.window_size
            if by_count
            else at - window[0][0] > breaker.window_size
        ):
            _, gone_failed, gone_slow = window.popleft()
            failed, slowed = failed - gone_failed, slowed - gone_slow
        calls = len(window)
        if calls >= breaker.minimum_calls and (
            failed / calls >= breaker.failure_rate or slowed / calls >= breaker.slow_call_rate
        ):
            return True
    return False


def _s(seconds: float) -> str:
    return f"{seconds:.3g}s" if math.isfinite(seconds) else "never (calls failed)"


def _named(figures: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    return {f"{prefix}{k}": float(v) for k, v in figures.items() if v is not None}


class _Replayer:
    """Replays one target's recent attempts with a given setting (a fixed seed per round)."""

    def __init__(
        self,
        autopilot: Autopilot,
        target: Target,
        records: list[TraceRecord],
        rate: float,
        streaming: bool,
        seed: int,
    ) -> None:
        self.autopilot, self.target, self.records = autopilot, target, records
        self.rate, self.streaming, self.seed = rate, streaming, seed

    def config(self, setting: Setting) -> dict[str, Any]:
        """The replayed ``LLM``'s config for ``setting``."""
        target = self.target
        config: dict[str, Any] = {"model": target.key, "timeout": target.timeout}
        if setting.hedge_quantile is not None:
            load = self.autopilot._hedge.max_extra_load
            config["hedge"] = {"delay": {"q": setting.hedge_quantile}, "max_extra_load": load}
        guard = {
            name: value
            for name, value in (("first_token", setting.first_token), ("stall", setting.stall))
            if value is not None and value < (target.timeout or math.inf)
        }
        if guard:
            config["stream_guard"] = guard
        return config

    def __call__(self, setting: Setting) -> dict[str, float]:
        from .lab.replay import replay

        row = replay(
            self.records,
            self.config(setting),
            seed=self.seed,
            rate=self.rate,
            stream=self.streaming,
        )
        return _figures(row)
