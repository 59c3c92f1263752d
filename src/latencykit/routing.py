"""Routing by job: pick each call's target from the request.

Not every request needs the largest model. ``LLM(..., router=Router(...))`` picks, per call, the
target that should answer: a short classification to a small model, a long document to a
long-context one, a request with tools or images to a target that supports them, and, when
what is left of the budget cannot fit the chosen target's recent p95 latency, the fastest
target that fits. Failover then goes on from the chosen target to the other eligible ones.

A router is any callable ``(RouteRequest) -> target key`` (or a :class:`RouteDecision`);
:class:`Router` is the built-in one, driven by :class:`Rule` objects. Prompt tokens are counted
with litellm's token counter, only when a rule or a context window asks for them.
:class:`Balanced` (from :mod:`latencykit.balance`) spreads calls over equivalent targets instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _validation, events
from ._context import order_var, remaining, task_var, trace_var
from ._litellm import litellm
from ._values import RouteDecision
from .balance import Balanced as Balanced
from .pipeline import Call, Next, Policy, Stage

if TYPE_CHECKING:
    from .stats import Recorder
    from .target import Target

__all__ = [
    "Balanced",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "RouterFunction",
    "Rule",
    "needs_of",
]


# What a request needs, and how litellm's model map says a model has it.
_SUPPORT = {
    "tools": "supports_function_calling",
    "vision": "supports_vision",
    "json": "supports_response_schema",
}


def needs_of(kwargs: Mapping[str, Any]) -> frozenset[str]:
    """The capabilities a request needs, from its litellm arguments: ``"tools"`` (``tools`` or
    ``functions`` given), ``"vision"`` (an image part in a message), ``"json"`` (a
    ``response_format`` of type ``json_object`` or ``json_schema``)."""
    parts = (part for message in kwargs.get("messages") or () for part in _parts(message))
    found = {
        "tools": kwargs.get("tools") or kwargs.get("functions"),
        "json": _type(kwargs.get("response_format")) in ("json_object", "json_schema"),
        "vision": any(_type(part) == "image_url" for part in parts),
    }
    return frozenset(need for need, needed in found.items() if needed)


def _type(item: object) -> object:
    return item.get("type") if isinstance(item, Mapping) else None


def _parts(message: object) -> list[Any]:
    content = message.get("content") if isinstance(message, Mapping) else None
    return content if isinstance(content, list) else []


class RouteRequest:
    """What a router sees of a call: its arguments, its task tag, its needs, the budget left and
    each target's recent latency.

    Attributes:
        kwargs: the call's litellm arguments (``messages``, ``tools``, ...); do not modify.
        task: the call's task tag (``acompletion(task="classify")``; ``None``: none).
        needs: the capabilities the request needs (see :func:`needs_of`).
        remaining: seconds left of the call's deadline (``None``: no deadline).
        targets: the LLM's targets, in failover order.
    """

    def __init__(
        self,
        kwargs: Mapping[str, Any],
        task: str | None,
        targets: Sequence[Target],
        recorder: Recorder | None = None,
    ) -> None:
        self.kwargs = kwargs
        self.task = task
        self.targets = tuple(targets)
        self.needs = needs_of(kwargs)
        self.remaining = remaining()
        self._recorder = recorder

    @functools.cached_property
    def prompt_tokens(self) -> int:
        """The prompt's tokens, counted once with litellm's ``token_counter`` (the first
        target's tokenizer; an estimate for the others)."""
        messages = self.kwargs.get("messages") or []
        return int(litellm().token_counter(model=self.targets[0].model, messages=messages))

    def latency(
        self, target: str, quantile: float = 0.95, *, min_samples: int = 20
    ) -> float | None:
        """``target``'s recent attempt latency at ``quantile`` (default p95) over the LLM's
        statistics window, or ``None`` with fewer than ``min_samples`` (default ``20``)."""
        window = None if self._recorder is None else self._recorder.latency.get(target)
        if window is None or window.count() < min_samples:
            return None
        return window.quantile(quantile)

    def supports(self, target: Target, capability: str) -> bool | None:
        """Whether ``target`` supports ``capability``: ``True`` when declared in its
        ``capabilities`` or when litellm's model map says so, ``False`` when litellm knows the
        model and says not, ``None`` when nobody knows."""
        if target.supports(capability):
            return True
        check = _SUPPORT.get(capability)
        if check is None or not target.model:
            return None
        module = litellm()
        try:
            module.get_model_info(model=target.model)  # raises for a model it does not know
        except Exception:
            return None
        return bool(getattr(module, check)(model=target.model))


RouterFunction = Callable[[RouteRequest], "str | RouteDecision"]
"""Any router: a request in, a target key (or a :class:`RouteDecision`) out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """Send matching calls to ``to``. A rule matches when every condition given holds.

    Attributes:
        to: the key (name) of the target to send to (required).
        task: the task tag(s) it is for (default ``None``: any).
        min_prompt_tokens: match prompts of at least this many tokens (default ``None``).
        max_prompt_tokens: match prompts of at most this many tokens (default ``None``).
        needs: match requests needing all of these capabilities (default empty: any).
    """

    to: str
    task: str | Collection[str] | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    needs: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        _validation.text("Rule.to", self.to, "target name")
        if self.task is not None:
            tasks = {self.task} if isinstance(self.task, str) else self.task
            object.__setattr__(self, "task", frozenset(tasks))
        for name in ("min_prompt_tokens", "max_prompt_tokens"):
            if getattr(self, name) is not None:
                _validation.count(f"Rule.{name}", getattr(self, name), minimum=0)
        object.__setattr__(self, "needs", _validation.tags("Rule.needs", self.needs))

    def matches(self, request: RouteRequest) -> bool:
        """Whether ``request`` meets every condition of this rule."""
        low, high = self.min_prompt_tokens, self.max_prompt_tokens
        return (
            (self.task is None or request.task in self.task)
            and self.needs <= request.needs
            and (low is None or request.prompt_tokens >= low)
            and (high is None or request.prompt_tokens <= high)
        )

    def __str__(self) -> str:
        shown = {
            "task": None if self.task is None else sorted(self.task),
            "min_prompt_tokens": self.min_prompt_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "needs": sorted(self.needs) or None,
        }
        return ", ".join(f"{n}={v!r}" for n, v in shown.items() if v is not None) or "always"


def _fits(target: Target, request: RouteRequest) -> bool:
    """Whether the prompt fits ``target``'s context window (counted only if it has one)."""
    return target.context_window is None or target.context_window > request.prompt_tokens


class Router:
    """The built-in router: rules first, then capabilities, context and the budget.

    Args:
        rules: :class:`Rule` objects, tried in order; the first that matches and whose target
            is eligible picks it.
        default: the target when no rule picks one (default ``None``: the LLM's first target).
        fit_budget: when the call has a deadline and the picked target's recent latency at
            ``quantile`` is longer than what is left, take the eligible target with the
            shortest such latency that fits (or, if none fits, the fastest) (default ``True``).
            Targets with fewer than ``min_samples`` recent attempts are not judged.
        quantile: the latency quantile the budget is compared with (default ``0.95``).
        min_samples: recent attempts a target needs before its latency is trusted (default
            ``20``).

    A target is **eligible** for a request when it is known to support every capability the
    request needs (declared in its ``capabilities``, or in litellm's model map: see
    :meth:`RouteRequest.supports`; when no target is known to support a need, that need
    excludes none) and, when the target has a ``context_window``, the prompt fits in it.
    """

    def __init__(
        self,
        *rules: Rule,
        default: str | None = None,
        fit_budget: bool = True,
        quantile: float = 0.95,
        min_samples: int = 20,
    ) -> None:
        for index, rule in enumerate(rules):
            _validation.instance(f"Router.rules[{index}]", rule, Rule, "a latencykit.routing.Rule")
        if default is not None:
            _validation.text("Router.default", default, "target name")
        self.rules = rules
        self.default = default
        self.fit_budget = bool(fit_budget)
        self.quantile = _validation.number("Router.quantile", quantile, low=0, high=1, open=True)
        self.min_samples = _validation.count("Router.min_samples", min_samples)

    def __repr__(self) -> str:
        return f"Router({len(self.rules)} rules, default={self.default!r})"

    def check(self, targets: Sequence[str]) -> None:
        """Raise ``ValueError`` if a rule or the default names none of ``targets``."""
        names = {f"Router.rules[{i}].to": rule.to for i, rule in enumerate(self.rules)}
        _validation.known_targets({**names, "Router.default": self.default}, targets)

    def eligible(self, request: RouteRequest) -> list[Target]:
        """The targets that can serve ``request`` (see the class docs), in failover order."""
        targets = list(request.targets)
        for need in sorted(request.needs):  # a need nobody is known to meet excludes none
            targets = [t for t in targets if request.supports(t, need)] or targets
        return [t for t in targets if _fits(t, request)] or list(request.targets)

    def __call__(self, request: RouteRequest) -> RouteDecision:
        """Pick the target for ``request``."""
        return self.decide(request, self.eligible(request))

    def decide(self, request: RouteRequest, eligible: Sequence[Target]) -> RouteDecision:
        """Pick the target for ``request`` among its ``eligible`` targets."""
        names = [t.key for t in eligible]
        for index, rule in enumerate(self.rules, 1):
            if rule.to in names and rule.matches(request):
                decision = RouteDecision(rule.to, f"rule {index}: {rule}")
                break
        else:
            decision = RouteDecision(self.default if self.default in names else names[0], "default")
        if self.fit_budget and request.remaining is not None:
            return self._fit(request, decision, names)
        return decision

    def _fit(self, request: RouteRequest, picked: RouteDecision, names: list[str]) -> RouteDecision:
        left = request.remaining
        assert left is not None

        def latency(name: str) -> float | None:
            return request.latency(name, self.quantile, min_samples=self.min_samples)

        own = latency(picked.target)
        if own is None or own <= left:
            return picked
        known = [(seconds, name) for name in names if (seconds := latency(name)) is not None]
        fits = [entry for entry in known if entry[0] <= left]
        seconds, name = max(fits) if fits else min(known)  # the slowest that fits: the best
        p = f"p{self.quantile * 100:g}"
        return RouteDecision(
            name,
            f"budget: {picked.target} {p} {own:.3f}s > {left:.3f}s left; "
            f"{name} {p} {seconds:.3f}s" + ("" if fits else " (none fits: the fastest)"),
        )


class Routing:
    """Stage ``ROUTER`` in ``LLM``: route each call, then let failover follow the route.

    ``is_open(key)``: whether a target's breaker refuses calls (default ``None``: no breakers);
    a :class:`Balanced` router does not pick those. :attr:`policies` are the stages it adds to
    the pipeline: itself, and a :class:`Balanced` router's count of each member's attempts.
    """

    stage = Stage.ROUTER
    __slots__ = ("_by_key", "_is_open", "_recorder", "_rewrite", "_targets", "router")

    def __init__(
        self,
        router: RouterFunction,
        targets: Sequence[Target],
        rewrite: Callable[[Target, Call], Call],
        recorder: Recorder | None,
        is_open: Callable[[str], bool] | None = None,
    ) -> None:
        self.router = _validation.function("LLM.router", router)
        self._targets = tuple(targets)
        self._by_key = {t.key: t for t in targets}
        self._rewrite = rewrite
        self._recorder = recorder
        self._is_open = is_open
        if isinstance(router, (Router, Balanced)):
            router.check(list(self._by_key))

    def __repr__(self) -> str:
        return f"routing({self.router!r})"

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The stages routing adds to the pipeline."""
        return (self, self.router) if isinstance(self.router, Balanced) else (self,)

    def _route(self, call: Call) -> tuple[RouteDecision, tuple[str, ...]]:
        """The call's decision, and the targets in the order failover tries them."""
        router = self.router
        if isinstance(router, Balanced):
            chosen, pool = router.pick(self._is_open)
            return chosen, (*pool, *(t.key for t in self._targets if t.key not in pool))
        request = RouteRequest(call.kwargs, task_var.get(), self._targets, self._recorder)
        if isinstance(router, Router):
            eligible = router.eligible(request)
            chosen = router.decide(request, eligible)
        else:
            eligible, found = list(self._targets), router(request)
            chosen = found if isinstance(found, RouteDecision) else RouteDecision(found, "router")
        return chosen, (chosen.target, *(t.key for t in eligible if t.key != chosen.target))

    async def handle(self, call: Call, next: Next) -> Any:
        """Route ``call`` and run it on the chosen target (failover after it)."""
        chosen, order = self._route(call)
        target = self._by_key.get(chosen.target)
        if target is None:
            raise ValueError(
                f"LLM.router chose {chosen.target!r}, which is not one of {list(self._by_key)}"
            )
        trace = trace_var.get()
        if trace is not None:
            trace.route = chosen
            if events.listening():
                events.emit(
                    events.Routed(
                        trace.call_id, target=target.key, reason=chosen.reason, task=task_var.get()
                    )
                )
        token = order_var.set(order)
        try:
            return await next(self._rewrite(target, call))
        finally:
            order_var.reset(token)
