"""A budget for extra requests (hedges, retries), so an outage does not multiply traffic.

Finagle's RetryBudget, as a token bucket over a sliding window: every call deposits ``ratio``
of a token, every extra request withdraws a whole one, and both expire after ``ttl`` seconds. So
over any ``ttl`` window, extra requests stay under ``ratio`` x calls, plus a small reserve
(``min_per_second`` x ``ttl``) that lets a quiet service still hedge or retry now and then.
"""

from __future__ import annotations

from collections.abc import Callable

from . import _validation
from . import fleet as _fleet
from ._cancel import clock as loop_clock
from ._context import trace_var
from .fleet.redis import SharedBudget
from .stats import SlidingCounts

__all__ = ["RetryBudget"]

_SLOTS = 10  # the window moves in steps of ttl / 10
_DEPOSITS, _WITHDRAWALS = 0, 1  # the window's counters


class RetryBudget:
    """Caps extra requests (hedges and retries) at a fraction of calls over a sliding window.

    Args:
        ratio: extra requests allowed per call, ``0 <= ratio <= 10`` (default ``0.1``: +10 %).
        ttl: window in seconds over which deposits and withdrawals count, at least ``0.01``
            (default ``10``).
        min_per_second: extra requests always allowed per second, as a reserve for low traffic
            (default ``0``).
        clock: time source (default the event loop's clock, ``time.monotonic`` outside a loop).
        name: the budget's name in a shared store (default ``None``: named after its options,
            so budgets built alike share one fleet budget).
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`): the budget then
            caps the fleet's extra requests, not just this process's (default ``None``: the
            process default, :func:`~latencykit.use_store`, looked up at each use). The
            process spends tokens it leased at the store's last refresh, so no call waits for
            it; ``min_per_second`` is then the fleet's reserve. While the store is unavailable
            the budget counts on its own.

    Share one budget between a hedge and a retry policy to cap their sum.
    """

    def __init__(
        self,
        ratio: float = 0.1,
        *,
        ttl: float = 10.0,
        min_per_second: float = 0.0,
        clock: Callable[[], float] = loop_clock,
        name: str | None = None,
        shared: _fleet.SharedStore | None = None,
    ) -> None:
        self.ratio = _validation.number("RetryBudget.ratio", ratio, 0, 10)
        self.min_per_second = _validation.number("RetryBudget.min_per_second", min_per_second)
        # The window moves in steps of ttl / 10 on the loop's clock: a step below a millisecond
        # is noise (and a tiny ttl overflows the step count).
        self.ttl = _validation.seconds("RetryBudget.ttl", ttl, minimum=0.01)
        self._clock = clock
        self._slot_width = self.ttl / _SLOTS
        self._window = SlidingCounts(_SLOTS, 2)
        self.name = None if name is None else _validation.text("RetryBudget.name", name)
        _validation.optional("RetryBudget.shared", shared, _fleet.SharedStore, "a RedisStore")
        self.shared = shared
        self._fleet_key = name or (
            f"ratio={self.ratio:g},ttl={self.ttl:g},reserve={self.min_per_second:g}"
        )

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio:g}, ttl={self.ttl:g}, "
            f"min_per_second={self.min_per_second:g}, balance={self.balance:.2f})"
        )

    def _slot(self) -> int:
        return int(self._clock() // self._slot_width)

    def _fleet(self) -> SharedBudget | None:
        store = self.shared or _fleet._current
        if store is None:
            return None
        reserve = self.min_per_second * self.ttl
        return store.budget(self._fleet_key, ratio=self.ratio, ttl=self.ttl, reserve=reserve)

    @property
    def balance(self) -> float:
        """Extra requests the budget would allow right now (with a shared store: the fleet's,
        as of its last refresh)."""
        shared = self._fleet()
        if shared is not None and (fleet_balance := shared.balance()) is not None:
            return fleet_balance
        return self._local_balance()

    def _local_balance(self) -> float:
        self._window.advance(self._slot())
        deposits, withdrawals = self._window.totals
        return deposits * self.ratio + self.min_per_second * self.ttl - withdrawals

    def deposit(self) -> None:
        """Count one call (earns ``ratio`` of an extra request)."""
        self._window.add(self._slot(), _DEPOSITS)
        if self.shared is not None or _fleet._current is not None:
            self._deposit_shared()

    def deposit_once(self) -> None:
        """Count the current call, unless another policy already did so for this budget.

        A hedge and a retry sharing one budget each call this; the call counts once (the
        call's trace remembers which budgets it paid into). Outside a call: :meth:`deposit`.
        """
        trace = trace_var.get()
        if trace is None:
            return self.deposit()
        paid = trace.paid_budgets
        if paid is None:
            paid = trace.paid_budgets = set()
        elif id(self) in paid:
            return None
        paid.add(id(self))
        # Counted at the call's start, on the loop's clock: no reading of its own.
        at = trace.started_at if self._clock is loop_clock else self._clock()
        self._window.add(int(at // self._slot_width), _DEPOSITS)
        if self.shared is not None or _fleet._current is not None:
            self._deposit_shared()
        return None

    def _deposit_shared(self) -> None:
        shared = self._fleet()
        if shared is not None:
            shared.deposit()

    def try_withdraw(self) -> bool:
        """Take one extra request from the budget; ``False`` (and nothing taken) if empty."""
        shared = self._fleet()
        granted = None if shared is None else shared.try_withdraw()
        if granted is False:
            return False
        if granted is None and self._local_balance() < 1.0:
            return False
        # Counted here too, granted by the fleet or not: the local count is where the budget
        # starts from if the store goes away.
        self._window.add(self._window.newest, _WITHDRAWALS)  # the slot the balance was read in
        return True
