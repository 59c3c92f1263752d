"""What the fake provider does for one request: :class:`Behavior`, :class:`Fault`."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields

from ._latency import Latency

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class Fault(str, enum.Enum):
    """A failure the fake provider injects into a response.

    The values are lowercase strings, usable in the ``x-fake-behavior`` header
    (``{"fault": "http_503"}``). Each fault applies to every wire format, in that format's
    words (described here for OpenAI's; see ``docs/testing.md`` for Anthropic and Gemini):
    e.g. ``HTTP_503`` is Anthropic's 529 ``overloaded_error``, ``CUT_WITH_DONE`` a Gemini
    stream that ends without ``finishReason``.
    """

    HTTP_429 = "http_429"
    """429 ``rate_limit_exceeded``, with ``Retry-After`` if ``Behavior.retry_after`` is set
    (Anthropic: also ``anthropic-ratelimit-*`` headers, made up unless a ``ProviderQuota`` tells its
    own; Gemini: the wait as ``RetryInfo.retryDelay`` in the body, no header). A request
    past a ``ProviderQuota`` gets a 429 without this fault."""
    HTTP_500 = "http_500"
    """500 ``server_error``."""
    HTTP_503 = "http_503"
    """503 ``service_unavailable`` ("The server is overloaded"), with ``Retry-After`` if
    ``Behavior.retry_after`` is set (Anthropic: 529 ``overloaded_error``; Gemini: 503
    ``UNAVAILABLE``)."""
    HTTP_ERROR = "http_error"
    """Any HTTP error, after ``ttft``: status ``Behavior.status``, an OpenAI error body built
    from ``error_type``/``error_code``/``error_message`` (or the raw ``Behavior.body``), plus
    ``Behavior.headers`` and ``Retry-After`` if ``retry_after`` is set. A stream gets the same
    answer (an error before the first chunk)."""
    RESET_BEFORE_HEADERS = "reset_before_headers"
    """Read the request, wait ``ttft``, then reset the TCP connection (RST), no response bytes."""
    CLOSE_BEFORE_HEADERS = "close_before_headers"
    """Read the request, stay silent ``ttft`` seconds, then close the connection cleanly (FIN)
    without a response byte: what a proxy or load balancer with an idle timeout does."""
    HANG = "hang"
    """Read the request and never answer, until the client disconnects."""
    KEEPALIVE_THEN_TOKENS = "keepalive_then_tokens"
    """Streaming: headers at once, ``: keep-alive`` SSE comments during ``ttft``, then tokens."""
    STALL = "stall"
    """Streaming: pause ``stall_for`` seconds (``None``: forever) after ``stall_after`` tokens,
    silently or with keep-alives (``Behavior.stall_keepalive``)."""
    CUT = "cut"
    """Close the connection after ``stall_after`` tokens, without finish_reason nor [DONE]."""
    CUT_WITH_DONE = "cut_with_done"
    """Streaming: after ``stall_after`` tokens send ``data: [DONE]`` with no chunk carrying a
    ``finish_reason`` (nor usage) before it, and end the body properly. Non-streaming: a 200
    whose content stops after ``stall_after`` tokens, with ``finish_reason`` null."""
    ERROR_EVENT = "error_event"
    """Fail with the error chosen by ``Behavior.error``. Streaming: after ``stall_after``
    tokens (``0``: as the first event, with the headers at ``ttft``) send one
    ``data: {"error": {...}}`` event and end the body, without [DONE]. Non-streaming: the
    matching HTTP status (500, 529, 429, 400, 400) with the same body, after ``ttft``."""
    HEADERS_THEN_SILENCE = "headers_then_silence"
    """Send the 200 headers on arrival, ignoring ``ttft`` (SSE headers, plus the role chunk
    with ``Behavior.role_chunk``, for a stream; JSON headers with the ``Content-Length`` of
    the answer otherwise), then nothing until the client disconnects. A stream gets
    keep-alives meanwhile if ``Behavior.stall_keepalive`` is set."""
    MALFORMED_CHUNK = "malformed_chunk"
    """Streaming: after ``stall_after`` tokens send ``data: {not json`` then continue."""
    MISSING_DONE = "missing_done"
    """Streaming: finish_reason and usage are sent but no ``data: [DONE]``, then close."""
    CONTEXT_LENGTH = "context_length"
    """400 ``context_length_exceeded`` (also produced by ``Behavior.context_window``)."""
    CONTENT_POLICY = "content_policy"
    """400 ``content_policy_violation`` whose message carries the reason ``flagged: violence``
    (Gemini: a 200 whose ``promptFeedback.blockReason`` is ``SAFETY``, no candidates)."""

    def __str__(self) -> str:
        return self.value


ERROR_KINDS = ("server_error", "overloaded", "rate_limit", "content_filter", "context_length")
"""The values of ``Behavior.error``, the errors ``Fault.ERROR_EVENT`` can send."""

FLAVORS = ("vllm", "ollama", "gemini_list_errors")
"""The values of ``Behavior.flavor``, variants of a wire format."""

LIMIT_HEADERS = ("honest", "missing", "full")
"""The values of ``Behavior.limit_headers``, what the rate-limit headers say."""


def _number(
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    positive: bool = False,
    signed: bool = False,
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"Behavior.{name} must be a number, got {value!r}")
    if not math.isfinite(value) or (value < 0 and not signed) or (positive and value == 0):
        bound = "" if signed else " > 0" if positive else " >= 0"
        raise ValueError(f"Behavior.{name} must be a finite number{bound}, got {value!r}")


def _choice(
    name: str, value: object, choices: tuple[str, ...], *, allow_none: bool = False
) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, str) or value not in choices:
        none = " or None" if allow_none else ""
        raise ValueError(
            f"Behavior.{name} must be one of {', '.join(choices)}{none}, got {value!r}"
        )


def _integer(name: str, value: object, *, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Behavior.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"Behavior.{name} must be >= {minimum}, got {value!r}")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"Behavior.{name} must be a bool, got {value!r}")


def header_pairs(value: object) -> tuple[tuple[str, str], ...]:
    """``Behavior.headers`` as ``(name, value)`` pairs, validated (``ValueError``)."""
    items = value.items() if hasattr(value, "items") else value
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise ValueError(f"Behavior.headers must be a mapping of str to str, got {value!r}")
    pairs = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"Behavior.headers must be a mapping of str to str, got {value!r}")
        name, text = item
        if (
            not (isinstance(name, str) and isinstance(text, str))
            or any(c in name + text for c in "\r\n")
            or not name.strip()
            or ":" in name
        ):
            raise ValueError(f"Behavior.headers has an invalid header {item!r}")
        pairs.append((name, text))
    return tuple(pairs)


@dataclass(frozen=True, kw_only=True)
class Behavior:
    """How the fake provider answers one chat (or embeddings) request, in any of its wire
    formats.

    All fields are keyword-only and validated on construction (``ValueError`` naming the
    field). ``Behavior()`` is a fast, successful answer: no delay, 16 tokens.
    """

    ttft: Latency | float = 0.0
    """Seconds from request arrival to the first response byte. Default ``0.0``.

    Streaming: the headers and the first token are sent after ``ttft`` (the headers at once
    with ``role_chunk``, ``KEEPALIVE_THEN_TOKENS`` and ``HEADERS_THEN_SILENCE``, which
    ignores ``ttft``). Non-streaming: the whole response is sent after
    ``ttft + output_tokens * itl``. Error faults (429, 500, 503, 400s, ``ERROR_EVENT``
    without a stream), ``rejects_prefill`` and ``RESET_BEFORE_HEADERS`` wait ``ttft``
    before failing."""
    itl: Latency | float = 0.0
    """Seconds between streamed tokens (inter-token latency). Default ``0.0``."""
    output_tokens: int = 16
    """Number of tokens generated (``tok0 tok1 ...``, one per chunk). Default ``16``.

    If the request ends with an assistant message (a prefill) that the answer text starts
    with, only the rest of the text is emitted, and counted (see ``rejects_prefill``). A
    request's ``max_tokens`` (or ``max_completion_tokens``) below the answer's length cuts it
    there, with ``finish_reason`` ``"length"``, as real servers do."""
    fault: Fault | None = None
    """Injected failure, or ``None`` (default) for a normal answer."""
    retry_after: float | None = None
    """Seconds sent as ``Retry-After`` header with a 429. Default ``None`` (no header)."""
    stall_after: int = 4
    """Tokens sent before a ``STALL``, ``CUT``, ``CUT_WITH_DONE``, ``ERROR_EVENT`` or
    ``MALFORMED_CHUNK`` fault. Default ``4``.

    If the answer has fewer tokens, the fault happens after the last token. With ``0`` the
    headers and an empty role chunk come first, except for ``ERROR_EVENT``, whose error is
    the first event."""
    stall_for: float | None = None
    """``STALL`` pause in seconds; ``None`` (default) stalls until the client disconnects.
    After the pause the stream continues normally."""
    stall_keepalive: bool = False
    """Streaming: send keep-alives every ``keepalive_every`` seconds during a ``STALL`` pause
    and during ``HEADERS_THEN_SILENCE``, alternately a ``: keep-alive`` comment and a chunk
    with an empty ``{"content": ""}`` delta and no finish_reason. Default ``False``."""
    keepalive_every: float = 0.5
    """Interval of the keep-alives of ``KEEPALIVE_THEN_TOKENS`` and ``stall_keepalive``.
    Default ``0.5``."""
    context_window: int | None = None
    """If set and the prompt's estimated tokens (characters of all message contents // 4,
    at least 1) exceed it, answer 400 ``context_length_exceeded``. Default ``None``."""
    text: str | None = None
    """Content to emit instead of ``tok0 tok1 ...``. Default ``None``.

    It is split into word tokens (each with its leading whitespace), one per chunk, and
    the number of words replaces ``output_tokens``."""
    role_chunk: bool = False
    """Streaming: send a role-only chunk (delta ``{"role": "assistant", "content": ""}``)
    with the headers on arrival, before ``ttft``; no later chunk carries the role. Default
    ``False``: the role rides on the first content chunk, sent after ``ttft``."""
    error: str = "server_error"
    """The error ``Fault.ERROR_EVENT`` sends, one of :data:`ERROR_KINDS`. Default
    ``"server_error"``:

    - ``"server_error"``: type ``server_error``, code null; HTTP 500;
    - ``"overloaded"``: type ``overloaded_error``, message ``Overloaded``; HTTP 529;
    - ``"rate_limit"``: type and code ``rate_limit_exceeded``; HTTP 429;
    - ``"content_filter"``: type ``invalid_request_error``, code ``content_filter``; HTTP 400;
    - ``"context_length"``: type ``invalid_request_error``, code
      ``context_length_exceeded``; HTTP 400."""
    status: int = 500
    """HTTP status sent by ``Fault.HTTP_ERROR``, 400-599. Default ``500``."""
    error_type: str | None = None
    """``type`` of the ``Fault.HTTP_ERROR`` error object. Default ``None``: by status
    (``invalid_request_error`` for a 4xx, ``authentication_error`` 401, ``permission_error``
    403, ``not_found_error`` 404, ``rate_limit_error`` 429, ``overloaded_error`` 529,
    ``server_error`` for other 5xx)."""
    error_code: str | int | None = None
    """``code`` of the ``Fault.HTTP_ERROR`` error object (vLLM sends an int). Default
    ``None``."""
    error_message: str | None = None
    """``message`` of the ``Fault.HTTP_ERROR`` error object. Default ``None``: the status's
    reason phrase."""
    body: str | None = None
    """The raw body ``Fault.HTTP_ERROR`` sends instead of the OpenAI error object (an
    Anthropic-shaped error, a proxy's HTML page...). Default ``None``."""
    headers: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    """Extra response headers of ``Fault.HTTP_ERROR`` (e.g. ``{"retry-after-ms": "250"}``);
    stored as a tuple of ``(name, value)`` pairs. Default none."""
    reasoning: str | None = None
    """Thinking text streamed before the answer, split into word tokens like ``text``
    (one per chunk, counted in ``tokens_sent`` and ``stall_after``). Default ``None``: none.

    OpenAI format: ``reasoning_content`` deltas (``reasoning`` with ``flavor="ollama"``);
    Anthropic: a ``thinking`` block (``thinking_delta`` events, then a ``signature_delta``);
    Gemini: parts with ``"thought": true``."""
    tool_call: str | None = None
    """Name of a function the answer calls, with ``tool_arguments``. Default ``None``.

    The answer is then the tool call alone (``output_tokens`` is ignored), after ``text``
    if that is set; the finish reason is ``tool_calls`` (Anthropic ``tool_use``, Gemini
    ``STOP``). The call is one piece: one chunk (OpenAI ``tool_calls`` delta, Anthropic
    ``tool_use`` block with one ``input_json_delta``, Gemini ``functionCall`` part)."""
    tool_arguments: str = '{"city": "Paris"}'
    """The JSON text of the tool call's arguments. Default ``'{"city": "Paris"}'``."""
    flavor: str | None = None
    """A variant of the wire format, one of :data:`FLAVORS`. Default ``None``: the
    provider's own format.

    - ``"vllm"`` (OpenAI format): vLLM's error objects, ``{"object": "error", "message",
      "type": "BadRequestError", "param", "code": 400}`` as an HTTP error body and
      ``{"error": {"object": "error", "type": "InternalServerError", "message",
      "code": 500}}`` as a stream's error event;
    - ``"ollama"`` (OpenAI format): reasoning streamed as ``reasoning`` deltas;
    - ``"gemini_list_errors"`` (Gemini format): HTTP error bodies wrapped in a list,
      ``[{"error": {...}}]``, as Gemini's JSON-array stream endpoint sends them."""
    rejects_prefill: bool = False
    """Answer 400 ``invalid_request_error`` ("does not support assistant message prefill"),
    after ``ttft``, to a request whose last message has role ``assistant``; the fault, if
    any, is not applied. Default ``False``: such a request gets its prefill continued."""
    concurrency_knee: int | None = None
    """The knee of the model's latency under load. Default ``None``: latency does not
    depend on load.

    With ``N``, a request that arrives while ``k`` requests of the same model are being
    answered, itself included, gets its ``ttft`` and every ``itl`` multiplied by
    ``max(1, k / N)``: unchanged up to ``N`` in flight, then growing in proportion, as a
    server that serves ``N`` at a time. A request the quota refuses is not counted."""
    limit_headers: str = "honest"
    """What the rate-limit headers of a :class:`ProviderQuota` say, one of :data:`LIMIT_HEADERS`.
    Default ``"honest"``: the room the key has left.

    ``"missing"``: no ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` header (a 429 past the
    quota keeps its ``retry-after`` and body); ``"full"``: a lie, every answer claims all
    the room (remaining = limit, reset now) while the quota is still enforced."""
    dimensions: int | None = None
    """The length of the vectors ``POST /v1/embeddings`` answers with, unless the request
    asks for ``dimensions``. Default ``None``: OpenAI's for its models
    (``text-embedding-3-small`` and ``text-embedding-ada-002`` 1536, ``text-embedding-3-large``
    3072), else ``8``. The vectors are deterministic: the same text always embeds into the
    same unit vector."""
    reset_skew: float = 0.0
    """Seconds added to every reset the rate-limit headers report (OpenAI's durations,
    floored at ``0s``; Anthropic's timestamps), as a provider whose clock is off. Default
    ``0.0``; may be negative. ``retry-after`` is not moved."""

    def __post_init__(self) -> None:
        for name in ("ttft", "itl"):
            value = getattr(self, name)
            if not isinstance(value, Latency):
                _number(name, value)
        _integer("output_tokens", self.output_tokens, minimum=0)
        if self.fault is not None and not isinstance(self.fault, Fault):
            raise ValueError(f"Behavior.fault must be a Fault or None, got {self.fault!r}")
        _number("retry_after", self.retry_after, allow_none=True)
        _integer("stall_after", self.stall_after, minimum=0)
        _number("stall_for", self.stall_for, allow_none=True)
        _number("keepalive_every", self.keepalive_every, positive=True)
        _integer("context_window", self.context_window, minimum=1, allow_none=True)
        _integer("dimensions", self.dimensions, minimum=1, allow_none=True)
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError(f"Behavior.text must be a str or None, got {self.text!r}")
        for name in ("role_chunk", "stall_keepalive", "rejects_prefill"):
            _flag(name, getattr(self, name))
        _integer("status", self.status, minimum=400)
        if self.status > 599:
            raise ValueError(
                f"Behavior.status must be an HTTP error status (400-599), got {self.status!r}"
            )
        for name in ("error_type", "error_message", "body", "reasoning", "tool_call"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"Behavior.{name} must be a str or None, got {value!r}")
        if self.error_code is not None and (
            isinstance(self.error_code, bool) or not isinstance(self.error_code, (str, int))
        ):
            raise ValueError(
                f"Behavior.error_code must be a str, an int or None, got {self.error_code!r}"
            )
        if not isinstance(self.tool_arguments, str):
            raise ValueError(f"Behavior.tool_arguments must be a str, got {self.tool_arguments!r}")
        _choice("flavor", self.flavor, FLAVORS, allow_none=True)
        _integer("concurrency_knee", self.concurrency_knee, minimum=1, allow_none=True)
        _choice("limit_headers", self.limit_headers, LIMIT_HEADERS)
        _number("reset_skew", self.reset_skew, signed=True)
        object.__setattr__(self, "headers", header_pairs(self.headers))
        _choice("error", self.error, ERROR_KINDS)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Behavior:
        """Build a Behavior from a JSON object, as sent in the ``x-fake-behavior`` header.

        ``ttft``/``itl`` are numbers of seconds, ``fault`` a :class:`Fault` value (e.g.
        ``"http_429"``) or name (``"HTTP_429"``). Unknown keys raise ``ValueError``.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown Behavior field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        kwargs = dict(data)
        fault = kwargs.get("fault")
        if fault is not None:
            kwargs["fault"] = parse_fault(fault)
        return cls(**kwargs)  # type: ignore[arg-type]


def parse_fault(value: object) -> Fault:
    """Return the Fault named by a value (``"http_429"``) or a name (``"HTTP_429"``)."""
    if isinstance(value, Fault):
        return value
    if isinstance(value, str):
        try:
            return Fault(value.lower())
        except ValueError:
            pass
    names = ", ".join(f.value for f in Fault)
    raise ValueError(f"Behavior.fault must be one of {names}, got {value!r}")
