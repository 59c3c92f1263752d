"""Helpers shared by the test modules (fixtures live in ``conftest.py``): a conversation, a key,
an ``lk.LLM`` or a failover target on the fake provider, reading a stream, waiting for state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

import latencykit as lk
from latencykit.testing import FakeProvider

MESSAGES = [{"role": "user", "content": "hello"}]
KEY = "sk-test-secret-0123456789abcdef"  # no log line, span, error or record may show it


def make_llm(fake: FakeProvider, model: str = "primary", **options: Any) -> lk.LLM:
    """An ``lk.LLM`` for ``openai/<model>`` on the fake provider."""
    return lk.LLM(f"openai/{model}", api_base=fake.base_url, api_key=KEY, **options)


def target(fake: FakeProvider, model: str, **extra: Any) -> dict[str, Any]:
    """A failover target for ``openai/<model>`` on the fake provider."""
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": KEY, **extra}


async def read_all(stream: lk.Stream[Any]) -> list[Any]:
    """Every chunk of ``stream``, which is closed after."""
    async with stream:
        return [chunk async for chunk in stream]


def text_of(chunks: list[Any]) -> str:
    """The content the chunks carry, joined."""
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def until(predicate: Callable[[], bool], *, within: float = 10.0) -> None:
    """Poll ``predicate()`` until it holds (failing after ``within`` seconds): for state that
    changes in another thread (the provider's, a store's), where there is no event to wait on."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the state itself
            await anyio.sleep(0.005)
