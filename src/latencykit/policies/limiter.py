"""``limiter``: per-target concurrency limits and per-tenant quotas, fair between tenants.

A :class:`Limiter` sits inside the breaker and failover, outside retry and the attempt
(``Stage.LIMITER``), so it runs once per target a call goes to. Before letting a call through it
takes, in this order:

1. the tenant's **rate quotas** (:class:`Quota`: requests per second, tokens per minute), token
   buckets kept in memory, or for the fleet by a shared store (``shared=``, or
   :func:`~latencykit.use_store`). A bucket knows how long until it can serve, so a wait
   that does not fit (``max_wait``, the remaining budget) is refused at once;
2. a slot of the tenant's **concurrency cap** (``Quota.concurrency``), FIFO per tenant;
3. a slot of the **target's concurrency limit** (``concurrency``). Waiters for a target's slots
   are served by weighted round robin across tenants (FIFO within a tenant), so a noisy tenant's
   backlog does not delay a quiet tenant's calls.

A slot wait cannot be known in advance: the call waits until a slot frees, at most until
``max_wait`` after it arrived (then :class:`~latencykit.errors.LimitExceeded`) or until the
enclosing deadline or cancel scope ends (whose cancellation then wins:
:class:`~latencykit.DeadlineExceeded`, or a failover share's timeout). Every refusal raises
``LimitExceeded`` without calling the target; it is transient to failover and degrade (they move
on), never retried by default and never counted by breakers.

Slots are held until the call's result is final: a response returned, an error raised, the call
cancelled, or, for a stream, the stream ended (closed, finished, broken, garbage-collected).
Concurrency slots are process-local; the token buckets may be the fleet's (a Lua script on
Redis takes from them atomically).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import anyio

from .. import _response, _validation, events
from .. import fleet as _fleet
from .._cancel import Backend, backend, clock, effective_deadline, threadsafe_caller
from .._context import current_call_id, deadline_var
from .._fair import FairSlots, Waiter, wait_granted
from .._response import Summary
from ..errors import LimitExceeded
from ..events import Event, LimitKind, LimitRefused, LimitWaited
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stream import Stream, StreamOutcome

__all__ = [
    "DEFAULT_TENANT",
    "LimitKind",
    "LimitRefused",
    "LimitWaited",
    "Limiter",
    "LimiterSnapshot",
    "Quota",
    "current_tenant",
    "tenant",
]

DEFAULT_TENANT = "<default>"
"""The tenant of calls that name none (no ``tenant()`` scope, no string ``user=``)."""

# Idle state (full buckets, tenants with nothing in flight) is forgotten once there are this many
# entries, then again at twice as many as were kept: tenants may be end users, many and brief.
_PRUNE_FROM = 1024
V = TypeVar("V")


def _forget(entries: dict[str, V], idle: Callable[[V], bool]) -> int:
    """Forget the idle ``entries`` (tenants may be end users, many and brief); return the size
    from which to look again: twice as many as were kept."""
    for key in [key for key, value in entries.items() if idle(value)]:
        del entries[key]
    return max(_PRUNE_FROM, 2 * len(entries))


# --- tenants -----------------------------------------------------------------------------------

_tenant_var: ContextVar[str | None] = ContextVar("latencykit.tenant", default=None)


@contextlib.contextmanager
def _tenant_scope(name: str) -> Iterator[str]:
    token = _tenant_var.set(name)
    try:
        yield name
    finally:
        _tenant_var.reset(token)


def tenant(name: str) -> contextlib.AbstractContextManager[str]:
    """Run the calls made inside ``with tenant(name):`` on behalf of tenant ``name``.

    A context variable: it follows the calls into the tasks they start (hedges, races), and
    nests (the innermost wins). Each ``with`` needs its own ``tenant(...)`` call. It takes
    precedence over the ``user=`` argument of an LLM call (see :class:`Limiter`).

    Raises:
        TypeError, ValueError: ``name`` is not a string, or is empty.
    """
    return _tenant_scope(_validation.text("tenant.name", name))


def current_tenant() -> str | None:
    """The tenant set by the innermost enclosing ``with tenant(...)``, or ``None``."""
    return _tenant_var.get()


def _default_tenant_of(call: Call) -> str | None:
    named = _tenant_var.get()
    if named is not None:
        return named
    if call.target.model:  # an LLM call: OpenAI's end-user id
        user = call.kwargs.get("user")
        if isinstance(user, str) and user:
            return user
    return None


# --- quotas and their buckets --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """What one tenant may use: rates (token buckets), a concurrency cap and a fair share.

    Frozen and validated at construction (``ValueError`` naming the field). Every field is
    optional; a quota with none set only gives the tenant its ``weight``.

    Attributes:
        requests_per_second: calls per second, refilled continuously (default ``None``: no
            request rate).
        tokens_per_minute: tokens per minute (prompt plus the largest possible answer, see
            ``Limiter(tokens_of=...)``), refilled continuously (default ``None``: no token
            rate).
        request_burst: the request bucket's size: calls that may go at once after a quiet
            spell (default ``None``: one second's worth, at least 1; must be ``>= 1``).
        token_burst: the token bucket's size (default ``None``: one minute's worth,
            ``tokens_per_minute``).
        concurrency: calls of the tenant in flight at once through the limiter, all targets
            together (default ``None``: no cap). A cap below the target's ``concurrency``
            keeps slots free for the other tenants: this is what keeps a noisy tenant from
            raising a quiet one's latency.
        weight: the tenant's share of a contended target's slots relative to the other
            waiting tenants (default ``1.0``): a tenant of weight 2 is served twice as often
            as one of weight 1 while both wait.

    After construction ``request_burst`` and ``token_burst`` hold the sizes in force (the
    defaults filled in) when their rate is set, else ``None``.
    """

    requests_per_second: float | None = None
    tokens_per_minute: float | None = None
    request_burst: float | None = None
    token_burst: float | None = None
    concurrency: int | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        for rate_name, burst_name, low in (
            ("requests_per_second", "request_burst", 1.0),
            ("tokens_per_minute", "token_burst", 0.0),
        ):
            rate, burst = getattr(self, rate_name), getattr(self, burst_name)
            if rate is None:
                if burst is not None:
                    raise ValueError(f"Quota.{burst_name} needs Quota.{rate_name}")
                continue
            rate = _validation.number(f"Quota.{rate_name}", rate, above=True)
            if burst is None:  # a second's worth of requests (at least one), a minute's of tokens
                burst = max(low, rate)
            burst = _validation.number(f"Quota.{burst_name}", burst, low, above=not low)
            object.__setattr__(self, rate_name, rate)
            object.__setattr__(self, burst_name, burst)
        if self.concurrency is not None:
            _validation.count("Quota.concurrency", self.concurrency)
        object.__setattr__(
            self, "weight", _validation.number("Quota.weight", self.weight, above=True)
        )

    @property
    def rated(self) -> bool:
        """Whether the quota has a request or token rate (a bucket to take from)."""
        return self.requests_per_second is not None or self.tokens_per_minute is not None


class _Buckets:
    """The process-local token buckets, by key (``"<tenant>/requests"``, ``"<tenant>/tokens"``).

    A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second; a bucket
    never seen is full, so full buckets are forgotten from time to time (tenants may be end
    users, many and brief). ``quota.lua`` is the same bucket for a fleet.
    """

    __slots__ = ("_buckets", "_clock", "_lock", "_prune_at")

    def __init__(self, clock: Callable[[], float] = clock) -> None:
        self._clock = clock
        self._buckets: dict[str, list[float]] = {}  # key -> [tokens, updated at, rate, burst]
        self._lock = threading.Lock()
        self._prune_at = _PRUNE_FROM

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, amount: float, *, rate: float, burst: float, max_wait: float) -> float:
        """Take ``amount`` tokens if they are there within ``max_wait`` seconds, and return
        the wait (``0.0``: now).

        The bucket refills for the time since its last update (up to ``burst``); if the wait
        until it holds ``amount`` is at most ``max_wait``, ``amount`` is taken (the bucket may
        go negative: the tokens that arrive during the wait are reserved; later callers queue
        behind). Otherwise nothing is taken: a wait above ``max_wait`` says so. A negative
        ``amount`` gives tokens back (never above ``burst``) and returns ``0.0``.
        """
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self._prune_at:  # forget the full buckets
                    self._prune_at = _forget(
                        self._buckets, lambda b: b[0] + (now - b[1]) * b[2] >= b[3]
                    )
                bucket = self._buckets[key] = [burst, now, rate, burst]
            tokens = min(burst, bucket[0] + max(0.0, now - bucket[1]) * rate)
            # A clock read out of order never refills twice.
            bucket[1:] = (max(bucket[1], now), rate, burst)
            if amount <= 0:
                bucket[0] = min(burst, tokens - amount)
                return 0.0
            wait = 0.0 if tokens >= amount else (amount - tokens) / rate
            bucket[0] = tokens - amount if wait <= max_wait else tokens
            return wait

    def adjust(self, key: str, amount: float, *, rate: float, burst: float) -> None:
        """Charge ``amount`` more tokens (into debt if need be), or give them back when
        negative: what the shared store's ``adjust`` does to the fleet's bucket."""
        self.take(key, amount, rate=rate, burst=burst, max_wait=math.inf)

    def level(self, key: str, *, rate: float, burst: float) -> float:
        """The tokens bucket ``key`` holds now (negative while reserved ahead)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (burst, now))[:2]
            return min(burst, tokens + max(0.0, now - at) * rate)


# --- the policy --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimiterSnapshot:
    """What a :class:`Limiter` holds now (see :meth:`Limiter.snapshot`).

    Attributes:
        in_flight: calls holding a slot, by target key (targets seen so far).
        tenants: calls in flight, by tenant (tenants with none are left out).
        waiting: calls waiting for a concurrency slot (the tenant's or a target's), by tenant.
        buckets: the tokens in each rate bucket now, by store key (``"<tenant>/requests"``,
            ``"<tenant>/tokens"``), for the tenants in flight or waiting, those with their
            own ``quotas`` entry and those named in the call; negative while calls are
            reserved ahead.
    """

    in_flight: Mapping[str, int]
    tenants: Mapping[str, int]
    waiting: Mapping[str, int]
    buckets: Mapping[str, float]


# A bucket charge: key, amount, rate, burst, and who holds the bucket (the fleet's store, or
# the limiter's own buckets when the store is unset or could not answer).
_Charge = tuple[str, float, float, float, "_Buckets | _fleet.SharedStore"]


@dataclass(slots=True, eq=False)
class _Permit:
    """One call through the limiter: whom it is for, when it arrived, and what it holds (its
    slots, and the bucket charges to refund or reconcile)."""

    call: Call
    tenant: str
    quota: Quota | None
    loop: Backend = field(default_factory=backend)
    started: float = field(init=False)
    tenant_slots: FairSlots | None = None
    target_slots: FairSlots | None = None
    charges: list[_Charge] = field(default_factory=list)
    tokens: _Charge | None = None  # the token charge
    released: bool = False

    def __post_init__(self) -> None:
        self.started = self.loop.now()

    def waited(self) -> float:
        return self.loop.now() - self.started


_UNLIMITED = math.inf


class Limiter(PolicyDecorator):
    """Per-target concurrency limits and per-tenant quotas; a policy and a decorator.

    ``Limiter(...)`` is used as ``lk.LLM(..., limiter=Limiter(...))`` (it then runs per target:
    a call refused on one target fails over to the next) or as a decorator on any async
    callable (the target is the function). One limiter's state is shared by every call
    through it: build it once. All arguments are keyword-only; each is also a read-only
    attribute (``quotas`` as a read-only mapping).

    Args:
        concurrency: calls in flight at once per target key, an int for every target or a
            mapping ``{target key: int}`` (targets not in it are not limited). Default
            ``None``: no limit. A call holds its slot through its retries (``Stage.RETRY`` is
            inside) and, for a stream, until the stream ends.
        tenant_quota: the :class:`Quota` of every tenant without its own entry in
            ``quotas`` (default ``None``: no quota).
        quotas: per-tenant quotas, ``{tenant: Quota}`` (default ``None``: none).
        max_wait: the longest a call waits in the limiter, for quotas and slots together, in
            seconds or a ``timedelta`` (default ``None``: as long as the remaining budget
            allows, :func:`~latencykit.remaining`, or any enclosing cancel scope; unbounded
            without either). ``0``: never wait.
        tenant_of: ``tenant_of(call) -> str | None``, the tenant a call is made for (default
            ``None``: the innermost ``with tenant(...)``, else an LLM call's ``user=``
            argument when it is a non-empty string, else :data:`DEFAULT_TENANT`; ``None``
            from your function means :data:`DEFAULT_TENANT` too).
        tokens_of: ``tokens_of(call) -> int``, the token cost charged to a token quota before
            the call (default ``None``: for an LLM call, litellm's ``token_counter`` of the
            messages (and tools), plus ``max_completion_tokens`` or ``max_tokens`` times
            ``n`` when set; a decorated function then needs one). The charge is reconciled
            with the usage the response (or a stream's usage chunk) reports.
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`) that holds the
            token buckets, so a tenant's quota is the fleet's (default ``None``: the process
            default, :func:`~latencykit.use_store`, looked up at each call). Taking from a
            shared bucket is one round trip per bucket and call (bounded by the store's
            timeout); while the store is unavailable the local buckets are used.
            Concurrency slots stay per process.

    Raises:
        ValueError, TypeError: an invalid option, naming it; or no limit at all (none of
            ``concurrency``, ``tenant_quota``, ``quotas``).
    """

    stage = Stage.LIMITER

    def __init__(
        self,
        *,
        concurrency: int | Mapping[str, int] | None = None,
        tenant_quota: Quota | None = None,
        quotas: Mapping[str, Quota] | None = None,
        max_wait: float | datetime.timedelta | None = None,
        tenant_of: Callable[[Call], str | None] | None = None,
        tokens_of: Callable[[Call], int] | None = None,
        shared: _fleet.SharedStore | None = None,
    ) -> None:
        self.concurrency = _concurrency(concurrency)
        _validation.optional("Limiter.tenant_quota", tenant_quota, Quota, "a Quota")
        self.tenant_quota = tenant_quota
        self.quotas: Mapping[str, Quota] = MappingProxyType(_quotas(quotas))
        if self.concurrency is None and tenant_quota is None and not self.quotas:
            raise ValueError(
                "Limiter needs a limit: concurrency, tenant_quota or quotas (it would do nothing)"
            )
        self.max_wait = None if max_wait is None else _validation.wait("Limiter.max_wait", max_wait)
        self.tenant_of = _validation.function("Limiter.tenant_of", tenant_of)
        self.tokens_of = _validation.function("Limiter.tokens_of", tokens_of)
        _validation.optional("Limiter.shared", shared, _fleet.SharedStore, "a RedisStore")
        self.shared = shared
        self._buckets = _Buckets()
        self._lock = threading.Lock()
        self._targets: dict[str, FairSlots] = {}
        self._tenants: dict[str, FairSlots] = {}
        self._prune_at = _PRUNE_FROM

    def __repr__(self) -> str:
        concurrency = (
            dict(self.concurrency) if isinstance(self.concurrency, Mapping) else self.concurrency
        )
        return (
            f"Limiter(concurrency={concurrency!r}, tenant_quota={self.tenant_quota!r}, "
            f"quotas={dict(self.quotas)!r}, max_wait={self.max_wait!r})"
        )

    # --- the policy ---------------------------------------------------------------------------

    async def handle(self, call: Call, next: Next) -> Any:
        """Take the call's quotas and slots (waiting as allowed, else raising
        :class:`~latencykit.errors.LimitExceeded`), run ``next``, and give the slots back when
        the result is final (for a stream, when it ends)."""
        who = (self.tenant_of or _default_tenant_of)(call)
        if who is None:
            who = DEFAULT_TENANT
        elif not isinstance(who, str) or not who:
            raise TypeError(
                f"Limiter.tenant_of must return a non-empty string or None, got {who!r}"
            )
        permit = _Permit(call, who, self.quotas.get(who, self.tenant_quota))
        await self._acquire(permit)
        try:
            result = await next(call)
        except BaseException:
            self._release(permit)
            raise
        if isinstance(result, Stream):
            ended = functools.partial(self._stream_ended, permit, threadsafe_caller())
            result.on_close(ended, attempt=True)
        else:
            self._release(permit, _response.summary(result) if permit.tokens else None)
        return result

    def _stream_ended(
        self,
        permit: _Permit,
        soon: Callable[[Callable[[], object]], object],
        stream: Stream[Any],
        outcome: StreamOutcome,
        error: BaseException | None,
    ) -> None:
        usage = stream.summary() if permit.tokens else None
        if outcome == "abandoned":
            # Garbage-collected: this may run at any allocation, even inside one of our own
            # critical sections (whose lock is not reentrant). Release from the event loop.
            try:
                soon(functools.partial(self._release, permit, usage))
                return
            except RuntimeError:  # the loop is closed: nothing of ours runs there any more
                pass
        self._release(permit, usage)

    async def _acquire(self, permit: _Permit) -> None:
        """Take the call's quotas and slots, waiting for them as allowed."""
        try:
            if permit.quota is not None and permit.quota.rated:
                await self._take_quotas(permit, permit.quota)
            permit.tenant_slots = await self._enter(permit, "tenant_concurrency")
            permit.target_slots = await self._enter(permit, "concurrency")
        except BaseException:
            self._release(permit, refund=True)
            raise

    def _slots(self, kind: LimitKind, key: str, quota: Quota | None) -> FairSlots:
        """The slots a call of ``key`` (a tenant or a target) takes; under the lock."""
        of_tenant = kind == "tenant_concurrency"
        kept = self._tenants if of_tenant else self._targets
        slots = kept.get(key)
        if slots is None:
            if of_tenant and len(kept) >= self._prune_at:  # forget the idle tenants
                self._prune_at = _forget(kept, lambda slots: slots.idle)
            if of_tenant:
                cap = None if quota is None else quota.concurrency
            else:
                limit = self.concurrency
                cap = limit.get(key) if isinstance(limit, Mapping) else limit
            slots = kept[key] = FairSlots(_UNLIMITED if cap is None else cap)
        return slots

    # --- rates --------------------------------------------------------------------------------

    async def _take_quotas(self, permit: _Permit, quota: Quota) -> None:
        room = self._room(permit.started, permit.loop.now())
        longest: tuple[float, LimitKind] = (0.0, "requests")  # the longest wait, and for what
        for kind, key, rate, burst in _buckets(permit.tenant, quota):
            amount = 1.0 if kind == "requests" else float(self._tokens(permit.call))
            wait, holder = await self._take(key, amount, rate, burst, room)
            if wait > room:  # nothing taken: it cannot fit, say so now rather than wait to fail
                raise self._refused(permit, kind, wait)
            charge = (key, amount, rate, burst, holder)
            permit.charges.append(charge)
            if kind == "tokens":
                permit.tokens = charge
            longest = max(longest, (wait, kind))
        wait, kind = longest
        if wait > 0:
            await anyio.sleep(wait)  # the tokens are reserved: they are ours after it
            _report(LimitWaited, permit, kind, wait)

    async def _take(
        self, key: str, amount: float, rate: float, burst: float, room: float
    ) -> tuple[float, _Buckets | _fleet.SharedStore]:
        """Take from bucket ``key``: the wait, and who holds the bucket taken from."""
        store = self.shared or _fleet._current
        if store is not None:
            wait = await store.take(key, amount, rate=rate, burst=burst, max_wait=room)
            if wait is not None:  # None: the store could not answer; count locally
                return wait, store
        return self._buckets.take(key, amount, rate=rate, burst=burst, max_wait=room), self._buckets

    def _tokens(self, call: Call) -> int:
        cost = (self.tokens_of or _llm_tokens)(call)
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
            raise TypeError(f"Limiter.tokens_of must return an int >= 0, got {cost!r}")
        return cost

    def _room(self, started: float, now: float) -> float:
        """Seconds a call may still wait: up to ``max_wait`` after it arrived, and before the
        enclosing deadline or cancel scope ends."""
        end = min(deadline_var.get(), effective_deadline())
        room = end - now
        if self.max_wait is not None:
            room = min(room, started + self.max_wait - now)
        return max(0.0, room)

    # --- slots --------------------------------------------------------------------------------

    async def _enter(self, permit: _Permit, kind: LimitKind) -> FairSlots:
        """Take a slot of the tenant's cap or of the target's limit, waiting if allowed."""
        who, quota = permit.tenant, permit.quota
        # The tenant's cap queues its calls FIFO; a target's limit serves tenants by weight.
        if kind == "tenant_concurrency":
            key, weight = who, 1.0
        else:
            key, weight = permit.call.target.key, 1.0 if quota is None else quota.weight
        own_end = math.inf if self.max_wait is None else permit.started + self.max_wait
        with self._lock:
            slots = self._slots(kind, key, quota)
            if slots.take():
                return slots
            waiter = None if own_end <= permit.loop.now() else slots.enqueue(who, weight)
        if waiter is None:  # max_wait is used up (or 0): no waiting at all
            raise self._refused(permit, kind, None)
        try:
            await wait_granted(waiter, own_end, permit.loop)
        except BaseException:
            self._stop_waiting(slots, waiter, keep=False)
            raise
        if not self._stop_waiting(slots, waiter, keep=True):
            raise self._refused(permit, kind, None)
        _report(LimitWaited, permit, kind, permit.waited())
        return slots

    def _stop_waiting(self, slots: FairSlots, waiter: Waiter, *, keep: bool) -> bool:
        """The waiter stops waiting; return whether it holds a slot. A slot granted to it is
        kept if ``keep``, else handed on (it was cancelled); otherwise it leaves the queue."""
        with self._lock:
            if waiter.granted and keep:
                return True
            woken = slots.leave(waiter)
        if woken is not None:
            woken.wake()
        return False

    def _release(
        self, permit: _Permit, usage: Summary | None = None, *, refund: bool = False
    ) -> None:
        """Give back what ``permit`` holds, once. ``refund``: the call was not made, so its
        rate charges go back too; else a token charge is reconciled with ``usage``, the
        token usage the answer reported."""
        if permit.released:
            return
        permit.released = True
        with self._lock:
            woken = [
                slots.release() for slots in (permit.target_slots, permit.tenant_slots) if slots
            ]
        for waiter in woken:
            if waiter is not None:
                waiter.wake()
        if refund:
            for key, amount, rate, burst, holder in permit.charges:
                holder.adjust(key, -amount, rate=rate, burst=burst)
        elif permit.tokens is not None and (extra := _unbilled(permit.tokens[1], usage)):
            key, _, rate, burst, holder = permit.tokens  # charge (into debt) or refund the rest
            holder.adjust(key, extra, rate=rate, burst=burst)

    # --- events and errors --------------------------------------------------------------------

    def _refused(self, permit: _Permit, kind: LimitKind, wait: float | None) -> LimitExceeded:
        waited = permit.waited()
        _report(LimitRefused, permit, kind, waited, wait=wait)
        limit = "concurrency" if kind == "tenant_concurrency" else kind
        of_tenant = None if kind == "concurrency" else permit.tenant  # a target's: no tenant's
        key = permit.call.target.key
        return LimitExceeded(key, limit, tenant=of_tenant, wait=wait, waited=waited)

    # --- introspection ------------------------------------------------------------------------

    def snapshot(self, *tenants: str) -> LimiterSnapshot:
        """What the limiter holds now: slots in flight by target and tenant, waiters by
        tenant, and the rate buckets' levels of the tenants in flight or waiting, those in
        ``quotas`` and ``tenants`` (the process's own buckets). Cheap: no I/O."""
        with self._lock:
            in_flight = {key: slots.in_use for key, slots in self._targets.items()}
            by_tenant = {who: slots.in_use for who, slots in self._tenants.items() if slots.in_use}
            waiting = Counter(
                who
                for slots in (*self._targets.values(), *self._tenants.values())
                for who, queue in slots.queues.items()
                for _ in queue.waiters
            )
        buckets: dict[str, float] = {}
        for who in dict.fromkeys([*by_tenant, *waiting, *self.quotas, *tenants]):
            quota = self.quotas.get(who, self.tenant_quota)
            for _, key, rate, burst in () if quota is None else _buckets(who, quota):
                buckets[key] = self._buckets.level(key, rate=rate, burst=burst)
        return LimiterSnapshot(
            in_flight=MappingProxyType(in_flight),
            tenants=MappingProxyType(by_tenant),
            waiting=MappingProxyType(dict(waiting)),
            buckets=MappingProxyType(buckets),
        )


def _report(
    event: Callable[..., Event], permit: _Permit, kind: LimitKind, waited: float, **more: Any
) -> None:
    """Emit :class:`LimitRefused` or :class:`LimitWaited` for ``permit``'s call."""
    if events.listening():
        call_id = current_call_id()
        target, who = permit.call.target.key, permit.tenant
        events.emit(event(call_id, target=target, tenant=who, limit=kind, waited=waited, **more))


def _buckets(who: str, quota: Quota) -> list[tuple[LimitKind, str, float, float]]:
    """The rate buckets of tenant ``who``: ``(kind, store key, rate per second, burst)``."""
    found: list[tuple[LimitKind, str, float, float]] = []
    if quota.requests_per_second is not None and quota.request_burst is not None:
        found.append(
            ("requests", f"{who}/requests", quota.requests_per_second, quota.request_burst)
        )
    if quota.tokens_per_minute is not None and quota.token_burst is not None:
        found.append(("tokens", f"{who}/tokens", quota.tokens_per_minute / 60, quota.token_burst))
    return found


def _unbilled(charged: float, usage: Summary | None) -> float:
    """The tokens a call used beyond its charge (negative: fewer); ``0`` when not reported."""
    if usage is None or usage.input_tokens is None or usage.output_tokens is None:
        return 0.0
    return usage.input_tokens + usage.output_tokens - charged


def _concurrency(value: int | Mapping[str, int] | None) -> int | Mapping[str, int] | None:
    """``Limiter.concurrency``, checked (a mapping is copied, read-only)."""
    if not isinstance(value, Mapping):
        return None if value is None else _validation.count("Limiter.concurrency", value)
    for key, limit in value.items():
        _validation.text("Limiter.concurrency keys", key)
        _validation.count(f"Limiter.concurrency[{key!r}]", limit)
    return MappingProxyType(dict(value))


def _quotas(quotas: Mapping[str, Quota] | None) -> dict[str, Quota]:
    """``Limiter.quotas``, checked and copied."""
    _validation.optional("Limiter.quotas", quotas, Mapping, "a mapping of tenant to Quota")
    for name, quota in (quotas or {}).items():
        _validation.text("Limiter.quotas keys", name)
        _validation.instance(f"Limiter.quotas[{name!r}]", quota, Quota, "a Quota")
    return dict(quotas or {})


def _llm_tokens(call: Call) -> int:
    """The default ``tokens_of``: the prompt's tokens plus the largest answer allowed."""
    model = call.target.model
    if not model:
        raise TypeError(
            f"a token quota needs the token cost of calls to {call.target.key!r}, which is not "
            "an LLM call: pass Limiter(tokens_of=...)"
        )
    from .._litellm import litellm

    kwargs = call.kwargs
    count = litellm().token_counter(
        model=model, messages=kwargs.get("messages") or [], tools=kwargs.get("tools")
    )
    answer = kwargs.get("max_completion_tokens") or kwargs.get("max_tokens")
    if isinstance(answer, int) and not isinstance(answer, bool) and answer > 0:
        n = kwargs.get("n")
        count += answer * (n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1)
    return int(count)
