"""Deadlines that travel: a gateway's budget honoured by the app it calls and by the provider.

Three hops: a gateway sets a 0.5 s deadline and calls an app over HTTP with latencykit's httpx
hook, which sends the time left along (``x-request-timeout-ms`` and W3C Baggage); the app, an
ASGI app behind ``DeadlineMiddleware``, reads it and makes its ``lk.LLM`` call inside it; the
provider is slow (no answer for 30 s). Nobody configured a timeout in the app, yet its call ends
at the gateway's deadline and the provider sees its request closed then: no work goes on for a
caller that has already given up.

The gateway reaches the app in-process (httpx's ``ASGITransport``, so the example needs no web
server); the app reaches the fake OpenAI-compatible provider from ``latencykit.testing`` over
HTTP on 127.0.0.1 (no API key, no network). ``benchmarks/deadline_e2e.py`` runs the same three
hops as three processes, 10,000 calls, and measures how late each hop lets go.

    python examples/deadlines.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio
import httpx

import latencykit as lk
from latencykit.integrations.asgi import DeadlineMiddleware, Receive, Scope, Send
from latencykit.integrations.httpx import send_deadline
from latencykit.testing import Behavior, FakeProvider

BUDGET = 0.5  # the gateway's deadline, seconds


def make_app(llm: lk.LLM) -> DeadlineMiddleware:
    """The app: one LLM call per request; no timeout of its own."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        answer = await llm.acompletion(messages=[{"role": "user", "content": "Summarise."}])
        body = str(answer.choices[0].message.content).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return DeadlineMiddleware(app)  # reads grpc-timeout, x-request-timeout-ms or baggage


async def main() -> None:
    with FakeProvider() as fake:
        fake.script("slow-model", Behavior(ttft=30.0))  # queued at the provider: 30 s
        async with lk.LLM(
            "openai/slow-model", api_base=fake.base_url, api_key="sk-fake", transport="openai"
        ) as llm:
            transport = httpx.ASGITransport(app=make_app(llm))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://app", event_hooks={"request": [send_deadline]}
            ) as gateway:
                started = time.monotonic()
                try:
                    with lk.deadline(BUDGET):
                        outcome = f"HTTP {(await gateway.get('/answer')).status_code}"
                except lk.DeadlineExceeded:
                    outcome = "HTTP 504"  # the gateway's own deadline ended first: the same
                back = time.monotonic() - started - BUDGET
        [call] = await fake.wait_for_async(lambda seen: seen[0].disconnected)
        assert call.disconnected_at is not None
        closed = call.disconnected_at - started - BUDGET
        sent = int(call.request_headers["x-request-timeout-ms"])
        print(f"gateway: {outcome}, control back within 0.2 s of its deadline: {back < 0.2}")
        print(f"provider was told the time left: {0 < sent <= BUDGET * 1000}")
        print(f"provider saw the request closed within 0.2 s of the deadline: {closed < 0.2}")
        print(f"provider answered: {call.completed}")


if __name__ == "__main__":
    anyio.run(main)
