"""What events report of a call's request and result, read from OpenAI-shaped objects; and
how long a request's prompt is.

litellm's ``ModelResponse`` and its stream chunks, the openai SDK's ``ChatCompletion``, and any
object shaped like them (``id``, ``model``, ``choices[i].finish_reason``, ``usage``) are read the
same way, so a decorated function that calls a provider's SDK itself is reported as well. These
run only while somebody listens to events, never on the hot path (but :func:`characters`, which
the governor and the stream guard read per attempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "CHAT_PARAMETERS",
    "MODEL_PARAMETERS",
    "Summary",
    "characters",
    "message_text",
    "parameters",
    "summary",
]

MODEL_PARAMETERS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "n",
)
"""The request parameters events report (numbers only: never text such as stop sequences)."""

CHAT_PARAMETERS = frozenset(
    [
        *MODEL_PARAMETERS,
        "messages",
        "model",
        "audio",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "metadata",
        "modalities",
        "parallel_tool_calls",
        "prediction",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "tool_choice",
        "tools",
        "top_logprobs",
        "user",
        "verbosity",
        "web_search_options",
        "extra_headers",
        "extra_body",
        "thinking",
        "api_version",
        "base_url",
        "custom_llm_provider",
        "drop_params",
        "mock_response",
    ]
)
"""OpenAI's chat-completions request parameters and the common litellm arguments: what
``LLM`` checks the spelling of an argument's name against (without importing litellm)."""


class Summary(NamedTuple):
    """What a result says about itself (``None``/empty where it does not)."""

    model: str | None = None
    id: str | None = None
    finish_reasons: tuple[str, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None


_NOTHING = Summary()


def parameters(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The reportable model parameters among a call's keyword arguments."""
    return {
        name: value
        for name in MODEL_PARAMETERS
        if isinstance(value := kwargs.get(name), (int, float)) and not isinstance(value, bool)
    }


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summary(result: Any) -> Summary:
    """The model, id, finish reasons and token usage ``result`` reports, if it is shaped like a
    chat completion (anything else gives an empty summary)."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, (list, tuple)):
        return _NOTHING
    usage = getattr(result, "usage", None)
    return Summary(
        model=_string(getattr(result, "model", None)),
        id=_string(getattr(result, "id", None)),
        finish_reasons=tuple(str(r) for c in choices if (r := getattr(c, "finish_reason", None))),
        input_tokens=_count(getattr(usage, "prompt_tokens", None)),
        output_tokens=_count(getattr(usage, "completion_tokens", None)),
    )


def message_text(result: Any) -> str | None:
    """The text of a chat completion's first choice (``None`` if it has none)."""
    choices = getattr(result, "choices", None)
    if not isinstance(choices, (list, tuple)) or not choices:
        return None
    return _string(getattr(getattr(choices[0], "message", None), "content", None))


_NOT_TEXT = frozenset({"role", "type"})


def characters(value: Any) -> int:
    """The characters of the text in messages (strings at any depth of lists and dicts, but
    a message's role and a content part's type)."""
    if isinstance(value, str):
        return len(value)
    total = 0
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _NOT_TEXT:
                # A message's content is mostly a string: counted without a call.
                total += len(item) if type(item) is str else characters(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            total += characters(item)
    return total
