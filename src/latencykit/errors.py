"""The error taxonomy: exception types, and the classification of provider errors.

Policies decide what to do with an error by its :class:`ErrorKind` (retry it, hedge past it,
fail over, raise at once), never by string matching at the call site. :func:`classify` knows
litellm's exceptions (by type and by cause chain: a refused connection reaches us as a litellm
``InternalServerError`` whose cause is ``APIConnectionError``), httpx's, the OpenAI SDK's status
errors and Python's own ``TimeoutError``/``ConnectionError``, without importing any of them.

Every exception latencykit raises derives from :class:`LatencykitError` and carries the attempt
history (``.attempts``). Messages never contain API keys (they are scrubbed) nor prompt text.
"""

from __future__ import annotations

import contextlib
import enum
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

if TYPE_CHECKING:
    from ._context import Attempt

__all__ = [
    "AttemptTimeout",
    "AuthenticationFailed",
    "BadRequest",
    "ContentPolicyViolation",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "ErrorFilter",
    "ErrorKind",
    "FallbackFailed",
    "FirstTokenTimeout",
    "LatencykitError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimited",
    "StreamBroken",
    "StreamStalled",
    "TransientError",
    "attach_others",
    "classify",
    "error_predicate",
    "is_transient",
    "retry_after",
]


class ErrorKind(str, enum.Enum):
    """What an error says about the call and the provider; it drives every policy decision."""

    RATE_LIMITED = "rate_limited"
    """429: honour Retry-After, or go elsewhere if the wait does not fit the budget."""
    SERVER_ERROR = "server_error"
    """5xx: the provider is failing or overloaded."""
    CONNECTION = "connection"
    """No HTTP exchange: refused, reset, DNS, TLS."""
    TIMEOUT = "timeout"
    """The attempt took longer than its timeout."""
    STREAM_BROKEN = "stream_broken"
    """A stream died before it finished (no finish_reason, cut, malformed)."""
    CONTEXT_LENGTH = "context_length"
    """The prompt does not fit the model's context window: only a larger model can answer."""
    CONTENT_POLICY = "content_policy"
    """The provider refused the content: never retried."""
    AUTHENTICATION = "authentication"
    """401/403: never retried."""
    BAD_REQUEST = "bad_request"
    """400/404/422: the request itself is wrong; never retried."""
    CIRCUIT_OPEN = "circuit_open"
    """A circuit breaker refused the call: go elsewhere (failover, degrade); not retried."""
    UNKNOWN = "unknown"
    """Anything else; treated as not transient."""

    @property
    def transient(self) -> bool:
        """Whether another attempt (now, later, or elsewhere) may succeed."""
        return self in _TRANSIENT


_TRANSIENT = frozenset(
    {
        ErrorKind.RATE_LIMITED,
        ErrorKind.SERVER_ERROR,
        ErrorKind.CONNECTION,
        ErrorKind.TIMEOUT,
        ErrorKind.STREAM_BROKEN,
        ErrorKind.CIRCUIT_OPEN,
    }
)


class LatencykitError(Exception):
    """Base of every exception latencykit raises.

    Attributes:
        kind: the :class:`ErrorKind` of errors that have a fixed one (provider errors,
            :class:`~latencykit.CircuitOpen`), else ``None`` (then :func:`classify` decides).
        attempts: the attempt history of the call that failed, oldest first (empty until the
            error leaves the latencykit scope that made the attempts).
    """

    attempts: tuple[Attempt, ...] = ()
    kind: ErrorKind | None = None
    """The classification, for errors that have a fixed one (see :func:`classify`)."""
    others: tuple[BaseException, ...] = ()
    """Errors of the other attempts, when several failed (hedging): see :func:`attach_others`."""

    def __str__(self) -> str:
        text = super().__str__()
        if self.attempts:
            text += "\nattempts:\n" + "\n".join(f"  {a}" for a in self.attempts)
        return text


class DeadlineExceeded(LatencykitError, TimeoutError):
    """A :func:`~latencykit.deadline` budget ran out; everything inside it was cancelled.

    Attributes:
        budget: the deadline's budget in seconds.
        elapsed: seconds from entering the deadline to giving up.
        partial_text: for a stream that expired after its first content chunk, the text it
            delivered (``None`` otherwise).
    """

    partial_text: str | None = None

    def __init__(self, budget: float, elapsed: float) -> None:
        super().__init__(f"deadline of {budget:.3f}s exceeded after {elapsed:.3f}s")
        self.budget = budget
        self.elapsed = elapsed


class FallbackFailed(LatencykitError):
    """The primary path failed or timed out, and then the fallback failed too.

    Attributes:
        reason: ``"timeout"`` or ``"error"``: why the primary was abandoned.
        primary_error: the primary's exception (``None`` when it timed out).
        fallback_error: the fallback's exception (also the ``__cause__``).
    """

    def __init__(
        self, reason: str, primary_error: BaseException | None, fallback_error: BaseException
    ) -> None:
        primary = "timed out" if primary_error is None else f"raised {_describe(primary_error)}"
        super().__init__(f"primary {primary}; then the fallback raised {_describe(fallback_error)}")
        self.reason = reason
        self.primary_error = primary_error
        self.fallback_error = fallback_error


class ProviderError(LatencykitError):
    """An LLM provider answered with an error, or could not be reached.

    Raised by :class:`~latencykit.LLM` in place of litellm's exception (which stays reachable as
    ``__cause__``). Subclasses mirror :class:`ErrorKind`.

    Attributes:
        kind: the classification.
        target: the target (model string) of the failed attempt.
        status_code: the HTTP status when there was one.
        retry_after: seconds the provider asked us to wait (429/503 ``Retry-After``), if any.
        provider_message: the provider's own explanation, with secrets scrubbed and cut to 500
            characters.
        partial_text: for an error that ended a stream after its first content chunk, the text
            delivered before it (default ``None``).
    """

    kind: ErrorKind = ErrorKind.UNKNOWN
    partial_text: str | None = None

    def __init__(
        self,
        provider_message: str,
        *,
        target: str,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        status = f" (HTTP {status_code})" if status_code is not None else ""
        super().__init__(f"{target}: {self.kind.value}{status}: {provider_message}")
        self.target = target
        self.status_code = status_code
        self.retry_after = retry_after
        self.provider_message = provider_message


class TransientError(ProviderError):
    """A provider error that another attempt may not repeat (rate limit, 5xx, network)."""


class RateLimited(TransientError):
    """HTTP 429: too many requests; see ``retry_after``."""

    kind = ErrorKind.RATE_LIMITED


class ProviderUnavailable(TransientError):
    """HTTP 5xx: the provider failed or is overloaded."""

    kind = ErrorKind.SERVER_ERROR


class ProviderConnectionError(TransientError):
    """The provider could not be reached (refused, reset, DNS, TLS)."""

    kind = ErrorKind.CONNECTION


class AttemptTimeout(TransientError, TimeoutError):
    """One attempt exceeded its per-attempt timeout."""

    kind = ErrorKind.TIMEOUT


class FirstTokenTimeout(AttemptTimeout):
    """A stream sent no content chunk within its first-token limit
    (:class:`~latencykit.StreamGuard` ``first_token``); role-only chunks, empty deltas and
    keep-alives do not count. A timeout: failover and hedging move on; retries on the same
    target do not, by default (see :func:`~latencykit.retry`)."""


StreamBreak = Literal["cut", "stall", "error", "recovery_diverged"]
"""Why a stream broke (:attr:`StreamBroken.reason`)."""


class StreamBroken(TransientError):
    """A response stream died before its end: cut, stalled, an error event, or a malformed end.

    Raised instead of ending the iteration, so that a partial answer is never taken for a
    complete one.

    Attributes:
        reason: ``"cut"`` (ended without the provider's finish), ``"stall"``
            (:class:`StreamStalled`), ``"error"`` (the provider or the connection failed
            mid-stream) or ``"recovery_diverged"`` (a regenerated answer did not repeat the text
            already delivered).
        partial_text: the content text delivered before the break (default ``""``).
        finish_reason: the finish reason the provider sent, if any (default ``None``).
        chunks: content chunks delivered before the break (default ``0``).
    """

    kind = ErrorKind.STREAM_BROKEN

    def __init__(
        self,
        provider_message: str,
        *,
        target: str,
        reason: StreamBreak = "error",
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            provider_message, target=target, status_code=status_code, retry_after=retry_after
        )
        self.reason: StreamBreak = reason
        self.partial_text = ""
        self.finish_reason: str | None = None
        self.chunks = 0


class StreamStalled(StreamBroken):
    """A committed stream sent no content chunk for longer than its stall limit
    (:class:`~latencykit.StreamGuard` ``stall``); keep-alives and empty deltas do not count."""


class ContextLengthExceeded(ProviderError):
    """The prompt is longer than the model's context window."""

    kind = ErrorKind.CONTEXT_LENGTH


class ContentPolicyViolation(ProviderError):
    """The provider's safety system refused the request; ``provider_message`` says why."""

    kind = ErrorKind.CONTENT_POLICY


class AuthenticationFailed(ProviderError):
    """HTTP 401/403: missing, wrong or unauthorised credentials."""

    kind = ErrorKind.AUTHENTICATION


class BadRequest(ProviderError):
    """HTTP 400/404/422: the request is invalid for this provider or model."""

    kind = ErrorKind.BAD_REQUEST


_ERROR_TYPES: dict[ErrorKind, type[ProviderError]] = {
    cls.kind: cls
    for cls in (
        RateLimited,
        ProviderUnavailable,
        ProviderConnectionError,
        AttemptTimeout,
        StreamBroken,
        ContextLengthExceeded,
        ContentPolicyViolation,
        AuthenticationFailed,
        BadRequest,
    )
}
_ERROR_TYPES[ErrorKind.UNKNOWN] = ProviderError


ErrorFilter: TypeAlias = (
    "type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]"
)
"""Which errors a policy handles: exception type(s), or a predicate on the exception."""


def error_predicate(on: ErrorFilter | None, name: str) -> Callable[[BaseException], bool]:
    """The predicate for an ``on=`` option (``None``: :func:`is_transient`); ``name`` is the
    option's public name, for the error message."""
    if on is None:
        return is_transient
    if isinstance(on, type) and issubclass(on, BaseException):
        return lambda exc: isinstance(exc, on)
    if isinstance(on, tuple) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in on
    ):
        return lambda exc: isinstance(exc, on)
    if callable(on):
        return on  # type: ignore[return-value]
    raise TypeError(f"{name} must be exception type(s) or a predicate, got {on!r}")


def attach_others(error: BaseException, others: list[Exception]) -> None:
    """Attach the errors of the other failed attempts to the one raised.

    On a :class:`LatencykitError` they go to ``.others``; on any other exception to a
    ``latencykit_others`` attribute; on Python 3.11+ a note lists them too.
    """
    if not others:
        return
    if isinstance(error, LatencykitError):
        error.others = tuple(others)
    else:
        with contextlib.suppress(AttributeError):  # exceptions with __slots__ refuse it
            setattr(error, "latencykit_others", tuple(others))  # noqa: B010
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note("other attempts failed too: " + "; ".join(_describe(e) for e in others))


# --- classification -------------------------------------------------------------------------

# litellm class name -> kind, most specific first (checked along the MRO, so subclasses win).
_LITELLM_KINDS = {
    "ContextWindowExceededError": ErrorKind.CONTEXT_LENGTH,
    "ContentPolicyViolationError": ErrorKind.CONTENT_POLICY,
    "MidStreamFallbackError": ErrorKind.STREAM_BROKEN,
    "RateLimitError": ErrorKind.RATE_LIMITED,
    "Timeout": ErrorKind.TIMEOUT,
    "APITimeoutError": ErrorKind.TIMEOUT,
    "AuthenticationError": ErrorKind.AUTHENTICATION,
    "PermissionDeniedError": ErrorKind.AUTHENTICATION,
    "APIConnectionError": ErrorKind.CONNECTION,
    "InternalServerError": ErrorKind.SERVER_ERROR,
    "ServiceUnavailableError": ErrorKind.SERVER_ERROR,
    "BadGatewayError": ErrorKind.SERVER_ERROR,
    "BadRequestError": ErrorKind.BAD_REQUEST,
    "NotFoundError": ErrorKind.BAD_REQUEST,
    "UnprocessableEntityError": ErrorKind.BAD_REQUEST,
    "UnsupportedParamsError": ErrorKind.BAD_REQUEST,
}
_CLIENT_MODULES = ("litellm", "openai", "httpx", "httpcore", "aiohttp", "anthropic")

# Cause-chain markers of "the request never got an HTTP answer".
_CONNECTION_CAUSES = frozenset(
    {
        "APIConnectionError",
        "ConnectError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerDisconnectedError",
        "RemoteProtocolError",
        "ReadError",
        "WriteError",
    }
)
_TIMEOUT_CAUSES = frozenset(
    {
        "ReadTimeout",
        "ConnectTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "APITimeoutError",
        "ServerTimeoutError",
    }
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status_kind(status: int) -> ErrorKind | None:
    if status == 429:
        return ErrorKind.RATE_LIMITED
    if status == 408:
        return ErrorKind.TIMEOUT
    if status in (401, 403):
        return ErrorKind.AUTHENTICATION
    if 500 <= status <= 599:
        return ErrorKind.SERVER_ERROR
    if 400 <= status <= 499:
        return ErrorKind.BAD_REQUEST
    return None


def _status_code(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _kind_by_class_name(exc: BaseException) -> ErrorKind | None:
    for cls in type(exc).__mro__:
        if cls.__module__.split(".", 1)[0] in _CLIENT_MODULES:
            kind = _LITELLM_KINDS.get(cls.__name__)
            if kind is not None:
                return kind
    return None


# OpenAI-style error ``code`` / ``type`` -> kind, for errors that arrive without a telling class
# (an error event in the middle of a stream reaches us as litellm's MidStreamFallbackError, a
# generic 400 as BadRequestError).
_CODE_KINDS = {
    "content_filter": ErrorKind.CONTENT_POLICY,
    "content_policy_violation": ErrorKind.CONTENT_POLICY,
    "context_length_exceeded": ErrorKind.CONTEXT_LENGTH,
    "invalid_api_key": ErrorKind.AUTHENTICATION,
}
_TYPE_KINDS = {
    "authentication_error": ErrorKind.AUTHENTICATION,
    "permission_error": ErrorKind.AUTHENTICATION,
    "invalid_request_error": ErrorKind.BAD_REQUEST,
}


def _kind_by_error_code(exc: BaseException) -> ErrorKind | None:
    """The kind an OpenAI-style error body in the cause chain names, if any (``code`` first,
    then ``type``)."""
    by_type = None
    for link in _chain(exc):
        body = getattr(link, "body", None)
        for source in (body, link) if isinstance(body, Mapping) else (link,):
            get = source.get if isinstance(source, Mapping) else source.__dict__.get
            code, kind_name = get("code"), get("type")
            if isinstance(code, str) and code in _CODE_KINDS:
                return _CODE_KINDS[code]
            if by_type is None and isinstance(kind_name, str):
                by_type = _TYPE_KINDS.get(kind_name)
    return by_type


_NETWORK_CAUSES = (_CONNECTION_CAUSES - {"APIConnectionError"}) | _TIMEOUT_CAUSES


def _caller_bug(exc: BaseException) -> bool:
    """Whether a "connection error" is in fact a bug raised before anything was sent.

    litellm wraps whatever goes wrong in a call in ``APIConnectionError``, a bad argument too
    (``messages="hi"`` fails with an ``AttributeError`` inside it): with no network error in
    the cause chain and a programming error there, nothing reached the provider, and another
    attempt, anywhere, would fail the same way.
    """
    bug = False
    for link in _chain(exc):
        if link is exc:
            continue
        if (
            type(link).__name__ in _NETWORK_CAUSES
            or isinstance(link, (ConnectionError, TimeoutError))
            or (_status_code(link) is not None and not _from_litellm(link))
        ):
            return False
        if isinstance(link, (TypeError, AttributeError, KeyError, IndexError)) or (
            isinstance(link, ValueError) and type(link).__name__ != "JSONDecodeError"
        ):
            bug = True
    return bug


def _from_litellm(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("litellm")


def classify(exc: BaseException) -> ErrorKind:
    """Classify any exception into an :class:`ErrorKind`.

    Rules, first match wins: latencykit's own :class:`ProviderError` keeps its kind; litellm /
    OpenAI SDK / httpx / aiohttp exceptions are classified by class (along the MRO), and a 5xx
    whose cause chain shows no HTTP exchange happened (a refused connection arrives from litellm
    as a 500) becomes ``CONNECTION``, and one caused by a client-side failure (litellm reports
    missing credentials as a 500 too) ``UNKNOWN``; any other exception with an integer
    ``status_code`` by status; ``TimeoutError`` (so :class:`DeadlineExceeded` too) is ``TIMEOUT``;
    ``ConnectionError`` is ``CONNECTION``; everything else is ``UNKNOWN``.
    """
    if isinstance(exc, LatencykitError) and exc.kind is not None:
        return exc.kind
    kind = _kind_by_class_name(exc)
    if kind is ErrorKind.CONNECTION and _caller_bug(exc):
        return ErrorKind.UNKNOWN
    if kind is ErrorKind.STREAM_BROKEN or kind is ErrorKind.BAD_REQUEST:
        # A content filter or a context-length error sent as an event mid-stream, or behind a
        # generic 400: it says more than the class does, and it is not worth another attempt.
        refined = _kind_by_error_code(exc)
        if refined is not None and refined is not kind and not refined.transient:
            return refined
    if kind is ErrorKind.SERVER_ERROR or kind is None:
        client_side = False
        for link in _chain(exc):
            name = type(link).__name__
            if name in _TIMEOUT_CAUSES:
                return ErrorKind.TIMEOUT
            if name == "JSONDecodeError" and kind is not None:
                # A provider answer that does not parse (truncated, empty, not JSON): a fault
                # of the provider, worth another attempt, not a client-side failure.
                return ErrorKind.SERVER_ERROR
            if name in _CONNECTION_CAUSES or (
                link is not exc and isinstance(link, ConnectionError)
            ):
                return ErrorKind.CONNECTION
            if link is exc or type(link).__module__.startswith("litellm"):
                continue  # litellm's own wrappers carry a status even when nothing was sent
            if _status_code(link) is not None:
                break  # a real HTTP answer: the class-based kind stands
            client_side = True
        else:
            # litellm reports client-side failures (missing credentials, its own bugs) as a
            # 500: nothing reached the provider, and another attempt would fail the same way.
            if client_side and kind is ErrorKind.SERVER_ERROR:
                return ErrorKind.UNKNOWN
    if kind is not None:
        return kind
    status = _status_code(exc)
    if status is not None and (by_status := _status_kind(status)) is not None:
        return by_status
    if isinstance(exc, TimeoutError):
        return ErrorKind.TIMEOUT
    if isinstance(exc, ConnectionError):
        return ErrorKind.CONNECTION
    return ErrorKind.UNKNOWN


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth another attempt: ``classify(exc).transient``."""
    return classify(exc).transient


def _parse_retry_after(value: str) -> float | None:
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        import email.utils  # lazily: it imports socket, 15 ms off `import latencykit`

        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        seconds = parsed.timestamp() - time.time()
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def _headers_of(exc: BaseException) -> Iterator[Mapping[str, Any]]:
    for attr in ("litellm_response_headers", "headers"):
        headers = getattr(exc, attr, None)
        if headers is not None and hasattr(headers, "get"):
            yield headers
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None and hasattr(headers, "get"):
        yield headers


def retry_after(exc: BaseException) -> float | None:
    """Seconds the provider asked to wait before retrying, from ``Retry-After``, or ``None``.

    Reads ``retry-after-ms`` and ``retry-after`` (seconds or an HTTP date) from litellm's
    ``litellm_response_headers``, or from ``exc.response.headers``, along the cause chain.
    """
    for link in _chain(exc):
        if isinstance(link, ProviderError) and link.retry_after is not None:
            return link.retry_after
        for headers in _headers_of(link):
            try:
                millis = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
                if millis is not None and (value := _parse_retry_after(str(millis))) is not None:
                    return value / 1000.0
                seconds = headers.get("retry-after") or headers.get("Retry-After")
                if seconds is not None and (value := _parse_retry_after(str(seconds))) is not None:
                    return value
            except (TypeError, ValueError, OverflowError):
                continue
    return None


# --- conversion -----------------------------------------------------------------------------

_SECRET_PATTERNS = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-]+|"
    r"(?i:api[_-]?key)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]+)"
)
_MESSAGE_LIMIT = 500


def scrub(text: str, *secrets: str | None) -> str:
    """Remove API-key-looking strings, and the given secrets, from ``text``.

    A secret is replaced only where it stands as a whole token (not inside a longer word), so
    that a short key does not mangle ordinary text.
    """
    for secret in secrets:
        if secret:
            text = re.sub(rf"(?<![\w\-.]){re.escape(secret)}(?![\w\-.])", "***", text)
    return _SECRET_PATTERNS.sub("***", text)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ProviderError):
        return f"{type(exc).__name__}({exc.target}: {exc.kind.value})"
    return f"{type(exc).__name__}: {scrub(str(exc))[:200]}"


def _provider_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    # litellm prefixes its class names ("litellm.BadRequestError: OpenAIException - ..."); keep
    # the provider's part.
    text = re.sub(r"^(litellm\.\w+:\s*)+(\w+:\s*)?", "", text).strip()
    return text or type(exc).__name__


def provider_error(
    exc: BaseException, *, target: str, secrets: tuple[str, ...] = ()
) -> ProviderError:
    """Wrap a client exception (litellm, httpx, ...) in the matching :class:`ProviderError`."""
    if isinstance(exc, ProviderError):
        return exc
    kind = classify(exc)
    message = scrub(_provider_message(exc), *secrets)
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    error = _ERROR_TYPES[kind](
        message,
        target=target,
        status_code=_status_code(exc),
        retry_after=retry_after(exc),
    )
    return error
