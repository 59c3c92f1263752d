"""Wire formats: how the engine's answer (pieces, errors, stream events) becomes bytes.

The engine (``_engine``) decides *what* happens to a request (latencies, faults, the
pieces of the answer); a :class:`Wire` decides how it looks on the wire for one API:
which URLs it serves, how it reads a request body, and how it renders answers, stream
events and errors. One Wire instance serves one request.
"""

from __future__ import annotations

import abc
import json
import math
import re
from dataclasses import dataclass
from typing import Literal

from ._behavior import Fault

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._quota import QuotaUsage, Refusal

PieceKind = Literal["text", "reasoning", "tool"]
Piece = tuple[PieceKind, str]
"""One unit of the answer, one per stream event: ``("text", " word")``, ``("reasoning",
" word")`` (thinking text, before the answer) or ``("tool", '{"city": "Paris"}')`` (a whole
tool call's arguments, as JSON text)."""

DEFAULT_CONTEXT_WINDOW = 4096
"""Context length reported by ``Fault.CONTEXT_LENGTH`` when ``context_window`` is unset."""

ERROR_FAULTS = frozenset(
    {Fault.HTTP_429, Fault.HTTP_500, Fault.HTTP_503, Fault.CONTEXT_LENGTH, Fault.CONTENT_POLICY}
)
"""Faults answered with an HTTP error status and the format's error body."""

_WORD = re.compile(r"\s*\S+|\s+")


def dumps(obj: object) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def words(text: str) -> list[str]:
    """``text`` split into word tokens, each with its leading whitespace."""
    return _WORD.findall(text)


def content_text(content: object) -> str:
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


def dicts(value: object) -> list[dict[str, object]]:
    """The dict items of ``value`` if it is a list, else ``[]``."""
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def integer(value: object) -> int | None:
    """``value`` if it is an int (not a bool), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_object(text: str) -> object:
    """A tool call's arguments parsed (``{}`` if they are not valid JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return {}


def context_length_numbers(prompt_tokens: int, context_window: int | None) -> tuple[int, int]:
    """``(limit, used)`` for a context-length error: ``used`` always exceeds ``limit``."""
    limit = context_window if context_window is not None else DEFAULT_CONTEXT_WINDOW
    return limit, max(prompt_tokens, limit + 1)


def seconds_header(value: float) -> str:
    """``2`` for whole seconds, else a short decimal such as ``0.25``."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


def wait_header(seconds: float) -> str:
    """A ``retry-after`` of whole seconds, rounded up: no client comes back too early."""
    return str(max(math.ceil(seconds), 1))


def sse(data: bytes, event: str | None = None) -> bytes:
    """One SSE event carrying ``data``, with an ``event:`` line if ``event`` is given."""
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + data + b"\n\n"


@dataclass(frozen=True)
class Parsed:
    """What the engine needs from a chat request body, read by :meth:`Wire.parse`."""

    model: str
    stream: bool
    prompt_tokens: int
    """Estimated: characters of all message texts // 4, at least 1."""
    prefill: str | None
    """The text of a trailing assistant message (the start of the answer), else ``None``."""
    max_tokens: int | None
    """The client's output cap, if any."""
    include_usage: bool = False
    """Whether a stream ends with usage (always, in the formats that always send it)."""


@dataclass(frozen=True)
class Meta:
    """Per-response constants a Wire renders with."""

    response_id: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool
    flavor: str | None
    tool_name: str
    dimensions: int | None = None
    """The length of an embeddings answer's vectors (``Behavior.dimensions``)."""


Reply = tuple[int, bytes, list[tuple[str, str]]]
"""An error answer: HTTP status, JSON body, extra headers."""


class Wire(abc.ABC):
    """One API's wire format, serving one request (subclassed per format).

    The engine calls :meth:`route` on each format's class to find who serves a URL, then,
    on an instance, :meth:`parse`, :meth:`start` and the rendering methods. Stream
    renderers may keep state (the open content block, whether the role was sent).
    """

    name = ""
    """The format's name in records and messages: ``"openai"``, ``"anthropic"``, ``"gemini"``."""
    endpoints = ""
    """The URLs served, for the 404 message."""
    id_prefix = "fake"
    """The start of response ids."""
    retry_after_header = True
    """Whether a 429 or 503 says how long to wait in a ``Retry-After`` header (``False``:
    the format says it in the body)."""
    request_id_header = "x-request-id"
    """The response header that names the request (``req_fake_<attempt index>``)."""

    def __init__(self, url_model: str) -> None:
        self.url_model = url_model
        self.meta = Meta("", 0, url_model, 1, False, None, "")

    @classmethod
    @abc.abstractmethod
    def route(cls, method: str, path: str) -> str | None:
        """The model named by the URL (``""`` if none) when this format serves it, else None."""

    @abc.abstractmethod
    def parse(self, body: Mapping[str, object]) -> Parsed:
        """Read a request body (a JSON object)."""

    def start(self, meta: Meta) -> None:
        """Set the response's constants, before any rendering."""
        self.meta = meta

    # -- rate limits

    def api_key(self, headers: Mapping[str, str], query: str) -> str:
        """The request's API key (``""`` if none): ``Authorization: Bearer`` or ``api-key``
        (Azure's header); ``query`` is the URL's query string."""
        auth = headers.get("authorization", "")
        return auth[7:] if auth[:7].lower() == "bearer " else headers.get("api-key", "")

    def limit_headers(self, usage: QuotaUsage, skew: float) -> list[tuple[str, str]]:
        """The headers telling the room left, every reset moved by ``skew`` seconds
        (default: none, as Gemini sends)."""
        return []

    def quota_error(self, refusal: Refusal) -> Reply:
        """The 429 of a request past the quota (the engine adds ``retry-after``)."""
        wait = math.ceil(refusal.wait * 1000) / 1000  # to the millisecond, rounded up
        return self.fault_error(Fault.HTTP_429, context_window=None, retry_after=wait)

    # -- errors

    @abc.abstractmethod
    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        """A generic error body (a body that is not JSON, a failing script...); ``code``
        is OpenAI's error code, where the format has one."""

    @abc.abstractmethod
    def fault_error(
        self, fault: Fault, *, context_window: int | None, retry_after: float | None
    ) -> Reply:
        """The answer to one of :data:`ERROR_FAULTS` (the engine adds ``Retry-After``).

        A 200 is an answer that refuses (Gemini's blocked prompt): a stream gets its body
        as its only event."""

    @abc.abstractmethod
    def error_event(self, kind: str, *, context_window: int | None) -> tuple[int, bytes]:
        """``Fault.ERROR_EVENT``'s status and error object for ``Behavior.error == kind``."""

    def stream_error(self, error: bytes) -> bytes:
        """The SSE event carrying an error object in the middle of a stream."""
        return sse(error)

    @abc.abstractmethod
    def http_error(
        self,
        status: int,
        *,
        type_: str | None,
        code: str | int | None,
        message: str | None,
    ) -> bytes:
        """``Fault.HTTP_ERROR``'s body for a status and the Behavior's error fields."""

    def prefill_rejected(self) -> tuple[int, bytes]:
        """The 400 of ``Behavior.rejects_prefill``."""
        return 400, self.error(
            400,
            "This model does not support assistant message prefill: "
            "the last message must have role 'user'.",
        )

    # -- answers

    @abc.abstractmethod
    def completion(self, pieces: list[Piece], finish: str | None) -> bytes:
        """A whole (non-streaming) answer; ``finish`` is the engine's finish reason
        (``"stop"``, ``"length"``, ``"tool_calls"``) or ``None`` (an answer cut short)."""

    @abc.abstractmethod
    def opening(self) -> bytes:
        """The stream's first event, sent with the headers (``Behavior.role_chunk``)."""

    @abc.abstractmethod
    def piece(self, piece: Piece) -> bytes:
        """The stream event(s) for one piece of the answer."""

    @abc.abstractmethod
    def beat(self, k: int) -> bytes:
        """The ``k``-th keep-alive (0-based) of ``Behavior.stall_keepalive``: nothing a client
        should count as content."""

    def keepalive(self) -> bytes:
        """The keep-alive of ``Fault.KEEPALIVE_THEN_TOKENS`` while the first token is due."""
        return self.beat(0)

    def malformed(self) -> bytes:
        """An event whose data is not JSON."""
        return b"data: {not json\n\n"

    @abc.abstractmethod
    def end_without_finish(self) -> list[bytes]:
        """``Fault.CUT_WITH_DONE``: the events that end the stream properly, no finish."""

    @abc.abstractmethod
    def end(self, finish: str, n_tokens: int, *, terminator: bool) -> list[bytes]:
        """The events that finish a stream: finish reason, usage and, if ``terminator``,
        the end marker (``Fault.MISSING_DONE`` leaves it out)."""
