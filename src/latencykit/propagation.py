"""Deadlines on the wire: the one home of the formats a remaining budget travels in.

A request may say how long its caller will wait in three forms; :func:`budget_of` reads them
all and the smallest wins:

* ``grpc-timeout``: gRPC's header, a relative timeout of at most 8 digits and a unit
  (``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds,
  ``n`` nanoseconds): ``250m``;
* ``x-request-timeout-ms`` (:data:`HEADER`): milliseconds left, relative: ``250``;
* a W3C Baggage entry ``deadline`` (:data:`BAGGAGE_KEY`): the **absolute** Unix time of the
  deadline in milliseconds: ``baggage: deadline=1764136800123``. Absolute because baggage is
  copied unchanged by hops that do not know the entry (a proxy, a queue, a service without
  latencykit): a relative value would grow stale at each such hop and silently extend the
  budget, an absolute one stays right (within the hosts' clock skew, which the relative header
  does not suffer; the smallest of the forms wins).

A value that does not parse is ignored (a debug line on the ``latencykit`` logger), never an
error for the caller. A budget already spent reads as ``0.0``.

Outbound, :func:`inject` writes the current remainder (``lk.remaining()``) as the header and
the baggage entry, keeping every other baggage member (the request's own, or else the
OpenTelemetry context's); calls to providers made by :class:`~latencykit.LLM` inside a
deadline carry the header alone (the app's baggage is not a provider's business): see
:func:`provider_headers` and :func:`send_to_providers`.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from . import _validation
from ._cancel import now
from ._context import deadline_var
from ._context import remaining as _remaining

__all__ = [
    "BAGGAGE_KEY",
    "GRPC_TIMEOUT",
    "HEADER",
    "budget_of",
    "inject",
    "provider_headers",
    "send_to_providers",
]

HEADER = "x-request-timeout-ms"
"""The relative form: whole milliseconds left (read with decimals too)."""
GRPC_TIMEOUT = "grpc-timeout"
"""gRPC's relative form (read only: latencykit writes HTTP headers)."""
BAGGAGE_KEY = "deadline"
"""The W3C Baggage entry: the absolute Unix time of the deadline, in milliseconds."""

_logger = logging.getLogger("latencykit")
_GRPC = re.compile(r"([0-9]{1,8})([HMSmun])")
_GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_MILLIS = re.compile(r"[0-9]{1,15}(\.[0-9]{1,9})?")
_to_providers = True
_deadline, _NONE = deadline_var.get, math.inf  # read per attempt: no attribute lookups


def budget_of(headers: Mapping[str, str] | Iterable[tuple[Any, Any]]) -> float | None:
    """The caller's remaining budget in seconds, from request ``headers`` (a mapping, or ASGI's
    ``(name, value)`` pairs of bytes or str; names in any case): the smallest of what
    ``grpc-timeout``, ``x-request-timeout-ms`` and the baggage ``deadline`` say, ``0.0`` if
    already spent, ``None`` when none of them is there (or none parses)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = math.inf
    for raw_name, raw_value in pairs:
        name = _text(raw_name).lower()
        if name == GRPC_TIMEOUT:
            found = min(found, _grpc(_text(raw_value)))
        elif name == HEADER:
            found = min(found, _millis(name, _text(raw_value).strip()) / 1000)
        elif name == "baggage":
            found = min(found, _baggage_ms(_text(raw_value)) / 1000 - time.time())
    return None if found == math.inf else max(0.0, found)


def inject(headers: MutableMapping[str, str], remaining: float | None = None) -> None:
    """Write ``remaining`` seconds (default: the current deadline's, ``lk.remaining()``) into
    outgoing request ``headers``: :data:`HEADER` and the baggage entry :data:`BAGGAGE_KEY`.

    A ``baggage`` header already there keeps its other members (a ``deadline`` it has stays
    if it is earlier); without one, the baggage of the current OpenTelemetry context (the
    app's, ``opentelemetry.baggage``) is written with the entry added, through OpenTelemetry's
    W3C propagator. Outside any deadline (and with ``remaining=None``) nothing is written."""
    if remaining is None:
        remaining = _remaining()
        if remaining is None:
            return
    headers[HEADER] = _format_millis(remaining)
    deadline: float = math.floor((time.time() + remaining) * 1000)
    present = headers.get("baggage")
    if present is not None:
        headers["baggage"] = _merged(present, deadline)
        return
    from opentelemetry import baggage
    from opentelemetry.baggage.propagation import W3CBaggagePropagator

    theirs = baggage.get_baggage(BAGGAGE_KEY)
    if theirs is not None:  # an upstream deadline in the context, kept if earlier
        deadline = min(deadline, _baggage_ms(f"{BAGGAGE_KEY}={theirs}"))
    context = baggage.set_baggage(BAGGAGE_KEY, str(math.floor(deadline)))
    W3CBaggagePropagator().inject(headers, context=context)


def provider_headers(extra_headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """The ``extra_headers`` of a provider call made now: ``extra_headers`` with
    :data:`HEADER` added when the call runs inside a deadline (unless it names the header
    itself, in any case, or :func:`send_to_providers` turned it off); else ``extra_headers``
    as they are. Called per attempt by both lanes: outside a deadline it costs one context
    variable read."""
    deadline = _deadline()
    if deadline == _NONE or not _to_providers:
        return extra_headers
    if extra_headers and any(name.lower() == HEADER for name in extra_headers):
        return extra_headers
    return {**(extra_headers or {}), HEADER: _format_millis(deadline - now())}


def send_to_providers(enabled: bool) -> None:
    """Whether calls to providers made inside a deadline send :data:`HEADER` (default
    ``True``, process-wide): ``send_to_providers(False)`` stops it (a provider that rejects
    unknown headers, say). Only the header is ever sent to a provider, never baggage.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    global _to_providers
    _to_providers = _validation.instance("send_to_providers.enabled", enabled, bool, "a bool")


def _format_millis(seconds: float) -> str:
    """Whole milliseconds, rounded down: a hop is never told it has more than is left."""
    return str(max(0, math.floor(seconds * 1000)))


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)


def _ignored(name: str, value: str) -> float:
    _logger.debug("latencykit: ignored a %s value that does not parse: %.40r", name, value)
    return math.inf


def _grpc(value: str) -> float:
    match = _GRPC.fullmatch(value.strip())
    if match is None:
        return _ignored(GRPC_TIMEOUT, value)
    return int(match[1]) * _GRPC_UNITS[match[2]]


def _millis(name: str, value: str) -> float:
    return float(value) if _MILLIS.fullmatch(value) else _ignored(name, value)


def _baggage_ms(header: str) -> float:
    """The earliest ``deadline`` member of a baggage header (Unix milliseconds; ``inf``:
    none)."""
    found = math.inf
    for member in header.split(","):
        key, _, rest = member.partition("=")
        if key.strip() == BAGGAGE_KEY:
            value = rest.partition(";")[0].strip()  # properties after ';' are not ours
            found = min(found, _millis(f"baggage {BAGGAGE_KEY}", value))
    return found


def _merged(header: str, deadline: float) -> str:
    """``header`` (a baggage list) with one ``deadline`` member: the earlier of its own and
    ``deadline`` (Unix milliseconds); every other member kept as it was."""
    deadline = math.floor(min(deadline, _baggage_ms(header)))
    others = [
        member
        for member in header.split(",")
        if member.strip() and member.partition("=")[0].strip() != BAGGAGE_KEY
    ]
    return ",".join([*others, f"{BAGGAGE_KEY}={deadline}"])
