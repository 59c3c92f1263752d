"""Recent latencies per target, for adaptive hedging delays (and later slow-call detection).

:class:`LatencyWindow` keeps the successful latencies of the last ``window`` seconds (at most
``max_samples``, the newest) in a sorted list: an exact quantile is then one index away, a new
sample one ``bisect.insort`` (a C ``memmove`` of at most ``max_samples`` pointers) and an
expired one a ``bisect`` plus a delete. Measured in ``benchmarks/estimator.py`` against
ddsketch and HdrHistogram (see docs/benchmarks.md): well under the 2 us per update and 5 us per
quantile query the hedging policy needs.
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


class LatencyWindow:
    """Exact quantiles of the latencies recorded in a sliding time window.

    Args:
        window: how long a sample counts, in seconds (default ``60``).
        max_samples: most samples kept; the oldest go first (default ``1000``).
        clock: time source (default the event loop's clock,
            ``time.monotonic`` outside a loop); tests pass a fake one.

    Samples are clamped to [1 ms, 10 min], the range of LLM calls.
    """

    __slots__ = ("_arrivals", "_clock", "_sorted", "max_samples", "window")

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
        self._arrivals: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        """Samples currently in the window (expired ones are dropped on the next access)."""
        return len(self._sorted)

    def __repr__(self) -> str:
        return f"LatencyWindow(window={self.window:g}, samples={len(self)})"

    def _drop_oldest(self) -> None:
        _, value = self._arrivals.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]

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
        self._arrivals.append((now, value))
        bisect.insort(self._sorted, value)

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q``-quantile (0 < q <= 1) of the window, or ``None`` if empty."""
        self._expire(self._clock())
        values = self._sorted
        if not values:
            return None
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def quantiles(self, *qs: float) -> tuple[float, ...]:
        """Several nearest-rank quantiles at once (one expiry pass); ``()`` if empty."""
        self._expire(self._clock())
        values = self._sorted
        n = len(values)
        if not n:
            return ()
        return tuple(values[min(n - 1, max(0, math.ceil(q * n) - 1))] for q in qs)

    def count(self) -> int:
        """Samples in the window now (after dropping expired ones)."""
        self._expire(self._clock())
        return len(self._sorted)
