"""Shared test set-up: run every async test on asyncio and trio; keep litellm offline; start
every test with no circuit breaker registered.

Markers (registered in pyproject.toml):

- ``virtual_time``: the test's async function runs on virtual time: on asyncio, on the lab's
  :class:`~latencykit.lab.virtual.VirtualClockLoop`; on trio, under
  ``MockClock(autojump_threshold=0)``. When every task waits for a timer, the clock jumps to
  it, so a policy's timing is exact and costs no real time. No real I/O in such a test.
- ``slow``: a test that takes seconds of real time (processes, soak-like loops, the docs site,
  lab runs); ``make test-fast`` leaves these out, ``make test`` runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

# litellm fetches a price map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from latencykit.policies.breaker import reset_breakers
from latencykit.testing import FakeProvider, ProviderQuota


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str | tuple[str, dict[str, Any]]:
    """Every ``@pytest.mark.anyio`` test runs once per backend; with ``virtual_time``, on that
    backend's virtual clock (a fresh one per test)."""
    name = str(request.param)
    if request.node.get_closest_marker("virtual_time") is None:
        return name
    if name == "trio":
        import trio.testing

        return "trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}
    from latencykit.lab.virtual import VirtualClockLoop

    return "asyncio", {"loop_factory": VirtualClockLoop}


@pytest.fixture(scope="session", autouse=True)
def _quiet_litellm() -> None:
    """litellm prints a 'Give Feedback / Get Help' banner on every error; tests don't need it."""
    import litellm

    litellm.suppress_debug_info = True


@pytest.fixture(autouse=True)
def _fresh_breakers() -> Iterator[None]:
    """Breakers are process-wide, keyed by target: each test starts and ends with none."""
    reset_breakers()
    yield
    reset_breakers()


@pytest.fixture
def fake(fake_provider: FakeProvider) -> FakeProvider:
    """The pytest plugin's provider (latencykit.testing.pytest_plugin), under a short name."""
    return fake_provider


@pytest.fixture
def quota() -> Iterator[FakeProvider]:
    """A provider of its own with a quota of 6 requests and 600 tokens per minute per key (1
    request and 10 tokens per second), on a frozen quota clock."""
    with FakeProvider(
        quota=ProviderQuota(requests_per_minute=6, tokens_per_minute=600)
    ) as provider:
        provider.freeze_quota()
        yield provider
