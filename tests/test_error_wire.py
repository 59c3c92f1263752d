"""Errors that say what happened, from what providers actually send: the waits they ask for
(headers, Gemini's body, the reset of an exhausted limit), Gemini's bad key, no made-up status
where no HTTP answer came, the fast lane's messages, and a process out of file descriptors."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

import latencykit as lk
from latencykit._openai import HTTPError, _error_of
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "hello"}]
K = lk.ErrorKind


def answer(status: int, body: object = b"", headers: Mapping[str, str] | None = None) -> HTTPError:
    """The fast lane's error for an answer, as it builds it (``_error_of``)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, headers=headers, content=raw, request=request)
    return _error_of(response, raw, None)


def gemini_error(code: int, status: str, message: str, *details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status, "details": [*details]}}


def retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


GEMINI_429 = gemini_error(
    429, "RESOURCE_EXHAUSTED", "Resource has been exhausted.", retry_info("2s")
)
GEMINI_BAD_KEY = gemini_error(
    400,
    "INVALID_ARGUMENT",
    "API key not valid. Please pass a valid API key.",
    {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "API_KEY_INVALID",
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"},
    },
)


def rfc3339_in(seconds: float) -> str:
    when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


# --- retry_after: the waits providers send ------------------------------------------------------

OPENAI_LIMITS = {"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"}


@pytest.mark.parametrize(
    ("headers", "body", "wait"),
    [
        # Gemini: the wait is in the body, a dict or a list of errors
        ({}, GEMINI_429, 2.0),
        ({}, [GEMINI_429], 2.0),
        ({}, gemini_error(429, "RESOURCE_EXHAUSTED", "x", retry_info("0.250s")), 0.25),
        # OpenAI: the reset of the limit that ran out (remaining 0), not of the other one
        (
            {
                **OPENAI_LIMITS,
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-remaining-tokens": "29000",
                "x-ratelimit-reset-tokens": "20ms",
            },
            {},
            360.0,
        ),
        (
            {
                **OPENAI_LIMITS,
                "x-ratelimit-remaining-requests": "499",
                "x-ratelimit-reset-requests": "120ms",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "1m2.5s",
            },
            {},
            62.5,
        ),
        # both ran out: the later reset
        (
            {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "1h0m3s",
            },
            {},
            3603.0,
        ),
        # none ran out: the resets say nothing about this error
        (
            {"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "1s"},
            {},
            None,
        ),
        # retry-after-ms / retry-after, where sent, beat the resets
        (
            {
                "retry-after-ms": "1500",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "9s",
            },
            {},
            1.5,
        ),
        (
            {
                "retry-after": "4",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "9s",
            },
            {},
            4.0,
        ),
    ],
    ids=[
        "gemini-body",
        "gemini-list",
        "gemini-fraction",
        "openai-requests-exhausted",
        "openai-tokens-exhausted",
        "openai-both-exhausted",
        "openai-none-exhausted",
        "retry-after-ms-first",
        "retry-after-first",
    ],
)
def test_retry_after_reads_the_wait_providers_send(
    headers: dict[str, str], body: object, wait: float | None
) -> None:
    error = answer(429, body, headers)
    expected = None if wait is None else pytest.approx(wait)
    assert lk.errors.retry_after(error) == expected
    assert lk.errors.provider_error(error, target="t").retry_after == expected


def test_retry_after_reads_anthropic_resets_as_times() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": rfc3339_in(5),
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": rfc3339_in(30),
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-output-tokens-reset": rfc3339_in(60),
    }
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "rate limited"}}
    wait = lk.errors.retry_after(answer(429, body, headers))
    assert wait is not None and 20 < wait <= 30  # the input tokens' reset, in whole seconds


# --- the fast lane's messages -------------------------------------------------------------------

TEMPERATURE = "Invalid value for 'temperature'."


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (400, {"error": {"message": TEMPERATURE, "type": "invalid_request_error"}}, TEMPERATURE),
        (
            400,
            {
                "object": "error",
                "message": TEMPERATURE,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            TEMPERATURE,
        ),
        (400, [{"error": {"code": 400, "message": TEMPERATURE}}], TEMPERATURE),
        (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": TEMPERATURE}},
            TEMPERATURE,
        ),
        (400, f"{TEMPERATURE}\nat line 1\n".encode(), TEMPERATURE),
        (
            502,
            b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>"
            b"502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>",
            "502 Bad Gateway",
        ),
        (502, b"<html><body><h1>Bad gateway</h1><p>upstream down</p></body></html>", "Bad gateway"),
        (422, {"detail": "Unprocessable request"}, "Unprocessable request"),
        (502, b"", "Bad Gateway"),
        (503, b"   ", "Service Unavailable"),
    ],
    ids=[
        "openai",
        "vllm",
        "gemini-list",
        "anthropic",
        "text",
        "nginx-html",
        "html",
        "fastapi",
        "empty",
        "blank",
    ],
)
def test_fast_lane_reads_the_message_wherever_providers_put_it(
    status: int, body: object, message: str
) -> None:
    error = lk.errors.provider_error(answer(status, body), target="openai/m")
    assert error.provider_message == message
    assert str(error) == f"openai/m: {error.kind.value} (HTTP {status}): {message}"


def test_a_long_text_body_gives_a_short_message() -> None:
    error = answer(500, ("x" * 5000).encode())
    assert str(error).startswith("xxx") and len(str(error)) <= 200


@pytest.mark.anyio
async def test_fast_lane_errors_say_what_the_provider_said(fake_provider: FakeProvider) -> None:
    vllm = {"object": "error", "message": "bad top_k", "type": "BadRequestError", "code": 400}
    fake_provider.script(
        "vllm", Behavior(fault=Fault.HTTP_ERROR, status=400, body=json.dumps(vllm))
    )
    fake_provider.script("bare", Behavior(fault=Fault.HTTP_ERROR, status=502, body=""))
    for model, expected in (
        ("vllm", "bad_request (HTTP 400): bad top_k"),
        ("bare", "server_error (HTTP 502): Bad Gateway"),
    ):
        client = lk.LLM(
            f"openai/{model}",
            api_base=fake_provider.base_url,
            api_key="sk-fake",
            transport="openai",
        )
        with pytest.raises(lk.ProviderError) as info:
            await client.acompletion(messages=MESSAGES)
        assert str(info.value).splitlines()[0] == f"openai/{model}: {expected}"


# --- through litellm: Gemini's answers, served as Google sends them ---------------------------


class RawServer:
    """A loopback HTTP server answering every POST with the same status, headers and body
    (the fake provider speaks OpenAI's protocol; this one serves Google's bytes as they are)."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.arrivals: list[tuple[float, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                outer.arrivals.append((time.monotonic(), self.path))
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(status)
                for name, value in {"content-type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def gemini(server: RawServer, **options: Any) -> lk.LLM:
    return lk.LLM("gemini/gemini-2.0-flash", api_base=server.url, api_key="AIza-fake", **options)


async def call(client: lk.LLM, arguments: Mapping[str, Any]) -> Any:
    response = await client.acompletion(**{"messages": MESSAGES, **arguments})
    if arguments.get("stream"):
        async with response:
            async for _ in response:
                pass
    return response


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("shape", ["dict", "list"])
async def test_gemini_retry_delay_is_honoured(stream: bool, shape: str) -> None:
    body = gemini_error(429, "RESOURCE_EXHAUSTED", "Resource exhausted.", retry_info("1s"))
    server = RawServer(429, json.dumps(body if shape == "dict" else [body]).encode())
    try:
        client = gemini(server, retry=lk.Retry(max_attempts=2, initial=0.01, max_wait=0.01))
        with pytest.raises(lk.RateLimited) as info:
            await call(client, {"stream": stream})
    finally:
        server.close()
    assert server.arrivals[0][1].startswith("/models/gemini-2.0-flash:")  # Google's path
    assert info.value.retry_after == pytest.approx(1.0)
    assert info.value.status_code == 429
    (first, _), (second, _) = server.arrivals
    assert second - first >= 1.0 - 0.02  # the wait was honoured


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_gemini_bad_key_is_an_authentication_error(stream: bool) -> None:
    server = RawServer(400, json.dumps(GEMINI_BAD_KEY).encode())
    try:
        other = {"model": "gemini/gemini-2.0-pro", "api_base": server.url, "api_key": "AIza-fake"}
        client = gemini(server, failover=[other])
        with pytest.raises(lk.AuthenticationFailed) as info:
            await call(client, {"stream": stream})
    finally:
        server.close()
    assert info.value.kind is K.AUTHENTICATION and info.value.status_code == 400
    assert len(server.arrivals) == 1  # a bad key is not failed over


def test_gemini_bad_key_on_the_fast_lane_is_an_authentication_error() -> None:
    assert lk.errors.classify(answer(400, GEMINI_BAD_KEY)) is K.AUTHENTICATION
    assert lk.errors.classify(answer(400, [GEMINI_BAD_KEY])) is K.AUTHENTICATION


# --- no status where no HTTP answer came ---------------------------------------------------------


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["refused", "reset", "cut-stream", "timeout", "messages-none"])
async def test_litellm_lane_claims_no_status_without_an_answer(
    fake_provider: FakeProvider, case: str
) -> None:
    fake_provider.script("reset", Behavior(fault=Fault.RESET_BEFORE_HEADERS))
    fake_provider.script("cut", Behavior(fault=Fault.CUT, stall_after=0))
    fake_provider.script("slow", Behavior(ttft=30))
    cases: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
        "refused": ("x", {"api_base": f"http://127.0.0.1:{refused_port()}/v1"}, {}),
        "reset": ("reset", {}, {}),
        "cut-stream": ("cut", {}, {"stream": True}),
        "timeout": ("slow", {"timeout": 0.5}, {}),
        "messages-none": ("m", {}, {"messages": None}),
    }
    model, options, arguments = cases[case]
    options = {"api_base": fake_provider.base_url, "api_key": "sk-fake", **options}
    client = lk.LLM(f"openai/{model}", **options)
    with pytest.raises(lk.ProviderError) as info:
        await call(client, arguments)
    assert info.value.status_code is None
    assert "(HTTP" not in str(info.value)


# --- out of file descriptors ---------------------------------------------------------------------

EMFILE_SCRIPT = textwrap.dedent(
    """
    import json, os, resource
    import anyio
    import latencykit as lk
    from latencykit.testing import Behavior, FakeProvider, Fault
    import litellm

    litellm.suppress_debug_info = True

    def lowest_free_descriptor():
        fd = 0
        while True:
            try:
                os.fstat(fd)
            except OSError:
                return fd
            fd += 1

    async def main(fake, transport):
        llm = lk.LLM(
            "openai/m",
            api_base=fake.base_url,
            api_key="sk-fake",
            transport=transport,
            breaker={"minimum_calls": 50, "window_size": 50},
        )
        messages = [{"role": "user", "content": "hi"}]
        try:  # set the client up (it opens files); the server closes the connection
            await llm.acompletion(messages=messages)
        except lk.ProviderConnectionError:
            pass
        breaker = lk.policies.breaker.breakers()["openai/m"]
        before = breaker.metrics()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        # No descriptor left: the next socket the call opens fails with EMFILE.
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free_descriptor(), hard))
        try:
            await llm.acompletion(messages=messages)
        except Exception as error:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            after = breaker.metrics()
            return {
                "type": type(error).__name__,
                "kind": lk.errors.classify(error).value,
                "status": getattr(error, "status_code", None),
                "message": str(error).splitlines()[0],
                "breaker": [before.calls, before.failures, after.calls, after.failures],
            }
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return {"type": "no error"}

    results = {}
    with FakeProvider() as fake:
        fake.script("m", Behavior(fault=Fault.CLOSE_BEFORE_HEADERS))
        for backend in ("asyncio", "trio"):
            for transport in ("litellm", "openai"):
                lk.policies.breaker.reset_breakers()
                lane = f"{backend}-{transport}"
                results[lane] = anyio.run(main, fake, transport, backend=backend)
    print(json.dumps(results))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_running_out_of_file_descriptors_says_so_and_spares_the_breaker() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-c", EMFILE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == {"asyncio-litellm", "asyncio-openai", "trio-litellm", "trio-openai"}
    for lane, result in results.items():
        assert result["type"] == "ProviderError", (lane, result)
        assert result["kind"] == "unknown", (lane, result)  # not transient: raised at once
        assert "too many open files (EMFILE)" in result["message"], (lane, result)
        assert result["status"] is None, (lane, result)
        calls, failures, calls_after, failures_after = result["breaker"]
        assert (calls_after, failures_after) == (calls, failures), (lane, result)
