"""pytest plugin of latencykit: the ``fake_provider`` fixture.

Registered through the ``pytest11`` entry point, so it is loaded by every pytest run in an
environment where latencykit is installed: it imports nothing heavy until the fixture is used.
"""

from __future__ import annotations

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

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
