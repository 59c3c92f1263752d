"""What a script callable is told about an incoming request: :class:`RequestInfo`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class RequestInfo:
    """An incoming chat-completion request, as passed to a callable script.

    A callable script is ``Callable[[RequestInfo], Behavior]``; it runs on the server's
    thread, once per request, and must not block.
    """

    model: str
    """The model name the server received (litellm's ``"openai/slow"`` sends ``"slow"``)."""
    stream: bool
    """Whether the client asked for an SSE stream."""
    prompt_tokens: int
    """Estimated prompt tokens: characters of all message contents // 4, at least 1."""
    arrived_at: float
    """``time.monotonic()`` when the request was fully read."""
    nth: int
    """0-based count of earlier requests for this model (since the last ``reset()``)."""
    headers: Mapping[str, str]
    """Request headers, lowercase keys; ``authorization``, ``api-key``, ``x-api-key`` and
    ``x-goog-api-key`` redacted to ``***``."""
    body: Mapping[str, object] = field(default_factory=dict, repr=False)
    """The parsed JSON request body."""
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)
    """The provider's seeded RNG: sample from it to keep runs reproducible."""
    wire: str = "openai"
    """The request's wire format: ``"openai"`` (default), ``"openai-embeddings"``,
    ``"openai-responses"``, ``"anthropic"`` or ``"gemini"``."""
