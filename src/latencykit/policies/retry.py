"""``retry``: budgeted retries with exponential backoff and full jitter, driven by tenacity.

A transient failure (429, 5xx, connection, timeout, broken stream) is tried again on the same
target after a wait; everything else is raised at once. What makes it safe in production:

* **full jitter**: the wait before retry ``n`` is ``uniform(0, min(max_wait, initial *
  multiplier ** (n - 1)))`` (AWS's "Full Jitter"), so clients that failed together do not come
  back together;
* **Retry-After** is honoured: the wait is at least what the provider asked for, and a wait
  longer than ``max_retry_after`` is not worth it (give up, so an outer failover can go
  elsewhere at once);
* **a budget**: retries draw from a :class:`~latencykit.RetryBudget` (share it with a hedge to
  cap their sum), so an outage does not multiply the traffic sent to a failing provider;
* **the deadline**: no wait that would end past the deadline and no attempt that cannot fit
  (the previous attempt's duration is the estimate): the last error is raised at once instead,
  while there is still time for a fallback to answer;
* **slow failures are not retried**: an attempt that failed only after ``slow_failure`` seconds
  (default: half the target's attempt timeout) without an answer (a silent close after 30 s, a
  502 from a proxy that waited) is treated like a timeout: left to failover and hedging rather
  than waited on again on the same target.

The loop itself is tenacity's :class:`tenacity.AsyncRetrying`: this module gives it a ``retry``
predicate, a ``wait`` (tenacity's ``wait_exponential`` ceiling, jittered), a ``stop`` that
applies the attempt limit, ``max_retry_after``, the deadline and the budget, a ``before_sleep``
hook for the events, a ``retry_error_callback`` so that the last error (not a ``RetryError``) is
raised, and an injectable ``sleep``. The first attempt runs before the controller is built (the
happy path stays a few microseconds); after a failure, tenacity replays it as its own first
attempt and decides everything from there.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from .. import _validation, events
from .._cancel import now
from .._context import current_call_id, deadline_var, probe_var, queued_total_var, reason_var
from ..budget import RetryBudget
from ..errors import ErrorFilter, ErrorKind, attach_others, classify, error_predicate, retry_after
from ..events import GiveUpReason, RetryGaveUp, RetryScheduled
from ..pipeline import Call, Next, PolicyDecorator, Stage, is_async_callable

if TYPE_CHECKING:
    import tenacity

__all__ = ["GiveUpReason", "Retry", "RetryGaveUp", "RetryScheduled", "retry"]

Sleep: TypeAlias = Callable[[float], Awaitable[Any]]
"""An async sleep function, ``await sleep(seconds)`` (default ``anyio.sleep``)."""

# Never retried on the same target, whatever ``on`` says: another attempt would fail the same way
# (DESIGN §3). UNKNOWN is not here: ``on=`` may opt a user's own exception type in.
_NEVER_RETRIED = frozenset(
    {
        ErrorKind.BAD_REQUEST,
        ErrorKind.CONTEXT_LENGTH,
        ErrorKind.CONTENT_POLICY,
        ErrorKind.AUTHENTICATION,
        ErrorKind.NOT_FOUND,
    }
)

# The default slow-failure threshold, as a fraction of the target's attempt timeout.
SLOW_FAILURE_SHARE = 0.5

# The default budget: 20 % extra requests, plus a reserve of one retry per second so that a
# process that just started (or a quiet one) can still retry (Finagle keeps such a reserve too).
_DEFAULT_RATIO = 0.2
_DEFAULT_RESERVE = 1.0


def _retried_by_default(exc: BaseException) -> bool:
    kind = classify(exc)
    return kind.transient and kind not in (
        ErrorKind.TIMEOUT,
        ErrorKind.CIRCUIT_OPEN,
        ErrorKind.LIMIT_EXCEEDED,
    )


def _optional_wait(name: str, value: object, *, allow_inf: bool = False) -> float | None:
    return None if value is None else _validation.wait(name, value, allow_inf=allow_inf)


_GAVE_UP = object()  # what tenacity returns when our stop strategy ended the retries


class Retry(PolicyDecorator):
    """Retry transient failures on the same target, with backoff, a budget and the deadline:
    a policy and a decorator (``@lk.retry(max_attempts=3)``; ``lk.retry`` is this class).

    Args:
        max_attempts: attempts in all, the first included (default ``3``; ``1`` never retries).
        initial: ceiling of the first wait, in seconds or a ``timedelta`` (default ``0.5``).
        max_wait: largest ceiling of a backoff wait (default ``8.0``); must be ``>= initial``.
        multiplier: growth of the ceiling per retry, ``>= 1`` (default ``2.0``). The wait before
            retry ``n`` is ``uniform(0, min(max_wait, initial * multiplier ** (n - 1)))``: full
            jitter.
        on: which errors are retried: exception type(s) or a predicate (default ``None``:
            transient errors except timeouts and open circuits: a target that stayed silent for
            its whole timeout, or whose breaker is open, is left to failover and hedging rather
            than waited on again; pass ``on=lk.errors.is_transient`` to retry those too). Bad
            requests, context-length, content-policy and authentication errors are never
            retried, whatever ``on`` says; neither is cancellation.
        honor_retry_after: wait at least the provider's ``Retry-After``
            (:func:`~latencykit.errors.retry_after`) when the error carries one (default ``True``).
        budget: the :class:`~latencykit.RetryBudget` retries draw from: every call deposits
            once, every retry takes one token. Pass the same budget to a hedge to cap their sum.
            Default ``None``: a new ``RetryBudget(0.2, min_per_second=1.0)`` for this policy
            (+20 % requests, and a reserve of one retry per second).
        max_retry_after: give up at once, rather than wait, when ``Retry-After`` is longer than
            this many seconds (default ``None``: no cap, the deadline still applies).
        slow_failure: an attempt that failed after running at least this many seconds (a
            connection closed after a long silence, a 502 from a proxy that waited) is not
            retried on the same target, as a timeout is not: failover and hedging move on
            (``RetryGaveUp(reason="slow_failure")``). Default ``None``: half the target's
            attempt timeout (``Target.timeout``; every :class:`~latencykit.LLM` target has
            one), no limit for a target without one (a decorated function). ``math.inf``:
            never. Timeouts themselves follow ``on``.
        sleep: the async sleep used for waits (default ``anyio.sleep``); tests inject a fake.
        rng: the ``random.Random`` the jitter draws from (default: a fresh one); tests seed it.

    Never waits past the enclosing :class:`~latencykit.deadline`, nor retries when the wait plus
    the previous attempt's duration would not fit before it: the last error is raised at once.
    The error raised is always the last attempt's own, with the earlier ones attached
    (``.others`` on latencykit errors, ``latencykit_others`` and a note on other exceptions).
    Emits :class:`RetryScheduled` before each wait and :class:`RetryGaveUp` when it stops.
    Each option is an attribute of the same name; ``budget`` is the live one every call
    through this policy draws its retries from.
    """

    stage = Stage.RETRY
    __slots__ = (
        "_ceiling",
        "_handles",
        "_reads_retry_after",
        "_rng",
        "_sleep",
        "_tenacity",
        "budget",
        "honor_retry_after",
        "initial",
        "max_attempts",
        "max_retry_after",
        "max_wait",
        "multiplier",
        "on",
        "slow_failure",
    )

    def __init__(
        self,
        *,
        max_attempts: int = 3,
        initial: float | datetime.timedelta = 0.5,
        max_wait: float | datetime.timedelta = 8.0,
        multiplier: float = 2.0,
        on: ErrorFilter | None = None,
        honor_retry_after: bool = True,
        budget: RetryBudget | None = None,
        max_retry_after: float | datetime.timedelta | None = None,
        slow_failure: float | datetime.timedelta | None = None,
        sleep: Sleep = anyio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.max_attempts = _validation.count("retry.max_attempts", max_attempts)
        self.initial = _validation.wait("retry.initial", initial)
        self.max_wait = _validation.wait("retry.max_wait", max_wait)
        if self.max_wait < self.initial:
            raise ValueError(
                f"retry.max_wait ({self.max_wait:g}s) must be >= retry.initial ({self.initial:g}s)"
            )
        self.multiplier = _validation.number("retry.multiplier", multiplier, low=1.0)
        self.honor_retry_after = _validation.instance(
            "retry.honor_retry_after", honor_retry_after, bool, "a bool"
        )
        self.max_retry_after = _optional_wait("retry.max_retry_after", max_retry_after)
        self.slow_failure = _optional_wait("retry.slow_failure", slow_failure, allow_inf=True)
        self.budget = _validation.optional("retry.budget", budget, RetryBudget) or RetryBudget(
            _DEFAULT_RATIO, min_per_second=_DEFAULT_RESERVE
        )
        if not is_async_callable(sleep):
            raise TypeError(
                f"retry.sleep must be an async function (like anyio.sleep), got {sleep!r}"
            )
        rng = _validation.optional("retry.rng", rng, random.Random, "a random.Random")
        self.on = on
        self._handles = _retried_by_default if on is None else error_predicate(on, "retry.on")
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._reads_retry_after = honor_retry_after or self.max_retry_after is not None
        # tenacity is imported here, not at module level: `import latencykit` stays light.
        import tenacity

        self._tenacity = tenacity
        # The backoff ceiling before retry n (n = the failed attempt's number):
        # min(max_wait, initial * multiplier ** (n - 1)); full jitter is applied on top.
        self._ceiling = tenacity.wait_exponential(
            multiplier=self.initial, max=self.max_wait, exp_base=self.multiplier
        )

    def __repr__(self) -> str:
        return (
            f"retry(max_attempts={self.max_attempts}, initial={self.initial:g}, "
            f"max_wait={self.max_wait:g}, multiplier={self.multiplier:g}, "
            f"slow_failure={self.slow_failure!r}, budget={self.budget!r})"
        )

    async def handle(self, call: Call, next: Next) -> Any:
        """Run ``call``; retry transient failures while attempts, budget and deadline allow.

        A half-open breaker's probe is one attempt: it is never retried, so that the breaker
        judges the provider on a fair probe."""
        if probe_var.get():
            return await next(call)
        self.budget.deposit_once()
        # The first attempt runs before tenacity or any state of the retries is involved: a
        # call that succeeds (nearly all of them) costs a clock reading instead of ~30 us for
        # building and driving an AsyncRetrying. After a failure tenacity takes over, replaying
        # that failure as its first attempt, and makes every decision from there.
        started = now() - queued_total_var.get()  # waits in a queue are no attempt's time
        try:
            return await next(call)
        except Exception as exc:
            run = _Run(self, call, next, exc, now() - started - queued_total_var.get())
        return await self._retry(run)

    async def _retry(self, run: _Run) -> Any:
        tenacity = self._tenacity
        retrying = tenacity.AsyncRetrying(
            sleep=self._sleep_for,
            stop=run.stop,
            wait=run.wait,
            retry=tenacity.retry_if_exception(run.should_retry),
            before_sleep=run.scheduled,
            retry_error_callback=run.gave_up,
        )
        try:
            result = await retrying(run.attempt)
        except Exception as exc:  # an error the policy does not retry, re-raised by tenacity
            run.not_retryable(exc)
            raise
        if result is _GAVE_UP:
            raise run.last_error()
        return result

    async def _sleep_for(self, seconds: float) -> None:
        await self._sleep(float(seconds))  # tenacity passes a float subclass (DoSleep)


class _Run:
    """The state of one call through a :class:`Retry`: tenacity's strategies are its methods."""

    __slots__ = (
        "call",
        "errors",
        "give_up_reason",
        "give_up_wait",
        "last_duration",
        "next",
        "planned_for",
        "planned_wait",
        "policy",
        "replay",
        "retry_after",
    )

    def __init__(
        self, policy: Retry, call: Call, next: Next, first: Exception, duration: float
    ) -> None:
        """The retries of ``call`` after its first attempt failed with ``first`` after
        ``duration`` seconds."""
        self.policy = policy
        self.call = call
        self.next = next
        self.errors: list[Exception] = [first]
        self.last_duration = duration
        self.retry_after: float | None = None
        self.give_up_reason: GiveUpReason = "max_attempts"
        self.give_up_wait: float | None = None
        self.replay: Exception | None = first  # replayed as tenacity's first attempt
        self.planned_for = 0  # the failed attempt whose wait is planned_wait
        self.planned_wait = 0.0

    async def attempt(self) -> Any:
        """A retry, through the rest of the pipeline (which records it in the trace)."""
        if self.replay is not None:  # tenacity's first attempt: the one made before it started
            error, self.replay = self.replay, None
            raise error
        started = now() - queued_total_var.get()
        reason = reason_var.set("retry")
        try:
            return await self.next(self.call)
        except Exception as exc:
            self.errors.append(exc)
            raise
        finally:
            self.last_duration = now() - started - queued_total_var.get()
            reason_var.reset(reason)

    # --- tenacity strategies --------------------------------------------------------------

    def should_retry(self, exc: BaseException) -> bool:
        """tenacity's ``retry``: is this error worth another attempt at all?"""
        if not isinstance(exc, Exception):
            return False  # cancellation, KeyboardInterrupt, ...: never retried
        if classify(exc) in _NEVER_RETRIED:
            return False
        return bool(self.policy._handles(exc))

    def wait(self, state: tenacity.RetryCallState) -> float:
        """tenacity's ``wait``: jittered backoff, at least the Retry-After when honoured."""
        # Computed once per failed attempt, for whichever of wait/stop tenacity calls first
        # (9.x calls wait first; older versions stop first).
        if self.planned_for == state.attempt_number:
            return self.planned_wait
        policy = self.policy
        # Full jitter under tenacity's exponential ceiling (state.attempt_number is the
        # number of the attempt that just failed).
        wait = policy._rng.uniform(0.0, policy._ceiling(state))
        error = self.errors[-1]
        self.retry_after = retry_after(error) if policy._reads_retry_after else None
        if policy.honor_retry_after and self.retry_after is not None:
            wait = max(wait, self.retry_after)
        self.planned_for, self.planned_wait = state.attempt_number, wait
        return wait

    def stop(self, state: tenacity.RetryCallState) -> bool:
        """tenacity's ``stop``: attempts, Retry-After cap, deadline, then the budget."""
        policy = self.policy
        wait = self.wait(state)
        if state.attempt_number >= policy.max_attempts:
            return self._stop("max_attempts")
        if self.last_duration >= self._slow_failure() and (
            classify(self.errors[-1]) is not ErrorKind.TIMEOUT  # timeouts follow `on=`
        ):
            return self._stop("slow_failure", self.last_duration)
        if (
            policy.max_retry_after is not None
            and self.retry_after is not None
            and self.retry_after > policy.max_retry_after
        ):
            return self._stop("retry_after_too_long", wait)
        deadline = deadline_var.get()
        # Never sleep past the deadline, nor start an attempt that cannot fit: the previous
        # attempt's duration is the estimate of the next one's.
        if deadline != math.inf and now() + wait + self.last_duration >= deadline:
            return self._stop("deadline", wait)
        if not policy.budget.try_withdraw():  # last: take a token only for a real retry
            return self._stop("budget")
        return False

    def _slow_failure(self) -> float:
        """Seconds after which a failed attempt is not retried on the same target."""
        threshold = self.policy.slow_failure
        if threshold is not None:
            return threshold
        timeout = self.call.target.timeout
        return math.inf if timeout is None else SLOW_FAILURE_SHARE * timeout

    def _stop(self, reason: GiveUpReason, wait: float | None = None) -> bool:
        self.give_up_reason = reason
        self.give_up_wait = wait
        return True

    def scheduled(self, state: tenacity.RetryCallState) -> None:
        """tenacity's ``before_sleep``: announce the retry."""
        if events.listening():
            events.emit(
                RetryScheduled(
                    current_call_id(),
                    attempt=state.attempt_number + 1,
                    wait=self.planned_wait,
                    reason_kind=classify(self.errors[-1]),
                    retry_after=self.retry_after,
                )
            )

    def gave_up(self, state: tenacity.RetryCallState) -> object:
        """tenacity's ``retry_error_callback``: hand control back to :meth:`Retry.handle`."""
        return _GAVE_UP

    # --- outcomes ---------------------------------------------------------------------------

    def last_error(self) -> Exception:
        """The error to raise after giving up: the last one, the others attached."""
        error = self.errors[-1]
        attach_others(error, [e for e in self.errors[:-1] if e is not error])
        self._gave_up(self.give_up_reason, error, self.give_up_wait)
        return error

    def not_retryable(self, error: Exception) -> None:
        """``error`` ends the call unretried; attach the earlier errors, say so if we retried."""
        attach_others(error, [e for e in self.errors if e is not error])
        if len(self.errors) > 1:
            self._gave_up("not_retryable", error, None)

    def _gave_up(self, reason: GiveUpReason, error: Exception, wait: float | None) -> None:
        if events.listening():
            events.emit(
                RetryGaveUp(
                    current_call_id(),
                    attempts=len(self.errors),
                    reason=reason,
                    error_kind=classify(error),
                    wait=wait,
                )
            )


retry = Retry
"""The same class: ``@lk.retry(max_attempts=3)`` reads as the decorator it is."""
