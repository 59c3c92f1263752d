"""Value types shared by many layers: the base layer, which imports nothing of latencykit.

An error's kind, a turn's ledger, a route decision and a breaker's state are carried by the
per-call context, the errors and the events alike, so they live here, below all of them; each
is documented (and re-exported) where users meet it: ``lk.ErrorKind``,
``latencykit.turn.Ledger``, ``latencykit.routing.RouteDecision``,
``latencykit.policies.breaker.BreakerState``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from typing import Literal, NamedTuple


class ErrorKind(str, enum.Enum):
    """What an error says about the call and the provider; it drives every policy decision."""

    RATE_LIMITED = "rate_limited"
    """429: honour Retry-After, or go elsewhere if the wait does not fit the budget."""
    SERVER_ERROR = "server_error"
    """5xx: the provider is failing or overloaded."""
    CONNECTION = "connection"
    """No HTTP exchange: refused, reset, DNS, TLS."""
    TIMEOUT = "timeout"
    """The attempt took longer than its timeout."""
    STREAM_BROKEN = "stream_broken"
    """A stream died before it finished (no finish_reason, cut, malformed)."""
    CONTEXT_LENGTH = "context_length"
    """The prompt does not fit the model's context window: only a larger model can answer."""
    CONTENT_POLICY = "content_policy"
    """The provider refused the content: never retried."""
    AUTHENTICATION = "authentication"
    """401/403: never retried."""
    NOT_FOUND = "not_found"
    """404, ``model_not_found``: this target does not serve the model (or the endpoint is
    wrong). Not retried on the same target; failover tries the other targets, where the model
    may exist. Not a provider-health failure."""
    BAD_REQUEST = "bad_request"
    """400/409/413/422 and other 4xx: the request itself is wrong; never retried."""
    CIRCUIT_OPEN = "circuit_open"
    """A circuit breaker refused the call: go elsewhere (failover, degrade); not retried."""
    LIMIT_EXCEEDED = "limit_exceeded"
    """latencykit's own limiter refused the call (a concurrency limit or a tenant's quota, not
    within the budget): go elsewhere (failover, degrade); not retried, never held against the
    target's breaker (the provider did nothing wrong)."""
    UNKNOWN = "unknown"
    """Anything else; treated as not transient."""

    @property
    def transient(self) -> bool:
        """Whether another attempt (now, later, or elsewhere) may succeed."""
        return self in _TRANSIENT


# Worth another attempt: the provider's passing failures, and latencykit's own refusals (another
# target may take the call).
_TRANSIENT = frozenset(
    map(ErrorKind, ["rate_limited", "server_error", "connection", "timeout", "stream_broken"])
) | {ErrorKind.CIRCUIT_OPEN, ErrorKind.LIMIT_EXCEEDED}


StageOutcome = Literal["ok", "error", "cancelled", "overran"]
"""How a stage ended: its block returned, raised, was cancelled (from outside, before its time
ran out), or ran out of time (its own budget or the turn's)."""


class StageRecord(NamedTuple):
    """One ended stage, as the ledger keeps it.

    Attributes:
        name: the stage's name.
        budget: the budget it asked for in seconds (``None``: none, whatever the turn had).
        allowed: the seconds it was given: its budget, cut to what remained of the turn when it
            started (``None``: unbounded, no budget and no deadline around).
        start: seconds from the start of the turn to the start of the stage.
        spent: seconds the stage ran.
        outcome: ``"ok"``, ``"error"``, ``"cancelled"`` or ``"overran"``.
        parent: the name of the stage it ran inside (``None``: a top-level stage).
        attempts: attempts (LLM requests, decorated calls) made inside the stage.
    """

    name: str
    budget: float | None
    allowed: float | None
    start: float
    spent: float
    outcome: StageOutcome
    parent: str | None = None
    attempts: int = 0

    @property
    def overran(self) -> bool:
        """Whether the stage ran out of time (its budget, or the turn's)."""
        return self.outcome == "overran"

    @property
    def lent(self) -> float:
        """Seconds of its allowance the stage did not use and left to the turn (``0.0`` when
        it overran, or had no allowance)."""
        if self.allowed is None or self.overran:
            return 0.0
        return max(0.0, self.allowed - self.spent)

    def __str__(self) -> str:
        budget = "-" if self.budget is None else f"{self.budget:.3f}s"
        allowed = "-" if self.allowed is None else f"{self.allowed:.3f}s"
        return (
            f"{self.name}: budget {budget}, allowed {allowed}, spent {self.spent:.3f}s "
            f"at +{self.start:.3f}s, {self.outcome}"
        )


class Ledger:
    """The stages of one turn, in the order they ended.

    Read it with ``lk.ledger()`` inside the turn, ``scope.ledger`` after ``with lk.deadline(...)
    as scope``, or ``error.ledger`` from a :class:`~latencykit.DeadlineExceeded`.

    Attributes:
        started_at: when the turn started, on the event loop's clock.
        deadline: the turn's deadline on the same clock (``math.inf``: none).
    """

    __slots__ = ("_open", "_records", "deadline", "started_at")

    def __init__(self, started_at: float, deadline: float) -> None:
        self.started_at = started_at
        self.deadline = deadline
        self._records: list[StageRecord] = []
        self._open: list[str] = []  # names of the stages running, outermost first

    @property
    def budget(self) -> float | None:
        """The turn's total budget in seconds (``None``: no deadline)."""
        return None if self.deadline == math.inf else self.deadline - self.started_at

    @property
    def stages(self) -> tuple[StageRecord, ...]:
        """Every ended stage, in the order they ended (nested stages before their parent)."""
        return tuple(self._records)

    @property
    def running(self) -> tuple[str, ...]:
        """Names of the stages running now, outermost first."""
        return tuple(self._open)

    @property
    def overran(self) -> tuple[StageRecord, ...]:
        """The stages that ran out of time."""
        return tuple(r for r in self._records if r.overran)

    def __iter__(self) -> Iterator[StageRecord]:
        return iter(tuple(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, name: str) -> StageRecord:
        """The last ended stage called ``name``; ``KeyError`` if none."""
        for record in reversed(self._records):
            if record.name == name:
                return record
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"Ledger(budget={self.budget}, stages={[r.name for r in self._records]})"

    def __str__(self) -> str:
        budget = "none" if self.budget is None else f"{self.budget:.3f}s"
        lines = [f"turn budget {budget}", *(f"  {record}" for record in self._records)]
        if self._open:
            lines.append(f"  running: {', '.join(self._open)}")
        return "\n".join(lines)

    def ran_out_in(self, deadline: float) -> str | None:
        """The innermost stage that was running when a deadline at ``deadline`` (on the loop's
        clock) expired: of the stages that overran and ended at that deadline (the last ones
        written, nested stages before their parents), the first; ``None`` if none did."""
        found = None
        for record in reversed(self._records):
            ended = self.started_at + record.start + record.spent
            if not (record.overran and ended >= deadline - 1e-6):
                break
            found = record.name
        return found


class RouteDecision(NamedTuple):
    """Where a call was routed and why.

    Attributes:
        target: the chosen target's key.
        reason: a short human-readable reason (``"rule 1: task='classify'"``, ``"default"``,
            ``"budget: ..."``).
    """

    target: str
    reason: str


class BreakerState(str, enum.Enum):
    """The state of a circuit breaker (a ``str``: ``BreakerState.OPEN == "open"``)."""

    CLOSED = "closed"
    """Calls go through and fill the window."""
    OPEN = "open"
    """Calls are refused until ``open_duration`` has passed."""
    HALF_OPEN = "half_open"
    """A few probe calls are admitted to test the target; the others are refused."""
    FORCED_OPEN = "forced_open"
    """Isolated by hand (:meth:`~latencykit.policies.breaker.Breaker.isolate`): every call is
    refused until ``reset()``."""
