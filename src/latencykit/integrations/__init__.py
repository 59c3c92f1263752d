"""Deadlines across services: latencykit at the edges of an app.

* :mod:`latencykit.integrations.asgi`: :class:`~latencykit.integrations.asgi.DeadlineMiddleware`
  reads the caller's remaining budget from a request's headers and runs the request inside it;
* :mod:`latencykit.integrations.httpx`: :func:`~latencykit.integrations.httpx.send_deadline`,
  an httpx event hook that sends the remainder on with the app's own requests.

Neither imports its framework (they speak ASGI and httpx's hook protocol); the wire formats
are :mod:`latencykit.propagation`'s. See ``docs/deadlines.md``.
"""
