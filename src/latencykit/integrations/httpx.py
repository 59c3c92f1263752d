"""Send the deadline on with the app's own httpx requests: :func:`send_deadline`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import propagation
from .._context import remaining

if TYPE_CHECKING:
    import httpx

__all__ = ["send_deadline"]


async def send_deadline(request: httpx.Request) -> None:
    """An httpx request event hook: inside a deadline, the request carries the time left
    (``x-request-timeout-ms`` and the baggage entry ``deadline``, see
    :func:`latencykit.propagation.inject`) and its timeouts (connect, read, write, pool) are
    cut to it; outside one it does nothing. No options (nothing to default).

    ``httpx.AsyncClient(event_hooks={"request": [send_deadline]})``. The deadline's scope
    still does the cancelling: the timeout is for the time between the hook and the scope's
    expiry, and for a hop that runs outside the scope's task."""
    left = remaining()
    if left is None:
        return
    propagation.inject(request.headers, left)
    timeout = request.extensions.get("timeout")
    if isinstance(timeout, dict):
        request.extensions["timeout"] = {
            kind: left if limit is None else min(limit, left) for kind, limit in timeout.items()
        }
