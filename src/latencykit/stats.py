"""Recent latencies per target, for adaptive hedging delays (and later slow-call detection).

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
import math
from collections import deque
from collections.abc import Callable

from . import _validation
from ._cancel import clock as loop_clock

__all__ = ["MAX_SECONDS", "MIN_SECONDS", "LatencyWindow"]

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
        if value > 0:
            del self._sorted[bisect.bisect_left(self._sorted, value)]
        else:
            del self._censored[bisect.bisect_left(self._censored, -value)]

    def _expire(self, now: float) -> None:
        cutoff = now - self.window
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < cutoff:
            self._drop_oldest()

    def record(self, seconds: float) -> None:
        """Add one latency sample (seconds)."""
        now = self._clock()
        self._expire(now)
        if len(self._arrivals) >= self.max_samples:
            self._drop_oldest()
        value = MIN_SECONDS if seconds < MIN_SECONDS else min(seconds, MAX_SECONDS)
        self.changes += 1
        self._arrivals.append((now, value))
        bisect.insort(self._sorted, value)

    def record_censored(self, seconds: float) -> None:
        """Add an attempt abandoned after running ``seconds``: its latency is longer than that.

        A hedged primary cancelled because its backup answered first, a loser of any race, an
        attempt cut off by a deadline: each tells how long the attempt was *not yet* done.
        """
        now = self._clock()
        self._expire(now)
        if len(self._arrivals) >= self.max_samples:
            self._drop_oldest()
        value = _clamp(seconds)
        self.changes += 1
        self._arrivals.append((now, -value))
        bisect.insort(self._censored, value)

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
        for censored_at in censored:
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
        run = len(done) - start
        if run:
            needed = math.ceil(at_risk * (1.0 - limit / survival) - _EPSILON)
            if needed <= run:
                return done[start + max(needed, 1) - 1]
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
        self._expire(self._clock())
        return self._quantile(q) if self._sorted else None

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
        done, censored = self._sorted, self._censored
        if not censored:
            return done[-1] if done else None
        return max(done[-1], censored[-1]) if done else censored[-1]

    def count(self) -> int:
        """Samples in the window now, censored ones included (after dropping expired ones)."""
        self._expire(self._clock())
        return len(self._arrivals)

    def censored(self) -> int:
        """Censored samples in the window now (after dropping expired ones)."""
        self._expire(self._clock())
        return len(self._censored)
