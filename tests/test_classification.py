"""The classification table (docs/errors.md), one row at a time, end to end: lk.LLM, real
litellm, the fake provider sending what real providers send. Each row checks the exception
class and kind, whether the same target is retried, whether failover moves on, and whether the
target's breaker counts it; non-streaming and streaming (the error comes before the first
chunk)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
K = lk.ErrorKind


def http(status: int, message: str | None = None, **fields: Any) -> Behavior:
    return Behavior(fault=Fault.HTTP_ERROR, status=status, error_message=message, **fields)


def raw(status: int, body: object) -> Behavior:
    text = body if isinstance(body, str) else json.dumps(body)
    return Behavior(fault=Fault.HTTP_ERROR, status=status, body=text)


@dataclass(frozen=True)
class Row:
    """One row of the table: what the provider sends, and what latencykit does with it."""

    behavior: Behavior
    error: type[lk.ProviderError]
    kind: lk.ErrorKind
    retried: bool = False
    failed_over: bool = False
    health: bool = False  # counts against the target's breaker
    retry_after: float | None = None
    status: int = field(init=False)

    def __post_init__(self) -> None:
        classic: dict[Fault | None, int] = {
            Fault.HTTP_429: 429,
            Fault.HTTP_500: 500,
            Fault.HTTP_503: 503,
            Fault.CONTENT_POLICY: 400,
        }
        status = classic.get(self.behavior.fault, self.behavior.status)
        object.__setattr__(self, "status", status)


def transient(
    behavior: Behavior, error: type[lk.ProviderError], kind: lk.ErrorKind, **kw: Any
) -> Row:
    """A provider-health failure: counted by the breaker, failed over."""
    return Row(behavior, error, kind, failed_over=True, health=True, **kw)


CONTEXT_WORDINGS = {
    "openai-code": http(
        400,
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens. Please reduce the length of the messages.",
        error_type="invalid_request_error",
        error_code="context_length_exceeded",
    ),
    "responses-api": http(
        400,
        "Your input exceeds the context window of this model. Please adjust your input and "
        "try again.",
        error_type="invalid_request_error",
    ),
    "anthropic": raw(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 201234 tokens > 200000 maximum",
            },
        },
    ),
    "vllm": raw(
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5000 tokens (4000 in the messages, 1000 in the completion). Please "
            "reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    "mistral": http(
        400,
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length",
        error_type="invalid_request_error",
    ),
    "gemini": raw(
        400,
        [
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200293) exceeds the maximum number "
                    "of tokens allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ],
    ),
    "bedrock": http(
        400, "Input is too long for requested model.", error_type="ValidationException"
    ),
    "xai": http(
        400, "This model's maximum prompt length is 131072 but the request contains 136973 tokens."
    ),
    "cohere": http(400, "too many tokens: total number of tokens in the prompt cannot exceed 4081"),
    "tgi-422": raw(
        422,
        {
            "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= "
            "4096. Given: 5000 `inputs` tokens and 100 `max_new_tokens`",
            "error_type": "validation",
        },
    ),
    "llama.cpp": http(
        400,
        "the request exceeds the available context size, try increasing it",
        error_type="exceed_context_size_error",
    ),
    "error-event": Behavior(fault=Fault.ERROR_EVENT, error="context_length", stall_after=0),
}

CONTENT_FILTERS = {
    "openai-code": Behavior(fault=Fault.CONTENT_POLICY),
    "openai-wording": http(
        400,
        "Invalid prompt: your prompt was flagged as potentially violating our usage policy.",
        error_type="invalid_request_error",
        error_code="invalid_prompt",
    ),
    "azure": raw(
        400,
        {
            "error": {
                "message": "The response was filtered due to the prompt triggering Azure "
                "OpenAI's content management policy.",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation"},
            }
        },
    ),
    "anthropic": http(400, "Output blocked by content filtering policy"),
    "error-event": Behavior(fault=Fault.ERROR_EVENT, error="content_filter", stall_after=0),
}

ROWS: dict[str, Row] = {
    "401": Row(
        http(401, "Invalid authentication", error_type="invalid_request_error"),
        lk.AuthenticationFailed,
        K.AUTHENTICATION,
    ),
    "401-openai": Row(
        http(401, "Incorrect API key provided.", error_code="invalid_api_key"),
        lk.AuthenticationFailed,
        K.AUTHENTICATION,
    ),
    "403": Row(
        http(
            403,
            "Country, region, or territory not supported",
            error_type="invalid_request_error",
            error_code="unsupported_country_region_territory",
        ),
        lk.AuthenticationFailed,
        K.AUTHENTICATION,
    ),
    "404-model": Row(
        http(
            404,
            "The model `primary` does not exist or you do not have access to it.",
            error_type="invalid_request_error",
            error_code="model_not_found",
        ),
        lk.ModelNotFound,
        K.NOT_FOUND,
        failed_over=True,
    ),
    "404-anthropic": Row(
        raw(404, {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}}),
        lk.ModelNotFound,
        K.NOT_FOUND,
        failed_over=True,
    ),
    "408": transient(http(408), lk.AttemptTimeout, K.TIMEOUT),
    "409": Row(http(409, "Conflict"), lk.BadRequest, K.BAD_REQUEST),
    "413-bytes": Row(
        http(
            413,
            "Request exceeds the maximum allowed number of bytes.",
            error_type="request_too_large",
        ),
        lk.BadRequest,
        K.BAD_REQUEST,
    ),
    "413-groq-tpm": Row(
        http(
            413,
            "Request too large for model `primary` on tokens per minute (TPM): Limit 6000, "
            "Requested 12328, please reduce your message size and try again.",
            error_type="tokens",
            error_code="rate_limit_exceeded",
        ),
        lk.BadRequest,
        K.BAD_REQUEST,
    ),
    "422": Row(http(422, "Unprocessable Entity"), lk.BadRequest, K.BAD_REQUEST),
    "400": Row(
        http(400, "Invalid value for 'temperature'.", error_type="invalid_request_error"),
        lk.BadRequest,
        K.BAD_REQUEST,
    ),
    "429": transient(Behavior(fault=Fault.HTTP_429), lk.RateLimited, K.RATE_LIMITED, retried=True),
    "429-retry-after": transient(
        Behavior(fault=Fault.HTTP_429, retry_after=0.25),
        lk.RateLimited,
        K.RATE_LIMITED,
        retried=True,
        retry_after=0.25,
    ),
    "429-retry-after-ms": transient(
        http(429, "Rate limit reached", headers={"retry-after-ms": "250"}),
        lk.RateLimited,
        K.RATE_LIMITED,
        retried=True,
        retry_after=0.25,
    ),
    "500": transient(
        Behavior(fault=Fault.HTTP_500), lk.ProviderUnavailable, K.SERVER_ERROR, retried=True
    ),
    "502": transient(
        raw(502, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
        lk.ProviderUnavailable,
        K.SERVER_ERROR,
        retried=True,
    ),
    "503-retry-after": transient(
        Behavior(fault=Fault.HTTP_503, retry_after=0.25),
        lk.ProviderUnavailable,
        K.SERVER_ERROR,
        retried=True,
        retry_after=0.25,
    ),
    "504": transient(http(504, "Gateway Timeout"), lk.AttemptTimeout, K.TIMEOUT),
    "529-overloaded": transient(
        raw(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        lk.ProviderUnavailable,
        K.SERVER_ERROR,
        retried=True,
    ),
    **{
        f"context-{name}": Row(behavior, lk.ContextLengthExceeded, K.CONTEXT_LENGTH)
        for name, behavior in CONTEXT_WORDINGS.items()
    },
    **{
        f"content-filter-{name}": Row(behavior, lk.ContentPolicyViolation, K.CONTENT_POLICY)
        for name, behavior in CONTENT_FILTERS.items()
    },
}


def llm(fake: FakeProvider, **options: Any) -> lk.LLM:
    return lk.LLM(
        "openai/primary", api_base=fake.base_url, api_key="sk-fake", timeout=10, **options
    )


def target(fake: FakeProvider, model: str, **extra: Any) -> dict[str, Any]:
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": "sk-fake", **extra}


async def call(client: lk.LLM, stream: bool, messages: list[dict[str, str]] = MESSAGES) -> Any:
    response = await client.acompletion(messages=messages, stream=stream)
    if stream:
        async with response:
            async for _ in response:
                pass
    return response


def primary_attempts(fake: FakeProvider) -> list[float]:
    return [a.arrived_at for a in fake.attempts if a.model == "primary"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_the_error_raised_for_each_row(
    fake_provider: FakeProvider, row: Row, stream: bool
) -> None:
    fake_provider.script("primary", row.behavior)
    with pytest.raises(lk.ProviderError) as info:
        await call(llm(fake_provider), stream)
    error = info.value
    assert (
        type(error) is row.error
        and error.kind is row.kind
        and lk.errors.classify(error) is row.kind
    )
    assert isinstance(error.__cause__, Exception)  # litellm's own exception stays reachable
    if row.behavior.fault is not Fault.ERROR_EVENT:
        assert error.status_code == row.status
    if row.retry_after is None:
        assert error.retry_after is None
    else:
        assert error.retry_after == pytest.approx(row.retry_after)
    assert len(error.attempts) == 1 and error.attempts[0].error_kind is row.kind


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_retried_failed_over_and_counted_as_each_row_says(
    fake_provider: FakeProvider, row: Row, stream: bool
) -> None:
    fake = fake_provider
    fake.script("primary", row.behavior)
    client = llm(
        fake,
        retry=lk.Retry(max_attempts=2, initial=0.01, max_wait=0.01, budget=lk.RetryBudget(10)),
        failover=[target(fake, "secondary")],
        breaker={"minimum_calls": 50, "window_size": 50},
    )
    if row.failed_over:
        response = await call(client, stream)
        assert lk.report(response).target == "openai/secondary"
        failed = [a for a in lk.report(response).attempts if a.target == "openai/primary"]
        assert {(a.error_type, a.error_kind) for a in failed} == {(row.error.__name__, row.kind)}
    else:
        with pytest.raises(row.error) as info:
            await call(client, stream)
        assert info.value.kind is row.kind
    models = [a.model for a in fake.attempts]
    assert models.count("secondary") == (1 if row.failed_over else 0)
    arrivals = primary_attempts(fake)
    assert len(arrivals) == (2 if row.retried else 1)
    if row.retry_after is not None:
        assert arrivals[1] - arrivals[0] >= row.retry_after - 0.02  # the wait was honoured
    metrics = lk.policies.breaker.breakers()["openai/primary"].metrics()
    assert (metrics.failures, metrics.calls) == ((1, 1) if row.health else (0, 0))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wording", CONTEXT_WORDINGS.values(), ids=CONTEXT_WORDINGS.keys())
async def test_context_length_goes_only_to_a_larger_context_target(
    fake_provider: FakeProvider, wording: Behavior, stream: bool
) -> None:
    fake = fake_provider
    fake.script("primary", wording)
    fake.script("same-size", wording)
    client = llm(
        fake,
        context_window=8_192,
        retry=lk.Retry(max_attempts=3, initial=0.01, max_wait=0.01),
        failover=[
            target(fake, "same-size", context_window=8_192),
            target(fake, "large", context_window=200_000),
        ],
    )
    response = await call(client, stream)
    assert lk.report(response).target == "openai/large"
    assert [a.model for a in fake.attempts] == ["primary", "large"]


# --- precedence, without HTTP ---------------------------------------------------------------------


class StatusError(Exception):
    """An HTTP error as any client library might raise it."""

    def __init__(self, status: int, body: dict[str, Any] | None = None, message: str = "") -> None:
        super().__init__(message or f"HTTP {status}")
        self.status_code = status
        self.body = body


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # the account or the pace beats what the body says
        (StatusError(401, {"code": "context_length_exceeded"}), K.AUTHENTICATION),
        (StatusError(403, {"type": "invalid_request_error"}), K.AUTHENTICATION),
        (StatusError(429, message="too many tokens per minute"), K.RATE_LIMITED),
        (StatusError(408, {"type": "invalid_request_error"}), K.TIMEOUT),
        # what the body says about the request beats the status
        (StatusError(500, {"code": "context_length_exceeded"}), K.CONTEXT_LENGTH),
        (StatusError(422, message="This model's maximum context length is 4096"), K.CONTEXT_LENGTH),
        # a wording alone does not overrule a 5xx
        (StatusError(503, message="engine busy: too many tokens in flight"), K.SERVER_ERROR),
        (StatusError(400, {"code": "model_not_found"}), K.NOT_FOUND),
        (StatusError(400, {"code": "invalid_api_key"}), K.AUTHENTICATION),
        (StatusError(404, {"code": "content_filter"}), K.CONTENT_POLICY),
        # the code beats the wording
        (
            StatusError(400, {"code": "content_filter", "message": "maximum context length"}),
            K.CONTENT_POLICY,
        ),
        # then the status alone
        (StatusError(400, {"type": "invalid_request_error"}), K.BAD_REQUEST),
        (StatusError(500, {"type": "invalid_request_error"}), K.SERVER_ERROR),
        (StatusError(599), K.SERVER_ERROR),
        (StatusError(418), K.BAD_REQUEST),
    ],
)
def test_precedence(error: Exception, kind: lk.ErrorKind) -> None:
    assert lk.errors.classify(error) is kind


def test_an_error_event_keeps_the_stream_broken_kind_unless_it_names_the_request() -> None:
    import openai
    from litellm import exceptions

    common: dict[str, Any] = {"model": "m", "llm_provider": "openai"}

    def event(body: dict[str, Any]) -> BaseException:
        error = exceptions.MidStreamFallbackError("stream died", generated_content="", **common)
        error.__cause__ = openai.APIError(str(body.get("message")), request=None, body=body)  # type: ignore[arg-type]
        return error

    assert (
        lk.errors.classify(event({"type": "overloaded_error", "message": "Overloaded"}))
        is K.STREAM_BROKEN
    )
    assert lk.errors.classify(event({"type": "server_error", "message": "boom"})) is K.STREAM_BROKEN
    assert lk.errors.classify(event({"code": "content_filter", "message": "x"})) is K.CONTENT_POLICY
    assert (
        lk.errors.classify(event({"code": "context_length_exceeded", "message": "x"}))
        is K.CONTEXT_LENGTH
    )


def test_every_kind_and_exception_class_is_in_the_documented_table() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text("utf-8")
    for kind in lk.ErrorKind:
        assert f"`{kind.name}`" in text, kind
    for row in ROWS.values():
        assert f"`{row.error.__name__}`" in text, row.error
