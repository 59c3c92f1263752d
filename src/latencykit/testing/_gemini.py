"""Google's Gemini API wire format (``generativelanguage.googleapis.com``, ``v1beta``).

``POST /v1beta/models/{model}:generateContent`` answers a ``GenerateContentResponse``;
``:streamGenerateContent?alt=sse`` sends one as each SSE ``data:`` event. The model is named
by the URL; the key (``?key=`` or ``x-goog-api-key``) is not checked (a ``ProviderQuota`` counts by
it). ``candidates[0]`` holds ``content.parts`` (``text``, ``"thought": true`` parts,
``functionCall``); the last event carries ``finishReason`` and ``usageMetadata``; there is
no end marker. Errors are ``{"error": {"code", "message", "status", "details"}}``.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

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
    json_object,
    seconds_header,
    sse,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_PREFIXES = ("/v1beta/models/", "/v1/models/", "/models/")
_METHODS = ("generateContent", "streamGenerateContent")

# The engine's finish reasons in Gemini's words (a tool call ends with STOP).
_FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}

# google.rpc.Code names by HTTP status.
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_QUOTA = (
    "You exceeded your current quota, please check your plan and billing details. "
    "For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)
_INTERNAL = (
    "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting"
)
_OVERLOADED = "The model is overloaded. Please try again later."

# Fault or Behavior.error -> (HTTP status, message); context length and safety are built.
_ERRORS: dict[Fault | str, tuple[int, str]] = {
    Fault.HTTP_429: (429, _QUOTA),
    Fault.HTTP_500: (500, _INTERNAL),
    Fault.HTTP_503: (503, _OVERLOADED),
    "server_error": (500, _INTERNAL),
    "overloaded": (503, _OVERLOADED),
    "rate_limit": (429, _QUOTA),
    "content_filter": (400, "The response was blocked due to SAFETY."),
}


def _status_name(status: int) -> str:
    return _STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


class GeminiWire(Wire):
    """Gemini: ``POST /v1beta/models/{model}:generateContent`` and
    ``:streamGenerateContent`` (also under ``/v1/`` and at ``/models/...``).

    litellm's ``gemini/<model>`` with ``api_base`` set to
    :attr:`FakeProvider.gemini_base_url` (``http://127.0.0.1:<port>/v1beta``) posts here.
    """

    name = "gemini"
    retry_after_header = False  # the wait is the body's RetryInfo.retryDelay
    endpoints = "POST /v1beta/models/{model}:generateContent and :streamGenerateContent"

    def __init__(self, url_model: str) -> None:
        super().__init__(url_model)
        self.thoughts = 0  # reasoning pieces streamed, for usageMetadata
        model, _, method = url_model.rpartition(":")
        self.model_name = model
        self.streaming = method == "streamGenerateContent"

    @classmethod
    def route(cls, method: str, path: str) -> str | None:
        if method != "POST":
            return None
        for prefix in _PREFIXES:
            if path.startswith(prefix):
                name = path[len(prefix) :]
                model, sep, verb = name.rpartition(":")
                if sep and model and "/" not in model and verb in _METHODS:
                    return name  # "model:method"; split in __init__
        return None

    def parse(self, body: Mapping[str, object]) -> Parsed:
        contents = dicts(body.get("contents"))
        system = body.get("systemInstruction") or body.get("system_instruction")
        chars = len(content_text(system.get("parts"))) if isinstance(system, dict) else 0
        chars += sum(len(content_text(c.get("parts"))) for c in contents)
        prefill = None
        if contents and contents[-1].get("role") == "model":
            prefill = content_text(contents[-1].get("parts"))
        config = body.get("generationConfig") or body.get("generation_config")
        cap = integer(config.get("maxOutputTokens")) if isinstance(config, dict) else None
        return Parsed(
            model=self.model_name,
            stream=self.streaming,
            prompt_tokens=max(chars // 4, 1),
            prefill=prefill,
            max_tokens=cap,
            include_usage=True,
        )

    # -- rate limits

    def api_key(self, headers: Mapping[str, str], query: str) -> str:
        key = headers.get("x-goog-api-key")
        if key:
            return key
        for name, value in parse_qsl(query):
            if name == "key":
                return value
        return super().api_key(headers, query)

    # -- errors

    def _error(
        self, status: int, message: str, details: list[dict[str, object]] | None = None
    ) -> bytes:
        error: dict[str, object] = {
            "code": status,
            "message": message,
            "status": _status_name(status),
        }
        if details:
            error["details"] = details
        return dumps({"error": error})

    def _http_body(self, body: bytes) -> bytes:
        """An HTTP error body: ``[{"error": ...}]`` with ``flavor="gemini_list_errors"``."""
        return b"[" + body + b"]" if self.meta.flavor == "gemini_list_errors" else body

    def _by_kind(
        self, key: Fault | str, context_window: int | None, retry_after: float | None = None
    ) -> tuple[int, bytes]:
        if key in (Fault.CONTEXT_LENGTH, "context_length"):
            limit, used = context_length_numbers(self.meta.prompt_tokens, context_window)
            message = (
                f"The input token count ({used}) exceeds the maximum number of tokens "
                f"allowed ({limit})."
            )
            return 400, self._error(400, message)
        status, message = _ERRORS[key]
        details: list[dict[str, object]] = []
        if status == 429:
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                        }
                    ],
                }
            )
            if retry_after is not None:  # Gemini's wait is in the body, not a header
                details.append(
                    {
                        "@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{seconds_header(retry_after)}s",
                    }
                )
        return status, self._error(status, message, details)

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        return self._http_body(self._error(status, message))

    def fault_error(
        self, fault: Fault, *, context_window: int | None, retry_after: float | None
    ) -> Reply:
        if fault is Fault.CONTENT_POLICY:  # a blocked prompt is a 200 without candidates
            feedback = {"blockReason": "SAFETY", "safetyRatings": _BLOCKED_RATINGS}
            return 200, dumps({"promptFeedback": feedback, "usageMetadata": self._usage(0)}), []
        status, body = self._by_kind(fault, context_window, retry_after)
        return status, self._http_body(body), []

    def error_event(self, kind: str, *, context_window: int | None) -> tuple[int, bytes]:
        return self._by_kind(kind, context_window)

    def http_error(
        self,
        status: int,
        *,
        type_: str | None,
        code: str | int | None,
        message: str | None,
    ) -> bytes:
        details: list[dict[str, object]] = []
        if code is not None:  # e.g. "API_KEY_INVALID"
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": str(code),
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"},
                }
            )
        error: dict[str, object] = {
            "code": status,
            "message": message if message is not None else REASONS.get(status, "Error"),
            "status": type_ if type_ is not None else _status_name(status),
        }
        if details:
            error["details"] = details
        return self._http_body(dumps({"error": error}))

    # -- answers

    def _usage(self, n_tokens: int, thoughts: int = 0) -> dict[str, int]:
        prompt = self.meta.prompt_tokens
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": n_tokens - thoughts,
            "totalTokenCount": prompt + n_tokens,
        }
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return usage

    def _part(self, piece: Piece) -> dict[str, object]:
        kind, text = piece
        if kind == "reasoning":
            return {"text": text, "thought": True}
        if kind == "tool":
            return {"functionCall": {"name": self.meta.tool_name, "args": json_object(text)}}
        return {"text": text}

    def _response(
        self,
        parts: list[dict[str, object]],
        finish: str | None,
        usage: dict[str, int] | None,
    ) -> dict[str, object]:
        candidate: dict[str, object] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = _FINISH_REASONS[finish]
        response: dict[str, object] = {"candidates": [candidate]}
        if usage is not None:
            response["usageMetadata"] = usage
        response["modelVersion"] = self.meta.model
        response["responseId"] = self.meta.response_id
        return response

    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        parts: list[dict[str, object]] = []
        for kind in ("reasoning", "text"):
            text = "".join(t for k, t in pieces if k == kind)
            if text:
                parts.append(self._part((kind, text)))
        parts += [self._part(p) for p in pieces if p[0] == "tool"]
        if not parts:
            parts.append({"text": ""})
        thoughts = sum(1 for k, _ in pieces if k == "reasoning")
        return dumps(self._response(parts, finish, self._usage(len(pieces), thoughts)))

    def opening(self) -> bytes:
        return sse(dumps(self._response([{"text": ""}], None, None)))

    def piece(self, piece: Piece) -> bytes:
        self.thoughts += piece[0] == "reasoning"
        return sse(dumps(self._response([self._part(piece)], None, None)))

    def beat(self, k: int) -> bytes:
        # An empty text part, no SSE comment: Google's API sends none, and litellm's Gemini
        # parser loses the rest of a stream after a line that is not JSON.
        return self.opening()

    def end_without_finish(self) -> list[bytes]:
        return []  # the body just ends: Gemini has no end marker

    def end(self, finish: str, n_tokens: int, *, terminator: bool) -> list[bytes]:
        usage = self._usage(n_tokens, self.thoughts)
        return [sse(dumps(self._response([{"text": ""}], finish, usage)))]


_BLOCKED_RATINGS = [
    {"category": "HARM_CATEGORY_SEXUALLY_EXPLICIT", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_HATE_SPEECH", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_HARASSMENT", "probability": "NEGLIGIBLE"},
    {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"},
]
