"""What the fake provider observed for one request: :class:`RecordedAttempt`."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._behavior import Fault


@dataclass(frozen=True)
class RecordedAttempt:
    """One request as the fake provider saw it: a snapshot taken when read.

    Times are ``time.monotonic()`` values, comparable with the test's own clock. The server
    records what it sends just before handing the bytes to the socket, so whatever a client
    has received is already recorded; a client's disconnect is recorded within a few
    milliseconds (wait for it with ``wait_for``/``wait_for_async``). A request whose
    response the server cut on purpose (``Fault.CUT``, ``RESET_BEFORE_HEADERS``,
    ``CLOSE_BEFORE_HEADERS``) is neither
    ``completed`` nor ``disconnected``; so is one still in progress. A stream that ends
    early but properly (``CUT_WITH_DONE``, ``ERROR_EVENT``) is ``completed``.
    """

    index: int
    """Global arrival order, 0-based (since the last ``reset()``)."""
    model: str
    """Model name received (``""`` if the body had none or was not valid JSON)."""
    stream: bool
    """Whether the client asked for an SSE stream."""
    fault: Fault | None
    """The fault applied (``CONTEXT_LENGTH`` if ``context_window`` triggered), or ``None``."""
    status: int | None
    """HTTP status sent, ``None`` if no status line was sent (yet)."""
    arrived_at: float
    """When the request was fully read."""
    first_byte_at: float | None
    """When the first response byte was written, or ``None``."""
    ended_at: float | None
    """When the server finished sending the full response, or ``None``."""
    disconnected_at: float | None
    """When the client closed the connection before the response was complete, or ``None``."""
    tokens_sent: int
    """Content tokens written to the client."""
    connection_id: int
    """Id of the TCP connection (equal ids mean keep-alive reuse)."""
    request_headers: Mapping[str, str]
    """Request headers with lowercase keys; ``authorization``, ``api-key``, ``x-api-key`` and
    ``x-goog-api-key`` are ``***``."""
    prompt_tokens: int
    """Estimated prompt tokens (characters of message contents // 4, at least 1)."""
    prefill_chars: int = 0
    """Characters of the trailing ``assistant`` message (the answer's prefill) of the
    request; ``0`` when there is none (or it is empty)."""
    wire: str = "openai"
    """The request's wire format: ``"openai"`` (default), ``"openai-embeddings"``,
    ``"openai-responses"``, ``"anthropic"`` or ``"gemini"``."""

    @property
    def completed(self) -> bool:
        """True if the server sent the full response (``ended_at`` is set)."""
        return self.ended_at is not None

    @property
    def disconnected(self) -> bool:
        """True if the client went away before the response was complete."""
        return self.disconnected_at is not None


class AttemptState:
    """The mutable record behind a :class:`RecordedAttempt`, updated by the server thread.

    Mutate it only through ``FakeProvider._update`` (which holds the provider's lock).
    """

    __slots__ = (
        "arrived_at",
        "connection_id",
        "disconnected_at",
        "ended_at",
        "fault",
        "first_byte_at",
        "index",
        "model",
        "prefill_chars",
        "prompt_tokens",
        "request_headers",
        "status",
        "stream",
        "tokens_sent",
        "wire",
    )

    def __init__(
        self,
        *,
        index: int,
        model: str,
        stream: bool,
        arrived_at: float,
        connection_id: int,
        request_headers: Mapping[str, str],
        prompt_tokens: int,
        prefill_chars: int,
        wire: str = "openai",
    ) -> None:
        self.index = index
        self.model = model
        self.stream = stream
        self.fault: Fault | None = None
        self.status: int | None = None
        self.arrived_at = arrived_at
        self.first_byte_at: float | None = None
        self.ended_at: float | None = None
        self.disconnected_at: float | None = None
        self.tokens_sent = 0
        self.connection_id = connection_id
        self.request_headers = request_headers
        self.prompt_tokens = prompt_tokens
        self.prefill_chars = prefill_chars
        self.wire = wire

    def snapshot(self) -> RecordedAttempt:
        """A frozen copy."""
        return RecordedAttempt(
            index=self.index,
            model=self.model,
            stream=self.stream,
            fault=self.fault,
            status=self.status,
            arrived_at=self.arrived_at,
            first_byte_at=self.first_byte_at,
            ended_at=self.ended_at,
            disconnected_at=self.disconnected_at,
            tokens_sent=self.tokens_sent,
            connection_id=self.connection_id,
            request_headers=self.request_headers,
            prompt_tokens=self.prompt_tokens,
            prefill_chars=self.prefill_chars,
            wire=self.wire,
        )
