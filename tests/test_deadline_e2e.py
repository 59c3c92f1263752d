"""The 3-service demo, short: gateway -> app -> provider on loopback, each over real HTTP.

The gateway (this test, an httpx client with latencykit's hook) sets a deadline; the app (an
ASGI app behind :class:`DeadlineMiddleware`, served by hypercorn on 127.0.0.1, on the test's
backend) calls the fake provider through ``lk.LLM``; the provider is slow. The app must give
up at the gateway's deadline, and the provider must see its request closed then. The same
demo with many calls and its overshoot percentiles: ``benchmarks/deadline_e2e.py``.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

import latencykit as lk
from helpers import MESSAGES, make_llm, read_all, text_of, until
from latencykit.integrations.asgi import DeadlineMiddleware, Receive, Scope, Send
from latencykit.integrations.httpx import send_deadline
from latencykit.testing import Behavior, FakeProvider

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BUDGET = 0.5
# The provider sees the close within milliseconds of the deadline (benchmarks/deadline_e2e.py
# measures it); the margin here is for a loaded 2-core machine running other suites.
MARGIN = 0.25


def llm_app(llm: lk.LLM, *, stream: bool) -> DeadlineMiddleware:
    """The app: one LLM call per request, its text as the answer, inside the caller's
    deadline."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        answer = await llm.acompletion(messages=MESSAGES, stream=stream)
        text = text_of(await read_all(answer)) if stream else answer.choices[0].message.content
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": text.encode()})

    return DeadlineMiddleware(app, maximum=60)


@asynccontextmanager
async def served(app: Any, backend: str) -> AsyncIterator[str]:
    """``app`` served by hypercorn on a free port of 127.0.0.1 (on this test's backend): its
    URL. The socket listens before the server starts, so no request can come too early."""
    from hypercorn.config import Config

    if backend == "trio":
        from hypercorn.trio import serve
    else:
        from hypercorn.asyncio import serve  # type: ignore[assignment]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]
    config.graceful_timeout = 1.0
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(functools.partial(serve, app, config, shutdown_trigger=stop.wait))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()


@pytest.mark.parametrize("lane", ["openai", "litellm"])
@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
async def test_a_gateway_deadline_is_honoured_end_to_end(
    fake: FakeProvider, anyio_backend: str, lane: str, stream: bool
) -> None:
    # Slow either way: no answer for 30 s, or a stream of 1,000 tokens at 20 a second.
    slow = Behavior(ttft=0.05, itl=0.05, output_tokens=1000) if stream else Behavior(ttft=30)
    fake.script("slow", slow)
    async with make_llm(fake, "slow", transport=lane) as llm:
        await llm.warm(raise_errors=True)  # litellm's first-call set-up is not the demo's
        async with (
            served(llm_app(llm, stream=stream), anyio_backend) as url,
            httpx.AsyncClient(event_hooks={"request": [send_deadline]}) as gateway,
        ):
            started = time.monotonic()
            try:
                with lk.deadline(BUDGET):
                    status: int | None = (await gateway.get(url)).status_code
            except lk.DeadlineExceeded:
                status = None  # the gateway's own scope ended first: a race with the 504
            ended = time.monotonic()
            await until(lambda: any(a.disconnected for a in fake.attempts))
    expiry = started + BUDGET
    assert status in (504, None)
    assert ended - expiry < MARGIN
    [call] = [a for a in fake.attempts if a.model == "slow"]
    assert call.disconnected_at is not None
    assert expiry - 0.05 < call.disconnected_at < expiry + MARGIN
    assert 0 < int(call.request_headers["x-request-timeout-ms"]) < BUDGET * 1000
    assert not call.completed


@pytest.mark.parametrize("stream", [False, True], ids=["response", "stream"])
async def test_the_app_answers_504_to_a_caller_that_said_its_budget(
    fake: FakeProvider, anyio_backend: str, stream: bool
) -> None:
    # A stream's own guard may see the deadline pass before the scope does: a 504 all the same.
    slow = Behavior(ttft=0.05, itl=0.05, output_tokens=1000) if stream else Behavior(ttft=30)
    fake.script("slow", slow)
    async with (
        make_llm(fake, "slow", transport="openai") as llm,
        served(llm_app(llm, stream=stream), anyio_backend) as url,
        httpx.AsyncClient(timeout=30) as caller,  # no latencykit: just the header
    ):
        started = time.monotonic()
        response = await caller.get(url, headers={"grpc-timeout": "300m"})
        elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.text == "deadline exceeded"
    assert 0.3 <= elapsed < 0.3 + MARGIN
    [call] = fake.attempts
    assert 0 < int(call.request_headers["x-request-timeout-ms"]) <= 300
    await until(lambda: fake.attempts[0].disconnected)
