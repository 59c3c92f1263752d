"""The error classifier and the typed exceptions (pure logic; litellm classes via the fake
provider are covered in test_llm.py)."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import pytest

import latencykit as lk
from latencykit.errors import provider_error, scrub


class StatusError(Exception):
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.headers = headers or {}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, lk.ErrorKind.RATE_LIMITED),
        (408, lk.ErrorKind.TIMEOUT),
        (500, lk.ErrorKind.SERVER_ERROR),
        (503, lk.ErrorKind.SERVER_ERROR),
        (401, lk.ErrorKind.AUTHENTICATION),
        (403, lk.ErrorKind.AUTHENTICATION),
        (400, lk.ErrorKind.BAD_REQUEST),
        (404, lk.ErrorKind.NOT_FOUND),
        (409, lk.ErrorKind.BAD_REQUEST),
        (413, lk.ErrorKind.BAD_REQUEST),
        (422, lk.ErrorKind.BAD_REQUEST),
        (504, lk.ErrorKind.TIMEOUT),
        (529, lk.ErrorKind.SERVER_ERROR),
    ],
)
def test_classify_by_status(status: int, kind: lk.ErrorKind) -> None:
    assert lk.errors.classify(StatusError(status)) is kind


def test_classify_builtin_errors() -> None:
    assert lk.errors.classify(TimeoutError()) is lk.ErrorKind.TIMEOUT
    assert lk.errors.classify(lk.DeadlineExceeded(1.0, 1.0)) is lk.ErrorKind.TIMEOUT
    assert lk.errors.classify(ConnectionRefusedError()) is lk.ErrorKind.CONNECTION
    assert lk.errors.classify(ValueError("bug")) is lk.ErrorKind.UNKNOWN
    assert not lk.errors.is_transient(ValueError("bug"))
    assert lk.errors.is_transient(ConnectionResetError())


def test_server_error_caused_by_a_refused_connection_is_a_connection_error() -> None:
    outer = StatusError(500)
    outer.__cause__ = ConnectionRefusedError("refused")
    assert lk.errors.classify(outer) is lk.ErrorKind.CONNECTION


def test_transient_kinds() -> None:
    transient = {k for k in lk.ErrorKind if k.transient}
    assert transient == {
        lk.ErrorKind.RATE_LIMITED,
        lk.ErrorKind.SERVER_ERROR,
        lk.ErrorKind.CONNECTION,
        lk.ErrorKind.TIMEOUT,
        lk.ErrorKind.STREAM_BROKEN,
        lk.ErrorKind.CIRCUIT_OPEN,
        lk.ErrorKind.LIMIT_EXCEEDED,
    }


def test_retry_after_forms() -> None:
    assert lk.errors.retry_after(StatusError(429, {"retry-after": "2"})) == 2.0
    assert lk.errors.retry_after(StatusError(429, {"retry-after-ms": "1500"})) == 1.5
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    after = lk.errors.retry_after(StatusError(429, {"retry-after": date}))
    assert after is not None and 25 < after <= 31
    assert lk.errors.retry_after(StatusError(429, {"retry-after": "soon"})) is None
    assert lk.errors.retry_after(StatusError(429)) is None
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = StatusError(429, {"retry-after": "3"})
    assert lk.errors.retry_after(wrapped) == 3.0
    # litellm keeps a provider's headers under "llm_provider-": they count as the provider's.
    assert lk.errors.retry_after(StatusError(429, {"llm_provider-retry-after": "4"})) == 4.0
    # No asked wait: the reset of the limit that is exhausted (not of one with room left).
    exhausted = {
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert lk.errors.retry_after(StatusError(429, exhausted)) == 360.0


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (429, lk.RateLimited),
        (503, lk.ProviderUnavailable),
        (408, lk.AttemptTimeout),
        (401, lk.AuthenticationFailed),
        (400, lk.BadRequest),
    ],
)
def test_provider_error_types(status: int, cls: type[lk.ProviderError]) -> None:
    error = provider_error(StatusError(status, {"retry-after": "1"}), target="openai/x")
    assert type(error) is cls
    assert error.target == "openai/x"
    assert error.status_code == status
    assert error.retry_after == 1.0
    assert str(error).startswith(f"openai/x: {cls.kind.value} (HTTP {status}):")


def test_transient_provider_errors_share_a_base() -> None:
    assert issubclass(lk.RateLimited, lk.TransientError)
    assert issubclass(lk.AttemptTimeout, TimeoutError)
    assert not issubclass(lk.ContentPolicyViolation, lk.TransientError)
    assert issubclass(lk.DeadlineExceeded, TimeoutError)


def test_secrets_never_reach_messages() -> None:
    raw = StatusError(401)
    raw.args = ("Incorrect API key provided: sk-abcdef1234567890XYZ. Authorization: Bearer tok.en",)
    error = provider_error(raw, target="openai/x", secrets=("my-own-secret",))
    assert "sk-abcdef" not in str(error)
    assert "tok.en" not in str(error)
    assert scrub("key my-own-secret here", "my-own-secret") == "key *** here"
    assert scrub('{"api_key": "abc123"}') == '{"***"}'


def test_long_provider_messages_are_cut() -> None:
    raw = StatusError(500)
    raw.args = ("x" * 5000,)
    assert len(provider_error(raw, target="t").provider_message) == 500


def test_attempt_history_is_rendered_in_the_message() -> None:
    error = lk.DeadlineExceeded(2.0, 2.01)
    error.attempts = (
        lk.Attempt(1, "openai/gpt-4o", 0.0, 2.01, "cancelled"),
        lk.Attempt(2, "openai/mini", 1.5, 0.2, "error", "RateLimited", lk.ErrorKind.RATE_LIMITED),
    )
    text = str(error)
    assert "deadline of 2.000s exceeded after 2.010s" in text
    assert "#1 openai/gpt-4o at +0.000s for 2.010s: cancelled" in text
    assert "#2 openai/mini at +1.500s for 0.200s: RateLimited [rate_limited]" in text


def _litellm_errors() -> list[tuple[BaseException, lk.ErrorKind]]:
    import httpx
    from litellm import exceptions as e

    def response(status: int) -> httpx.Response:
        return httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/v1"))

    common: dict[str, Any] = {"model": "m", "llm_provider": "openai"}
    refused = e.InternalServerError("Connection error.", response=response(500), **common)
    refused.__cause__ = e.APIConnectionError("Connection error.", **common)
    return [
        (
            e.RateLimitError("slow down", response=response(429), **common),
            lk.ErrorKind.RATE_LIMITED,
        ),
        (
            e.InternalServerError("boom", response=response(500), **common),
            lk.ErrorKind.SERVER_ERROR,
        ),
        (refused, lk.ErrorKind.CONNECTION),
        (
            e.ServiceUnavailableError("busy", response=response(503), **common),
            lk.ErrorKind.SERVER_ERROR,
        ),
        (e.BadGatewayError("gw", response=response(502), **common), lk.ErrorKind.SERVER_ERROR),
        (e.Timeout("took too long", **common), lk.ErrorKind.TIMEOUT),
        (e.APIConnectionError("refused", **common), lk.ErrorKind.CONNECTION),
        (
            e.MidStreamFallbackError("stream died", generated_content="par", **common),
            lk.ErrorKind.STREAM_BROKEN,
        ),
        (e.ContextWindowExceededError("too long", **common), lk.ErrorKind.CONTEXT_LENGTH),
        (e.ContentPolicyViolationError("flagged", **common), lk.ErrorKind.CONTENT_POLICY),
        (
            e.AuthenticationError("bad key", response=response(401), **common),
            lk.ErrorKind.AUTHENTICATION,
        ),
        (
            e.PermissionDeniedError("no", response=response(403), **common),
            lk.ErrorKind.AUTHENTICATION,
        ),
        (
            e.NotFoundError("no such model", response=response(404), **common),
            lk.ErrorKind.NOT_FOUND,
        ),
        (e.BadRequestError("bad", response=response(400), **common), lk.ErrorKind.BAD_REQUEST),
        (
            e.UnprocessableEntityError("bad", response=response(422), **common),
            lk.ErrorKind.BAD_REQUEST,
        ),
    ]


def test_classify_every_litellm_exception_type() -> None:
    # Built directly from litellm's classes (pure classification); test_llm.py checks the same
    # kinds arise from real HTTP faults through litellm.
    for error, kind in _litellm_errors():
        assert lk.errors.classify(error) is kind, type(error).__name__
        assert type(provider_error(error, target="t")).kind is kind
