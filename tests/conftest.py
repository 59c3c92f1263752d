"""Shared test set-up: run every async test on asyncio and trio; keep litellm offline."""

from __future__ import annotations

import os

# litellm fetches a price map from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every ``@pytest.mark.anyio`` test runs once per backend."""
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def _quiet_litellm() -> None:
    """litellm prints a 'Give Feedback / Get Help' banner on every error; tests don't need it."""
    import litellm

    litellm.suppress_debug_info = True
