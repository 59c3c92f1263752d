"""pytest plugin of latencykit: the ``fake_provider`` and ``redis_server`` fixtures.

Registered through the ``pytest11`` entry point, so it is loaded by every pytest run in an
environment where latencykit is installed: it imports nothing heavy until the fixture is used.
"""

from __future__ import annotations

import os

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import NoReturn

    from ._redis import RedisServer
    from ._server import FakeProvider


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    """A started :class:`~latencykit.testing.FakeProvider` (function scope), stopped after the test.

    It listens on a free port of 127.0.0.1 with ``seed=0``; give clients
    ``fake_provider.base_url`` as their OpenAI base URL.
    """
    from ._server import FakeProvider

    provider = FakeProvider()
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


def _under_ci() -> bool:
    """Whether this run is CI: the ``CI`` environment variable is ``true`` (any case) or ``1``,
    as GitHub Actions, GitLab CI and most other CI services set it."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def _skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it under CI, where a skipped test would hide a broken set-up."""
    if _under_ci():
        pytest.fail(f"{reason} (CI=true: a skip would hide it)", pytrace=False)
    pytest.skip(reason)


def _start_redis_server() -> RedisServer:
    """A started :class:`~latencykit.testing.RedisServer`, or skip (fail under CI) without one."""
    from ._redis import INSTALL_HINT, RedisServer

    if RedisServer.available() is None:
        _skip_or_fail(INSTALL_HINT)
    return RedisServer().start()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A started :class:`~latencykit.testing.RedisServer` (function scope), closed after the test.

    A fresh, empty ``redis-server`` on a free port of 127.0.0.1 with no persistence; give
    clients ``redis_server.url`` (``redis://127.0.0.1:<port>/0``). Starting one takes about
    15 ms. Without ``redis-server`` installed the test is skipped, or fails when the
    environment variable ``CI`` is ``true``.
    """
    server = _start_redis_server()
    try:
        yield server
    finally:
        server.close()
