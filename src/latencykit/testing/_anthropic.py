"""Anthropic's Messages wire format: ``POST /v1/messages``.

A ``message`` JSON answer, or SSE events ``message_start``, ``content_block_start``,
``content_block_delta`` (``text_delta``, ``thinking_delta``, ``signature_delta``,
``input_json_delta``), ``content_block_stop``, ``message_delta`` (``stop_reason`` and
``usage``), ``message_stop``; ``ping`` as keep-alive; ``event: error`` mid-stream. Errors are
``{"type": "error", "error": {"type", "message"}}``; overloaded is HTTP 529.
"""

from __future__ import annotations

import datetime
import math
import time

from ._behavior import Fault
from ._http import REASONS
from ._wire import (
    Parsed,
    Piece,
    PieceKind,
    Reply,
    Wire,
    content_text,
    context_length_numbers,
    dicts,
    dumps,
    integer,
    json_object,
    sse,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._quota import QuotaUsage, Refusal

_PATHS = frozenset({"/v1/messages", "/messages"})

# The engine's finish reasons in Anthropic's words.
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

_RATE_LIMIT = "Number of request tokens has exceeded your per-minute rate limit"
_OVERLOADED = "Overloaded"
_CONTENT_FILTER = "Output blocked by content filtering policy"

# Fault or Behavior.error -> (HTTP status, error type, message); context length is built.
_ERRORS: dict[Fault | str, tuple[int, str, str]] = {
    Fault.HTTP_429: (429, "rate_limit_error", _RATE_LIMIT),
    Fault.HTTP_500: (500, "api_error", "Internal server error"),
    Fault.HTTP_503: (529, "overloaded_error", _OVERLOADED),
    Fault.CONTENT_POLICY: (400, "invalid_request_error", _CONTENT_FILTER),
    "server_error": (500, "api_error", "Internal server error"),
    "overloaded": (529, "overloaded_error", _OVERLOADED),
    "rate_limit": (429, "rate_limit_error", _RATE_LIMIT),
    "content_filter": (400, "invalid_request_error", _CONTENT_FILTER),
}

_SIGNATURE = "RmFrZVNpZ25hdHVyZQ=="  # a stand-in for the opaque signature of a thinking block


def timestamp(seconds_from_now: float) -> str:
    """An RFC 3339 UTC time that many seconds from now, rounded up to the second, as
    Anthropic writes its resets: ``2026-11-26T01:02:03Z``."""
    moment = math.ceil(time.time() + seconds_from_now)
    stamp = datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).isoformat()
    return stamp.replace("+00:00", "Z")


def _rate_limit_headers(retry_after: float | None) -> list[tuple[str, str]]:
    """The ``anthropic-ratelimit-*`` headers of an injected 429 (no quota configured): no
    requests left until the reset."""
    stamp = timestamp(60.0 if retry_after is None else retry_after)
    headers = []
    for name, limit in (("requests", 50), ("tokens", 40000), ("input-tokens", 30000)):
        headers += [
            (f"anthropic-ratelimit-{name}-limit", str(limit)),
            (f"anthropic-ratelimit-{name}-remaining", "0" if name == "requests" else str(limit)),
            (f"anthropic-ratelimit-{name}-reset", stamp),
        ]
    return headers


class AnthropicWire(Wire):
    """Anthropic Messages: ``POST /v1/messages`` (also ``/messages``).

    litellm's ``anthropic/<model>`` with ``api_base`` set to the server's root URL
    (:attr:`FakeProvider.anthropic_base_url`) posts here.
    """

    name = "anthropic"
    endpoints = "POST /v1/messages"
    id_prefix = "msg_fake"
    request_id_header = "request-id"  # Anthropic's name for it

    def __init__(self, url_model: str) -> None:
        super().__init__(url_model)
        self.started = False  # message_start sent
        self.block: PieceKind | None = None  # the open content block's kind
        self.index = -1  # the open content block's index

    @classmethod
    def route(cls, method: str, path: str) -> str | None:
        return "" if method == "POST" and path in _PATHS else None

    def parse(self, body: Mapping[str, object]) -> Parsed:
        model = body.get("model")
        messages = dicts(body.get("messages"))
        chars = len(content_text(body.get("system")))
        chars += sum(len(content_text(m.get("content"))) for m in messages)
        prefill = None
        if messages and messages[-1].get("role") == "assistant":
            prefill = content_text(messages[-1].get("content"))
        return Parsed(
            model=model if isinstance(model, str) else "",
            stream=body.get("stream") is True,
            prompt_tokens=max(chars // 4, 1),
            prefill=prefill,
            max_tokens=integer(body.get("max_tokens")),
            include_usage=True,
        )

    # -- rate limits

    def api_key(self, headers: Mapping[str, str], query: str) -> str:
        return headers.get("x-api-key") or super().api_key(headers, query)

    def limit_headers(self, usage: QuotaUsage, skew: float) -> list[tuple[str, str]]:
        # One token budget: the tokens, input-tokens and output-tokens families all tell it
        # (Anthropic's tokens-* is the most restrictive of its input and output limits).
        requests = timestamp(usage.requests_reset + skew)
        tokens = timestamp(usage.tokens_reset + skew)
        headers = [
            ("anthropic-ratelimit-requests-limit", str(usage.requests_limit)),
            ("anthropic-ratelimit-requests-remaining", str(usage.requests_remaining)),
            ("anthropic-ratelimit-requests-reset", requests),
        ]
        for name in ("tokens", "input-tokens", "output-tokens"):
            headers += [
                (f"anthropic-ratelimit-{name}-limit", str(usage.tokens_limit)),
                (f"anthropic-ratelimit-{name}-remaining", str(usage.tokens_remaining)),
                (f"anthropic-ratelimit-{name}-reset", tokens),
            ]
        return headers

    def quota_error(self, refusal: Refusal) -> Reply:
        message = (
            f"This request would exceed your organization's rate limit of {refusal.limit} "
            f"{refusal.limit_name} per minute. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits. You can see the response headers for "
            "current usage. Please reduce the prompt length or the maximum tokens requested, "
            "or try again later."
        )
        return 429, self._error("rate_limit_error", message), []

    # -- errors

    def _error(self, type_: str, message: str) -> bytes:
        return dumps(
            {
                "type": "error",
                "error": {"type": type_, "message": message},
                "request_id": f"req_{self.meta.response_id}",
            }
        )

    def _by_kind(self, key: Fault | str, context_window: int | None) -> tuple[int, bytes]:
        if key in (Fault.CONTEXT_LENGTH, "context_length"):
            limit, used = context_length_numbers(self.meta.prompt_tokens, context_window)
            message = f"prompt is too long: {used} tokens > {limit} maximum"
            return 400, self._error("invalid_request_error", message)
        status, type_, message = _ERRORS[key]
        return status, self._error(type_, message)

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        return self._error(
            _TYPES.get(status, "api_error" if status >= 500 else _TYPES[400]), message
        )

    def fault_error(
        self, fault: Fault, *, context_window: int | None, retry_after: float | None
    ) -> Reply:
        status, body = self._by_kind(fault, context_window)
        extra = _rate_limit_headers(retry_after) if fault is Fault.HTTP_429 else []
        return status, body, extra

    def error_event(self, kind: str, *, context_window: int | None) -> tuple[int, bytes]:
        return self._by_kind(kind, context_window)

    def stream_error(self, error: bytes) -> bytes:
        return sse(error, "error")

    def http_error(
        self,
        status: int,
        *,
        type_: str | None,
        code: str | int | None,
        message: str | None,
    ) -> bytes:
        if type_ is None:
            type_ = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return self._error(type_, message if message is not None else REASONS.get(status, "Error"))

    # -- answers

    def _usage(self, output_tokens: int) -> dict[str, int]:
        return {"input_tokens": self.meta.prompt_tokens, "output_tokens": output_tokens}

    def _message(
        self, content: list[dict[str, object]], stop: str | None, n: int
    ) -> dict[str, object]:
        return {
            "id": self.meta.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": self._usage(n),
        }

    def _tool_id(self) -> str:
        return f"toolu_fake{self.meta.response_id[-8:]}"

    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        content: list[dict[str, object]] = []
        reasoning = "".join(t for k, t in pieces if k == "reasoning")
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": _SIGNATURE})
        text = "".join(t for k, t in pieces if k == "text")
        if text or not any(k == "tool" for k, _ in pieces):
            content.append({"type": "text", "text": text})
        for kind, arguments in pieces:
            if kind == "tool":
                content.append(
                    {
                        "type": "tool_use",
                        "id": self._tool_id(),
                        "name": self.meta.tool_name,
                        "input": json_object(arguments),
                    }
                )
        stop = None if finish is None else _STOP_REASONS[finish]
        return dumps(self._message(content, stop, len(pieces)))

    @staticmethod
    def _event(obj: dict[str, object]) -> bytes:
        return sse(dumps(obj), str(obj["type"]))

    def opening(self) -> bytes:
        self.started = True
        return self._event({"type": "message_start", "message": self._message([], None, 1)})

    def _close_block(self) -> bytes:
        if self.block is None:
            return b""
        out = b""
        if self.block == "reasoning":  # a thinking block ends with its signature
            delta = {"type": "signature_delta", "signature": _SIGNATURE}
            out += self._event({"type": "content_block_delta", "index": self.index, "delta": delta})
        self.block = None
        return out + self._event({"type": "content_block_stop", "index": self.index})

    def piece(self, piece: Piece) -> bytes:
        kind, text = piece
        out = b"" if self.started else self.opening()
        if kind != self.block or kind == "tool":
            out += self._close_block()
            self.block = kind
            self.index += 1
            block: dict[str, object]
            if kind == "text":
                block = {"type": "text", "text": ""}
            elif kind == "reasoning":
                block = {"type": "thinking", "thinking": ""}
            else:
                block = {"type": "tool_use", "id": self._tool_id(), "name": self.meta.tool_name}
                block["input"] = {}
            out += self._event(
                {"type": "content_block_start", "index": self.index, "content_block": block}
            )
        if kind == "text":
            delta = {"type": "text_delta", "text": text}
        elif kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "input_json_delta", "partial_json": text}
        return out + self._event(
            {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def beat(self, k: int) -> bytes:
        return self._event({"type": "ping"})

    def end_without_finish(self) -> list[bytes]:
        # The end marker without the message_delta that carries stop_reason and usage.
        return [self._close_block(), self._event({"type": "message_stop"})]

    def end(self, finish: str, n_tokens: int, *, terminator: bool) -> list[bytes]:
        events = [b"" if self.started else self.opening(), self._close_block()]
        delta = {"stop_reason": _STOP_REASONS[finish], "stop_sequence": None}
        events.append(
            self._event(
                {"type": "message_delta", "delta": delta, "usage": {"output_tokens": n_tokens}}
            )
        )
        if terminator:
            events.append(self._event({"type": "message_stop"}))
        return events
