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
import errno
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from ._values import BreakerState, ErrorKind
from .ratelimit import parse_wait, read_limits

if TYPE_CHECKING:
    from ._context import Attempt
    from ._values import Ledger

__all__ = [
    "AttemptTimeout",
    "AuthenticationFailed",
    "BadRequest",
    "CircuitOpen",
    "ContentPolicyViolation",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "ErrorFilter",
    "ErrorKind",
    "FallbackFailed",
    "FirstTokenTimeout",
    "GatherIncomplete",
    "LatencykitError",
    "LimitExceeded",
    "ModelNotFound",
    "NoAcceptableResult",
    "OutputTruncated",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderUnavailable",
    "REQUEST_ID_HEADERS",
    "RateLimited",
    "StreamBroken",
    "StreamStalled",
    "TransientError",
    "attach_others",
    "classify",
    "error_predicate",
    "is_transient",
    "overloaded",
    "request_id",
    "retry_after",
]


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

    def _headline(self) -> str:
        """The first part of ``str()``: the message (before the attempts)."""
        return super().__str__()

    def __str__(self) -> str:
        text = self._headline()
        if self.attempts:
            text += "\nattempts:\n" + "\n".join(f"  {a}" for a in self.attempts)
        return text


class DeadlineExceeded(LatencykitError, TimeoutError):
    """A :func:`~latencykit.deadline` budget (or a :func:`~latencykit.stage`'s) ran out;
    everything inside it was cancelled.

    Attributes:
        budget: the deadline's budget in seconds.
        elapsed: seconds from entering the deadline to giving up.
        partial_text: for a stream that expired after its first content chunk, the text it
            delivered (``None`` otherwise).
        stage: the name of the stage that overran: the one whose budget ran out, or the one
            running when the turn's deadline did (``None``: no stage).
        ledger: the turn's :class:`~latencykit.turn.Ledger` when stages ran in it (``None``
            otherwise).
        queued_for: when the deadline ended an attempt's wait for a connection slot (the
            provider was not asked: no request sent), the host it waited for, as
            ``"host:port (lane)"`` (else ``None``).
        queued: how many seconds that attempt waited (``0.0`` otherwise).
    """

    partial_text: str | None = None
    ledger: Ledger | None = None

    def __init__(
        self,
        budget: float,
        elapsed: float,
        *,
        stage: str | None = None,
        queued_for: tuple[str, float] | None = None,
    ) -> None:
        where = "" if stage is None else f" in stage {stage!r}"
        if queued_for is not None:
            where += (
                f", while an attempt waited {queued_for[1]:.3f}s for a connection to "
                f"{queued_for[0]} (no request sent)"
            )
        super().__init__(f"deadline of {budget:.3f}s exceeded after {elapsed:.3f}s{where}")
        self.budget = budget
        self.elapsed = elapsed
        self.stage = stage
        self.queued_for: str | None = None if queued_for is None else queued_for[0]
        self.queued = 0.0 if queued_for is None else queued_for[1]

    def __str__(self) -> str:
        text = super().__str__()
        if self.ledger is not None and len(self.ledger):
            text += "\nledger: " + str(self.ledger).replace("\n", "\n  ")
        return text


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


class LimitExceeded(LatencykitError):
    """A limiter refused the call: the wait for a concurrency slot or a tenant's quota would
    not fit the remaining budget (or ``max_wait``). The wrapped callable was not called.

    Attributes:
        target: the key of the target the call was for.
        tenant: the tenant whose quota ran out (``None`` for a target's concurrency limit).
        limit: which limit: ``"concurrency"``, ``"requests"`` or ``"tokens"``.
        wait: seconds the call would have had to wait (``None``: unknown, e.g. a slot
            with nothing to say when it frees up).
        waited: seconds the call waited before giving up.
        lane: the call's lane (``"interactive"``, ``"default"`` or ``"batch"``) when a
            governor shed it for want of room (default ``None``: another limit).
    """

    kind = ErrorKind.LIMIT_EXCEEDED

    def __init__(
        self,
        target: str,
        limit: str,
        *,
        tenant: str | None = None,
        wait: float | None = None,
        waited: float = 0.0,
        lane: str | None = None,
    ) -> None:
        who = f"target {target!r}" if tenant is None else f"tenant {tenant!r} on {target!r}"
        if lane is not None:
            who += f" for the {lane} lane"
        needs = "" if wait is None else f"; it would have had to wait {wait:.3f}s"
        super().__init__(
            f"{limit} limit of {who} reached; gave up after waiting {waited:.3f}s{needs}"
        )
        self.lane = lane
        self.target = target
        self.tenant = tenant
        self.limit = limit
        self.wait = wait
        self.waited = waited


class CircuitOpen(LatencykitError):
    """A circuit breaker refused the call; the wrapped callable was not called.

    Attributes:
        key: the breaker's key (a target name).
        state: the breaker's state: ``OPEN``, ``FORCED_OPEN``, or ``HALF_OPEN`` when every
            probe permit was taken.
        half_open_in: seconds until the breaker half-opens and admits probe calls again;
            ``None`` when no time is known (forced open, or half-open with all probes in
            flight).
        keys: the keys of every breaker that refused: ``(key,)``, or all the routes' keys
            for :meth:`all_open`.
    """

    keys: tuple[str, ...]
    kind = ErrorKind.CIRCUIT_OPEN

    def __init__(self, key: str, state: BreakerState, half_open_in: float | None) -> None:
        if state is BreakerState.FORCED_OPEN:
            why = "is forced open (isolate()); calls are refused until reset()"
        elif state is BreakerState.HALF_OPEN:
            why = "is half-open and every probe call is taken; calls are refused until they end"
        else:
            why = f"is open; calls are refused until it half-opens in {half_open_in or 0.0:.3f}s"
        super().__init__(f"circuit breaker {key!r} {why}")
        self.key = key
        self.keys = (key,)
        self.state = state
        self.half_open_in = half_open_in

    @classmethod
    def all_open(cls, keys: Sequence[str], half_open_in: float | None = None) -> CircuitOpen:
        """The error for a call none of whose targets admitted it (failover skipped them all).

        ``key`` is the first of ``keys`` (``""`` if there are none), ``state`` is ``OPEN``.
        """
        error = cls(keys[0] if keys else "", BreakerState.OPEN, half_open_in)
        error.keys = tuple(keys)
        named = ", ".join(repr(key) for key in keys) or "none"
        error.args = (f"every target's circuit breaker refuses calls (open: {named})",)
        return error


class OutputTruncated(LatencykitError):
    """The answer stopped at its output cap (``finish_reason == "length"``) that
    ``LLM(max_output_tokens=...)`` set: it is incomplete. Act on it: accept it
    (:attr:`response`), continue it (ask again with :attr:`partial_text` as the start of the
    assistant's answer), or fail.

    A stream raises it after its last chunk, in place of the end of iteration (the chunks
    already read are the answer so far).

    Attributes:
        response: the truncated litellm ``ModelResponse`` (``None`` for a stream).
        partial_text: its text.
        max_tokens: the cap the answering attempt was sent with (``None`` for a stream:
            ``report(stream)`` tells the rest).
        budget_capped: whether latencykit lowered the cap below ``max_output_tokens`` (and the
            call's own ``max_tokens``) to fit the remaining budget (``False`` for a stream).
    """

    def __init__(
        self, response: Any, partial_text: str, *, max_tokens: int | None, budget_capped: bool
    ) -> None:
        why = " (lowered to fit the remaining budget)" if budget_capped else ""
        cap = "" if max_tokens is None else f" of {max_tokens} tokens"
        super().__init__(
            f"the answer was cut at its output cap{cap}{why}; "
            "accept it (error.response, or the chunks read), continue from "
            "error.partial_text, or fail"
        )
        self.response = response
        self.partial_text = partial_text
        self.max_tokens = max_tokens
        self.budget_capped = budget_capped


class _FanOutError(LatencykitError):
    """What :class:`GatherIncomplete` and :class:`NoAcceptableResult` share: a message listing
    each marker (``latencykit.fanout``'s ``Missing``) by index, the error of the first failed
    awaitable as ``__cause__`` and the other failures in ``others``."""

    def __init__(self, summary: str, markers: Mapping[int, Any]) -> None:
        listing = "; ".join(f"[{index}] {marker}" for index, marker in markers.items())
        super().__init__(f"{summary}: {listing}")
        # A ``Failed`` marker is the one with an ``error`` (typed loosely: fanout is above us).
        failures = [
            error
            for marker in markers.values()
            if isinstance(error := getattr(marker, "error", None), Exception)
        ]
        self.__cause__ = failures[0] if failures else None
        self.others = tuple(failures[1:])


class GatherIncomplete(_FanOutError):
    """:func:`~latencykit.gather` with ``return_partial=False`` got fewer values than it
    needed (also importable from ``latencykit.fanout``).

    Its ``__cause__`` is the error of the first awaitable (in input order) that failed, if any
    did; the other failures are in ``others``.

    Attributes:
        results: the full :class:`~latencykit.fanout.Gathered` list, markers included.
        needed: the values that were needed (``min_results``, or all of them).
        missing: the markers of :attr:`results`, by index (as ``Gathered.missing``).
    """

    def __init__(self, results: Any, needed: int) -> None:
        self.results = results
        self.needed = needed
        self.missing: dict[int, Any] = results.missing
        got = len(results) - len(self.missing)
        super().__init__(
            f"gather got {got} of the {needed} results it needed from {len(results)} awaitables",
            self.missing,
        )


class NoAcceptableResult(_FanOutError):
    """:func:`~latencykit.first` got no acceptable result: every source failed or was
    rejected, or ``within`` ran out first (also importable from ``latencykit.fanout``).

    Its ``__cause__`` is the error of the first source (in input order) that failed, if any
    did; the other failures are in ``others``.

    Attributes:
        outcomes: one ``latencykit.fanout`` marker per source, in input order: ``Failed``,
            ``Rejected``, or ``TimedOut`` (``elapsed`` ``0.0`` for a source that never started).
    """

    def __init__(self, outcomes: Sequence[Any]) -> None:
        self.outcomes = tuple(outcomes)
        super().__init__(
            f"no acceptable result from {len(outcomes)} source(s)", dict(enumerate(outcomes))
        )


_ERROR_TYPES: dict[ErrorKind, type[ProviderError]] = {}


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
        request_id: the request id the provider's answer carried (its ``x-request-id`` header,
            or another of :data:`REQUEST_ID_HEADERS`: see :func:`request_id`), what its support
            asks for; ``str()`` shows it on a line of its own. For an error that ended a
            stream, the stream's answer's. ``None`` (default): no answer came, or it carried
            none.
        partial_text: for an error that ended a stream after its first content chunk, the text
            delivered before it (default ``None``).
    """

    kind: ErrorKind = ErrorKind.UNKNOWN
    partial_text: str | None = None
    request_id: str | None = None

    def __init_subclass__(cls, **options: Any) -> None:
        # The type provider_error() raises for a kind: the first of this module's of that kind.
        super().__init_subclass__(**options)
        if cls.__module__ == __name__:
            _ERROR_TYPES.setdefault(cls.kind, cls)

    def __init__(
        self,
        provider_message: str,
        *,
        target: str,
        status_code: int | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        status = f" (HTTP {status_code})" if status_code is not None else ""
        super().__init__(f"{target}: {self.kind.value}{status}: {provider_message}")
        self.target = target
        self.status_code = status_code
        self.retry_after = retry_after
        self.provider_message = provider_message
        self.request_id = request_id

    def _headline(self) -> str:
        # Read when shown: a stream's error learns its request id as the stream ends.
        text = super()._headline()
        return text if self.request_id is None else f"{text}\nrequest id: {self.request_id}"


_ERROR_TYPES[ErrorKind.UNKNOWN] = ProviderError


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
    partial_text: str | None = ""
    finish_reason: str | None = None
    chunks = 0

    def __init__(self, provider_message: str, *, reason: StreamBreak = "error", **how: Any) -> None:
        super().__init__(provider_message, **how)  # target=, status_code=, retry_after=, ...
        self.reason: StreamBreak = reason


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
    """HTTP 400/409/413/422 (and other 4xx): the request is invalid for this provider or
    model."""

    kind = ErrorKind.BAD_REQUEST


class ModelNotFound(BadRequest):
    """HTTP 404 (or ``model_not_found``): this target does not serve the model. Failover tries
    the other targets; the same target is not retried. A :class:`BadRequest`, so ``except
    BadRequest`` still catches it."""

    kind = ErrorKind.NOT_FOUND


class HTTPError(Exception):
    """A provider's error as it arrived on the wire, before classification: an HTTP error
    answer (``status_code`` >= 400), or an error object inside a 200 answer (a JSON body or a
    stream's error event: ``status_code`` ``None``). ``body`` is the decoded error (or its
    text), ``response`` the HTTP response (its headers: ``Retry-After``), if any. The fast
    lane raises it; :func:`classify` reads it as it reads litellm's exceptions."""

    def __init__(
        self, message: str, status_code: int | None, body: Any, response: Any = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body
        self.response = response


ErrorFilter: TypeAlias = (
    "type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]"
)
"""Which errors a policy handles: exception type(s), or a predicate on the exception."""


def error_predicate(on: ErrorFilter | None, name: str) -> Callable[[BaseException], bool]:
    """The predicate for an ``on=`` option (``None``: :func:`is_transient`); ``name`` is the
    option's public name, for the error message."""
    if on is None:
        return is_transient
    types: tuple[Any, ...] = on if isinstance(on, tuple) else (on,)
    if all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        return lambda exc: isinstance(exc, types)
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
#
# One table decides (docs/errors.md renders it). classify() reads the cause chain once into
# _Links; it first asks whether an HTTP answer came back at all (a refused, reset or silent
# connection, a timeout, a caller's bug that litellm wrapped); if one did, it gathers _Evidence
# (the provider's HTTP status, the OpenAI-style error ``code``/``type`` values, the message
# text, and the class litellm or the OpenAI SDK chose) and returns the kind of the first rule of
# _RULES that matches.


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Cause-chain markers of "the request never got an HTTP answer".
_CONNECTION_CAUSES = _names(
    "APIConnectionError ConnectError ClientConnectorError ClientOSError ServerDisconnectedError "
    "RemoteProtocolError ReadError WriteError"
)
_TIMEOUT_CAUSES = _names(
    "ReadTimeout ConnectTimeout WriteTimeout PoolTimeout TimeoutException APITimeoutError "
    "ServerTimeoutError"
)
_NETWORK_CAUSES = (_CONNECTION_CAUSES - {"APIConnectionError"}) | _TIMEOUT_CAUSES
_CLIENT_MODULES = ("litellm", "openai", "httpx", "httpcore", "aiohttp", "anthropic")

# The providers' wordings, for errors that carry no telling code (lowercase, matched anywhere
# in the messages of the error and its causes; compiled on first use, by re's own cache, to
# keep them off `import latencykit`). Context length: OpenAI, Azure, DeepSeek, Groq,
# vLLM ("maximum context length"), Mistral ("too large for model with N maximum context
# length"), the Responses API ("exceeds the context window"), Anthropic ("prompt is too long"),
# Bedrock ("input is too long"), Cohere ("too many tokens"), Gemini ("exceeds the maximum
# number of tokens allowed"), xAI ("maximum prompt length"), llama.cpp ("exceeds the available
# context size"), TGI ("`inputs` tokens + `max_new_tokens` must be"), Cerebras ("current length
# is N while limit is M").
_CONTEXT_WORDS = (
    r"maximum context length|context[_ ]length[_ ]exceeded|context[_ ]window[_ ]exceeded"
    r"|exceeds? (?:the )?(?:model's |available )?context (?:window|size|length|limit)"
    r"|prompt is too long|input is too long|too many (?:input |prompt )?tokens"
    r"|maximum prompt length|maximum input length"
    r"|exceeds the maximum number of tokens allowed|tokens \+ `max_new_tokens` must be"
    r"|longer than the model's (?:maximum )?context length|current length is \d+ while limit is"
)
# Content filters: OpenAI ("rejected as a result of our safety system", "flagged as
# potentially violating our usage policy"), Azure ("content management policy",
# ResponsibleAIPolicyViolation), Anthropic ("content filtering policy").
_CONTENT_WORDS = (
    r"content[_ ]policy[_ ]violation|content management policy|content filtering policy"
    r"|as a result of (?:our|the) safety system|violating our usage polic"
    r"|responsibleaipolicyviolation"
)


class _Evidence(NamedTuple):
    """What an error that came with an HTTP answer (or as an error event) says about itself."""

    status: int | None
    """HTTP status of the provider's answer (not litellm's guess), if any."""
    codes: frozenset[str] = frozenset()
    """OpenAI-style error ``code``, ``type`` (and Azure ``innererror.code``) values, lowercase."""
    text: str = ""
    """The error messages along the cause chain, lowercase."""
    classes: tuple[str, ...] = ()
    """Class names along the MRO of the exception, when it comes from a client library."""


class _Rule(NamedTuple):
    """One row of the table: ``kind`` if any of its ``signals`` is the error's: an HTTP status
    (``#429``, or ``#5xx`` for the class), an error code/type (lowercase) or a client class
    name (capitalised), space-separated (the three never clash); or if its ``words`` (a regular
    expression) are in the messages. Wordings are looser than codes: they decide only on a 4xx
    or without a status (a 5xx that merely mentions "too many tokens" stays a server error)."""

    kind: ErrorKind
    signals: frozenset[str]
    words: str | None = None


def _rule(kind: ErrorKind, signals: str = "", words: str | None = None) -> _Rule:
    return _Rule(kind, frozenset(signals.split()), words)


_K = ErrorKind
_RULES: tuple[_Rule, ...] = (
    # 1. The caller's account or pace, whatever the body says.
    _rule(_K.AUTHENTICATION, "#401 #403"),
    _rule(_K.RATE_LIMITED, "#429"),
    _rule(_K.TIMEOUT, "#408"),
    # 2. What the error says about this request on this target, whatever the status: the
    #    provider's code/type first, then its wording, then litellm's own reading of it.
    _rule(
        _K.CONTEXT_LENGTH,
        "context_length_exceeded context_window_exceeded exceed_context_size_error",
    ),
    _rule(
        _K.CONTENT_POLICY, "content_filter content_policy_violation responsibleaipolicyviolation"
    ),
    _rule(_K.NOT_FOUND, "model_not_found deploymentnotfound deployment_not_found not_found_error"),
    _rule(
        _K.AUTHENTICATION, "invalid_api_key authentication_error permission_error api_key_invalid"
    ),
    _rule(_K.CONTEXT_LENGTH, words=_CONTEXT_WORDS),
    _rule(_K.CONTENT_POLICY, words=_CONTENT_WORDS),
    _rule(_K.CONTEXT_LENGTH, "ContextWindowExceededError"),
    _rule(_K.CONTENT_POLICY, "ContentPolicyViolationError"),
    # 3. The HTTP status.
    _rule(_K.NOT_FOUND, "#404"),
    _rule(_K.TIMEOUT, "#504"),
    _rule(_K.SERVER_ERROR, "#5xx"),
    _rule(_K.BAD_REQUEST, "#4xx"),
    # 4. No HTTP status (an error event inside a stream, an error litellm raised itself): the
    #    class litellm or the OpenAI SDK chose, most specific first, then the error type.
    _rule(_K.STREAM_BROKEN, "MidStreamFallbackError"),
    _rule(_K.RATE_LIMITED, "RateLimitError"),
    _rule(_K.TIMEOUT, "Timeout APITimeoutError"),
    _rule(_K.AUTHENTICATION, "AuthenticationError PermissionDeniedError"),
    _rule(_K.NOT_FOUND, "NotFoundError"),
    _rule(_K.CONNECTION, "APIConnectionError"),
    _rule(_K.SERVER_ERROR, "InternalServerError ServiceUnavailableError BadGatewayError"),
    _rule(_K.BAD_REQUEST, "BadRequestError UnprocessableEntityError UnsupportedParamsError"),
    _rule(_K.RATE_LIMITED, "rate_limit_exceeded rate_limit_error"),
    _rule(_K.SERVER_ERROR, "overloaded_error server_error api_error service_unavailable"),
    _rule(_K.BAD_REQUEST, "invalid_request_error"),
)
del _K

# The names of the table: does a client library's class say what happened?
_RULE_NAMES = frozenset(name for rule in _RULES for name in rule.signals)
_TEXT_LIMIT = 4000  # characters of each message searched for wordings
_BODY_LIMIT = 100_000  # bytes of a response body decoded (a longer one is read as text)
_LINE_LIMIT = 200  # characters of a text body's line taken as its message


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes: the explicit ``__cause__``, else the implicit ``__context__``
    (litellm often raises without ``from``), except a latencykit error there: one that was
    being handled when a new attempt failed (a stream's earlier break, say) is not its cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        cause = current.__cause__
        if cause is None:
            cause = current.__context__
            if isinstance(cause, LatencykitError):
                return
        current = cause


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Link(NamedTuple):
    """One exception of an error's cause chain (:func:`_chain`), read once."""

    exc: BaseException
    name: str
    status: int | None
    """Its ``status_code``, or its HTTP response's."""
    litellm: bool
    """Raised by litellm, which puts its own guess of a status on its exceptions (500 on a
    refused connection, 400 on an error event in a stream)."""
    in_answer: bool
    """An error object that came inside a 200 answer (a JSON body or a stream's error event)
    rather than as an HTTP error, on either lane."""
    body: object
    """The decoded error body (see :func:`_body_of`)."""

    @property
    def answered(self) -> int | None:
        """The status of the provider's answer, if this link carries it (not litellm's guess,
        nor the one litellm gives an error object inside a 200 answer: 422, or the error's
        code)."""
        return None if self.litellm or self.in_answer else self.status


def _links(exc: BaseException) -> list[_Link]:
    links = []
    for link in _chain(exc):
        status = _int(getattr(link, "status_code", None))
        if status is None:
            status = _int(getattr(getattr(link, "response", None), "status_code", None))
        # litellm's stand-in for an error object in a 200 answer: a bare ``Exception`` with a
        # ``status_code`` of its own making; the fast lane's: an HTTPError without a status.
        in_answer = (
            (type(link) is Exception and "status_code" in vars(link))
            or (isinstance(link, HTTPError) and link.status_code is None)
            or (status is not None and 200 <= status < 300)  # a 200 litellm could not read
        )
        litellm = type(link).__module__.startswith("litellm")
        links.append(_Link(link, type(link).__name__, status, litellm, in_answer, _body_of(link)))
    return links


def _client_classes(exc: BaseException) -> tuple[str, ...]:
    return tuple(
        cls.__name__
        for cls in type(exc).__mro__
        if cls.__module__.split(".", 1)[0] in _CLIENT_MODULES
    )


def _http_status(links: list[_Link]) -> int | None:
    """The status of the provider's answer: the first one in the cause chain that litellm did
    not make up."""
    return next((link.answered for link in links if link.answered is not None), None)


def _stated_status(body: object) -> int | None:
    """The HTTP status an error body states of itself (vLLM's and others' ``{"error": {"code":
    500, ...}}``), if any."""
    error = body.get("error", body) if isinstance(body, Mapping) else None
    code = error.get("code") if isinstance(error, Mapping) else None
    code = int(code) if isinstance(code, str) and code.isdigit() else _int(code)
    return code if code is not None and 400 <= code <= 599 else None


def _strings(body: Mapping[Any, Any], *keys: str) -> list[str]:
    return [value for key in keys if isinstance(value := body.get(key), str)]


def _read_body(
    body: object, codes: set[str], texts: list[str], waits: list[float], depth: int = 0
) -> None:
    """Read a decoded error body wherever the common providers put things: the ``code``,
    ``type`` and Google's ``details[].reason`` (``google.rpc.ErrorInfo``: "API_KEY_INVALID")
    into ``codes`` (lowercase); the ``message`` (or FastAPI's ``detail``, TGI's ``error``
    string, a text body) into ``texts``; Google's ``details[].retryDelay``
    (``google.rpc.RetryInfo``: "2s") in seconds into ``waits``."""
    if isinstance(body, str):
        texts.append(body[:_TEXT_LIMIT])
        return
    if depth > 4:  # a list of errors, an error, its inner error, its details, a detail
        return
    if isinstance(body, list):  # Gemini answers a list of error objects; Google's details
        nested = body[:8]
    elif isinstance(body, Mapping):
        codes.update(code.lower() for code in _strings(body, "code", "type", "reason"))
        texts.extend(message[:_TEXT_LIMIT] for message in _strings(body, "message", "detail"))
        delays = map(parse_wait, _strings(body, "retryDelay"))
        waits.extend(wait for wait in delays if wait is not None)
        nested = [body.get("error"), body.get("innererror"), body.get("details")]
    else:
        return
    for item in nested:
        _read_body(item, codes, texts, waits, depth + 1)


def _body_of(link: BaseException) -> object:
    """The error body an exception carries, decoded: its ``body`` (the OpenAI SDK's, the fast
    lane's), else the read body of its httpx ``response`` (litellm's own HTTP handlers, for
    Gemini or Anthropic, keep it only there); ``None`` if neither."""
    body = getattr(link, "body", None)
    if body is not None:
        return body
    # litellm's stand-in for an error object in a 200 keeps only its code (422 if it had none).
    code = vars(link).get("status_code", 422) if type(link) is Exception else 422
    if code != 422:
        return {"code": code}
    try:
        content = getattr(link, "response", None).content  # type: ignore[union-attr]
    except Exception:  # no response, or a stream's that was not read
        return None
    if not isinstance(content, bytes) or not content:
        return None
    text = content[:_BODY_LIMIT].decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def body_message(body: object) -> str | None:
    """The provider's own message in a decoded error body (see ``_read_body``), or for a text
    or HTML body its first line of text, short; ``None`` if there is none."""
    texts: list[str] = []
    _read_body(body, set(), texts, [])
    if not texts:
        return None
    if not isinstance(body, str):
        return texts[0]
    title = re.search(r"<title[^>]*>([^<]*)</title>", texts[0], re.IGNORECASE)
    text = title.group(1) if title else re.sub(r"<[^>]*>", "\n", texts[0])
    line = next((line.strip() for line in text.splitlines() if line.strip()), None)
    return None if line is None else _cut(line, _LINE_LIMIT)


def _answer_status(links: list[_Link], classes: tuple[str, ...]) -> int | None:
    """The HTTP status the error's answer had: the provider's (:func:`_http_status`); for a
    class the table does not know, its own; else the one its body states of itself (an error
    event inside a stream reads as that status would, on every lane)."""
    status = _http_status(links)
    if status is None and _RULE_NAMES.isdisjoint(classes) and not links[0].in_answer:
        status = links[0].status
    if status is None:
        status = next(filter(None, (_stated_status(link.body) for link in links)), None)
    return status


def _evidence(links: list[_Link], classes: tuple[str, ...]) -> _Evidence:
    codes: set[str] = set()
    texts: list[str] = []
    for link in links:
        _read_body(link.body, codes, texts, [])
        if not link.litellm:  # litellm sets its own code/type ("throttling_error")
            codes.update(code.lower() for code in _strings(vars(link.exc), "code", "type"))
        message = getattr(link.exc, "message", None)
        texts.append((message if isinstance(message, str) else str(link.exc))[:_TEXT_LIMIT])
    text = "\n".join(texts).lower()
    return _Evidence(_answer_status(links, classes), frozenset(codes), text, classes)


def _kind_by_rules(evidence: _Evidence) -> ErrorKind | None:
    status = evidence.status
    statuses = () if status is None else (f"#{status}", f"#{status // 100}xx")
    signals = evidence.codes.union(evidence.classes, statuses)
    wordy = status is None or 400 <= status < 500
    for rule in _RULES:
        if not rule.signals.isdisjoint(signals) or (
            wordy and rule.words is not None and re.search(rule.words, evidence.text)
        ):
            return rule.kind
    return None


# The client's own resources that ran out, by errno, as the message says it.
_RESOURCE_ERRORS = {
    errno.EMFILE: "too many open files (EMFILE): this process is out of file descriptors",
    errno.ENFILE: "too many open files in the system (ENFILE)",
}


def _out_of_resources(exc: BaseException) -> str | None:
    """What ran out, when the client itself could not open a socket (an ``OSError`` with errno
    ``EMFILE``/``ENFILE`` among the exceptions of ``exc``'s traceback: trio's "all attempts to
    connect ... failed" holds each attempt's error in a group); ``None`` otherwise."""
    for link in _printed(exc):
        if isinstance(link, OSError) and link.errno in _RESOURCE_ERRORS:
            return _RESOURCE_ERRORS[link.errno]
    return None


def _caller_bug(causes: list[_Link]) -> bool:
    """Whether a "connection error" is in fact a bug raised before anything was sent.

    litellm wraps whatever goes wrong in a call in ``APIConnectionError``, a bad argument too
    (``messages="hi"`` fails with an ``AttributeError`` inside it): with no network error in
    the cause chain and a programming error there, nothing reached the provider, and another
    attempt, anywhere, would fail the same way.
    """
    network = any(
        link.name in _NETWORK_CAUSES
        or isinstance(link.exc, (ConnectionError, TimeoutError))
        or (link.status is not None and not link.litellm)
        for link in causes
    )
    return not network and any(
        isinstance(link.exc, (TypeError, AttributeError, KeyError, IndexError))
        or (isinstance(link.exc, ValueError) and link.name != "JSONDecodeError")
        for link in causes
    )


def _without_answer(links: list[_Link], classes: tuple[str, ...]) -> ErrorKind | None:
    """The kind of an error that came without an HTTP answer, or ``None`` if one came.

    A refused, reset or silently closed connection reaches us from litellm as a 500 whose
    cause chain holds the network error: ``CONNECTION`` (``TIMEOUT`` for a timeout). A
    client-side failure wrapped the same way (missing credentials, a bad argument, litellm's
    own bugs) is ``UNKNOWN``: nothing reached the provider, and another attempt would fail the
    same way. A 200 whose body does not parse is the provider's fault: ``SERVER_ERROR``.
    """
    first = links[0]
    if first.exc.__cause__ is None and not first.litellm and first.status is not None:
        # An HTTP answer, not caused by anything: what it was raised while handling (its
        # implicit context, e.g. the break a stream's recovery answers) says nothing of it.
        return None
    kind = _kind_by_rules(_Evidence(None, classes=classes))  # what the library's class says
    if kind is ErrorKind.CONNECTION:
        return ErrorKind.UNKNOWN if _caller_bug(links[1:]) else None
    if kind is None or kind is ErrorKind.SERVER_ERROR:
        return _cause_kind(links, wrapped=kind is not None)
    return None  # the library's class says what happened (a timeout, an error event...)


def _cause_kind(links: list[_Link], *, wrapped: bool) -> ErrorKind | None:
    """What the cause chain (``wrapped``: of a client library's server error) says when no
    answer came: a timeout, a lost connection, a client-side failure (``UNKNOWN``), an answer
    that does not parse; ``None`` when an HTTP answer came (or nothing tells)."""
    client_side = False
    for index, link in enumerate(links):
        if (kind := _network_kind(link, index, wrapped=wrapped)) is not None:
            return kind
        if index and not link.litellm:  # litellm's wrappers carry a status when nothing was sent
            if link.status is not None:
                return None  # a real HTTP answer
            client_side = True
    return ErrorKind.UNKNOWN if client_side and wrapped else None


def _network_kind(link: _Link, index: int, *, wrapped: bool) -> ErrorKind | None:
    """What link ``index`` of the cause chain says of the network: a timeout, a lost
    connection, or (``wrapped``) an answer that does not parse."""
    if link.name in _TIMEOUT_CAUSES:
        return ErrorKind.TIMEOUT
    if link.name == "JSONDecodeError" and wrapped:
        # A provider answer that does not parse (truncated, empty, not JSON): a fault of the
        # provider, worth another attempt, not a client-side failure.
        return ErrorKind.SERVER_ERROR
    if link.name in _CONNECTION_CAUSES or (index and isinstance(link.exc, ConnectionError)):
        return ErrorKind.CONNECTION
    return None


def classify(exc: BaseException) -> ErrorKind:
    """Classify any exception into an :class:`ErrorKind`.

    latencykit's own errors keep their kind. An error that came without an HTTP answer is
    ``CONNECTION`` or ``TIMEOUT`` by its cause chain (a refused connection arrives from litellm
    as a 500), or ``UNKNOWN`` when it was a client-side failure that litellm wrapped (missing
    credentials, a bad argument). Otherwise one table decides, first match wins (docs/errors.md):

    1. HTTP 401/403 ``AUTHENTICATION``, 429 ``RATE_LIMITED``, 408 ``TIMEOUT``, whatever the
       body says;
    2. the error's ``code``/``type`` (whatever the status), then its wording (on a 4xx or
       without a status), then litellm's class, for context length (``CONTEXT_LENGTH``),
       content filters (``CONTENT_POLICY``), a missing model (``NOT_FOUND``) and bad keys;
    3. the HTTP status: 404 ``NOT_FOUND``, 504 ``TIMEOUT``, other 5xx ``SERVER_ERROR``, other
       4xx ``BAD_REQUEST``;
    4. without a status (an error event inside a stream, an error litellm raised itself):
       litellm's / the OpenAI SDK's class, then the error type.

    Then ``TimeoutError`` (so :class:`DeadlineExceeded` too) is ``TIMEOUT``, ``ConnectionError``
    ``CONNECTION``, and anything else ``UNKNOWN``.
    """
    if isinstance(exc, LatencykitError) and exc.kind is not None:
        return exc.kind
    return _kind_of(_links(exc))


def _kind_of(links: list[_Link]) -> ErrorKind:
    exc = links[0].exc
    if _out_of_resources(exc) is not None:
        return ErrorKind.UNKNOWN  # the client's fault, not the provider's: another try fails too
    classes = _client_classes(exc)
    if (without := _without_answer(links, classes)) is not None:
        return without
    evidence = _evidence(links, classes)
    if evidence.status is None and any(link.in_answer for link in links):
        # An error object in place of an answer: what its code/type/wording says (a context
        # length...), else a malformed answer, worth another attempt. The class litellm chose
        # for it says nothing (a made-up 422).
        return _kind_by_rules(evidence._replace(classes=())) or ErrorKind.SERVER_ERROR
    if (kind := _kind_by_rules(evidence)) is not None:
        return kind
    if isinstance(exc, TimeoutError):
        return ErrorKind.TIMEOUT
    return ErrorKind.CONNECTION if isinstance(exc, ConnectionError) else ErrorKind.UNKNOWN


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth another attempt: ``classify(exc).transient``."""
    return classify(exc).transient


_OVERLOAD_STATUSES = frozenset({503, 529})


def overloaded(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider has more than it can take: a ``RATE_LIMITED`` error
    (429), or a ``SERVER_ERROR`` (or a stream's error event, ``STREAM_BROKEN``) whose answer
    was a 503 or a 529 (Anthropic's overload) or whose error says ``overloaded_error``.
    Another 5xx (a 500) is a failure, not a sign of load."""
    kind = classify(exc)
    if kind is ErrorKind.RATE_LIMITED:
        return True
    if kind is not ErrorKind.SERVER_ERROR and kind is not ErrorKind.STREAM_BROKEN:
        return False
    for link in _links(exc):
        if link.status in _OVERLOAD_STATUSES or _stated_status(link.body) in _OVERLOAD_STATUSES:
            return True
        error = link.body.get("error", link.body) if isinstance(link.body, Mapping) else None
        if isinstance(error, Mapping) and "overloaded_error" in _strings(error, "type", "code"):
            return True
    return False


def _headers_of(exc: BaseException) -> Iterator[Mapping[str, Any]]:
    response = getattr(exc, "response", None)
    for owner, attr in ((exc, "litellm_response_headers"), (exc, "headers"), (response, "headers")):
        headers = getattr(owner, attr, None)
        if isinstance(headers, dict):  # httpx's headers ignore case already; a dict does not
            yield {str(name).lower(): value for name, value in headers.items()}
        elif headers is not None and hasattr(headers, "get"):
            yield headers


REQUEST_ID_HEADERS = (
    "x-request-id",
    "request-id",
    "apim-request-id",
    "x-ms-request-id",
    "x-amzn-requestid",
    "x-goog-request-id",
)
"""The response headers a provider names its request id in, first found wins: OpenAI and
most compatible hosts (Azure OpenAI too) ``x-request-id``, Anthropic ``request-id``, Azure's
API Management ``apim-request-id`` and other Azure services ``x-ms-request-id``, AWS
``x-amzn-requestid``, Google ``x-goog-request-id``."""
_LITELLM_COPY = "llm_provider-"  # litellm keeps the provider's headers under this prefix
_REQUEST_ID_NAMES = (*REQUEST_ID_HEADERS, *(_LITELLM_COPY + name for name in REQUEST_ID_HEADERS))
_REQUEST_ID_LIMIT = 200  # characters kept of a request id (a header may be anything)


def request_id(headers: Mapping[str, Any] | None) -> str | None:
    """The provider's request id in an answer's ``headers`` (an ``httpx.Headers``, or a dict
    of lowercase names such as litellm's ``_hidden_params["additional_headers"]``, where its
    ``llm_provider-`` copies count as the provider's own), or ``None``: the first of
    :data:`REQUEST_ID_HEADERS` that is set, cut to 200 characters. The same headers give the
    same id on either lane."""
    if not headers:
        return None
    get = headers.get
    for name in _REQUEST_ID_NAMES:  # the provider's own names first: x-request-id is common
        value = get(name)
        if value and isinstance(value, str):
            return value.strip()[:_REQUEST_ID_LIMIT] or None
    return None


def hidden_params(answer: Any) -> Any:
    """An answer's ``_hidden_params`` dict, where litellm keeps its per-response metadata and
    the fast lane and latencykit theirs (``None``: it has none).

    On a pydantic model (litellm's responses) it is read from the model's private dict:
    reading the attribute goes through pydantic's ``__getattr__`` (1.3 us, measured; a call
    read it four times). Whether a type is a pydantic model is looked up once per type (on a
    fast-lane answer, looking for pydantic's slot raises inside ``getattr``: 0.6 us)."""
    kind = type(answer)
    pydantic = _pydantic_types.get(kind)
    if pydantic is None:
        pydantic = _pydantic_types[kind] = hasattr(kind, "__pydantic_private__")
    if pydantic:
        private = answer.__pydantic_private__
        hidden = private.get("_hidden_params") if type(private) is dict else None
    else:
        hidden = getattr(answer, "_hidden_params", None)
    return hidden if isinstance(hidden, dict) else None


_pydantic_types: dict[type, bool] = {}
"""Whether each answer type seen is a pydantic model (:func:`hidden_params`)."""


def headers_of(answer: Any) -> Any:
    """The provider's headers kept on an answer (a response or a stream): its
    ``_hidden_params["additional_headers"]``, where litellm keeps them and the fast lane too
    (``None``: none kept)."""
    hidden = hidden_params(answer)
    return None if hidden is None else hidden.get("additional_headers")


def request_id_of(outcome: object) -> str | None:
    """The provider's request id an attempt's outcome carries: an exception's ``request_id``
    (a :class:`ProviderError`'s; the OpenAI SDK's errors have one too), else an answer's
    (:func:`headers_of`, read by :func:`request_id`); ``None`` if none."""
    if isinstance(outcome, BaseException):
        found = getattr(outcome, "request_id", None)
        return found if isinstance(found, str) else None
    return request_id(headers_of(outcome))


def _request_id_in(links: list[_Link]) -> str | None:
    """The request id of the first answer along the cause chain that carries one."""
    for link in links:
        for headers in _headers_of(link.exc):
            if (found := request_id(headers)) is not None:
                return found
    return None


def _asked_wait(link: _Link) -> float | None:
    """The wait one link of the chain asks for: a latencykit error's, ``retry-after-ms``
    (Azure, OpenAI) or ``retry-after``, Google's ``retryDelay``."""
    if isinstance(link.exc, ProviderError) and link.exc.retry_after is not None:
        return link.exc.retry_after
    for headers in _headers_of(link.exc):
        if (limits := read_limits(headers)) is not None and limits.retry_after is not None:
            return limits.retry_after
    waits: list[float] = []
    _read_body(link.body, set(), [], waits)
    return waits[0] if waits else None


def _reset_wait(headers: Mapping[str, Any]) -> float | None:
    """The time until the exhausted limit (remaining 0) resets, the later of requests' and
    tokens'."""
    limits = read_limits(headers)
    if limits is None:
        return None
    exhausted = (
        (limits.requests_remaining, limits.requests_reset),
        (limits.tokens_remaining, limits.tokens_reset),
    )
    return max(
        (reset for left, reset in exhausted if left == 0 and reset is not None), default=None
    )


def retry_after(exc: BaseException) -> float | None:
    """Seconds the provider asked to wait before another attempt, or ``None``.

    Along the cause chain, the first of: ``retry-after-ms`` and ``retry-after`` (seconds or an
    HTTP date) from litellm's ``litellm_response_headers`` or ``exc.response.headers``;
    Google's ``RetryInfo.retryDelay`` in the error body. Failing those, the time until the
    exhausted limit resets: the ``x-ratelimit-reset-requests``/``-tokens`` (OpenAI and
    compatible hosts) or ``anthropic-ratelimit-*-reset`` header of a limit whose
    ``remaining`` header is 0 (the latest, if several are).
    """
    return _wait_of(_links(exc))


def _wait_of(links: list[_Link]) -> float | None:
    asked = (_asked_wait(link) for link in links)
    resets = (_reset_wait(headers) for link in links for headers in _headers_of(link.exc))
    return next((wait for wait in (*asked, *resets) if wait is not None), None)


# --- conversion -----------------------------------------------------------------------------

_SECRET_PATTERNS = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-]+|"
    # a value after "api_key=", "API key:" or OpenAI's "API key provided:" (a final period
    # is the sentence's)
    r"(?i:api[_ -]?key(?:\s+provided)?)[\"']?\s*[:=]\s*[\"']?[^\s\"',}*]*[^\s\"',}.*]|"
    # credentials in a URL: "https://user:password@host" keeps only "https://***@host"
    r"(?<=://)[^/?#\s]+(?=@))"
)
# Environment variables whose values are credentials: litellm and the fast lane take a key
# from there when a target has none (OPENAI_API_KEY, AZURE_API_KEY, HF_TOKEN, ...).
_SECRET_VARIABLE = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$")
_MIN_ENV_SECRET = 8  # shorter values of such variables are flags, not keys


def _environment_secrets() -> list[str]:
    import os

    return [
        value
        for name, value in os.environ.items()
        if len(value) >= _MIN_ENV_SECRET and _SECRET_VARIABLE.search(name)
    ]


def scrub(text: str, *secrets: str | None) -> str:
    """Remove the given secrets, the credentials in the environment, and API-key-looking
    strings from ``text``.

    A secret is any string, whatever its shape (an Azure hex key, a proxy token); it is
    replaced where it stands as a whole token (not inside a longer word, nor before
    ``.word``; a sentence's final period is fine), so that a short key does not mangle
    ordinary text. The environment's credentials are the values of its ``*KEY``, ``*TOKEN``,
    ``*SECRET``, ``*PASSWORD``, ``*CREDENTIALS`` variables (8 characters or more), read now.
    The patterns catch ``sk-...`` keys, ``Bearer`` tokens, ``api_key=...`` / ``API key
    provided: ...`` values and the ``user:password@`` of URLs.
    """
    return _scrubber(secrets)(text)


def _scrubber(secrets: tuple[str | None, ...]) -> Callable[[str], str]:
    """What :func:`scrub` does, with these ``secrets`` (and the environment's, read now)."""
    known = sorted({s for s in (*secrets, *_environment_secrets()) if s}, key=len, reverse=True)
    alternatives = "|".join(map(re.escape, known)) or "(?!)"  # (?!): matches nothing
    exact = re.compile(rf"(?<![\w\-.])(?:{alternatives})(?![\w\-]|\.[\w\-])")
    return lambda text: _SECRET_PATTERNS.sub("***", exact.sub("***", text))


def _scrub_value(value: object, scrub: Callable[[str], str]) -> object:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {k: _scrub_value(v, scrub) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_scrub_value(v, scrub) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _scrub_chain(exc: BaseException, scrub: Callable[[str], str]) -> None:
    """Scrub, in place, the exceptions a printed traceback of ``exc`` shows.

    ``traceback.format_exception`` (so ``logging.exception``) prints every exception of the
    ``__cause__``/``__context__`` chain and of exception groups, with its ``str()``: litellm's
    and the OpenAI SDK's exceptions keep the provider's text (which may echo the key) in their
    ``args``, ``message`` and ``body``, which their ``str()`` reads. Scrubbing those where
    latencykit wraps such an exception (:func:`provider_error`) keeps the key out of every
    traceback of an error latencykit raises, while litellm's exception stays reachable as the
    ``__cause__``. They are the exceptions of the failed attempt: nothing else holds them.
    """
    for link in _printed(exc):
        link.args = tuple(_scrub_value(a, scrub) for a in link.args)
        for name, value in list(vars(link).items()):
            if type(value).__name__ in _HTTPX_HELD and type(value).__module__.startswith("httpx"):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(link, name, _scrub_http(value, scrub))
        for attr in ("message", "body", "__notes__"):
            if attr in vars(link):
                with contextlib.suppress(AttributeError, TypeError):  # read-only: left as is
                    setattr(link, attr, _scrub_value(getattr(link, attr), scrub))


_HTTPX_HELD = frozenset({"Response", "Headers"})  # what of httpx's an answer's error holds


def _scrub_http(value: Any, scrub: Callable[[str], str]) -> Any:
    """An httpx response (its headers, and its body once read) or headers, scrubbed: a
    provider may echo the key it refused (``exc.response.text`` is often logged)."""
    headers = getattr(value, "headers", value)
    clean = type(headers)([(k, scrub(v)) for k, v in headers.multi_items()])
    if headers is value:
        return clean
    value.headers = clean
    if hasattr(value, "_content"):
        value._content = scrub(value._content.decode(errors="replace")).encode()
        vars(value).pop("_text", None)  # the body's text, decoded before
    return value


def _printed(exc: BaseException) -> Iterator[BaseException]:
    """Every exception a printed traceback of ``exc`` shows: its causes, contexts and the
    members of exception groups, each once."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        link = pending.pop()
        if id(link) not in seen:
            seen.add(id(link))
            yield link
            pending.extend(e for e in (link.__cause__, link.__context__) if e is not None)
            group = getattr(link, "exceptions", None)  # an exception group's members
            if isinstance(group, (tuple, list)):
                pending.extend(e for e in group if isinstance(e, BaseException))


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
    """Wrap a client exception (litellm, httpx, ...) in the matching :class:`ProviderError`.

    ``secrets`` (the configured keys) are scrubbed, with the environment's credentials and
    key-looking strings (:func:`scrub`), from its message and from ``exc`` and its chain in
    place (see ``_scrub_chain``): raised ``from exc``, it prints no key in any traceback.
    """
    if isinstance(exc, ProviderError):
        return exc
    links = _links(exc)
    kind = _kind_of(links)  # before scrubbing: it reads the provider's own text
    scrubbed = _scrubber(secrets)
    _scrub_chain(exc, scrubbed)
    # rather than "All connection attempts failed", what ran out
    message = _out_of_resources(exc) or _cut(scrubbed(_provider_message(exc)), 500)
    return _ERROR_TYPES[kind](
        message,
        target=target,
        # The answer's status only: litellm's own (500 for a refused connection, a cut
        # stream or a bad argument, 408 for a timeout) are made up.
        status_code=_http_status(links),
        retry_after=_wait_of(links),
        request_id=_request_id_in(links),  # after scrubbing: from the scrubbed headers
    )


def _cut(text: str, limit: int) -> str:
    """``text``, cut to ``limit`` characters (with "..." at the cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stream_error(
    exc: BaseException, *, target: str, secrets: tuple[str, ...] = (), opened: bool = True
) -> ProviderError:
    """What an error raised while reading a stream means, the same on every lane.

    Before the stream opened (no answer yet), it is what it would be for any request
    (:func:`provider_error`). Once open: a lost connection is a cut
    (:class:`StreamBroken`, ``reason="cut"``), another transient error (an overload or server
    error event, an event that is not JSON) a break (``reason="error"``), and an error event
    that is not transient (a content filter, context length) keeps its own type. An HTTP error
    answer (a status: litellm may open a stream before its request is sent) is what it is for
    any request. A break claims no HTTP status: the stream's answer was a 200.
    """
    error = provider_error(exc, target=target, secrets=secrets)
    if not opened or not _breaks_stream(error, exc):
        return error
    chain = list(_chain(exc))
    if any(type(link).__name__ == "JSONDecodeError" for link in chain):
        return not_json_event(1, target=target)
    lost = any(
        type(link).__name__ in _CONNECTION_CAUSES or isinstance(link, ConnectionError)
        for link in chain
    )
    if error.kind is ErrorKind.CONNECTION or lost:
        return StreamBroken(
            f"the connection was lost mid-stream: {error.provider_message}",
            target=target,
            reason="cut",
            request_id=error.request_id,
        )
    return StreamBroken(
        error.provider_message,
        target=target,
        retry_after=error.retry_after,
        request_id=error.request_id,
    )


def _breaks_stream(error: ProviderError, exc: BaseException) -> bool:
    """Whether ``error`` (from ``exc``), raised by an open stream, is a break of it: a
    transient error other than a timeout, an HTTP error answer (a lazily opened stream's first
    read: no stream) and latencykit's own (a cut judged from the chunks)."""
    return (
        error.kind.transient
        and error.kind is not ErrorKind.TIMEOUT
        and error.status_code is None
        and not (error is exc and isinstance(exc, StreamBroken))
    )


def malformed_answer(what: str, sample: bytes | str, *, target: str) -> ProviderUnavailable:
    """The error for a 200 answer that is not one (``what`` it is: "is not JSON", "has no
    choices", "is not an event stream"...): a transient :class:`ProviderUnavailable` (another
    attempt, or another target, may answer), counted by the breaker. The message shows the
    start of what came back, scrubbed."""
    text = sample.decode(errors="replace") if isinstance(sample, bytes) else sample
    shown = _cut(scrub(" ".join(text.split())), 120)
    said = f": {shown!r}" if shown else ""
    return ProviderUnavailable(
        f"the provider's answer {what}{said}", target=target, status_code=200
    )


def not_json_event(count: int, *, target: str) -> StreamBroken:
    """The break of a stream that ended without its finish after ``count`` events that are not
    JSON (``reason="error"``): the same on every lane (through litellm, the first such event
    ends the stream)."""
    events = "an event" if count == 1 else f"{count} events"
    return StreamBroken(f"{events} of the stream did not parse as JSON", target=target)
