"""OpenAI-shaped JSON payloads: completions, stream chunks, errors, model lists."""

from __future__ import annotations

import json
import re

from ._behavior import Fault
from ._http import REASONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

CONTENT_POLICY_REASON = "flagged: violence"
"""The reason carried by ``Fault.CONTENT_POLICY`` errors."""

DEFAULT_CONTEXT_WINDOW = 4096
"""Context length reported by ``Fault.CONTEXT_LENGTH`` when ``context_window`` is unset."""

_WORD = re.compile(r"\s*\S+|\s+")


def dumps(obj: object) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def tokens_for(text: str | None, output_tokens: int) -> list[str]:
    """The content pieces to emit, one per token/chunk."""
    if text is None:
        return [f" tok{i}" if i else "tok0" for i in range(output_tokens)]
    return _WORD.findall(text)


def continuation(tokens: list[str], prefill: str | None) -> list[str]:
    """The tokens left to emit once the client prefilled the answer with ``prefill``.

    If the answer starts with the prefill, only the rest is emitted (re-split into words,
    so a prefill ending mid-word is continued mid-word); otherwise the whole answer.
    """
    if not prefill:
        return tokens
    answer = "".join(tokens)
    if not answer.startswith(prefill):
        return tokens
    return _WORD.findall(answer[len(prefill) :])


def _content_text(content: object) -> str:
    """The text of a message's content: a string or a list of ``{"text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _messages(body: Mapping[str, object]) -> list[dict[str, object]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def estimate_prompt_tokens(body: Mapping[str, object]) -> int:
    """Characters of all message contents // 4, at least 1."""
    chars = sum(len(_content_text(m.get("content"))) for m in _messages(body))
    return max(chars // 4, 1)


def max_tokens(body: Mapping[str, object]) -> int | None:
    """The client's output cap (``max_completion_tokens`` or ``max_tokens``), if any."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def prefill(body: Mapping[str, object]) -> str | None:
    """The text of a trailing ``assistant`` message (the start of the answer), else ``None``."""
    messages = _messages(body)
    if not messages or messages[-1].get("role") != "assistant":
        return None
    return _content_text(messages[-1].get("content"))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """An OpenAI ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    completion_id: str,
    created: int,
    model: str,
    content: str,
    prompt_tokens: int,
    n_tokens: int,
    finish_reason: str | None = "stop",
) -> bytes:
    """A non-streaming ``chat.completion`` body."""
    return dumps(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_latencykit_fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage(prompt_tokens, n_tokens),
        }
    )


def sse_event(data: bytes) -> bytes:
    """An SSE ``data:`` event carrying ``data``."""
    return b"data: " + data + b"\n\n"


def chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: Mapping[str, object] | None,
    finish_reason: str | None = None,
    usage_obj: Mapping[str, int] | None = None,
) -> bytes:
    """One SSE ``data:`` event carrying a ``chat.completion.chunk``.

    ``delta=None`` gives the usage-only chunk with empty ``choices``.
    """
    obj: dict[str, object] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": "fp_latencykit_fake",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage_obj is not None:
        obj["usage"] = dict(usage_obj)
    return sse_event(dumps(obj))


DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_EVENT = b": keep-alive\n\n"
MALFORMED_EVENT = b"data: {not json\n\n"


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """An OpenAI error body ``{"error": {"message", "type", "param", "code"}}``."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def fault_error(
    fault: Fault, *, prompt_tokens: int, context_window: int | None
) -> tuple[int, bytes]:
    """Status and body for the faults that answer with an HTTP error."""
    if fault is Fault.HTTP_429:
        return 429, error_body(
            "Rate limit reached for requests. Please try again later.",
            "requests",
            "rate_limit_exceeded",
        )
    if fault is Fault.HTTP_500:
        return 500, error_body(
            "The server had an error processing your request. Sorry about that!",
            "server_error",
            "server_error",
        )
    if fault is Fault.HTTP_503:
        return 503, error_body(
            "The server is overloaded or not ready yet.",
            "server_error",
            "service_unavailable",
        )
    if fault is Fault.CONTEXT_LENGTH:
        return 400, error_body(
            _context_length_message(prompt_tokens, context_window),
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        )
    if fault is Fault.CONTENT_POLICY:
        return 400, error_body(
            "Your request was rejected as a result of our safety system. "
            f"Your prompt may contain text that is not allowed by our safety system "
            f"({CONTENT_POLICY_REASON}).",
            "invalid_request_error",
            "content_policy_violation",
        )
    raise ValueError(f"{fault} is not an HTTP error fault")


def _context_length_message(prompt_tokens: int, context_window: int | None) -> str:
    limit = context_window if context_window is not None else DEFAULT_CONTEXT_WINDOW
    used = max(prompt_tokens, limit + 1)
    return (
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {used} tokens. Please reduce the length of the messages."
    )


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


def error_event(kind: str, *, prompt_tokens: int, context_window: int | None) -> tuple[int, bytes]:
    """``Fault.ERROR_EVENT``: the HTTP status and the ``{"error": ...}`` object for ``kind``.

    A stream sends the object as one SSE ``data:`` event, a JSON answer as its body.
    """
    status, type_, code, message = _ERROR_EVENTS[kind]
    if kind == "context_length":
        message = _context_length_message(prompt_tokens, context_window)
    return status, error_body(message, type_, code)


_DEFAULT_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def reason(status: int) -> str:
    """The reason phrase of an HTTP status (``"Error"`` when unknown)."""
    return REASONS.get(status, "Error")


def http_error(
    status: int,
    *,
    type_: str | None,
    code: str | int | None,
    message: str | None,
    body: str | None,
) -> tuple[int, bytes]:
    """``Fault.HTTP_ERROR``: the status and body (the raw ``body``, else an OpenAI error)."""
    if body is not None:
        return status, body.encode("utf-8")
    if type_ is None:
        type_ = _DEFAULT_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
    text = message if message is not None else reason(status)
    return status, dumps({"error": {"message": text, "type": type_, "param": None, "code": code}})


def prefill_rejected() -> tuple[int, bytes]:
    """Status and body for ``Behavior.rejects_prefill``."""
    return 400, error_body(
        "This model does not support assistant message prefill: "
        "the last message must have role 'user'.",
        "invalid_request_error",
        None,
        "messages",
    )


HTTP_ERROR_FAULTS = frozenset(
    {Fault.HTTP_429, Fault.HTTP_500, Fault.HTTP_503, Fault.CONTEXT_LENGTH, Fault.CONTENT_POLICY}
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
