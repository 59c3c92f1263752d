"""Deadlines on the wire (latencykit.propagation), the ASGI middleware that opens a request's
deadline from them, the httpx hook that sends the remainder on, and the header both lanes send
to providers (checked on the fake provider, over loopback)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

import latencykit as lk
from helpers import MESSAGES, make_llm, read_all
from latencykit import propagation
from latencykit.integrations.asgi import DeadlineMiddleware, Message, Receive, Scope, Send
from latencykit.integrations.httpx import send_deadline
from latencykit.testing import Behavior, FakeProvider

pytestmark = pytest.mark.anyio


# --- reading a budget ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("250m", 0.25),
        ("500000u", 0.5),
        ("99999999n", 0.099999999),
        (" 7S ", 7.0),
    ],
)
def test_grpc_timeout_units(value: str, seconds: float) -> None:
    assert propagation.budget_of({"grpc-timeout": value}) == pytest.approx(seconds)


def test_the_smallest_of_the_three_forms_wins() -> None:
    in_2s = math.floor((time.time() + 2) * 1000)
    headers = {"grpc-timeout": "5S", "x-request-timeout-ms": "3000", "baggage": f"deadline={in_2s}"}
    assert propagation.budget_of(headers) == pytest.approx(2, abs=0.1)
    headers["x-request-timeout-ms"] = "1500"
    assert propagation.budget_of(headers) == pytest.approx(1.5)
    headers["grpc-timeout"] = "400m"
    assert propagation.budget_of(headers) == pytest.approx(0.4)


def test_asgi_header_pairs_in_any_case_and_baggage_among_other_members() -> None:
    in_1s = math.floor((time.time() + 1) * 1000)
    pairs = [
        (b"Baggage", b"userId=alice, tenant=t1"),
        (b"baggage", f"region=eu;ttl=3, deadline = {in_1s};p=1".encode()),
        (b"X-Request-Timeout-Ms", b"9000.5"),
    ]
    assert propagation.budget_of(pairs) == pytest.approx(1, abs=0.1)


def test_no_deadline_said_is_none_and_a_spent_one_is_zero() -> None:
    assert propagation.budget_of({"content-type": "application/json"}) is None
    assert propagation.budget_of([]) is None
    assert propagation.budget_of({"baggage": "deadline=1000"}) == 0.0  # in 1970
    assert propagation.budget_of({"x-request-timeout-ms": "0"}) == 0.0


@pytest.mark.parametrize(
    "headers",
    [
        {"grpc-timeout": "5s"},  # lowercase s is not a unit
        {"grpc-timeout": "123456789S"},  # at most 8 digits
        {"grpc-timeout": "S"},
        {"x-request-timeout-ms": "-5"},
        {"x-request-timeout-ms": "1e3"},
        {"x-request-timeout-ms": "nan"},
        {"x-request-timeout-ms": ""},
        {"baggage": "deadline=tomorrow"},
        {"baggage": "deadline"},
    ],
)
def test_garbage_is_ignored_with_a_debug_line(
    headers: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="latencykit"):
        assert propagation.budget_of(headers) is None
    assert "does not parse" in caplog.text
    # ...and a valid value beside it still counts.
    assert propagation.budget_of([*headers.items(), ("grpc-timeout", "50m")]) == 0.05


# --- writing the remainder -------------------------------------------------------------------


def test_inject_writes_floored_millis_and_an_absolute_baggage_deadline() -> None:
    headers: dict[str, str] = {}
    before = time.time()
    propagation.inject(headers, 1.2345)
    assert headers["x-request-timeout-ms"] == "1234"
    [member] = headers["baggage"].split(",")
    key, value = member.split("=")
    assert key == "deadline"
    assert before + 1.2 <= int(value) / 1000 <= time.time() + 1.24
    assert propagation.budget_of(headers) == pytest.approx(1.234, abs=0.05)


def test_inject_keeps_the_requests_baggage_and_an_earlier_deadline() -> None:
    soon = math.floor((time.time() + 0.5) * 1000)
    headers = {"baggage": f"userId=alice;p=1, deadline={soon}, tenant=t1"}
    propagation.inject(headers, 30.0)
    assert headers["x-request-timeout-ms"] == "30000"
    members = headers["baggage"].split(",")
    assert members[:2] == ["userId=alice;p=1", " tenant=t1"]
    assert members[2] == f"deadline={soon}"  # earlier than ours: kept
    later = {"baggage": "deadline=99999999999999"}
    propagation.inject(later, 30.0)
    assert propagation.budget_of(later) == pytest.approx(30, abs=0.1)


@pytest.fixture
def app_baggage() -> Iterator[None]:
    """The app's own OpenTelemetry baggage in the current context, for the test."""
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("userId", "alice"))
    yield
    context.detach(token)


@pytest.mark.usefixtures("app_baggage")
def test_inject_carries_the_opentelemetry_baggage_of_the_app() -> None:
    headers: dict[str, str] = {}
    propagation.inject(headers, 2.0)
    members = sorted(headers["baggage"].split(","))
    assert members[1] == "userId=alice"
    assert members[0].startswith("deadline=")
    assert propagation.budget_of(headers) == pytest.approx(2, abs=0.1)
    assert "traceparent" not in headers  # baggage only: tracing is the app's business


async def test_inject_outside_a_deadline_writes_nothing() -> None:
    headers: dict[str, str] = {}
    propagation.inject(headers)
    assert headers == {}
    with lk.deadline(5):
        propagation.inject(headers)
    assert 4000 < int(headers["x-request-timeout-ms"]) <= 5000


async def test_provider_headers_inside_a_deadline_only_and_the_opt_out() -> None:
    mine = {"x-trace": "1"}
    assert propagation.provider_headers(mine) is mine
    assert propagation.provider_headers(None) is None
    with lk.deadline(5):
        sent = propagation.provider_headers(mine)
        assert sent is not None and sent["x-trace"] == "1"
        assert 4000 < int(sent["x-request-timeout-ms"]) <= 5000
        assert "baggage" not in sent  # never the app's baggage to a provider
        own = {"X-Request-Timeout-Ms": "50"}
        assert propagation.provider_headers(own) is own  # the caller's own value stays
        propagation.send_to_providers(False)
        try:
            assert propagation.provider_headers(mine) is mine
        finally:
            propagation.send_to_providers(True)
    with pytest.raises(TypeError, match=r"send_to_providers\.enabled"):
        propagation.send_to_providers("no")  # type: ignore[arg-type]


# --- both lanes send the header to the provider ----------------------------------------------


@pytest.mark.parametrize("transport", ["litellm", "openai"])
async def test_llm_calls_inside_a_deadline_send_the_remainder(
    fake: FakeProvider, transport: str
) -> None:
    async with make_llm(fake, transport=transport) as llm:
        await llm.acompletion(messages=MESSAGES)  # outside a deadline: no header
        with lk.deadline(20):
            await llm.acompletion(messages=MESSAGES)
            await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    outside, response, stream = fake.attempts
    assert "x-request-timeout-ms" not in outside.request_headers
    for inside in (response, stream):
        assert 10_000 < int(inside.request_headers["x-request-timeout-ms"]) <= 20_000
        assert "baggage" not in inside.request_headers
    assert stream.stream


@pytest.mark.parametrize("transport", ["litellm", "openai"])
async def test_embeddings_and_responses_inside_a_deadline_send_it_too(
    fake: FakeProvider, transport: str
) -> None:
    async with make_llm(fake, "gpt-4o-mini", transport=transport) as llm:
        with lk.deadline(20):
            await llm.aembedding(input=["hello"])
            if transport == "litellm":  # the Responses API goes through litellm only
                await llm.aresponses(input="hello")
    for seen in fake.attempts:
        assert 10_000 < int(seen.request_headers["x-request-timeout-ms"]) <= 20_000
    assert len(fake.attempts) == (2 if transport == "litellm" else 1)


async def test_the_deadline_header_costs_no_connection(fake: FakeProvider) -> None:
    # litellm caches its HTTP clients by their settings: a header that changes every call
    # must not be one of them (a new connection per call).
    async with make_llm(fake) as llm:
        for budget in (20, 19, 18):
            with lk.deadline(budget):
                await llm.acompletion(messages=MESSAGES)
    assert len({a.connection_id for a in fake.attempts}) == 1


# --- the httpx hook --------------------------------------------------------------------------


async def test_send_deadline_hook_tells_the_next_service_and_cuts_the_timeout(
    fake: FakeProvider,
) -> None:
    fake.default = Behavior()
    seen: list[dict[str, Any]] = []

    async def timeouts(request: httpx.Request) -> None:
        seen.append(request.extensions["timeout"])

    hooks = {"request": [send_deadline, timeouts]}
    async with httpx.AsyncClient(event_hooks=hooks, timeout=60) as client:
        url = f"{fake.base_url}/chat/completions"
        body = {"model": "m", "messages": MESSAGES}
        await client.post(url, json=body)
        with lk.deadline(3):
            await client.post(url, json=body, headers={"baggage": "userId=alice"})
    outside, inside = fake.attempts
    assert "x-request-timeout-ms" not in outside.request_headers
    assert 2000 < int(inside.request_headers["x-request-timeout-ms"]) <= 3000
    baggage = inside.request_headers["baggage"]
    assert baggage.startswith("userId=alice,deadline=")
    assert seen[0]["read"] == 60
    assert all(0 < limit <= 3 for limit in seen[1].values())


# --- the ASGI middleware (driven in-process through httpx's ASGITransport) --------------------


def _app(sleep: float = 0.0, *, stream: bool = False) -> Any:
    """An ASGI app answering the deadline it runs in (``lk.remaining()``) after ``sleep``
    seconds; with ``stream``, its response starts before the sleep."""
    calls: list[float | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(lk.remaining())
        start: Message = {"type": "http.response.start", "status": 200, "headers": []}
        if stream:
            await send(start)
        await anyio.sleep(sleep)
        if not stream:
            await send(start)
        await send({"type": "http.response.body", "body": repr(calls[-1]).encode()})

    app.calls = calls  # type: ignore[attr-defined]
    return app


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


@pytest.mark.virtual_time
async def test_middleware_runs_the_request_in_the_callers_deadline() -> None:
    app = _app()
    async with _client(DeadlineMiddleware(app, maximum=10)) as client:
        assert (await client.get("/", headers={"grpc-timeout": "2S"})).status_code == 200
        await client.get("/", headers={"x-request-timeout-ms": "60000"})  # capped at 10 s
        await client.get("/")  # no deadline said, no default: none
    assert app.calls == [pytest.approx(2), pytest.approx(10), None]


@pytest.mark.virtual_time
async def test_middleware_answers_504_when_the_deadline_expires_first() -> None:
    app = _app(sleep=30)
    async with _client(DeadlineMiddleware(app, default=1.5)) as client:
        start = anyio.current_time()
        response = await client.get("/")
        assert anyio.current_time() - start == pytest.approx(1.5)
        assert response.status_code == 504
        assert response.text == "deadline exceeded"
        spent = await client.get("/", headers={"x-request-timeout-ms": "0"})
        assert spent.status_code == 504
    assert len(app.calls) == 1  # the spent one never reached the app


@pytest.mark.virtual_time
async def test_middleware_aborts_a_started_response_and_leaves_the_apps_own_deadline() -> None:
    async with _client(DeadlineMiddleware(_app(sleep=30, stream=True), default=1)) as client:
        with pytest.raises(lk.DeadlineExceeded):  # the server aborts the half-sent answer
            await client.get("/")

    async def own_deadline(scope: Scope, receive: Receive, send: Send) -> None:
        with lk.deadline(0.5):
            await anyio.sleep(30)

    async with _client(DeadlineMiddleware(own_deadline, default=10)) as client:
        with pytest.raises(lk.DeadlineExceeded) as info:
            await client.get("/")
        assert info.value.budget == pytest.approx(0.5)


async def test_middleware_passes_other_scopes_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        return {}

    async def drop(message: Message) -> None:
        pass

    await DeadlineMiddleware(app, default=1)({"type": "lifespan"}, nothing, drop)
    assert seen == ["lifespan"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"default": 0}, r"DeadlineMiddleware\.default must be a positive"),
        ({"maximum": -1}, r"DeadlineMiddleware\.maximum must be a positive"),
        ({"default": math.inf}, r"DeadlineMiddleware\.default must be a positive"),
    ],
)
def test_middleware_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeadlineMiddleware(_app(), **options)
    with pytest.raises(TypeError, match=r"DeadlineMiddleware\.default"):
        DeadlineMiddleware(_app(), default="1s")  # type: ignore[arg-type]
