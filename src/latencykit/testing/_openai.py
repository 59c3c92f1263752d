"""OpenAI's chat-completions wire format (and the vLLM/Ollama variants of it).

``POST /v1/chat/completions``: a ``chat.completion`` JSON answer, or SSE ``data:`` chunks
ending with ``data: [DONE]``. ``Behavior.flavor`` ``"vllm"`` gives vLLM's error objects
(``{"object": "error", ..., "code": 500}``); ``"ollama"`` streams reasoning as ``reasoning``
instead of ``reasoning_content``.
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct

from ._behavior import Fault
from ._http import REASONS
from ._wire import (
    Parsed,
    Piece,
    Reply,
    Wire,
    content_text,
    context_length_numbers,
    dicts,
    dumps,
    integer,
    sse,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ._quota import QuotaUsage, Refusal

CONTENT_POLICY_REASON = "flagged: violence"
"""The reason carried by ``Fault.CONTENT_POLICY`` errors."""

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
MODELS_PATHS = frozenset({"/v1/models", "/models"})

DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_EVENT = b": keep-alive\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """An OpenAI ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """An OpenAI error body ``{"error": {"message", "type", "param", "code"}}``."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def duration(seconds: float) -> str:
    """A reset as OpenAI writes it, Go's duration format: ``20ms``, ``1s``, ``6m0s``,
    ``1h2m3.5s`` (rounded up to the millisecond; ``0s`` for none)."""
    ms = max(math.ceil(seconds * 1000 - 1e-6), 0)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    text = f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    return f"{hours}h{text}" if hours else text


def reason(status: int) -> str:
    """The reason phrase of an HTTP status (``"Error"`` when unknown)."""
    return REASONS.get(status, "Error")


def _context_length_message(prompt_tokens: int, context_window: int | None) -> str:
    limit, used = context_length_numbers(prompt_tokens, context_window)
    return (
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {used} tokens. Please reduce the length of the messages."
    )


# Fault -> (HTTP status, type, code, message, param); CONTEXT_LENGTH builds its message.
_FAULT_ERRORS: dict[Fault, tuple[int, str, str | None, str, str | None]] = {
    Fault.HTTP_429: (
        429,
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for requests. Please try again later.",
        None,
    ),
    Fault.HTTP_500: (
        500,
        "server_error",
        "server_error",
        "The server had an error processing your request. Sorry about that!",
        None,
    ),
    Fault.HTTP_503: (
        503,
        "server_error",
        "service_unavailable",
        "The server is overloaded or not ready yet.",
        None,
    ),
    Fault.CONTEXT_LENGTH: (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "",
        "messages",
    ),
    Fault.CONTENT_POLICY: (
        400,
        "invalid_request_error",
        "content_policy_violation",
        "Your request was rejected as a result of our safety system. Your prompt may contain "
        f"text that is not allowed by our safety system ({CONTENT_POLICY_REASON}).",
        None,
    ),
}

# Behavior.error -> (HTTP status, type, code, message); "context_length" builds its message.
_ERROR_EVENTS: dict[str, tuple[int, str, str | None, str]] = {
    "server_error": (
        500,
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    "overloaded": (529, "overloaded_error", None, "Overloaded"),
    "rate_limit": (
        429,
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        "Rate limit reached for requests. Please try again later.",
    ),
    "content_filter": (
        400,
        "invalid_request_error",
        "content_filter",
        "The response was filtered due to the prompt triggering the content management "
        "policy. Please modify your prompt and retry.",
    ),
    "context_length": (400, "invalid_request_error", "context_length_exceeded", ""),
}

_DEFAULT_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}

# vLLM names its error types after the HTTP status (vllm/entrypoints/openai/protocol.py).
_VLLM_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def _vllm_type(status: int) -> str:
    return _VLLM_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")


class OpenAIWire(Wire):
    """OpenAI chat completions: ``POST /v1/chat/completions`` (also ``/chat/completions``)."""

    name = "openai"
    endpoints = "POST /v1/chat/completions, GET /v1/models"
    id_prefix = "chatcmpl-fake"

    def __init__(self, url_model: str) -> None:
        super().__init__(url_model)
        self.role_sent = False

    @classmethod
    def route(cls, method: str, path: str) -> str | None:
        return "" if method == "POST" and path in CHAT_PATHS else None

    def parse(self, body: Mapping[str, object]) -> Parsed:
        model = body.get("model")
        stream = body.get("stream") is True
        options = body.get("stream_options")
        messages = dicts(body.get("messages"))
        chars = sum(len(content_text(m.get("content"))) for m in messages)
        prefill = None
        if messages and messages[-1].get("role") == "assistant":
            prefill = content_text(messages[-1].get("content"))
        cap = integer(body.get("max_completion_tokens"))
        return Parsed(
            model=model if isinstance(model, str) else "",
            stream=stream,
            prompt_tokens=max(chars // 4, 1),
            prefill=prefill,
            max_tokens=cap if cap is not None else integer(body.get("max_tokens")),
            include_usage=stream
            and isinstance(options, dict)
            and options.get("include_usage") is True,
        )

    # -- rate limits

    def limit_headers(self, usage: QuotaUsage, skew: float) -> list[tuple[str, str]]:
        return [
            ("x-ratelimit-limit-requests", str(usage.requests_limit)),
            ("x-ratelimit-limit-tokens", str(usage.tokens_limit)),
            ("x-ratelimit-remaining-requests", str(usage.requests_remaining)),
            ("x-ratelimit-remaining-tokens", str(usage.tokens_remaining)),
            ("x-ratelimit-reset-requests", duration(usage.requests_reset + skew)),
            ("x-ratelimit-reset-tokens", duration(usage.tokens_reset + skew)),
        ]

    def quota_error(self, refusal: Refusal) -> Reply:
        name = refusal.limit_name
        message = (
            f"Rate limit reached for {self.meta.model} in organization org-fake on {name} per "
            f"min ({'RPM' if name == 'requests' else 'TPM'}): Limit {refusal.limit}, Used "
            f"{refusal.used}, Requested {refusal.requested}. Please try again in "
            f"{duration(refusal.wait)}. Visit https://platform.openai.com/account/rate-limits "
            "to learn more."
        )
        return 429, self._error(429, message, name, "rate_limit_exceeded"), []

    # -- errors

    def _error(self, status: int, message: str, type_: str, code: str | int | None) -> bytes:
        if self.meta.flavor == "vllm":  # vLLM's ErrorResponse: flat, with an int code
            return dumps(
                {
                    "object": "error",
                    "message": message,
                    "type": _vllm_type(status),
                    "param": None,
                    "code": status,
                }
            )
        return dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        return self._error(status, message, type_, code)

    def fault_error(
        self, fault: Fault, *, context_window: int | None, retry_after: float | None
    ) -> Reply:
        status, type_, code, message, param = _FAULT_ERRORS[fault]
        if fault is Fault.CONTEXT_LENGTH:
            message = _context_length_message(self.meta.prompt_tokens, context_window)
        if self.meta.flavor == "vllm":
            return status, self._error(status, message, type_, code), []
        return status, error_body(message, type_, code, param), []

    def error_event(self, kind: str, *, context_window: int | None) -> tuple[int, bytes]:
        status, type_, code, message = _ERROR_EVENTS[kind]
        if kind == "context_length":
            message = _context_length_message(self.meta.prompt_tokens, context_window)
        if self.meta.flavor == "vllm":  # vLLM wraps its error object in "error" in a stream
            error = {"object": "error", "type": _vllm_type(status), "message": message}
            return status, dumps({"error": {**error, "code": status}})
        return status, error_body(message, type_, code)

    def http_error(
        self,
        status: int,
        *,
        type_: str | None,
        code: str | int | None,
        message: str | None,
    ) -> bytes:
        if type_ is None:
            type_ = _DEFAULT_TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            )
        text = message if message is not None else reason(status)
        return self._error(status, text, type_, code)

    def prefill_rejected(self) -> tuple[int, bytes]:
        return 400, error_body(
            "This model does not support assistant message prefill: "
            "the last message must have role 'user'.",
            "invalid_request_error",
            None,
            "messages",
        )

    # -- answers

    def _reasoning_key(self) -> str:
        return "reasoning" if self.meta.flavor == "ollama" else "reasoning_content"

    def _tool_call(self, arguments: str) -> dict[str, object]:
        return {
            "id": f"call_fake{self.meta.response_id[-8:]}",
            "type": "function",
            "function": {"name": self.meta.tool_name, "arguments": arguments},
        }

    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        meta = self.meta
        message: dict[str, object] = {
            "role": "assistant",
            "content": "".join(t for k, t in pieces if k == "text"),
            "refusal": None,
        }
        reasoning = "".join(t for k, t in pieces if k == "reasoning")
        if reasoning:
            message[self._reasoning_key()] = reasoning
        tools = [self._tool_call(t) for k, t in pieces if k == "tool"]
        if tools:
            message["tool_calls"] = tools
            if not message["content"]:
                message["content"] = None
        return dumps(
            {
                "id": meta.response_id,
                "object": "chat.completion",
                "created": meta.created,
                "model": meta.model,
                "system_fingerprint": "fp_latencykit_fake",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": usage(meta.prompt_tokens, len(pieces)),
            }
        )

    def chunk(
        self,
        delta: Mapping[str, object] | None,
        finish_reason: str | None = None,
        usage_obj: Mapping[str, int] | None = None,
    ) -> bytes:
        """One SSE ``data:`` event carrying a ``chat.completion.chunk``.

        ``delta=None`` gives the usage-only chunk with empty ``choices``.
        """
        meta = self.meta
        obj: dict[str, object] = {
            "id": meta.response_id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "system_fingerprint": "fp_latencykit_fake",
            "choices": []
            if delta is None
            else [
                {
                    "index": 0,
                    "delta": dict(delta),
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
        }
        if usage_obj is not None:
            obj["usage"] = dict(usage_obj)
        return sse(dumps(obj))

    def opening(self) -> bytes:
        self.role_sent = True
        return self.chunk({"role": "assistant", "content": ""})

    def piece(self, piece: Piece) -> bytes:
        kind, text = piece
        delta: dict[str, object]
        if kind == "text":
            delta = {"content": text}
        elif kind == "reasoning":
            delta = {self._reasoning_key(): text}
        else:
            call = {"index": 0, **self._tool_call(text)}
            delta = {"content": None, "tool_calls": [call]}
        if not self.role_sent:
            self.role_sent = True
            delta = {"role": "assistant", **delta}
            if kind == "text":
                delta["refusal"] = None
        return self.chunk(delta)

    def beat(self, k: int) -> bytes:
        # Alternately a comment and an empty delta: neither is content to a client.
        return KEEPALIVE_EVENT if k % 2 == 0 else self.chunk({"content": ""})

    def end_without_finish(self) -> list[bytes]:
        return [DONE_EVENT]

    def end(self, finish: str, n_tokens: int, *, terminator: bool) -> list[bytes]:
        events = [] if self.role_sent else [self.piece(("text", ""))]
        events.append(self.chunk({}, finish))
        if self.meta.include_usage:
            events.append(self.chunk(None, None, usage(self.meta.prompt_tokens, n_tokens)))
        if terminator:
            events.append(DONE_EVENT)
        return events


EMBEDDINGS_PATHS = frozenset({"/v1/embeddings", "/embeddings"})
DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}
"""The length of OpenAI's models' vectors; other models' are ``8`` unless a
:class:`Behavior` says otherwise."""


def embedding_of(text: str, dimensions: int) -> list[float]:
    """The fake provider's vector for ``text``: deterministic (seeded by the text), of unit
    length, ``dimensions`` long."""
    rng = random.Random(text)
    vector = [rng.uniform(-1.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class EmbeddingsWire(OpenAIWire):
    """OpenAI embeddings: ``POST /v1/embeddings`` (also ``/embeddings``), answered with one
    vector per input (:func:`embedding_of`; ``encoding_format="base64"``: little-endian
    float32, as OpenAI sends), after ``ttft``, with the chat endpoint's faults and errors (a
    fault of a stream's middle happens to the JSON body, as on a non-streaming chat answer).
    A request's ``dimensions`` overrides ``Behavior.dimensions``."""

    name = "openai-embeddings"
    endpoints = "POST /v1/embeddings"
    id_prefix = "embd-fake"

    def __init__(self, url_model: str) -> None:
        super().__init__(url_model)
        self.inputs: list[str] = []
        self.dimensions: int | None = None
        self.base64 = False

    @classmethod
    def route(cls, method: str, path: str) -> str | None:
        return "" if method == "POST" and path in EMBEDDINGS_PATHS else None

    def parse(self, body: Mapping[str, object]) -> Parsed:
        model = body.get("model")
        given = body.get("input")
        items = given if isinstance(given, list) else [given]
        self.inputs = [item if isinstance(item, str) else json.dumps(item) for item in items]
        self.dimensions = integer(body.get("dimensions"))
        self.base64 = body.get("encoding_format") == "base64"
        chars = sum(len(text) for text in self.inputs)
        return Parsed(
            model=model if isinstance(model, str) else "",
            stream=False,
            prompt_tokens=max(chars // 4, 1),
            prefill=None,
            max_tokens=None,
        )

    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        meta = self.meta
        size = self.dimensions or meta.dimensions or DIMENSIONS.get(meta.model, 8)
        data = []
        for index, text in enumerate(self.inputs):
            vector = embedding_of(text, size)
            shown: object = vector
            if self.base64:
                shown = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": shown})
        tokens = meta.prompt_tokens
        return dumps(
            {
                "object": "list",
                "data": data,
                "model": meta.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


def models_list(names: Iterable[str]) -> bytes:
    """A ``GET /v1/models`` body."""
    return dumps(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "latencykit"}
                for name in names
            ],
        }
    )
