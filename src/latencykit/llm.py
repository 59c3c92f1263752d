"""``LLM``: a resilient front for ``litellm.acompletion`` that keeps its call signature.

``await llm.acompletion(**litellm_kwargs)`` runs the policies around ``litellm.acompletion`` and
returns litellm's own ``ModelResponse``. :func:`report` reads, from any response it returned,
which target answered, after how many attempts, and whether the degraded path was used.

litellm facts this module is built on (measured, see docs/concepts.md): litellm is imported
lazily (it takes seconds); ``max_retries=0`` always (the OpenAI SDK would otherwise retry on its
own, tripling attempts); ``timeout`` is constant per target (litellm caches one HTTP client per
timeout value, so a per-call timeout would open a new connection every call), and deadlines are
enforced with cancel scopes instead.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import sniffio

from . import _validation
from ._context import Attempt, Trace, current_attempt
from .errors import ErrorFilter, provider_error
from .pipeline import Call, Next, Pipeline, Policy, Stage
from .policies.breaker import Breaker
from .policies.breaker import breaker as breaker_for
from .policies.deadline import Deadline
from .policies.failover import Failover, Route
from .policies.fallback import Fallback, FallbackReason
from .policies.hedge import Hedge
from .policies.retry import Retry
from .target import Target, as_target

if TYPE_CHECKING:
    from litellm import ModelResponse

__all__ = ["LLM", "CallReport", "Degrade", "report"]

_REPORT_KEY = "latencykit"
_ATTEMPT_KEY = "latencykit.attempt"
# Arguments latencykit owns: accepting them per call would defeat the policies.
_RESERVED = {
    "max_retries": "latencykit owns retries; litellm is always called with max_retries=0",
    "num_retries": "latencykit owns retries; litellm is always called with max_retries=0",
    "timeout": "the per-target timeout is LLM(timeout=...); bound the whole call with deadline=",
    "stream": "streaming is not supported by LLM yet (StreamGuard comes with the streaming work)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Degrade:
    """The degraded path of :class:`LLM`: the same call, rewritten to be cheaper and faster.

    Attributes:
        model: the model to answer from on the degraded path (default ``None``: same model).
        max_tokens: cap on the degraded answer's length (default ``None``: unchanged).
        after: seconds to give the primary before switching (default ``None``: switch on errors
            only). Must be shorter than ``LLM(deadline=...)``.
        on: which primary errors switch to the degraded path (default ``None``: transient
            errors; see :func:`~latencykit.fallback`).
        overrides: any other litellm arguments to set on the degraded call (default empty),
            e.g. ``{"api_base": ..., "temperature": 0}``.

    At least one of ``model``, ``max_tokens`` and ``overrides`` must be given.
    """

    model: str | None = None
    max_tokens: int | None = None
    after: float | datetime.timedelta | None = None
    on: ErrorFilter | None = None
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"Degrade.model must be a non-empty model string, got {self.model!r}")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise ValueError(f"Degrade.max_tokens must be a positive int, got {self.max_tokens!r}")
        if self.after is not None:
            object.__setattr__(self, "after", _validation.seconds("Degrade.after", self.after))
        if not isinstance(self.overrides, Mapping):
            raise TypeError(f"Degrade.overrides must be a mapping, got {self.overrides!r}")
        bad = sorted(set(self.overrides) & set(_RESERVED))
        if bad:
            raise ValueError(f"Degrade.overrides cannot set {bad[0]!r}: {_RESERVED[bad[0]]}")
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        if self.model is None and self.max_tokens is None and not self.overrides:
            raise ValueError("Degrade needs at least one of model, max_tokens or overrides")

    def rewrite(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The litellm arguments of the degraded call, from the primary's."""
        rewritten = {**kwargs, **self.overrides}
        if self.model is not None:
            rewritten["model"] = self.model
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
        target: the target (model string as called) of the attempt that answered.
        model: the model the response names (as the provider returned it).
        attempts: every attempt of the call, oldest first, including losers and failures.
        answered_by: the attempt that produced the response.
        degraded: whether the answer came from the degraded path (:class:`Degrade`).
        fallback_reason: ``"timeout"`` or ``"error"`` when degraded, else ``None``.
        duration: seconds from the start of the call to the answer.
    """

    target: str
    model: str
    attempts: tuple[Attempt, ...]
    answered_by: int
    degraded: bool
    fallback_reason: str | None
    duration: float


def report(response: object) -> CallReport:
    """The :class:`CallReport` of a response returned by :meth:`LLM.acompletion`.

    This is the one documented place where latencykit tells which target answered, after how
    many attempts, and whether the degraded path was used. (It lives in the response's
    ``_hidden_params["latencykit"]``, where litellm keeps its own per-response metadata.)

    Raises:
        LookupError: the response did not come from latencykit.
    """
    hidden = getattr(response, "_hidden_params", None)
    if not isinstance(hidden, dict):
        raise LookupError("this response did not come from latencykit.LLM.acompletion")
    found = hidden.get(_REPORT_KEY)
    if isinstance(found, CallReport):
        return found
    if not (isinstance(found, tuple) and len(found) == 3 and isinstance(found[0], Trace)):
        raise LookupError("this response did not come from latencykit.LLM.acompletion")
    trace, number, target = found
    built = CallReport(
        target=target,
        model=str(getattr(response, "model", "") or ""),
        attempts=tuple(trace.attempts),
        answered_by=number,
        degraded=trace.degraded,
        fallback_reason=trace.fallback_reason,
        duration=(trace.ended_at or time.monotonic()) - trace.started_at,
    )
    hidden[_REPORT_KEY] = built
    return built


class LLM:
    """A resilient front for ``litellm.acompletion``.

    Args:
        model: the primary target's litellm model string (``"openai/gpt-4o"``).
        deadline: total budget in seconds for each call, degraded path included
            (default ``None``: unbounded).
        degrade: the degraded path (default ``None``: none); see :class:`Degrade`.
        hedge: hedged requests (default ``None``: none), e.g.
            ``lk.Hedge(lk.quantile(0.9), max_extra_load=0.1)``; hedges go to the same target,
            or with ``target="next"`` to the next failover target. Its latency windows and
            budget are shared by every call of this ``LLM``.
        failover: further targets, in order, each a model string or a dict of litellm
            arguments (``model``, ``api_base``, ``api_key``, ``timeout``, plus latencykit's
            ``context_window`` and ``capabilities``) (default none). See
            :func:`~latencykit.failover` for what moves a call on.
        failover_on: which errors move a call to the next target (default ``None``: transient
            errors and context length, the latter only to a larger model). Content policy,
            authentication and bad requests are raised at once unless you widen this.
        retry: budgeted retries on the same target, e.g. ``lk.Retry(max_attempts=3)`` (default
            ``None``: no retry). They run inside failover, per target.
        breaker: a circuit breaker per target (default ``None``: none): a dict of
            :func:`~latencykit.breaker` options (``{"minimum_calls": 5, "open_duration": 10}``),
            or a function ``key -> Breaker``. Breakers are the process-wide ones of each
            target's name, so every ``LLM`` calling a target shares its breaker. Failover skips
            targets whose breaker is open.
        context_window: the primary model's context window in tokens (default ``None``:
            unknown); with the targets' ``context_window``, a context-length error goes only
            to a larger model.
        timeout: per-attempt timeout in seconds handed to litellm, constant so that litellm
            reuses its HTTP client and connections (default ``600``, litellm's own).
        api_base: the primary target's base URL (default ``None``: litellm's default for the
            provider).
        api_key: the primary target's API key (default ``None``: from the environment, as
            litellm does). Never logged, never put in events, errors or reprs.
        defaults: litellm arguments applied to every call unless the call sets them
            (default none), e.g. ``{"temperature": 0}``.

    Invalid options raise ``ValueError``/``TypeError`` naming the field at construction.
    Constructing the first ``LLM`` imports litellm (seconds, once per process): at start-up,
    not inside the first call, where the import would block the event loop.
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
        context_window: int | None = None,
        timeout: float | datetime.timedelta = 600.0,
        api_base: str | None = None,
        api_key: str | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"LLM.model must be a non-empty model string, got {model!r}")
        if degrade is not None and not isinstance(degrade, Degrade):
            raise TypeError(f"LLM.degrade must be a latencykit.Degrade, got {degrade!r}")
        if hedge is not None and not isinstance(hedge, Hedge):
            raise TypeError(f"LLM.hedge must be a latencykit.Hedge, got {hedge!r}")
        if isinstance(failover, (str, Mapping)):
            raise TypeError("LLM.failover must be a sequence of targets, e.g. ['openai/x']")
        if hedge is not None and hedge.target == "next" and not failover:
            raise ValueError("LLM.hedge.target='next' needs LLM(failover=[...]) targets")
        defaults = dict(defaults or {})
        for name in sorted(set(defaults) & (set(_RESERVED) | {"model", "api_key", "api_base"})):
            raise ValueError(f"LLM.defaults cannot set {name!r}: pass it as its own argument")
        self.model = model
        self.timeout = _validation.seconds("LLM.timeout", timeout)
        self.deadline = None if deadline is None else _validation.seconds("LLM.deadline", deadline)
        self.degrade = degrade
        self.hedge = hedge
        primary = Target(
            model,
            api_key=api_key,
            context_window=context_window,
            arguments={} if api_base is None else {"api_base": api_base},
        )
        self.targets: tuple[Target, ...] = (
            primary,
            *(as_target(t, where=f"LLM.failover[{i}]") for i, t in enumerate(failover)),
        )
        self._secrets = tuple(t.api_key for t in self.targets if t.api_key)
        self._defaults = defaults
        self._primary = primary.litellm_arguments(self.timeout)
        # Arguments that belong to a target: stripped before another target's are applied.
        self._target_keys = frozenset(
            {"model", "api_key", "api_base", "timeout"}.union(
                *(t.arguments.keys() for t in self.targets)
            )
        )
        policies: list[Policy] = []
        if self.deadline is not None:
            policies.append(Deadline(self.deadline))
        if degrade is not None:
            after = None if degrade.after is None else float(degrade.after)  # type: ignore[arg-type]
            if self.deadline is not None and after is not None and after >= self.deadline:
                raise ValueError(
                    f"LLM.degrade.after ({after:g}s) must be shorter than LLM.deadline "
                    f"({self.deadline:g}s)"
                )
            policies.append(Fallback(self._degraded_path, after=after, on=degrade.on))
        routes = [
            Route(t.name, functools.partial(self._to_target, t), t.context_window)
            for t in self.targets
        ]
        if hedge is not None:
            if hedge.target == "next":
                hedge = hedge.with_rewrite(
                    lambda call, i: call if i == 0 else routes[i % len(routes)].rewrite(call)
                )
            policies.append(hedge)
        breakers = _TargetBreakers(breaker) if breaker is not None else None
        if breakers is not None:
            for target in self.targets:
                breakers.of(target.name)  # invalid options fail now, naming the field
            policies.append(breakers)
        if retry is not None:
            if not isinstance(retry, Retry):
                raise TypeError(f"LLM.retry must be a latencykit.Retry, got {retry!r}")
            policies.append(retry)
        if len(self.targets) > 1:
            is_open = None if breakers is None else breakers.is_open
            policies.append(Failover(routes, on=failover_on, passthrough=True, is_open=is_open))
        self._pipeline = Pipeline(policies)
        # Import litellm now (seconds, once per process) rather than inside the first call,
        # where the import would block the event loop and no deadline could preempt it.
        self._litellm = _litellm()
        from ._asyncio_bridge import run_on_asyncio  # imports asyncio: only when needed

        self._run = run_on_asyncio

    def __repr__(self) -> str:
        return (
            f"LLM({self.model!r}, deadline={self.deadline}, degrade={self.degrade!r}, "
            f"hedge={self.hedge!r}, timeout={self.timeout:g})"
        )

    @property
    def pipeline(self) -> Pipeline:
        """The policies every call runs through, outermost first."""
        return self._pipeline

    async def acompletion(self, **kwargs: Any) -> ModelResponse:
        """Run ``litellm.acompletion(**kwargs)`` through the policies.

        ``kwargs`` are litellm's (``messages``, ``temperature``, ...); ``model`` defaults to the
        LLM's model. ``max_retries``, ``timeout`` and ``stream`` are refused with a
        ``ValueError`` saying why. Returns litellm's ``ModelResponse``; :func:`report` tells how
        it was obtained. Failures raise a :class:`~latencykit.ProviderError` subclass (litellm's
        exception is its ``__cause__``), :class:`~latencykit.DeadlineExceeded` or
        :class:`~latencykit.FallbackFailed`, all carrying the attempt history.
        """
        if not _RESERVED.keys().isdisjoint(kwargs):
            for name in sorted(_RESERVED.keys() & kwargs.keys()):
                if name != "stream" or kwargs[name]:
                    raise ValueError(f"acompletion({name}=...) is not accepted: {_RESERVED[name]}")
        if "model" in kwargs and len(self.targets) > 1:
            raise ValueError("acompletion(model=...) is not accepted with failover targets")
        arguments = {**self._defaults, **self._primary, **kwargs}
        call = Call(self._attempt, (), arguments, target=str(arguments["model"]))
        response, trace = await self._pipeline.run_traced(call)
        hidden = response._hidden_params
        # The report is built on demand by report(): most callers never ask for it.
        hidden[_REPORT_KEY] = (trace, *hidden.pop(_ATTEMPT_KEY, (0, "")))
        return response

    def _to_target(self, target: Target, call: Call) -> Call:
        kwargs = {k: v for k, v in call.kwargs.items() if k not in self._target_keys}
        kwargs.update(target.litellm_arguments(self.timeout))
        return call._replace(kwargs=kwargs, target=target.name)

    async def _attempt(self, **kwargs: Any) -> Any:
        try:
            coro = self._litellm.acompletion(**kwargs, max_retries=0)
            if sniffio.current_async_library() == "asyncio":
                response = await coro  # the common case, without the bridge's extra frame
            else:
                response = await self._run(coro)
        except Exception as exc:
            raise provider_error(exc, target=str(kwargs["model"]), secrets=self._secrets) from exc
        response._hidden_params[_ATTEMPT_KEY] = (current_attempt(), str(kwargs["model"]))
        return response

    async def _degraded_path(self, reason: FallbackReason, call: Call, next: Next) -> Any:
        assert self.degrade is not None
        arguments = self.degrade.rewrite(call.kwargs)
        return await next(Call(call.fn, (), arguments, target=str(arguments["model"])))


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
        return not self.of(target).allows()

    async def handle(self, call: Call, next: Next) -> Any:
        return await self.of(call.target).handle(call, next)


def _litellm() -> Any:
    """Import litellm on first use (it takes seconds; ``import latencykit`` must stay fast)."""
    import litellm

    return litellm
