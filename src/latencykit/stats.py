"""Recent latencies and attempt counts per target: what adaptive hedging reads and ``stats()``
shows.

:class:`Recorder` is the per-target record: each attempt run through it counts its outcome and
feeds the target's latency window (and, for a stream, its time-to-first-chunk window). ``lk.LLM``
runs every attempt through one recorder, innermost, and its hedge reads the same windows; a
hedge on a decorated function records its own attempts. ``stats()`` snapshots a recorder as
:class:`TargetStats` values, one per target, in a :class:`StatsTable` that prints as a table.

:class:`LatencyWindow` keeps the latencies of the last ``window`` seconds (at most
``max_samples``, the newest) in sorted lists: a completed sample is a latency, a *censored* one
is an attempt that was abandoned (cancelled because another attempt won, or because the caller
or a deadline gave up) after running for some time: its latency is known only to exceed that
time. Quantiles are Kaplan-Meier estimates, which count a censored sample as "slower" than every
latency below its censoring time and spread its weight over the samples above it; with nothing
censored they are the exact nearest-rank quantiles.

Why censoring matters: a hedged call that the backup won never reveals how slow its primary
would have been. Recording the time it ran as if it were its latency (a lower bound) keeps the
window from ever seeing how slow the slow attempts are, so an adaptive delay starts low and
climbs one backup's latency at a time (docs/benchmarks.md, "Why replicate/70b missed").

Cost: a new sample is one ``bisect.insort`` (a C ``memmove`` of at most ``max_samples``
pointers), an expired one a ``bisect`` and a delete. A quantile is one index when no censored
sample lies below it (the common case: a hedge censors its primary *after* the delay, above the
quantile the delay is), else a walk over the censored samples only, with a ``bisect`` per sample
and the runs of completed samples between them taken in one step. Measured in
``benchmarks/estimator.py`` against ddsketch and HdrHistogram (see docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from . import _validation
from . import fleet as _fleet
from ._cancel import clock as loop_clock
from .errors import ErrorKind

if TYPE_CHECKING:
    from ._context import Attempt
    from ._values import BreakerState
    from .ratelimit import RoomStats

__all__ = [
    "ConcurrencyStats",
    "MAX_SECONDS",
    "MIN_SECONDS",
    "LatencyWindow",
    "Percentiles",
    "Recorder",
    "StatsTable",
    "TargetStats",
]

MIN_SECONDS = 0.001
"""Shortest latency recorded: faster samples count as 1 ms."""
MAX_SECONDS = 600.0
"""Longest latency recorded: slower samples count as 10 minutes."""

_EPSILON = 1e-9  # float slack when a Kaplan-Meier product is compared with 1 - q


def _clamp(seconds: float) -> float:
    return MIN_SECONDS if seconds < MIN_SECONDS else min(seconds, MAX_SECONDS)


class LatencyWindow:
    """Quantiles of the latencies recorded in a sliding time window, censored samples included.

    Args:
        window: how long a sample counts, in seconds (default ``60``).
        max_samples: most samples kept, completed and censored together; the oldest go first
            (default ``1000``).
        clock: time source (default the event loop's clock,
            ``time.monotonic`` outside a loop); tests pass a fake one.

    :meth:`record` adds a latency, :meth:`record_censored` an attempt abandoned after some
    time (its latency is longer). Quantiles are Kaplan-Meier estimates (exact nearest-rank when
    nothing is censored). Samples are clamped to [1 ms, 10 min], the range of LLM calls.
    """

    __slots__ = ("_arrivals", "_censored", "_clock", "_sorted", "changes", "max_samples", "window")

    def __init__(
        self,
        *,
        window: float = 60.0,
        max_samples: int = 1000,
        clock: Callable[[], float] = loop_clock,
    ) -> None:
        self.window = _validation.seconds("LatencyWindow.window", window)
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
            raise ValueError(f"LatencyWindow.max_samples must be an int >= 1, got {max_samples!r}")
        self.max_samples = max_samples
        self._clock = clock
        # (arrival time, value); a censored sample's value is stored negated (values are > 0).
        self._arrivals: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []  # completed latencies
        self._censored: list[float] = []  # censoring times
        # Samples added or dropped so far: a cheap way to tell that the window changed.
        self.changes = 0

    def __len__(self) -> int:
        """Samples currently in the window, censored ones included (expired ones are dropped on
        the next access)."""
        return len(self._arrivals)

    def __repr__(self) -> str:
        return (
            f"LatencyWindow(window={self.window:g}, samples={len(self)}, "
            f"censored={len(self._censored)})"
        )

    def _drop_oldest(self) -> None:
        self.changes += 1
        _, value = self._arrivals.popleft()
        samples = self._sorted if value > 0 else self._censored
        del samples[bisect.bisect_left(samples, abs(value))]

    def _expire(self, now: float) -> None:
        cutoff = now - self.window
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < cutoff:
            self._drop_oldest()

    def record(self, seconds: float) -> None:
        """Add one latency sample (seconds)."""
        self._add(_clamp(seconds))

    def record_censored(self, seconds: float) -> None:
        """Add an attempt abandoned after running ``seconds``: its latency is longer than that.

        A hedged primary cancelled because its backup answered first, a loser of any race, an
        attempt cut off by a deadline: each tells how long the attempt was *not yet* done.
        """
        self._add(-_clamp(seconds))

    def _add(self, value: float) -> None:
        """Add a clamped latency, or a censoring time negated (a sample in the fleet's form)."""
        now = self._clock()
        self._expire(now)
        if len(self._arrivals) >= self.max_samples:
            self._drop_oldest()
        self.changes += 1
        self._arrivals.append((now, value))
        bisect.insort(self._sorted if value > 0 else self._censored, abs(value))

    def _quantile(self, q: float) -> float:
        # Kaplan-Meier: the smallest completed latency u with S(u) <= 1 - q, where the survival
        # S(u) multiplies (1 - 1/at_risk) over the completed latencies <= u and at_risk counts
        # the samples not yet passed (a censored sample at c leaves after every latency <= c).
        # `self._sorted` must not be empty.
        done = self._sorted
        censored = self._censored
        n = len(done) + len(censored)
        k = max(0, math.ceil(q * n - _EPSILON) - 1)
        if not censored or (k < len(done) and done[k] <= censored[0]):
            # Nothing censored below the nearest-rank candidate: the exact quantile.
            return done[k] if k < len(done) else done[-1]
        limit = 1.0 - q + _EPSILON
        survival = 1.0
        at_risk = n
        start = 0
        # The censored samples in order, then the end: each closes a run of completed ones.
        for censored_at in itertools.chain(censored, (math.inf,)):
            stop = bisect.bisect_right(done, censored_at, start)
            run = stop - start
            if run:
                # `run` completed latencies in a row: S falls to S * (at_risk - m) / at_risk
                # after the m-th of them; the first m that reaches the limit, if any.
                needed = math.ceil(at_risk * (1.0 - limit / survival) - _EPSILON)
                if needed <= run:
                    return done[start + max(needed, 1) - 1]
                survival *= (at_risk - run) / at_risk
                at_risk -= run
                start = stop
            at_risk -= 1  # the censored sample leaves the risk set
        # The censored samples above the last completed one hold more than 1 - q of the
        # weight: the quantile lies beyond anything observed to finish. Answer the slowest
        # completed latency, so that attempts that never finish (a hang, an outage) cannot
        # push the estimate past what the data shows.
        return done[-1]

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0 <= q <= 1) of the window, or ``None`` without a completed sample.

        A Kaplan-Meier estimate (the nearest-rank quantile when nothing is censored), always
        one of the completed latencies: when censored samples carry more than ``1 - q`` of the
        weight above the slowest completed one, that slowest one.
        """
        return (self.quantiles(q) or (None,))[0]

    def quantiles(self, *qs: float) -> tuple[float, ...]:
        """Several quantiles at once (one expiry pass); ``()`` without a completed sample."""
        self._expire(self._clock())
        if not self._sorted:
            return ()
        return tuple(self._quantile(q) for q in qs)

    def longest(self) -> float | None:
        """The longest time a sample in the window is known to have taken (completed or
        censored), or ``None`` if the window is empty."""
        self._expire(self._clock())
        return max((*self._sorted[-1:], *self._censored[-1:]), default=None)

    def count(self) -> int:
        """Samples in the window now, censored ones included (after dropping expired ones)."""
        self._expire(self._clock())
        return len(self._arrivals)

    def censored(self) -> int:
        """Censored samples in the window now (after dropping expired ones)."""
        self._expire(self._clock())
        return len(self._censored)


class SlidingCounts:
    """Counters summed over a sliding window (internal: the breaker's window, the retry
    budget's): a ring of ``size`` buckets of ``width`` counters each, numbered by the caller
    (a call's sequence number, or the time divided by a bucket's width).

    Args:
        size: buckets in the window.
        width: counters in each bucket.

    Attributes:
        totals: each counter summed over the buckets in the window.
        newest: the newest bucket's number (``-2**62`` before the first).
    """

    __slots__ = ("_buckets", "_size", "newest", "totals")

    def __init__(self, size: int, width: int) -> None:
        self._buckets = [[0] * width for _ in range(size)]
        self._size = size
        self.totals = [0] * width
        self.newest = -(2**62)

    def add(self, bucket: int, counter: int) -> None:
        """Count one in counter number ``counter`` of bucket number ``bucket`` (of the newest,
        if ``bucket`` is older)."""
        if bucket > self.newest:
            self.advance(bucket)
        self._buckets[self.newest % self._size][counter] += 1
        self.totals[counter] += 1

    def push(self, counts: tuple[int, ...]) -> None:
        """Count one entry as a bucket of its own, after the newest (a count window: the
        oldest entry makes room): ``counts`` holds its ``width`` counters."""
        self.newest = newest = self.newest + 1
        bucket, totals = self._buckets[newest % self._size], self.totals
        for i, count in enumerate(counts):
            totals[i] += count - bucket[i]
            bucket[i] = count

    def advance(self, bucket: int) -> list[int]:
        """Make ``bucket`` the newest, emptying the buckets that slid out; return the newest
        bucket's counters (a number going backwards leaves the newest as it is)."""
        buckets, size = self._buckets, self._size
        if bucket > self.newest:
            for stale in range(max(self.newest + 1, bucket - size + 1), bucket + 1):
                self._empty(buckets[stale % size])
            self.newest = bucket
        return buckets[self.newest % size]

    def clear(self) -> None:
        """Empty every bucket."""
        for bucket in self._buckets:
            self._empty(bucket)

    def _empty(self, bucket: list[int]) -> None:
        for i, count in enumerate(bucket):
            self.totals[i] -= count
            bucket[i] = 0


# --- the per-target record ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    """Quantiles of one latency window, in seconds, as :meth:`LatencyWindow.quantiles` gives
    them (Kaplan-Meier estimates that count cancelled attempts as censored samples).

    Attributes:
        p50: the median (``None``: no completed sample in the window).
        p95: the 95th percentile (``None`` likewise).
        p99: the 99th percentile (``None`` likewise).
        samples: samples in the window, censored ones included (default ``0``).
        censored: censored samples in the window: attempts cancelled before they finished
            (default ``0``).
    """

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    samples: int = 0
    censored: int = 0

    def __str__(self) -> str:
        if self.p50 is None or self.p95 is None or self.p99 is None:
            return f"- ({self.samples} samples)"
        return (
            f"p50 {self.p50:.3f}s p95 {self.p95:.3f}s p99 {self.p99:.3f}s "
            f"({self.samples} samples, {self.censored} censored)"
        )


def _percentiles(window: LatencyWindow | None) -> Percentiles:
    if window is None:
        return Percentiles()
    p50, p95, p99 = window.quantiles(0.5, 0.95, 0.99) or (None, None, None)
    return Percentiles(
        p50=p50, p95=p95, p99=p99, samples=window.count(), censored=window.censored()
    )


@dataclass(frozen=True, slots=True)
class ConcurrencyStats:
    """A target's adaptive concurrency at one moment (``TargetStats.concurrency``, with
    ``LLM(governor=True)``; see :mod:`latencykit.policies.concurrency`).

    Attributes:
        limit: the limit learned: attempts in flight allowed.
        in_flight: attempts holding a slot now.
        waiting: attempts waiting for a slot now, all lanes together.
        share: with a store, the slots this process may use now, its share of the fleet's
            limit (default ``None``: no store, or not heard from).
        fleet_in_flight: with a store, the fleet's attempts in flight as last refreshed
            (default ``None``).
        workers: with a store, the fleet's workers (processes' stages) for the target
            (default ``None``).
    """

    limit: int
    in_flight: int
    waiting: int
    share: int | None = None
    fleet_in_flight: int | None = None
    workers: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetStats:
    """One target's statistics at one moment: what ``lk.LLM.stats()`` (and
    ``lk.policies.hedge.Hedge.stats()``) return, one per target.

    Counts are totals since the recorder was built; latencies are quantiles over its sliding
    window (the last ``window`` seconds), the very windows an adaptive hedge reads.

    Attributes:
        target: the target's key (required).
        ok: attempts that succeeded (a stream: that ended complete) (default ``0``).
        errors: attempts that failed (a stream: that failed to open or broke) (default ``0``).
        cancelled: attempts cancelled before they finished: losers of a hedge race,
            attempts cut off by a deadline or a degrade timer, streams closed by the consumer
            before their end (default ``0``).
        error_kinds: the failed attempts by :class:`~latencykit.ErrorKind` (default empty).
        latency: end-to-end attempt latency (a stream's: to its end): successful attempts, and
            cancelled ones as censored samples; failures are left out (default: empty).
        ttft: time to first content chunk of stream attempts (default: empty).
        window: seconds the latency samples count (default ``60``).
        breaker: the target's circuit breaker state (default ``None``: no breaker).
        hedge_budget: extra attempts the hedge's budget allows right now (default ``None``: no
            hedging). One budget serves every target of a hedge.
        connection_wait: seconds attempts waited for a connection in latencykit's queue before
            their request (not in ``latency``), over the attempts that had to wait; the
            censored ones gave up waiting (default: empty).
        waiting: attempts waiting for a connection to the target's host now, whichever target
            of that host and lane they are for (default ``0``).
        room: the rate-limit room the provider told, with ``LLM(governor=True)``: requests
            and tokens left now, the limits learned, the waits for room (default ``None``: no
            governor).
        first_token_limit: the first-token limit the stream guard learned for the target, in
            seconds, before any scaling for a long prompt (default ``None``: none learned; a
            limit set in ``StreamGuard`` is not shown). See docs/streaming.md.
        stall_limit: the stall limit it learned likewise (default ``None``).
        concurrency: the adaptive concurrency limit learned, the attempts in flight and
            waiting, with ``LLM(governor=True)`` (default ``None``: no governor, or no attempt
            yet).

        hedge_quantile: with ``LLM(slo=...)``, the quantile the target's calls are hedged at
            (default ``None``: not hedged, or no SLO).
        slow_call_duration: with ``LLM(slo=...)`` and a breaker, its slow-call threshold in
            seconds (default ``None``).
        sources: with ``LLM(slo=...)``, where each of those values comes from, by setting
            (``"slo"``: the autopilot set it; ``"learned"``, ``"configured"``, ``"timeout"``,
            ``"off"``) (default empty). See docs/autopilot.md.
    """

    target: str
    ok: int = 0
    errors: int = 0
    cancelled: int = 0
    # A fresh dict per snapshot (so ``dataclasses.asdict`` and JSON take it), kept out of the
    # hash; read it as the Mapping it is typed as.
    error_kinds: Mapping[ErrorKind, int] = field(default_factory=dict, hash=False)
    latency: Percentiles = Percentiles()
    ttft: Percentiles = Percentiles()
    window: float = 60.0
    breaker: BreakerState | None = None
    hedge_budget: float | None = None
    connection_wait: Percentiles = Percentiles()
    waiting: int = 0
    room: RoomStats | None = None
    first_token_limit: float | None = None
    stall_limit: float | None = None
    concurrency: ConcurrencyStats | None = None
    hedge_quantile: float | None = None
    slow_call_duration: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def attempts(self) -> int:
        """Attempts recorded: ``ok + errors + cancelled``."""
        return self.ok + self.errors + self.cancelled

    def __str__(self) -> str:
        plural = "" if self.attempts == 1 else "s"
        kinds = f" [{_kinds(self.error_kinds)}]" if self.error_kinds else ""
        latency = f"latency {self.latency}"
        if self.ttft.samples:
            latency += f"; first chunk {self.ttft}"
        parts = [
            f"{self.target}: {self.attempts} attempt{plural} ({self.ok} ok, {self.errors} failed"
            f"{kinds}, {self.cancelled} cancelled)",
            f"{latency} over {self.window:g}s",
        ]
        if self.breaker is not None:
            parts.append(f"breaker {self.breaker.value}")
        if self.hedge_budget is not None:
            parts.append(f"hedge budget {self.hedge_budget:.1f}")
        if self.connection_wait.samples or self.waiting:
            parts.append(f"waited for a connection {self.connection_wait}, {self.waiting} now")
        if self.first_token_limit is not None or self.stall_limit is not None:
            learned = (_seconds(self.first_token_limit), _seconds(self.stall_limit))
            parts.append("learned limits: first token {}, stall {}".format(*learned))
        if self.sources:
            said = ", ".join(f"{name} {source}" for name, source in self.sources.items())
            parts.append(f"set by: {said}")
        return "; ".join(parts)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}s"


def _kinds(kinds: Mapping[ErrorKind, int]) -> str:
    return ", ".join(f"{kind.value} {count}" for kind, count in kinds.items())


class StatsTable(Mapping[str, TargetStats]):
    """:class:`TargetStats` by target key, in a fixed order; ``str()`` renders a text table.

    Args:
        stats: the values, in display order (keyed by their ``target``).

    Immutable; a snapshot (take another to see later attempts).
    """

    __slots__ = ("_by_target",)

    def __init__(self, stats: Iterable[TargetStats]) -> None:
        self._by_target = {s.target: s for s in stats}

    def __getitem__(self, target: str) -> TargetStats:
        return self._by_target[target]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_target)

    def __len__(self) -> int:
        return len(self._by_target)

    def __repr__(self) -> str:
        return f"StatsTable({list(self._by_target.values())!r})"

    def __str__(self) -> str:
        """A fixed-width table, latencies in milliseconds; the time-to-first-chunk, breaker
        and hedge-budget columns appear only when some target has one. Error kinds follow."""
        rows = list(self._by_target.values())
        width = max([len("target"), *(len(s.target) for s in rows)])
        columns = [c for c in _COLUMNS if c.shown(rows)]
        header = _line(f"{'target':<{width}}", columns, [c.header for c in columns])
        lines = [header, "-" * len(header)]
        lines += [
            _line(f"{s.target:<{width}}", columns, [c.value(s) for c in columns]) for s in rows
        ]
        return "\n".join(lines + _notes(rows))


def _notes(rows: Sequence[TargetStats]) -> list[str]:
    """The lines under the stats table: the windows, then each target's errors by kind."""
    over = "/".join(f"{w:g}" for w in sorted({s.window for s in rows})) or "60"
    return [
        f"latencies in ms over the last {over} s (n: samples, cancelled ones censored); "
        "counts since start",
        *(f"errors of {s.target}: {_kinds(s.error_kinds)}" for s in rows if s.error_kinds),
    ]


def _line(first: str, columns: Iterable[_Column], cells: Iterable[object]) -> str:
    """A line of the stats table: ``first``, then each cell right-aligned in its column."""
    return first + "".join(
        f" {'-' if cell is None else cell:>{column.width}}"
        for column, cell in zip(columns, cells, strict=True)
    )


def _ms(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds * 1000:,.0f}"


class _Column(NamedTuple):
    """A column of the stats table."""

    header: str
    width: int
    value: Callable[[TargetStats], object]  # what a target shows (None: "-")
    optional: bool = False  # shown only when some target has a value

    def shown(self, rows: Sequence[TargetStats]) -> bool:
        return not self.optional or any(self.value(s) is not None for s in rows)


_COLUMNS = (
    _Column("attempts", 8, lambda s: s.attempts),
    _Column("ok", 6, lambda s: s.ok),
    _Column("errors", 6, lambda s: s.errors),
    _Column("cancel", 6, lambda s: s.cancelled),
    _Column("p50", 7, lambda s: _ms(s.latency.p50)),
    _Column("p95", 7, lambda s: _ms(s.latency.p95)),
    _Column("p99", 7, lambda s: _ms(s.latency.p99)),
    _Column("n", 5, lambda s: s.latency.samples),
    _Column("ttft50", 7, lambda s: _ms(s.ttft.p50), optional=True),
    _Column("ttft95", 7, lambda s: _ms(s.ttft.p95), optional=True),
    _Column("ttft99", 7, lambda s: _ms(s.ttft.p99), optional=True),
    _Column("breaker", 11, lambda s: s.breaker and s.breaker.value, optional=True),
    _Column("budget", 7, lambda s: _number(s.hedge_budget), optional=True),
    _Column("wait95", 7, lambda s: _ms(s.connection_wait.p95), optional=True),
    _Column("waiting", 7, lambda s: s.waiting or None, optional=True),
    _Column("req left", 8, lambda s: s.room and _whole(s.room.requests_left), optional=True),
    _Column("tok left", 8, lambda s: s.room and _whole(s.room.tokens_left), optional=True),
    _Column("paced", 5, lambda s: s.room and s.room.waits, optional=True),
    _Column("shed", 5, lambda s: s.room and s.room.shed, optional=True),
    _Column("ft limit", 8, lambda s: _ms(s.first_token_limit), optional=True),
    _Column("stall lim", 9, lambda s: _ms(s.stall_limit), optional=True),
    _Column("hedge q", 7, lambda s: s.hedge_quantile, optional=True),
    _Column("slow call", 9, lambda s: _ms(s.slow_call_duration), optional=True),
    _Column("slo set", 7, lambda s: _slo_set(s.sources), optional=True),
    _Column("limit", 5, lambda s: s.concurrency and s.concurrency.limit, optional=True),
    _Column("inflight", 8, lambda s: s.concurrency and s.concurrency.in_flight, optional=True),
)


def _slo_set(sources: Mapping[str, str]) -> str | None:
    """The settings the SLO autopilot set, abbreviated (``"hq,ft"``)."""
    short = {"hedge_quantile": "hq", "first_token": "ft", "stall": "st", "slow_call_duration": "sc"}
    found = [short[name] for name, source in sources.items() if source == "slo"]
    return ",".join(found) or None


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _number(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


class Recorder:
    """The record of each target's attempts: outcome counts and latency windows.

    Args:
        window: seconds a latency sample counts (default ``60``).
        max_samples: samples kept per target and window, the newest (default ``1000``).
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`): the latency and
            first-chunk windows then also hold the other processes' samples of the last
            ``window`` seconds, read at each refresh, so a new process starts warm (default
            ``None``: the process default, :func:`~latencykit.use_store`, looked up at each
            use). The per-token windows and the outcome counts stay per process.

    Fed with the attempts' own records (:class:`~latencykit.Attempt`): a call that carries a
    recorder (``Call.recorder``) reports each of its attempts to it when the attempt ends, and
    a stream's first content chunk when it arrives. Attempts are counted by outcome. A success
    feeds the target's latency window; an attempt cancelled before it finished feeds it a
    censored sample (its latency is longer than the time it ran); a failure feeds nothing
    (fast failures would drag the quantiles down). A stream is measured twice: to its first
    content chunk (the :attr:`ttft` window) and to its end.

    ``lk.LLM`` gives every call its recorder, and its hedge reads the recorder's windows (one
    sample per attempt, whether or not the LLM hedges); a hedge on a decorated function keeps
    one of its own, given to the calls it makes.

    Attributes:
        latency: each target's :class:`LatencyWindow` of end-to-end attempt latencies.
        ttft: each target's window of times to first content chunk (streams).
        per_token: each target's window of seconds per output token: a stream's
            :attr:`~latencykit.Attempt.time_per_output_token`, or what :meth:`output_rate`
            reports for a response (``LLM(budget_aware=True)`` reads it).
        gaps: each target's window of the longest gap between content chunks of its complete
            streams, per stream (:meth:`longest_gap`; the stream guard's learned stall limit
            reads it). Per process.
        on_record: called with every attempt :meth:`record` counts (default ``None``; the SLO
            autopilot's record of recent attempts, :mod:`latencykit.autopilot`).
        fleet: whether the windows join the process default store's
            (:func:`~latencykit.use_store`) when ``shared`` is ``None`` (default ``True``; a
            simulation, the lab's replay, sets ``False``: its samples are not the fleet's).
    """

    def __init__(
        self,
        *,
        window: float = 60.0,
        max_samples: int = 1000,
        shared: _fleet.SharedStore | None = None,
    ) -> None:
        LatencyWindow(window=window, max_samples=max_samples)  # invalid options fail now
        _validation.optional("Recorder.shared", shared, _fleet.SharedStore, "a RedisStore")
        self.window = float(window)
        self.max_samples = max_samples
        self.shared = shared
        self.latency: dict[str, LatencyWindow] = {}
        self.ttft: dict[str, LatencyWindow] = {}
        self.per_token: dict[str, LatencyWindow] = {}
        self.waits: dict[str, LatencyWindow] = {}
        self.gaps: dict[str, LatencyWindow] = {}
        # Each target's attempts by outcome, the failed ones by error kind instead.
        self._counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        # False: never the process default store's (a simulation's recorder: the lab's replays).
        self.fleet = True
        # Told every attempt recorded (the SLO autopilot's record of recent attempts).
        self.on_record: Callable[[Attempt], object] | None = None
        # window name -> (store, its pooled window, the queue of the other processes' samples)
        self._links: dict[str, tuple[_fleet.SharedStore, _fleet.SharedLatency, deque[float]]] = {}

    def __repr__(self) -> str:
        return f"Recorder(window={self.window:g}, targets={len(self.targets())})"

    def latency_window(
        self, target: str, *, ttft: bool = False, per_token: bool = False
    ) -> LatencyWindow:
        """The latency window of ``target`` (created on first use); with ``ttft`` (default
        ``False``), the window of its times to first content chunk; with ``per_token``
        (default ``False``), of its seconds per output token."""
        windows = self.ttft if ttft else self.per_token if per_token else self.latency
        found = windows.get(target)
        if found is None:
            found = windows[target] = LatencyWindow(
                window=self.window, max_samples=self.max_samples
            )
        if not per_token and (link := self._link(target, ttft)) is not None:
            incoming = link[2]
            while incoming:  # the other processes' samples, read by the store since
                found._add(incoming.popleft())
        return found

    def _link(
        self, target: str, ttft: bool
    ) -> tuple[_fleet.SharedStore, _fleet.SharedLatency, deque[float]] | None:
        """The pooled window behind ``target``'s (``ttft``) window, with a shared store."""
        store = self.shared or (_fleet._current if self.fleet else None)
        if store is None:
            return None
        name = f"{target}#ttft" if ttft else target
        found = self._links.get(name)
        if found is None or found[0] is not store:
            pooled = store.latency(name, window=self.window)
            found = self._links[name] = (store, pooled, pooled.follow())
        return found

    def _sample(self, target: str, seconds: float, *, ttft: bool = False) -> None:
        """Feed one sample (negative: censored) to ``target``'s window and to the fleet's."""
        value = math.copysign(_clamp(abs(seconds)), seconds)
        window = (self.ttft if ttft else self.latency).get(target)
        link = self._link(target, ttft)
        if window is None or link is not None:
            window = self.latency_window(target, ttft=ttft)  # made, or the fleet's drained in
        window._add(value)
        if link is not None:
            link[1].record(value)

    def targets(self) -> tuple[str, ...]:
        """Every target recorded so far, in the order first seen."""
        return tuple(dict.fromkeys([*self._counts, *self.latency, *self.ttft]))

    def first_chunk(self, target: str, ttft: float) -> None:
        """A stream attempt to ``target`` received its first content chunk ``ttft`` seconds
        after it started."""
        self._sample(target, ttft, ttft=True)

    def record(self, attempt: Attempt, *, stream: bool = False) -> None:
        """Count an attempt that ended and feed its latency (``stream``: a stream attempt,
        whose first chunk :meth:`first_chunk` already reported)."""
        target = attempt.target
        outcome = attempt.outcome
        if self.on_record is not None:
            self.on_record(attempt)
        self._counts[target][
            outcome if outcome != "error" else attempt.error_kind or ErrorKind.UNKNOWN
        ] += 1
        if outcome == "ok":
            self._sample(target, attempt.duration)
            if stream and (per_token := attempt.time_per_output_token) is not None:
                self.latency_window(target, per_token=True).record(per_token)
        elif outcome == "cancelled":
            self._sample(target, -attempt.duration)
            if stream and attempt.ttft is None:  # cancelled before its first chunk
                self._sample(target, -attempt.duration, ttft=True)

    def connection_wait(self, target: str, seconds: float, *, censored: bool = False) -> None:
        """An attempt to ``target`` waited ``seconds`` for a connection before its request
        (``censored``: it gave up waiting after that long)."""
        window = self._own_window(self.waits, target)
        (window.record_censored if censored else window.record)(seconds)

    def longest_gap(self, target: str, seconds: float) -> None:
        """A complete stream from ``target`` had ``seconds`` as its longest gap between two
        content chunks (what a learned stall limit reads: :attr:`gaps`)."""
        self._own_window(self.gaps, target).record(seconds)

    def _own_window(self, windows: dict[str, LatencyWindow], target: str) -> LatencyWindow:
        """``target``'s window in ``windows``, one of this process's own (never pooled),
        created on first use."""
        window = windows.get(target)
        if window is None:
            window = windows[target] = LatencyWindow(
                window=self.window, max_samples=self.max_samples
            )
        return window

    def output_rate(self, target: str, seconds: float, tokens: int) -> None:
        """A response from ``target`` produced ``tokens`` output tokens in ``seconds`` (its
        whole duration: an over-estimate of the time per token, on the safe side)."""
        if tokens > 0:
            self.latency_window(target, per_token=True).record(seconds / tokens)

    def stats(
        self,
        targets: Iterable[str] = (),
        *,
        breaker: Callable[[str], BreakerState | None] | None = None,
        hedge_budget: float | None = None,
        waiting: Callable[[str], int] | None = None,
    ) -> StatsTable:
        """A snapshot of every target: ``targets`` first (even those with no attempt yet),
        then the others recorded, in the order first seen.

        Args:
            targets: target keys to show first (default none).
            breaker: ``key -> BreakerState or None``, each target's breaker state (default
                ``None``: no breakers).
            hedge_budget: the hedge budget's balance to show (default ``None``: no hedging).
            waiting: ``key -> int``, the attempts waiting for a connection to each target's
                host now (default ``None``: none).

        Read it on the event loop that makes the calls: the windows expire samples by its clock.
        """
        return StatsTable(
            self._snapshot(key, breaker, hedge_budget, waiting)
            for key in dict.fromkeys([*targets, *self.targets()])
        )

    def _snapshot(
        self,
        target: str,
        breaker: Callable[[str], BreakerState | None] | None,
        hedge_budget: float | None,
        waiting: Callable[[str], int] | None,
    ) -> TargetStats:
        counts = self._counts.get(target, Counter())
        errors = {kind: n for kind, n in counts.most_common() if isinstance(kind, ErrorKind)}
        return TargetStats(
            target=target,
            ok=counts["ok"],
            errors=sum(errors.values()),
            cancelled=counts["cancelled"],
            error_kinds=errors,
            latency=_percentiles(self.latency.get(target)),
            ttft=_percentiles(self.ttft.get(target)),
            window=self.window,
            breaker=None if breaker is None else breaker(target),
            hedge_budget=hedge_budget,
            connection_wait=_percentiles(self.waits.get(target)),
            waiting=0 if waiting is None else waiting(target),
        )
