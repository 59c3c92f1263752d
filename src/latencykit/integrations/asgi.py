"""Run each request of an ASGI app inside its caller's deadline: :class:`DeadlineMiddleware`."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .. import _validation
from ..errors import DeadlineExceeded
from ..policies.deadline import deadline
from ..propagation import budget_of

__all__ = ["ASGIApp", "DeadlineMiddleware", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
"""An ASGI connection scope (``type``, ``headers``, ...)."""
Message = MutableMapping[str, Any]
"""An ASGI event, received or sent."""
Receive = Callable[[], Awaitable[Message]]
"""ASGI's ``receive``: the next event from the client."""
Send = Callable[[Message], Awaitable[None]]
"""ASGI's ``send``: an event to the client."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application (Starlette's and FastAPI's apps are ones)."""

_GATEWAY_TIMEOUT = {
    "type": "http.response.start",
    "status": 504,
    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"17")],
}
_BODY = {"type": "http.response.body", "body": b"deadline exceeded", "more_body": False}


class DeadlineMiddleware:
    """Pure ASGI middleware: each HTTP request runs inside ``lk.deadline(budget)``, its budget
    read from the request's headers (``grpc-timeout``, ``x-request-timeout-ms``, the baggage
    entry ``deadline``: the smallest wins, see :mod:`latencykit.propagation`), so everything
    latencykit does for the request (``lk.LLM`` calls, decorated functions, ``lk.remaining()``,
    the outbound headers) honours the caller's deadline.

    Args:
        app: the ASGI app to wrap.
        default: the budget of a request that says none (seconds or ``timedelta``; default
            ``None``: such a request runs without a deadline).
        maximum: the largest budget a caller may ask for (default ``None``: no cap).

    When the deadline expires before the response started, the work is cancelled and the
    client gets ``504 Gateway Timeout`` (body ``deadline exceeded``); after it started (a
    stream, say), the :class:`~latencykit.DeadlineExceeded` propagates to the server, which
    aborts the response: a cut answer is never passed off as a whole one. A budget already
    spent on arrival is answered 504 at once, without calling the app. Other scopes
    (WebSocket, lifespan) pass through untouched. Use with Starlette:
    ``app.add_middleware(DeadlineMiddleware, default=10.0)``.

    Raises:
        ValueError: ``default`` or ``maximum`` is not a positive finite number of seconds.
        TypeError: either is not a number or a ``timedelta``.
    """

    __slots__ = ("app", "default", "maximum")

    def __init__(
        self,
        app: ASGIApp,
        *,
        default: float | datetime.timedelta | None = None,
        maximum: float | datetime.timedelta | None = None,
    ) -> None:
        self.app = app
        self.default = _validation.optional_seconds("DeadlineMiddleware.default", default)
        self.maximum = _validation.optional_seconds("DeadlineMiddleware.maximum", maximum)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        budget = budget_of(scope["headers"]) if scope["type"] == "http" else None
        if budget is None and scope["type"] == "http":
            budget = self.default
        if budget is None:  # not HTTP, or no deadline said and no default
            await self.app(scope, receive, send)
            return
        if self.maximum is not None:
            budget = min(budget, self.maximum)
        if budget <= 0:
            await _gateway_timeout(send)
            return
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            started = True  # even a failed send: the server may have begun the response
            await send(message)

        try:
            with deadline(budget) as within:
                await self.app(scope, receive, send_started)
        except DeadlineExceeded:
            # Ours, whether the scope cancelled the work or a stream's own guard saw the
            # deadline pass first; an earlier deadline of the app's own is the app's error.
            if started or not (within.expired or within.remaining() == 0.0):
                raise  # ...and a started response is aborted
            await _gateway_timeout(send)


async def _gateway_timeout(send: Send) -> None:
    await send(dict(_GATEWAY_TIMEOUT))
    await send(dict(_BODY))
