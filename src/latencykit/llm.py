"""``LLM``: a resilient front for ``litellm.acompletion`` that keeps its call signature.

``await llm.acompletion(**litellm_kwargs)`` runs the policies around ``litellm.acompletion`` and
returns litellm's own ``ModelResponse`` (on the fast lane, a :class:`~latencykit.chunks.Response`
that reads like it). :func:`report` reads, from any response it returned,
which target answered, after how many attempts, and whether the degraded path was used.

litellm facts this module is built on (measured, see docs/concepts.md): litellm is imported
lazily (it takes seconds); ``max_retries=0`` always (the OpenAI SDK would otherwise retry on its
own, tripling attempts); ``timeout`` is constant per target (litellm caches one HTTP client per
timeout value, so a per-call timeout would open a new connection every call), and deadlines are
enforced with cancel scopes instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import sys
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from . import _validation
from ._cancel import clock, now
from ._context import (
    PRIORITIES,
    Attempt,
    Priority,
    Trace,
    current_attempt,
    operation_var,
    priority_var,
    remaining,
    task_var,
)
from ._litellm import LitellmTransport, litellm, to_model_response
from ._response import CHAT_PARAMETERS
from ._slots import ConnectionSlots, host_of, per_host, waiting
from ._sync import LoopThread, SyncStream
from .errors import (
    ErrorFilter,
    OutputTruncated,
    hidden_params,
    malformed_answer,
    provider_error,
    scrub,
)
from .fleet import SharedStore
from .pipeline import Call, Next, Pipeline, Policy, Stage
from .policies.breaker import Breaker
from .policies.breaker import breaker as breaker_for
from .policies.deadline import Deadline
from .policies.failover import Failover, Route
from .policies.fallback import Fallback, FallbackReason, Reroute
from .policies.guard import StreamGuard
from .policies.hedge import Hedge, Quantile
from .policies.retry import Retry
from .routing import RouteDecision, Router, RouterFunction, Routing
from .stats import Recorder, StatsTable
from .stream import ChunkSource, Stream
from .target import Target, as_target

if TYPE_CHECKING:
    from .autopilot import SLO, Autopilot
    from .config import LLMConfig
    from .policies.breaker import BreakerState

__all__ = [
    "LLM",
    "CallReport",
    "Degrade",
    "SyncStream",
    "Transport",
    "report",
    "to_model_response",
]

_REPORT_KEY = "latencykit"
_ATTEMPT_KEY = "latencykit.attempt"
_CAP_KEY = "latencykit.max_tokens"
_CAP_HEADROOM = 0.9  # budget-aware caps leave 10 % of the time left unused
_CAP_MIN_SAMPLES = 5
# Arguments latencykit owns: accepting them per call would defeat the policies.
_RESERVED = {
    "max_retries": "latencykit owns retries; litellm is always called with max_retries=0",
    "num_retries": "latencykit owns retries; litellm is always called with max_retries=0",
    "timeout": "the per-target timeout is LLM(timeout=...); bound the whole call with deadline=",
}
# Arguments that belong to a target (a key is only ever sent to its own target's host).
_TARGET_OWNED = {
    "api_key": "a key belongs to a target: pass LLM(api_key=...) or a failover target's",
    "api_base": "the endpoint belongs to a target: pass LLM(api_base=...) or a failover target's",
}


class Transport(Protocol):
    """A lane: how an :class:`LLM` makes its attempts on the targets that name it
    (``Target.transport``: ``"litellm"``, through ``litellm.acompletion``; ``"openai"``, the
    fast lane). Each ``LLM`` owns one of each, and closes them with :meth:`LLM.aclose`.
    The target's ``timeout`` is its attempt timeout."""

    def complete(self, target: Target, arguments: Mapping[str, Any]) -> Awaitable[Any]:
        """A non-streaming attempt: the answer (litellm's ``ModelResponse``, or one that reads
        like it, with a ``_hidden_params`` dict); raises what failed."""
        ...

    def open(
        self, target: Target, arguments: Mapping[str, Any]
    ) -> ChunkSource | Awaitable[ChunkSource]:
        """A streaming attempt's source, opened on its first read."""
        ...

    def embed(self, target: Target, arguments: Mapping[str, Any]) -> Awaitable[Any]:
        """An embedding attempt: the answer (litellm's ``EmbeddingResponse``, or one that reads
        like it, with a ``_hidden_params`` dict); raises what failed."""
        ...

    async def warm(self, target: Target, *, connect: bool, limit: float) -> None:
        """Do the client's first-call work for ``target``, then (``connect``) open a
        connection to it within ``limit`` seconds (see :meth:`LLM.warm`)."""
        ...

    async def aclose(self) -> None:
        """Close the connections it opened on this event loop."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Degrade:
    """The degraded path of :class:`LLM`: the same call, rewritten to be cheaper and faster.

    Attributes:
        model: the model to answer from on the degraded path (default ``None``: same model).
        max_tokens: cap on the degraded answer's length (default ``None``: unchanged).
        after: seconds to give the primary before switching (default ``None``: switch on errors
            only). Must be shorter than ``LLM(deadline=...)``.
        on: which primary errors switch to the degraded path (default ``None``: transient
            errors; see :class:`~latencykit.fallback`).
        overrides: any other litellm arguments to set on the degraded call (default empty),
            e.g. ``{"api_base": ..., "api_key": ..., "temperature": 0}``. A degraded call sent
            to another ``api_base`` carries the ``api_key`` given here, or none: never the
            primary's.

    At least one of ``model``, ``max_tokens`` and ``overrides`` must be given.

    Degrade before the deadline, not after: inside a deadline, when less time is left than the
    primary target's recent median duration (once it has 5 samples), the degraded path
    answers at once (``report(r).fallback_reason == "predicted"``) instead of starting an
    attempt that cannot finish.
    """

    model: str | None = None
    max_tokens: int | None = None
    after: float | datetime.timedelta | None = None
    on: ErrorFilter | None = None
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.model is not None:
            _validation.text("Degrade.model", self.model, "model string")
        if self.max_tokens is not None:
            _validation.count("Degrade.max_tokens", self.max_tokens)
        if self.after is not None:
            object.__setattr__(self, "after", _validation.seconds("Degrade.after", self.after))
        overrides = _validation.mapping("Degrade.overrides", self.overrides)
        bad = sorted(set(overrides) & set(_RESERVED))
        if bad:
            raise ValueError(f"Degrade.overrides cannot set {bad[0]!r}: {_RESERVED[bad[0]]}")
        object.__setattr__(self, "overrides", MappingProxyType(dict(overrides)))
        if self.model is None and self.max_tokens is None and not self.overrides:
            raise ValueError("Degrade needs at least one of model, max_tokens or overrides")

    def __repr__(self) -> str:
        overrides = {k: ("***" if k == "api_key" else v) for k, v in self.overrides.items()}
        if isinstance(overrides.get("api_base"), str):
            overrides["api_base"] = scrub(overrides["api_base"])  # its user:password@
        return (
            f"Degrade(model={self.model!r}, max_tokens={self.max_tokens!r}, "
            f"after={self.after!r}, overrides={overrides!r})"
        )

    def target(self, primary: Target) -> Target:
        """The degraded path's target, from the primary's."""
        changes: dict[str, Any] = {
            k: self.overrides[k] for k in ("api_base", "api_key") if k in self.overrides
        }
        if self.model is not None:
            changes["model"] = self.model
        return primary.replace(**changes) if changes else primary

    def rewrite(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The degraded call's litellm arguments (not the target's), from the primary's."""
        rewritten = {**kwargs, **self.overrides}
        rewritten.pop("api_base", None)
        rewritten.pop("api_key", None)
        if self.max_tokens is not None:
            current = rewritten.get("max_tokens")
            rewritten["max_tokens"] = (
                self.max_tokens if current is None else min(int(current), self.max_tokens)
            )
        return rewritten


@dataclass(frozen=True, slots=True)
class CallReport:
    """What happened during one :meth:`LLM.acompletion`; read it with :func:`report`.

    Attributes:
        target: the key of the target whose attempt answered.
        model: the model that answered (for a response, as the provider named it).
        attempts: every attempt of the call, oldest first, including losers and failures (for a
            stream: those ended so far; the answering one is added when the stream ends).
        answering_attempt: the :attr:`~latencykit.Attempt.number` of the attempt that produced
            the response or the stream (``0``: the cache answered).
            Which target that was is ``target`` (the span attribute ``latencykit.answered_by``).
        degraded: whether the answer came from the degraded path (:class:`Degrade`).
        fallback_reason: ``"timeout"``, ``"error"`` or ``"predicted"`` when degraded, else
            ``None``.
        duration: seconds from the start of the call to the answer (for a stream: to its end,
            or to now while it is open).
        ttft: for a stream, seconds from the start of the call to the first content chunk
            (``None`` for a response).
        chunks: for a stream, content chunks received so far (``0`` for a response).
        cache: ``"hit"`` when the response cache answered (no attempt was made: ``attempts``
            is empty, ``answering_attempt`` is ``0``), ``"miss"`` when the cache was asked and did
            not have it, ``None`` without a cache.
        route: the router's :class:`~latencykit.routing.RouteDecision` (``None``: no router).
        truncated: whether the answer stopped at its length limit (``finish_reason ==
            "length"``; for a stream, once it ended).
        max_tokens: the output cap latencykit sent with the answering attempt
            (``LLM(max_output_tokens=...)``; ``None``: it set none).

    ``str(report)`` is one line for a log or a notebook: who answered, after how many
    attempts, how (retried, hedged, failed over, resumed, degraded, truncated; for a stream,
    what its attempts recorded so far), the time to first token and the total, e.g.
    ``openai/backup answered after 2 attempts (failed over), first token 0.412s, total
    1.203s``; ``repr(report)`` shows every field.
    """

    target: str
    model: str
    attempts: tuple[Attempt, ...]
    answering_attempt: int
    degraded: bool
    fallback_reason: str | None
    duration: float
    ttft: float | None = None
    chunks: int = 0
    cache: str | None = None
    route: RouteDecision | None = None
    truncated: bool = False
    max_tokens: int | None = None

    def __str__(self) -> str:
        if self.cache == "hit":
            how = "from the cache"
        else:
            # A stream's answering attempt is recorded only when the stream ends.
            made = max([self.answering_attempt, *(attempt.number for attempt in self.attempts)])
            how = f"after {made} attempt{'s' if made > 1 else ''}"
        reasons = {attempt.reason for attempt in self.attempts}
        flags = [word for reason, word in _REASON_WORDS if reason in reasons]
        if self.degraded:
            flags.append(f"degraded: {self.fallback_reason}")
        if self.truncated:
            flags.append("truncated")
        line = f"{self.target} answered {how}" + (f" ({', '.join(flags)})" if flags else "")
        if self.ttft is not None:
            line += f", first token {self.ttft:.3f}s"
        return f"{line}, total {self.duration:.3f}s"


# How CallReport's line names the attempts that were made (the degraded one: by its reason).
_REASON_WORDS = (
    ("retry", "retried"),
    ("hedge", "hedged"),
    ("failover", "failed over"),
    ("resume", "resumed"),
)


def report(result: object) -> CallReport:
    """The :class:`CallReport` of a response or stream returned by :meth:`LLM.acompletion`.

    This is the one documented place where latencykit tells which target answered, after how
    many attempts, and whether the degraded path was used. (For a response it lives in the
    response's ``_hidden_params["latencykit"]``, where litellm keeps its own per-response
    metadata.)

    Raises:
        LookupError: the result did not come from latencykit.
    """
    if isinstance(result, SyncStream):
        result = result.stream
    if isinstance(result, Stream):
        return _stream_report(result)
    hidden = hidden_params(result) or {}
    found = hidden.get(_REPORT_KEY)
    if isinstance(found, CallReport):
        return found
    if not isinstance(found, _Answered):
        raise LookupError("this response did not come from latencykit.LLM.acompletion")
    trace, number, target = found
    choices = getattr(result, "choices", None) or ()
    built = CallReport(
        target=target,
        model=str(getattr(result, "model", "") or ""),
        attempts=tuple(trace.attempts),
        answering_attempt=number,
        degraded=trace.degraded,
        fallback_reason=trace.fallback_reason,
        duration=(trace.ended_at or clock()) - trace.started_at,
        cache=trace.cache,
        route=trace.route,
        truncated=any(getattr(c, "finish_reason", None) == "length" for c in choices),
        max_tokens=hidden.get(_CAP_KEY),
    )
    hidden[_REPORT_KEY] = built
    return built


class _Answered(NamedTuple):
    """What :func:`report` builds a response's report from (kept in the response)."""

    trace: Trace
    number: int
    target: str


def _stream_report(stream: Stream[Any]) -> CallReport:
    trace = stream.trace
    if trace is None:
        raise LookupError("this stream did not come from latencykit.LLM.acompletion")
    ttft = stream.ttft
    return CallReport(
        target=stream.target,
        model=stream.target,
        attempts=tuple(trace.attempts),
        answering_attempt=stream.attempt,
        degraded=trace.degraded,
        fallback_reason=trace.fallback_reason,
        duration=(trace.ended_at or clock()) - trace.started_at,
        ttft=None if ttft is None else ttft + stream.started_at - trace.started_at,
        chunks=stream.chunks,
        cache=trace.cache,
        route=trace.route,
        truncated=stream.finish_reason == "length",
    )


class LLM:
    """A resilient front for ``litellm.acompletion``, streaming or not.

    Args:
        model: the primary target's litellm model string (``"openai/gpt-4o"``).
        deadline: total budget in seconds for each call, degraded path included; for a stream,
            to its last chunk (default ``None``: unbounded).
        degrade: the degraded path (default ``None``: none); see :class:`Degrade`.
        hedge: hedged requests (default ``None``: none), e.g.
            ``lk.Hedge(lk.quantile(0.9), max_extra_load=0.1)``; hedges go to the same target,
            or with ``target="next"`` to the next failover target. A stream is hedged on its
            first content chunk (the delay is a quantile of recent times to first chunk). Its
            budget is shared by every call of this ``LLM``; its latency windows are the LLM's
            own (see :meth:`stats`), so ``llm.hedge`` is a copy of the hedge given that reads
            them.
        failover: further targets, in order, each a model string, a dict of litellm
            arguments (``model``, ``api_base``, ``api_key``, ``timeout``, plus latencykit's
            ``name``, ``context_window`` and ``capabilities``) or a :class:`~latencykit.Target`
            (default none). See :class:`~latencykit.failover` for what moves a call on.
        failover_on: which errors move a call to the next target (default ``None``: transient
            errors and context length, the latter only to a larger model). Content policy,
            authentication and bad requests are raised at once unless you widen this.
        retry: budgeted retries on the same target, e.g. ``lk.Retry(max_attempts=3)`` (default
            ``None``: no retry). They run inside failover, per target.
        breaker: a circuit breaker per target (default ``None``: none): a dict of
            :func:`~latencykit.breaker` options (``{"minimum_calls": 5, "open_duration": 10}``),
            or a function ``key -> Breaker``. Breakers are the process-wide ones of each
            target's key, so every ``LLM`` calling a target shares its breaker. Failover skips
            targets whose breaker is open.
        stream_guard: limits on streaming calls (default ``None``: ``lk.StreamGuard()``, whose
            first-token and stall limits are learned per target from its recent streams: 3x
            the p99 of its times to first chunk (at least 1 s, more for a prompt longer than
            it answered recently) and of its streams' longest gaps (at least 2 s), once it has
            20 recent samples; its attempt ``timeout`` before that, and as a cap, so that a
            stream never waits forever). A limit set in the guard wins. See
            :class:`~latencykit.StreamGuard` and docs/streaming.md; :meth:`stats` shows the
            learned limits.
        context_window: the primary model's context window in tokens (default ``None``:
            unknown); with the targets' ``context_window``, a context-length error goes only
            to a larger model.
        capabilities: the primary target's capabilities (default empty), e.g. ``{"prefill"}``.
        dimensions: the length of the primary model's embedding vectors (default ``None``:
            undeclared); see :meth:`aembedding` and :attr:`~latencykit.Target.dimensions`.
        timeout: per-attempt timeout in seconds handed to litellm, constant so that litellm
            reuses its HTTP client and connections (default ``600``, litellm's own); the
            default of every target that sets none.
        api_base: the primary target's base URL (default ``None``: litellm's default for the
            provider).
        api_key: the primary target's API key (default ``None``: from the environment, as
            litellm does). Never logged, never put in events, errors or reprs.
        transport: how the primary target's requests are made (default ``"litellm"``);
            ``"openai"`` is the fast lane for OpenAI-compatible providers (see
            :class:`~latencykit.Target`). A failover target sets its own
            (``{"model": ..., "transport": "openai"}``). Every policy works the same on both.
        defaults: litellm arguments applied to every call unless the call sets them
            (default none), e.g. ``{"temperature": 0}``.
        limiter: per-target concurrency limits and per-tenant quotas (default ``None``:
            none), a :class:`~latencykit.policies.limiter.Limiter`; it runs per target, inside
            the breaker, so a call refused on one target (:class:`~latencykit.LimitExceeded`)
            fails over to the next.
        cache: a response cache (default ``None``: none), a
            :class:`~latencykit.cache.ResponseCache`; a hit answers without any attempt
            (:func:`report` says ``cache="hit"``).
        router: picks each call's target from the request (default ``None``: every call
            starts at the first target): a :class:`~latencykit.routing.Router` or any function
            ``RouteRequest -> target name``. Calls may carry a task tag for it,
            ``acompletion(task="classify")``. Failover goes on from the chosen target to the
            other eligible ones; :func:`report` and the ``Routed`` event tell the decision.
        max_output_tokens: the most output tokens any call may ask for (default ``None``: no
            cap); a call's own ``max_tokens`` is kept when lower.
        budget_aware: with ``max_output_tokens``, lower each attempt's cap further to what its
            target can produce in the time left (its recent median time to first chunk and
            time per output token, with 10 % headroom; no lowering until a target has 5
            recent samples) (default ``False``).
        on_truncated: what an answer cut at the cap (``finish_reason == "length"``) does when
            ``max_output_tokens`` is set: ``"raise"`` :class:`~latencykit.errors.OutputTruncated`
            (carrying the response, to accept or continue; a stream raises it after its last
            chunk, in place of the end of iteration) or ``"accept"`` it (then
            ``report(result).truncated`` is ``True``) (default ``"raise"``).
        shared: a store shared by the fleet (:class:`~latencykit.RedisStore`) for this
            ``LLM``'s breakers (built from a dict of options) and the latency windows its
            hedge reads (default ``None``: the process default, :func:`~latencykit.use_store`,
            looked up at each use). Budgets and limiters take their own ``shared=``.
        governor: pace every attempt by the rate limits the provider's answers tell, so that
            a tight quota waits instead of answering 429, and hold each target's attempts in
            flight to a concurrency limit learned from its latency and overloads (default
            ``False``); see :class:`~latencykit.policies.governor.Governor`,
            :class:`~latencykit.policies.concurrency.AdaptiveConcurrency` and docs/governor.md.
            One room per target and API key for the fleet with ``shared`` (or
            :func:`~latencykit.use_store`), else per process; calls of a lower ``priority``
            yield to higher ones. The concurrency limit is learned per process.
        slo: a service-level objective, :class:`~latencykit.SLO` (default ``None``: none).
            With one, the autopilot (:attr:`autopilot`) sets each target's first-token and
            stall limits, hedge quantile and breaker slow-call threshold from its recent
            measurements, in small steps checked by replaying the recent attempts, every
            ``SLO.every`` seconds (see docs/autopilot.md); without ``hedge``, it makes one
            (budget ``SLO.max_extra_load``) that hedges nothing until it says so.

    The pipeline, outermost first: deadline, cache, router, degrade, hedge, failover, then per
    target breaker, limiter, retry and the attempt (with the stream guard, then its connection
    slot: see :meth:`stats`); :attr:`pipeline`
    shows it. Every attempt is reported to the LLM's :class:`~latencykit.stats.Recorder`,
    which :meth:`stats` reads.
    Invalid options raise ``ValueError``/``TypeError`` naming the field at construction.
    Constructing the first ``LLM`` with a target on the litellm lane (or a
    :class:`~latencykit.routing.Router`) imports litellm (seconds, once per process): at
    start-up, not inside the first call, where the import would block the event loop. An
    ``LLM`` whose targets are all on the fast lane never imports it.
    """

    def __init__(
        self,
        model: str,
        *,
        deadline: float | datetime.timedelta | None = None,
        degrade: Degrade | None = None,
        hedge: Hedge | None = None,
        failover: Sequence[str | Mapping[str, Any] | Target] = (),
        failover_on: ErrorFilter | None = None,
        retry: Retry | None = None,
        breaker: Mapping[str, Any] | Callable[[str], Breaker] | None = None,
        stream_guard: StreamGuard | None = None,
        context_window: int | None = None,
        capabilities: frozenset[str] | set[str] | Sequence[str] = frozenset(),
        dimensions: int | None = None,
        timeout: float | datetime.timedelta = 600.0,
        api_base: str | None = None,
        api_key: str | None = None,
        transport: str = "litellm",
        defaults: Mapping[str, Any] | None = None,
        limiter: Policy | None = None,
        cache: Policy | None = None,
        router: RouterFunction | None = None,
        max_output_tokens: int | None = None,
        budget_aware: bool = False,
        on_truncated: Literal["raise", "accept"] = "raise",
        shared: SharedStore | None = None,
        governor: bool = False,
        slo: SLO | None = None,
    ) -> None:
        # The arguments as given, first thing: what to_config() describes.
        self._arguments: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
        self._arguments["api_key_env"] = None
        self._configs: dict[str, Any] = {}  # limiter, cache, router: the configs they came from
        _check_options(self._arguments)
        self.model = model
        self.timeout = _validation.seconds("LLM.timeout", timeout)
        self.deadline = _validation.optional_seconds("LLM.deadline", deadline)
        self.degrade = degrade
        self.shared = shared
        hedge, owns_hedge = _hedge_for_slo(slo, hedge)
        # One record of every attempt, per target: the hedge's delays and stats() read it.
        self._recorder = _recorder_for(hedge, shared)
        self.hedge = None if hedge is None else hedge.reading(self._recorder)
        if slo is not None and self.hedge is not None:
            self.hedge.tuned = {}  # the autopilot's quantiles, shared by the hedge's copies
        self._breakers: _TargetBreakers | None = None
        self.stream_guard = stream_guard or StreamGuard()
        primary = Target(
            model,
            api_base=api_base,
            api_key=api_key,
            context_window=context_window,
            capabilities=capabilities,  # type: ignore[arg-type]  # Target validates it
            transport=transport,
            dimensions=dimensions,
        )
        self.targets = _targets(primary, failover, self.timeout)
        self._secrets = _secrets_of(self.targets, degrade)
        self._routes = [Route(t, functools.partial(self._to_target, t)) for t in self.targets]
        self._degraded = None if degrade is None else degrade.target(self.targets[0])
        _import_litellm_if_needed((*self.targets, self._degraded), router)
        self._defaults = _checked_defaults(defaults, failover)
        self.max_output_tokens = max_output_tokens
        self.budget_aware = bool(budget_aware)
        self.on_truncated = on_truncated
        self.router = router
        policies = self._policies(failover_on, retry, breaker)
        if router is not None:  # a Balanced router also counts each attempt (policies)
            is_open = None if self._breakers is None else self._breakers.is_open
            routing = Routing(router, self.targets, self._to_target, self._recorder, is_open)
            policies += routing.policies
        self._pipeline = Pipeline([*policies, *filter(None, (limiter, cache))])
        # Responses API calls: the same pipeline, without the cache (which stores chat and
        # embedding answers).
        self._uncached = Pipeline(p for p in self._pipeline.policies if p is not cache)
        # Per target (breaker, retry, attempt): what continues a broken stream on a target.
        self._per_target = Pipeline(
            p for p in self._pipeline.policies if int(p.stage) >= Stage.BREAKER
        )
        self.autopilot: Autopilot | None = None
        """The SLO autopilot (``None`` without ``slo``): its ``history`` of changes, ``step()``
        to run a round now; see :mod:`latencykit.autopilot`."""
        if slo is not None:
            self.autopilot = self._autopilot(slo, owns_hedge)

    def _autopilot(self, slo: SLO, owns_hedge: bool) -> Autopilot:
        from .autopilot import Autopilot  # here: only an LLM with an SLO needs it

        assert self.hedge is not None  # _hedge_for_slo gave one
        breakers = self._breakers
        return Autopilot(
            slo,
            targets=self.targets,
            recorder=self._recorder,
            hedge=self.hedge,
            guard=self._guard,
            breaker_of=None if breakers is None else breakers.of,
            owns_hedge=owns_hedge,
        )

    def _fallback(self) -> Fallback | None:
        """The degraded path as a fallback, its ``after`` within the deadline."""
        degrade = self.degrade
        if degrade is None:
            return None
        after = None if degrade.after is None else float(degrade.after)  # type: ignore[arg-type]
        if self.deadline is not None and after is not None and after >= self.deadline:
            raise ValueError(
                f"LLM.degrade.after ({after:g}s) must be shorter than LLM.deadline "
                f"({self.deadline:g}s)"
            )
        return Fallback(
            Reroute(self._degraded_path), after=after, on=degrade.on, predict=self._predicted
        )

    def _predicted(self, call: Call) -> float | None:
        """The primary's predicted time to answer ``call``: its target's recent median
        duration (to the last chunk, for a stream), once it has enough samples."""
        return _median(self._recorder.latency.get(call.target.key))

    def _hedge_of_targets(self) -> Hedge | None:
        """The hedge, sending its backups to the next targets with ``target="next"``."""
        hedge, routes = self.hedge, self._routes
        if hedge is None or hedge.target != "next":
            return hedge
        return hedge.with_rewrite(
            lambda call, i: call if i == 0 else routes[i % len(routes)].call(call)
        )

    def _target_breakers(
        self, breaker: Mapping[str, Any] | Callable[[str], Breaker] | None
    ) -> _TargetBreakers | None:
        """Each target's breaker (the fleet's with ``shared``), built now: invalid options
        fail at construction, naming the field."""
        if breaker is None:
            return None
        if isinstance(breaker, Mapping) and self.shared is not None:
            breaker = {"shared": self.shared, **breaker}
        breakers = _TargetBreakers(breaker)
        for target in self.targets:
            breakers.of(target.key)
        return breakers

    def _policies(
        self,
        failover_on: ErrorFilter | None,
        retry: Retry | None,
        breaker: Mapping[str, Any] | Callable[[str], Breaker] | None,
    ) -> list[Policy]:
        """The pipeline's policies, outermost first: the same objects the decorators use."""
        breakers = self._breakers = self._target_breakers(breaker)
        deadline = None if self.deadline is None else Deadline(self.deadline)
        outer = (deadline, self._fallback(), self._hedge_of_targets(), breakers)
        policies: list[Policy] = [policy for policy in outer if policy is not None]
        if retry is not None:
            policies.append(retry)
        if len(self.targets) > 1:
            is_open = None if breakers is None else breakers.is_open
            policies.append(
                Failover(*self._routes, on=failover_on, passthrough=True, is_open=is_open)
            )
        self._governor = self._concurrency = None
        if self._arguments["governor"]:
            from .policies.concurrency import AdaptiveConcurrency
            from .policies.governor import Governor

            policies.append(governor := Governor(shared=self.shared))
            policies.append(concurrency := AdaptiveConcurrency(shared=self.shared))
            self._governor, self._concurrency = governor, concurrency
        policies += [self._guard, ConnectionSlots(self._recorder)]
        return policies

    @functools.cached_property
    def _guard(self) -> StreamGuard:
        """``stream_guard`` for this LLM's calls: a broken stream goes on from its targets, and
        an answer cut at its cap raises (``on_truncated``)."""
        return self.stream_guard.bound(
            self.targets,
            lambda target: functools.partial(self._open, target),
            lambda call, trace: self._per_target.run_within(call, trace, reason="resume"),
            raise_truncated=self.max_output_tokens is not None and self.on_truncated == "raise",
            recorder=self._recorder,  # the limits left unset are learned from its windows
        )

    @functools.cached_property
    def _transports(self) -> dict[str, Transport]:
        """The lanes, by the name a target gives (``Target.transport``)."""
        # The fast lane's module (httpx, msgspec: ~60 ms) loads with the first LLM, not with
        # ``import latencykit``.
        from ._openai import OpenAITransport

        secrets = self._secrets
        keepalive = per_host("openai")  # the fast lane keeps as many connections alive
        return {"litellm": LitellmTransport(secrets), "openai": OpenAITransport(secrets, keepalive)}

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | LLMConfig,
        *,
        env_prefix: str | None = None,
    ) -> LLM:
        """An ``LLM`` from its configuration: a mapping, a ``.yaml``/``.yml``/``.json`` file or
        an :class:`~latencykit.config.LLMConfig`, with the environment variables starting with
        ``env_prefix`` on top (default ``None``: none; ``"LATENCYKIT_"`` is the usual one,
        ``LATENCYKIT_HEDGE__MAX_EXTRA_LOAD=0.05``). See :mod:`latencykit.config`.

        Unknown keys and wrong types raise ``pydantic.ValidationError`` naming the file, the
        field's path and its line (or environment variable); an unreadable file raises
        ``ValueError`` naming the file and the line.
        """
        from .config import _from_config

        return _from_config(source, env_prefix=env_prefix)

    async def aclose(self) -> None:
        """Close the HTTP connections this ``LLM`` opened on this event loop (its fast-lane
        targets' pool). A later call opens new ones. litellm's own clients (the litellm lane)
        are litellm's, shared by every caller in the process, and are left open.

        ``async with lk.LLM(...) as llm:`` closes them at the end of the block. The sync
        calls' event loop thread, if started, is closed too (see :meth:`close`)."""
        if self.autopilot is not None:
            await self.autopilot.aclose()
        await _close_all(self._transports)
        if "_sync_loop" in self.__dict__:
            import anyio

            await anyio.to_thread.run_sync(self.close)

    async def __aenter__(self) -> LLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def to_config(self) -> dict[str, Any]:
        """This ``LLM``'s configuration, as plain data :meth:`from_config` takes back (options
        left at their defaults are left out). A secret never appears: a key read from a
        variable is written as that variable's name (``api_key_env``).

        Raises ``ValueError`` naming the first option that is code (a predicate, a router
        function, a policy object built in code) and so has no config form, or that holds a
        secret with no variable to name (see :meth:`~latencykit.config.LLMConfig.of`).
        """
        from .config import LLMConfig

        return LLMConfig.of(self).model_dump(mode="json", exclude_defaults=True)

    def __repr__(self) -> str:
        return (
            f"LLM({self.model!r}, deadline={self.deadline}, degrade={self.degrade!r}, "
            f"hedge={self.hedge!r}, failover={[t.key for t in self.targets[1:]]}, "
            f"timeout={self.timeout:g})"
        )

    @property
    def pipeline(self) -> Pipeline:
        """The policies every call runs through, outermost first."""
        return self._pipeline

    def stats(self) -> StatsTable:
        """Per-target statistics of this LLM's attempts, now: a
        :class:`~latencykit.stats.StatsTable` of :class:`~latencykit.stats.TargetStats` by
        target key (``print()`` it for a table).

        Targets come in failover order, then the degraded path's, then any other recorded
        (a call's ``model=``). Each has its attempts by outcome and error kind (totals since
        this ``LLM`` was built), the p50/p95/p99 of its attempt latency and, for streams, of
        its time to first content chunk over the last 60 s (an adaptive hedge's ``window``:
        the windows the hedge reads), its breaker state (with ``breaker=``) and the hedge
        budget's balance (with ``hedge=``), and how long attempts waited for a connection
        (``connection_wait``: not in their latency) and how many wait now (``waiting``; see
        docs/concepts.md). Read it on the event loop that makes the calls.
        """
        keys = [t.key for t in self.targets]
        if self._degraded is not None:
            keys.append(self._degraded.key)
        now_waiting = waiting()
        queued = {
            t.key: now_waiting.get(host_of(t), 0) for t in (*self.targets, self._degraded) if t
        }
        table = self._recorder.stats(
            keys,
            breaker=None if self._breakers is None else self._breakers.state_of,
            hedge_budget=None if self.hedge is None else self.hedge.budget.balance,
            waiting=lambda key: queued.get(key, 0),
        )
        table = self._guard.with_learned(table)
        if self.autopilot is not None:
            table = self.autopilot.with_settings(table)
        if self._governor is None or self._concurrency is None:
            return table
        table = self._governor.with_rooms(table, (*self.targets, self._degraded))
        return self._concurrency.with_concurrency(table)

    async def warm(
        self,
        *,
        connect: bool = True,
        timeout: float | datetime.timedelta = 10.0,
        raise_errors: bool = False,
    ) -> dict[str, float | Exception]:
        """Do now, for every target (failover targets and the degraded path's too), what a
        process's first call to it would do before sending its request, so that first calls
        are fast; call it at start-up, on the event loop that makes the calls.

        - A litellm target: litellm's first-call work for its model (measured 0.2-0.9 s: its
          provider's configuration and response types, the tokenizer it counts with), run
          through a mock answer: no request is sent, and none of your litellm callbacks sees
          it. Then (``connect``) litellm's HTTP client for the target's key, base and timeout
          is built and a keep-alive connection opened in it, where litellm sends through its
          OpenAI client (provider ``openai``: OpenAI and OpenAI-compatible ``api_base`` s);
          for other providers the first call still makes its own connection. On trio this
          happens in the asyncio bridge's loop, where litellm runs.
        - A fast-lane target (``transport="openai"``): the event loop's shared HTTP client is
          built (~0.1 s, once per loop), then (``connect``) a connection opened.

        A connection is opened with ``GET {api_base}/models`` with the target's key (no
        completion: no tokens), whatever its status. Warming again redoes only that.
        Without ``warm()``, the first streaming attempt of a process to a model does the
        set-up itself, before its first-token clock starts (so ``StreamGuard.first_token`` and
        the hedge's statistics do not count it; the call's deadline does).

        Args:
            connect: also open a connection to each target (default ``True``).
            timeout: seconds a target's connection may take (default ``10``).
            raise_errors: raise the first target's error, in target order (default ``False``:
                errors are returned).

        Returns:
            By target key, in failover order then the degraded path's: the seconds its
            warm-up took, or the :class:`~latencykit.ProviderError` it failed with (an
            unreachable host: refused, timed out), keys scrubbed. An unreachable target does
            not raise unless ``raise_errors``.
        """
        limit = _validation.seconds("LLM.warm(timeout)", timeout)
        targets = {t.key: t for t in self.targets}
        if self._degraded is not None:
            targets.setdefault(self._degraded.key, self._degraded)
        done: dict[str, float | Exception] = {}

        async def warm_one(target: Target) -> None:
            started = now()
            try:
                transport = self._transports[target.transport]
                await transport.warm(target, connect=connect, limit=limit)
            except Exception as exc:
                done[target.key] = provider_error(exc, target=target.key, secrets=self._secrets)
            else:
                done[target.key] = now() - started

        import anyio

        async with anyio.create_task_group() as group:
            for target in targets.values():
                group.start_soon(warm_one, target)
        found = {key: done[key] for key in targets}
        if raise_errors:
            for outcome in found.values():
                if isinstance(outcome, Exception):
                    raise outcome
        return found

    async def acompletion(self, **kwargs: Any) -> Any:
        """Run ``litellm.acompletion(**kwargs)`` through the policies.

        ``kwargs`` are litellm's (``messages``, ``temperature``, ``stream``,
        ``stream_options``, ...); ``model`` defaults to the LLM's model (and is refused with
        failover targets). ``max_retries``, ``timeout``, ``api_key`` and ``api_base`` are
        refused with a ``ValueError`` saying why. latencykit's own: ``task=`` (a tag for the
        router), ``priority=`` (the call's lane: ``"interactive"``, ``"default"`` or
        ``"batch"``, highest first; default ``"default"``; under a tight quota or concurrency
        limit lower lanes wait or are shed first).

        Returns litellm's ``ModelResponse`` (from a fast-lane target, a
        :class:`~latencykit.chunks.Response` that reads like it; see :func:`to_model_response`),
        or with ``stream=True`` a :class:`~latencykit.Stream` of litellm's chunk objects (the
        fast lane's: :class:`~latencykit.chunks.Chunk`), returned once the first content
        chunk arrived (use ``async with`` / ``async for``; ``aclose()`` closes the HTTP
        response). :func:`report` tells how either was obtained. Failures raise a
        :class:`~latencykit.ProviderError` subclass (litellm's exception is its ``__cause__``),
        :class:`~latencykit.DeadlineExceeded` or :class:`~latencykit.FallbackFailed`, all
        carrying the attempt history; a stream that breaks after its first chunk raises
        :class:`~latencykit.StreamBroken` with the partial text.
        """
        target, stream, task, priority = self._own_arguments(kwargs)
        arguments = {**self._defaults, **kwargs}
        call = Call(
            self._attempt_on(target, stream),
            (),
            arguments,
            target,
            self._guard if stream else None,
            self._recorder,  # every attempt of the call reports to it: stats() and the hedge
        )
        if task is None and priority is None:
            result, trace = await self._pipeline.run_traced(call)
        else:
            tagged = task_var.set(task), priority_var.set(priority or "default")
            try:
                result, trace = await self._pipeline.run_traced(call)
            finally:
                task_var.reset(tagged[0])
                priority_var.reset(tagged[1])
        if stream:
            return result
        hidden = hidden_params(result)
        # The report is built on demand by report(): most callers never ask for it.
        hidden[_REPORT_KEY] = _Answered(trace, *hidden.pop(_ATTEMPT_KEY, (0, "")))
        if self.max_output_tokens is not None and self.on_truncated == "raise":
            self._check_truncation(result, arguments)
        return result

    async def aembedding(self, **kwargs: Any) -> Any:
        """Run ``litellm.aembedding(**kwargs)`` through the same policies as
        :meth:`acompletion`: deadline, cache, router, hedge, failover, breaker, limiter, retry
        (not the degraded path: an ``LLM`` with ``degrade=`` raises ``ValueError`` here).

        ``kwargs`` are litellm's (``input``: a string or a list of them, ``dimensions``,
        ``encoding_format``, ``user``, ...), refused as :meth:`acompletion` refuses them, plus
        ``task=`` and ``priority=``; ``LLM(defaults=...)`` (chat arguments) do not apply, and
        ``stream=True`` is refused. With failover targets, every target must declare the same
        :attr:`~latencykit.Target.dimensions` (vectors of another length are useless to the
        index they go to): otherwise ``ValueError``, at the first ``aembedding`` call. An
        answer whose vectors are not of the declared (or the call's ``dimensions=``) length
        is a :class:`~latencykit.ProviderUnavailable` of that target.

        Returns litellm's ``EmbeddingResponse`` (from a fast-lane target, ``POST
        {api_base}/embeddings``, a :class:`~latencykit.chunks.EmbeddingResponse` that reads
        like it: ``response.data[0].embedding``, ``response.usage``, ``response.model``);
        :func:`report` reads either. Failures raise as :meth:`acompletion`'s do.
        """
        target, stream, task, priority = self._own_arguments(kwargs, "aembedding")
        if stream:
            raise ValueError("aembedding(stream=...) is not accepted: embeddings do not stream")
        if self.degrade is not None:
            raise ValueError(
                "aembedding() is not accepted on an LLM with degrade=...: a degraded model "
                "embeds into other vectors; use an LLM without it"
            )
        self._check_dimensions()
        embed = functools.partial(self._embed, target)
        call = Call(embed, (), kwargs, target, None, self._recorder)
        result, trace = await self._run(call, task, priority, "embeddings", self._pipeline)
        hidden = hidden_params(result)
        hidden[_REPORT_KEY] = _Answered(trace, *hidden.pop(_ATTEMPT_KEY, (0, "")))
        return result

    async def aresponses(self, **kwargs: Any) -> Any:
        """Run ``litellm.aresponses(**kwargs)`` (OpenAI's Responses API) through the same
        policies as :meth:`acompletion`: deadline, router, hedge (on the first output text,
        for a stream), failover, breaker, limiter, retry, the stream guard (not the degraded
        path: an ``LLM`` with ``degrade=`` raises ``ValueError`` here; nor the response cache,
        which stores chat and embedding answers: with ``cache=``, Responses calls pass it by).

        ``kwargs`` are litellm's (``input``, ``instructions``, ``max_output_tokens``,
        ``tools``, ``stream``, ...), refused as :meth:`acompletion` refuses them, plus
        ``task=`` and ``priority=``; ``LLM(defaults=...)`` (chat arguments) do not apply.
        Every target must be on the litellm lane (``ValueError`` otherwise: the fast lane
        speaks chat completions and embeddings).

        An answer is complete only when the provider says so: returns litellm's
        ``ResponsesAPIResponse`` whose ``status`` is ``"completed"``, or with ``stream=True`` a
        :class:`~latencykit.Stream` of litellm's typed events, returned once the first output
        text arrived and complete only with its ``response.completed`` event (events that
        stop before it raise :class:`~latencykit.StreamBroken`, ``reason="cut"``). An answer
        stopped at ``max_output_tokens`` raises :class:`~latencykit.errors.OutputTruncated`
        (with the text so far), one stopped by the content filter
        :class:`~latencykit.ContentPolicyViolation`, a failed one (``response.failed``, an
        ``error`` event) the :class:`~latencykit.ProviderError` its error says. :func:`report`
        reads either result.
        """
        target, stream, task, priority = self._own_arguments(kwargs, "aresponses")
        if self.degrade is not None:
            raise ValueError(
                "aresponses() is not accepted on an LLM with degrade=...: the degraded path "
                "rewrites chat calls; use an LLM without it"
            )
        lanes = sorted({t.transport for t in self.targets} - {"litellm"})
        if lanes:
            raise ValueError(
                f"aresponses() goes through litellm: targets on transport={lanes[0]!r} speak "
                "chat completions and embeddings only; give them transport='litellm'"
            )
        respond = functools.partial(self._open_events if stream else self._respond, target)
        guard = self._guard if stream else None
        call = Call(respond, (), kwargs, target, guard, self._recorder)
        result, trace = await self._run(call, task, priority, "chat", self._uncached)
        if stream:
            return result
        hidden = hidden_params(result)
        hidden[_REPORT_KEY] = _Answered(trace, *hidden.pop(_ATTEMPT_KEY, (0, "")))
        return result

    async def _run(
        self,
        call: Call,
        task: str | None,
        priority: Priority | None,
        operation: str,
        pipeline: Pipeline,
    ) -> tuple[Any, Trace]:
        """Run ``call`` through ``pipeline`` with its tags set: the router's task, its lane,
        what telemetry calls the operation (``gen_ai.operation.name``)."""
        tagged = operation_var.set(operation), task_var.set(task)
        lane = priority_var.set(priority or "default")
        try:
            return await pipeline.run_traced(call)
        finally:
            priority_var.reset(lane)
            task_var.reset(tagged[1])
            operation_var.reset(tagged[0])

    async def _respond(self, target: Target, **kwargs: Any) -> Any:
        """One Responses API attempt on ``target``: a complete answer (see :meth:`aresponses`)."""
        from . import _responses

        response = await _responses.respond(target, kwargs, self._secrets)
        hidden_params(response)[_ATTEMPT_KEY] = (current_attempt(), target.key)
        return response

    def _open_events(self, target: Target, **kwargs: Any) -> ChunkSource:
        """A streaming Responses API attempt's source, opened on its first read."""
        from . import _responses

        return _responses.open_events(target, kwargs, self._secrets)  # type: ignore[no-any-return]

    def completion(self, **kwargs: Any) -> Any:
        """:meth:`acompletion` from sync code (a script, a Django view, a notebook cell without
        a loop), with the same arguments, policies and results, run on this ``LLM``'s own
        event loop: one asyncio loop in a daemon thread, started by the first sync call and
        kept (its connections serve every later sync call) until :meth:`close`. A deadline
        still closes the HTTP request. Any number of threads may call at once.

        With ``stream=True``, returns a :class:`~latencykit.llm.SyncStream`: iterate it
        (``for chunk in stream``) and ``close()`` it (or ``with``). Called from a thread that
        runs an event loop, raises ``RuntimeError`` (it would block that loop): await
        :meth:`acompletion` there.
        """
        loop = self._loop_thread()
        result = loop.run(functools.partial(self.acompletion, **kwargs), "completion")
        return SyncStream(result, loop.portal()) if isinstance(result, Stream) else result

    def embedding(self, **kwargs: Any) -> Any:
        """:meth:`aembedding` from sync code, on this ``LLM``'s own event loop thread (see
        :meth:`completion`)."""
        return self._loop_thread().run(functools.partial(self.aembedding, **kwargs), "embedding")

    def responses(self, **kwargs: Any) -> Any:
        """:meth:`aresponses` from sync code, on this ``LLM``'s own event loop thread (see
        :meth:`completion`; ``stream=True`` returns a :class:`~latencykit.llm.SyncStream`)."""
        loop = self._loop_thread()
        result = loop.run(functools.partial(self.aresponses, **kwargs), "responses")
        return SyncStream(result, loop.portal()) if isinstance(result, Stream) else result

    def close(self) -> None:
        """Close what the sync calls opened: the connections of this ``LLM``'s event loop
        thread, then the loop and its thread (calls still running there are cancelled). A
        later sync call starts a new one. Idempotent; also done by :meth:`aclose`, when the
        ``LLM`` is collected, and at interpreter exit (each wait bounded by a few seconds)."""
        loop = self.__dict__.get("_sync_loop")
        if loop is not None:
            loop.stop()

    def _loop_thread(self) -> LoopThread:
        """Where the sync calls run (its loop started by the first), closing the transports'
        connections on it when it stops: one per ``LLM``, even when several threads make
        their first sync call at once (``setdefault`` is atomic)."""
        found: LoopThread | None = self.__dict__.get("_sync_loop")
        if found is None:
            close = functools.partial(_close_all, self._transports)  # not self: see LoopThread
            found = self.__dict__.setdefault("_sync_loop", LoopThread(close))
        return found

    def _check_dimensions(self) -> None:
        """``ValueError`` unless every target declares the same
        :attr:`~latencykit.Target.dimensions` (a lone target need not declare any)."""
        declared = {t.key: t.dimensions for t in self.targets}
        found = set(declared.values())
        if len(declared) > 1 and (None in found or len(found) > 1):
            raise ValueError(
                "aembedding() fails over only between targets of the same dimensions: give "
                f"every target the same Target(dimensions=...), got {declared}"
            )

    async def _embed(self, target: Target, **kwargs: Any) -> Any:
        """One embedding attempt on ``target``; its vectors checked against the dimensions."""
        try:
            response = await self._transports[target.transport].embed(target, kwargs)
        except Exception as exc:
            raise provider_error(exc, target=target.key, secrets=self._secrets) from exc
        data = response.data or ()
        if not data:
            raw = response.model_dump_json()
            raise malformed_answer("has no embeddings", raw, target=target.key)
        expected = kwargs.get("dimensions") or target.dimensions
        for item in data if expected is not None else ():
            vector = item["embedding"] if isinstance(item, Mapping) else item.embedding
            if isinstance(vector, list) and len(vector) != expected:
                raise malformed_answer(
                    f"has vectors of {len(vector)} dimensions, not {expected}",
                    "",
                    target=target.key,
                )
        hidden_params(response)[_ATTEMPT_KEY] = (current_attempt(), target.key)
        return response

    def _own_arguments(
        self, kwargs: dict[str, Any], where: str = "acompletion"
    ) -> tuple[Target, bool, str | None, Priority | None]:
        """Take latencykit's own arguments out of ``kwargs``: the call's first target, whether
        it streams, its task tag, its lane; refuse the arguments it owns. ``where``: the
        method, for the messages."""
        for name in (kwargs.keys() & _RESERVED.keys()) or (kwargs.keys() & _TARGET_OWNED.keys()):
            raise ValueError(
                f"{where}({name}=...) is not accepted: "
                + (_RESERVED.get(name) or _TARGET_OWNED[name])
            )
        target = self.targets[0]
        if "model" in kwargs:
            if len(self.targets) > 1:
                raise ValueError(f"{where}(model=...) is not accepted with failover targets")
            target = target.replace(model=kwargs.pop("model"))
        stream = kwargs.pop("stream", False)
        if not isinstance(stream, bool):
            raise TypeError(f"{where}(stream=...) must be a bool, got {stream!r}")
        task = kwargs.pop("task", None)
        if task is not None and self.router is None:
            raise ValueError(f"{where}(task=...) is for a router: pass LLM(router=...)")
        priority = kwargs.pop("priority", None)
        if priority is not None and priority not in PRIORITIES:
            raise ValueError(
                f"{where}(priority=...) must be one of {', '.join(PRIORITIES)}, got {priority!r}"
            )
        return target, stream, task, priority

    def _check_truncation(self, response: Any, arguments: Mapping[str, Any]) -> None:
        choices: list[Any] = list(getattr(response, "choices", None) or ())
        if not any(getattr(c, "finish_reason", None) == "length" for c in choices):
            return
        cap = hidden_params(response).get(_CAP_KEY)
        asked = [self.max_output_tokens, arguments.get("max_tokens")]
        message = getattr(choices[0], "message", None)
        raise OutputTruncated(
            response,
            str(getattr(message, "content", "") or ""),
            max_tokens=cap,
            budget_capped=cap is not None and cap < min(int(a) for a in asked if a is not None),
        )

    def _cap(self, target: Target, kwargs: dict[str, Any], streaming: bool) -> int:
        """Set the attempt's output cap in ``kwargs`` (see ``max_output_tokens``); returns it."""
        assert self.max_output_tokens is not None
        name = "max_completion_tokens" if "max_completion_tokens" in kwargs else "max_tokens"
        own = kwargs.get(name)
        cap = self.max_output_tokens if own is None else min(int(own), self.max_output_tokens)
        left = remaining()
        if (
            self.budget_aware
            and left is not None
            and (per_token := _median(self._recorder.per_token.get(target.key))) is not None
        ):
            first = _median(self._recorder.ttft.get(target.key)) if streaming else None
            tokens = (left - (first or 0.0)) * _CAP_HEADROOM / max(per_token, 1e-6)
            cap = max(1, min(cap, int(tokens)))
        kwargs[name] = cap
        return cap

    def _attempt_on(self, target: Target, streaming: bool) -> Callable[..., Any]:
        return functools.partial(self._open if streaming else self._attempt, target)

    def _to_target(self, target: Target, call: Call) -> Call:
        if call.target is target:  # on it already (its attempt function is the target's)
            return call
        fn = call.fn
        if isinstance(fn, functools.partial):  # the same kind of attempt, on another target
            return call._replace(fn=functools.partial(fn.func, target), target=target)
        return call._replace(fn=self._attempt_on(target, call.stream is not None), target=target)

    def _open(self, target: Target, **kwargs: Any) -> Any:
        """A streaming attempt's source, from the target's transport, opened on its first read.

        The first attempt of the process to a model (litellm) or on the event loop (fast lane)
        first does the client's one-time set-up (see :meth:`warm`), and its source says when
        it was done (``ready_at``): the set-up is not counted in the provider's first-token
        time (``StreamGuard.first_token``, ``Stream.ttft``, the hedge's statistics).
        """
        if self.max_output_tokens is not None:
            self._cap(target, kwargs, streaming=True)
        return self._transports[target.transport].open(target, kwargs)

    async def _attempt(self, target: Target, **kwargs: Any) -> Any:
        cap = None if self.max_output_tokens is None else self._cap(target, kwargs, False)
        started = 0.0 if cap is None else clock()
        transport = self._transports[target.transport]
        try:
            response = await transport.complete(target, kwargs)
        except Exception as exc:
            raise provider_error(exc, target=target.key, secrets=self._secrets) from exc
        if not response.choices:  # litellm takes an answer with no choices for one
            raise malformed_answer("has no choices", response.model_dump_json(), target=target.key)
        hidden = hidden_params(response)
        hidden[_ATTEMPT_KEY] = (current_attempt(), target.key)
        if cap is not None:
            hidden[_CAP_KEY] = cap
            usage = getattr(response, "usage", None)
            tokens = getattr(usage, "completion_tokens", None)
            if isinstance(tokens, int):
                self._recorder.output_rate(target.key, clock() - started, tokens)
        return response

    async def _degraded_path(self, reason: FallbackReason, call: Call, next: Next) -> Any:
        assert self.degrade is not None and self._degraded is not None
        target = self._degraded
        return await next(
            call._replace(
                fn=self._attempt_on(target, call.stream is not None),
                kwargs=self.degrade.rewrite(call.kwargs),
                target=target,
            )
        )


async def _close_all(transports: Mapping[str, Transport]) -> None:
    """Close the connections ``transports`` opened on this event loop."""
    for transport in transports.values():
        await transport.aclose()


def _median(window: Any) -> float | None:
    """A latency window's median once it has enough samples to cap by, else ``None``."""
    if window is None:
        return None
    found = window.quantiles(0.5)  # drops the expired samples: len() counts the others
    return found[0] if found and len(window) >= _CAP_MIN_SAMPLES else None


# What a typo is checked against: the chat parameters and a target's own fields.
_KNOWN = CHAT_PARAMETERS | {f.name for f in dataclasses.fields(Target) if f.init} | {"api_base"}


def _import_litellm_if_needed(targets: Sequence[Target | None], router: object) -> None:
    """Import litellm now (seconds, once per process) rather than inside the first call, where
    the import would block the event loop and no deadline could preempt it: when a target takes
    the litellm lane, or for a :class:`~latencykit.routing.Router` (it counts tokens and reads
    model capabilities with litellm). An LLM whose targets are all on the fast lane never
    loads it; if the application did, its one-time set-up is done all the same (the heap
    frozen: see :func:`latencykit._litellm.litellm`)."""
    if (
        "litellm" in sys.modules
        or isinstance(router, Router)
        or any(t and t.transport == "litellm" for t in targets)
    ):
        litellm()


def _check_spelling(arguments: Mapping[str, Any], where: str, *, error: bool) -> None:
    """Reject (``error``) or warn about a key that looks like a misspelt known argument.

    litellm passes unknown arguments to the provider (``vertex_project``, ``extra_body``...), so
    an unknown name is allowed unless it is a near miss of a known one (``temprature``).
    """
    for name in arguments:
        if name in _KNOWN:
            continue
        import difflib  # here: most calls name only known arguments

        close = difflib.get_close_matches(name, _KNOWN, n=1, cutoff=0.8)
        if not close:
            continue
        message = f"{where}: unknown argument {name!r}; did you mean {close[0]!r}?"
        if error:
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=4)  # the LLM(...) line


# --- checking and assembling LLM's options ---------------------------------------------------

# The options that take a latencykit object: its class, and how a message names it.
_OPTION_KINDS: dict[str, tuple[type, str]] = {
    "degrade": (Degrade, "a latencykit.Degrade"),
    "hedge": (Hedge, "a latencykit.Hedge"),
    "retry": (Retry, "a latencykit.Retry"),
    "stream_guard": (StreamGuard, "a latencykit.StreamGuard"),
    "limiter": (Policy, "a latencykit policy"),
    "cache": (Policy, "a latencykit policy"),
    "shared": (SharedStore, "a SharedStore (RedisStore)"),
}


def _check_options(options: Mapping[str, Any]) -> None:
    """Check ``LLM``'s options one by one (each message names the field), then together."""
    _validation.text("LLM.model", options["model"], "model string")
    for name, (kind, what) in _OPTION_KINDS.items():
        _validation.optional(f"LLM.{name}", options[name], kind, what)
    failover = options["failover"]
    if isinstance(failover, (str, Mapping)) or not isinstance(failover, Sequence):
        raise TypeError("LLM.failover must be a sequence of targets, e.g. ['openai/x']")
    if options["max_output_tokens"] is not None:
        _validation.count("LLM.max_output_tokens", options["max_output_tokens"])
    _validation.choice("LLM.on_truncated", options["on_truncated"], ("raise", "accept"))
    _check_together(options)


def _check_together(options: Mapping[str, Any]) -> None:
    """The options that need another one."""
    hedge = options["hedge"]
    if hedge is not None and hedge.target == "next" and not options["failover"]:
        raise ValueError("LLM.hedge.target='next' needs LLM(failover=[...]) targets")
    if options["budget_aware"] and options["max_output_tokens"] is None:
        raise ValueError("LLM.budget_aware needs LLM.max_output_tokens (the cap it lowers)")
    if options["failover_on"] is not None and not options["failover"]:
        raise ValueError(
            "LLM.failover_on needs LLM(failover=[...]) targets: without them no error "
            "moves a call anywhere"
        )


def _checked_defaults(
    defaults: Mapping[str, Any] | None, failover: Sequence[str | Mapping[str, Any] | Target]
) -> dict[str, Any]:
    """``LLM.defaults`` as a dict, refusing what latencykit or a target owns, after checking
    the spelling of the failover targets' dicts (an error) and of the defaults (a warning)."""
    found = dict(defaults or {})
    for name in sorted(found.keys() & {*_RESERVED, *_TARGET_OWNED, "model", "stream"}):
        raise ValueError(
            f"LLM.defaults cannot set {name!r}: "
            + (
                "pass stream=True to acompletion() for the calls that stream"
                if name == "stream"
                else _RESERVED.get(name) or _TARGET_OWNED.get(name) or "pass LLM(model=...)"
            )
        )
    for index, spec in enumerate(failover):
        if isinstance(spec, Mapping):
            _check_spelling(spec, f"LLM.failover[{index}]", error=True)
    _check_spelling(found, "LLM.defaults", error=False)
    return found


def _hedge_for_slo(slo: SLO | None, hedge: Hedge | None) -> tuple[Hedge | None, bool]:
    """The LLM's hedge, and whether the SLO autopilot made it: with ``slo`` and no hedge, a
    quantile hedge within the SLO's extra-load budget, off until the autopilot turns it on."""
    if slo is None:
        return hedge, False
    from .autopilot import SLO

    _validation.optional("LLM.slo", slo, SLO, "a latencykit.SLO")
    if hedge is not None:
        return hedge, False
    return Hedge(Quantile(0.99), max_extra_load=slo.max_extra_load), True


def _recorder_for(hedge: Hedge | None, shared: SharedStore | None) -> Recorder:
    """The LLM's record of every attempt: windows as long as an adaptive hedge asks (default
    60 s, 1000 samples)."""
    adaptive = hedge.delay if hedge is not None and isinstance(hedge.delay, Quantile) else None
    if adaptive is None:
        return Recorder(shared=shared)
    return Recorder(window=adaptive.window, max_samples=adaptive.max_samples, shared=shared)


def _targets(
    primary: Target, failover: Sequence[str | Mapping[str, Any] | Target], timeout: float
) -> tuple[Target, ...]:
    """The primary, then the failover targets, each with a concrete attempt timeout (litellm's
    client cache and the stream guard's defaults both need one), their names distinct."""
    targets = tuple(
        t if t.timeout is not None else t.replace(timeout=timeout)
        for t in (
            primary,
            *(as_target(t, where=f"LLM.failover[{i}]") for i, t in enumerate(failover)),
        )
    )
    keys = [t.key for t in targets]
    if len(set(keys)) != len(keys):
        raise ValueError(f"LLM targets must have distinct names, got {keys}")
    return targets


def _secrets_of(targets: Sequence[Target], degrade: Degrade | None) -> tuple[str, ...]:
    """The keys an error message must never show."""
    found = tuple(t.api_key for t in targets if t.api_key)
    if degrade is not None and isinstance(degrade.overrides.get("api_key"), str):
        found += (degrade.overrides["api_key"],)
    return found


class _TargetBreakers:
    """Stage ``BREAKER`` in ``LLM``: each call goes through its own target's breaker."""

    stage = Stage.BREAKER

    def __init__(self, spec: Mapping[str, Any] | Callable[[str], Breaker]) -> None:
        if isinstance(spec, Mapping):
            options = dict(spec)
            self._make: Callable[[str], Breaker] = lambda key: breaker_for(key, **options)
        elif callable(spec):
            self._make = spec
        else:
            raise TypeError(
                f"LLM.breaker must be a dict of breaker options or a function, got {spec!r}"
            )
        self._by_target: dict[str, Breaker] = {}

    def of(self, target: str) -> Breaker:
        found = self._by_target.get(target)
        if found is None:
            found = self._by_target[target] = self._make(target)
            if not isinstance(found, Breaker):
                raise TypeError(f"LLM.breaker({target!r}) must return a Breaker, got {found!r}")
        return found

    def is_open(self, target: str) -> bool:
        return not (self._by_target.get(target) or self.of(target)).allows()

    def state_of(self, target: str) -> BreakerState | None:
        """The state of ``target``'s breaker, or ``None`` if it has none yet (asking does not
        make one: the registry is process-wide)."""
        found = self._by_target.get(target)
        return None if found is None else found.state

    def handle(self, call: Call, next: Next) -> Awaitable[Any]:
        key = call.target.key
        return (self._by_target.get(key) or self.of(key)).handle(call, next)  # no frame of its own
