"""``failover``: walk ordered alternatives until one answers, by what the errors say.

Error-aware (DESIGN §3): a transient error (429 whose wait does not fit, 5xx, connection,
timeout) moves to the next route at once; a context-length error goes only to a route with a
larger context window; a missing model (404, ``NOT_FOUND``) to the next route; content policy,
authentication, bad request and unknown errors are raised at once (``on=`` widens that, at your
own risk). Routes whose circuit breaker is open are
skipped without a request. Per-route policies (breaker, retry, attempt timeout) sit inside this
one, so they act per route.

**The deadline is shared.** Inside a deadline, a target that has others after it gets at most an
equal share of the budget left: ``remaining / (1 + later targets whose breaker is not open)``,
at least ``MIN_SHARE`` (0.25 s); the last target gets all that remains. A target that hangs
(silent, or slow to its first token) then fails over in time with an
:class:`~latencykit.AttemptTimeout`, and its retries cannot eat the later targets' budget.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import events
from .._cancel import backend, now
from .._context import current_call_id, deadline_var, order_var, reason_var
from ..errors import (
    AttemptTimeout,
    CircuitOpen,
    ErrorFilter,
    ErrorKind,
    attach_others,
    classify,
    error_predicate,
)
from ..pipeline import Call, Next, PolicyDecorator, Stage, function_target
from ..target import Target

__all__ = ["MIN_SHARE", "Failover", "Route", "failover"]

MIN_SHARE = 0.25
"""Seconds a target is always given when a deadline is split among failover targets."""


@dataclass(frozen=True, slots=True)
class Route:
    """One alternative of a :class:`Failover`.

    Attributes:
        target: where the route goes; its ``key`` names the route, its ``context_window`` says
            what prompts fit.
        rewrite: turns the incoming call into the call for this route (default: the same call
            addressed to ``target``).
    """

    target: Target
    rewrite: Callable[[Call], Call] | None = None
    name: str = field(init=False, repr=False, compare=False)
    """The route's name: its target's key."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.target.key)

    def call(self, call: Call) -> Call:
        """The call for this route."""
        if self.rewrite is not None:
            return self.rewrite(call)
        return call._replace(target=self.target)


class Failover(PolicyDecorator):
    """Call the decorated function; when it fails with a transient error, call each alternative
    (same arguments) in order until one answers: a policy and a decorator (``lk.failover`` is
    this class; ``LLM(failover=[...])`` builds one).

    Args:
        alternatives: async callables taking the decorated function's arguments, tried after
            it; or :class:`Route` objects, the first of which is the primary (what
            ``LLM(failover=[...])`` builds: a route per target).
        on: errors that move on to the next alternative (default ``None``: transient errors;
            a context-length error only to a route with a larger context window). Other
            errors are raised at once.
        is_open: ``is_open(name)`` tells whether a route's breaker refuses calls now (default
            ``None``: never); those routes are skipped without a request.
        passthrough: a call addressed to none of the routes (a degraded call, say) goes
            through untouched (default ``False``: it starts at the first route).

    When every alternative fails, the first (primary) error is raised with the others attached.
    """

    stage = Stage.FAILOVER
    __slots__ = ("_handles", "_index", "is_open", "passthrough", "routes")

    def __init__(
        self,
        *alternatives: Callable[..., Awaitable[Any]] | Route,
        on: ErrorFilter | None = None,
        is_open: Callable[[str], bool] | None = None,
        passthrough: bool = False,
    ) -> None:
        self.routes = tuple(_routes(alternatives))
        self._index = {route.name: index for index, route in enumerate(self.routes)}
        if len(self._index) != len(self.routes):
            names = [route.name for route in self.routes]
            raise ValueError(f"failover route names must be unique, got {names}")
        self._handles = error_predicate(on, "failover.on")
        self.is_open = is_open
        self.passthrough = passthrough

    def __repr__(self) -> str:
        return f"failover({', '.join(route.name for route in self.routes)})"

    def _order(self, call: Call) -> Sequence[Route] | None:
        """The routes to try: those a router chose, in its order, when the call is on the
        first of them; else from the call's own route on (``None``: not ours)."""
        key, chosen, index = call.target.key, order_var.get(), self._index
        if chosen is not None and chosen[0] == key:
            return [self.routes[index[name]] for name in chosen if name in index]
        if key in index:
            return self.routes[index[key] :]
        return None if self.passthrough else self.routes

    async def handle(self, call: Call, next: Next) -> Any:
        """Try the routes in order from the call's own, until one answers."""
        routes = self._order(call)
        if routes is None:
            return await next(call)
        errors: list[Exception] = []
        smaller_than: int | None = None  # after a context-length error: the window to beat
        skipped_open: list[str] = []
        previous: str | None = None
        for index, route in enumerate(routes):
            skipped = self._skipped(route, smaller_than)
            if skipped is not None:
                skipped_open += [route.name] if skipped == "breaker_open" else []
                self._event(route.name, previous, skipped)
                continue
            if previous is not None:
                self._event(route.name, previous, None)
            # The call on this route (index 0: the first tried; later ones are failovers),
            # within its share of the deadline (see _share); inline: no frame of its own.
            reason = reason_var.set("failover") if index else None
            try:
                limit = self._share(routes, index)
                if limit is None:
                    return await next(route.call(call))
                started, share = limit
                with backend().expiry(started + share):
                    return await next(route.call(call))
                raise AttemptTimeout(
                    f"no answer within its share of the deadline ({share:.3f}s): "
                    "the targets after it need the rest",
                    target=route.name,
                )
            except Exception as exc:
                errors.append(exc)
                previous = route.name
                smaller_than = self._judged(exc, route, errors, smaller_than)
                if smaller_than == _STOP:
                    break
            finally:
                if reason is not None:
                    reason_var.reset(reason)
        if not errors:
            raise CircuitOpen.all_open(skipped_open)
        attach_others(errors[0], errors[1:])
        raise errors[0]

    def _judged(
        self, exc: Exception, route: Route, errors: list[Exception], smaller_than: int | None
    ) -> int | None:
        """After ``route`` failed with ``exc`` (the last of ``errors``): the context window a
        later route must beat, ``_STOP`` when none can (a context-length error on an unknown
        window); raises ``exc`` when it is not failed over."""
        if classify(exc) is ErrorKind.CONTEXT_LENGTH:
            window = route.target.context_window
            return _STOP if window is None else window
        if classify(exc) is not ErrorKind.NOT_FOUND and not self._handles(exc):
            attach_others(exc, errors[:-1])  # NOT_FOUND: the model may exist on another
            raise exc
        return smaller_than

    def _skipped(
        self, route: Route, smaller_than: int | None
    ) -> Literal["breaker_open", "context_window"] | None:
        """Why ``route`` is passed over without a request, if it is."""
        window = route.target.context_window
        if smaller_than is not None and (window is None or window <= smaller_than):
            return "context_window"
        if self.is_open is not None and self.is_open(route.name):
            return "breaker_open"
        return None

    def _share(self, routes: Sequence[Route], index: int) -> tuple[float, float] | None:
        """``(now, seconds)``: the most the ``index``-th of ``routes`` may take from now when
        routes follow it and a deadline bounds the call: an equal share of the remaining budget
        among it and the later routes that could be tried (their breakers not open), at least
        ``MIN_SHARE`` (``None``: no limit)."""
        deadline = deadline_var.get()
        if deadline == math.inf or index + 1 == len(routes):
            return None
        is_open = self.is_open
        later = routes[index + 1 :]
        left = 1 + len(later)
        if is_open is not None:
            for route in later:  # a loop, not sum() of a generator: no frame per call
                left -= is_open(route.name)
        if left == 1:
            return None
        started = now()
        return started, max(MIN_SHARE, (deadline - started) / left)

    def _event(
        self,
        to: str,
        previous: str | None,
        skipped: Literal["breaker_open", "context_window"] | None,
    ) -> None:
        if not events.listening():
            return
        call_id = current_call_id()
        if skipped is None:
            assert previous is not None
            events.emit(events.FailedOver(call_id, from_target=previous, to_target=to))
        else:
            events.emit(events.TargetSkipped(call_id, target=to, reason=skipped))


failover = Failover
"""The same class: ``@lk.failover(backup)`` reads as the decorator it is."""


def _routes(alternatives: Sequence[Callable[..., Awaitable[Any]] | Route]) -> list[Route]:
    if all(isinstance(alternative, Route) for alternative in alternatives):
        if not alternatives:
            raise ValueError("failover needs at least one alternative")
        return list(alternatives)  # type: ignore[arg-type]
    routes = [Route(_ANY, lambda call: call)]  # the decorated function, named at call time
    for alternative in alternatives:
        if isinstance(alternative, Route) or not callable(alternative):
            raise TypeError(
                "failover alternatives must be all async callables or all Routes, "
                f"got {alternative!r}"
            )
        target = function_target(alternative)
        routes.append(Route(target, _calling(alternative, target)))
    return routes


_STOP = -1  # see Failover._judged
_ANY = Target(name="<the decorated function>")


def _calling(fn: Callable[..., Awaitable[Any]], target: Target) -> Callable[[Call], Call]:
    def rewrite(call: Call) -> Call:
        return call._replace(fn=fn, target=target)

    return rewrite
