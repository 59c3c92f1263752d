"""The story of a slow call: one log line per call that was slow or failed, with its attempts.

:class:`SlowCallLog` (``log_slow_calls``) subscribes to latencykit's events and writes, on the
standard :mod:`logging` module, one record for each call that took longer than a threshold (and, by
default, each call that failed): how long it took, how it ended, which target answered and
whether it degraded, then every attempt in start order (target, why it was made, when it
started, how long it ran, how it ended, the first chunk of a stream). The same data travels
structured in the record's ``extra`` (``record.latencykit``), for JSON log handlers.

Built from :class:`~latencykit.events.CallEnded` alone, so it says nothing events do not carry:
no prompt or answer text, no exception message, no key.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from . import _validation, events
from ._context import Attempt
from ._handle import Handle
from ._values import ErrorKind

__all__ = ["LOGGER", "SlowCallLog", "log_slow_calls"]

LOGGER = "latencykit.slow_calls"
"""The name of the logger :class:`SlowCallLog` writes to unless given another."""


class SlowCallLog(Handle):
    """Log one line for each latencykit call slower than ``threshold`` (or failed), until
    closed (``close()``, or the end of its ``with`` block); ``log_slow_calls`` is this class.

    Args:
        threshold: seconds (or ``timedelta``) a call may take before it is logged (default
            ``1.0``; ``0`` logs every call). A stream's duration runs to its end.
        logger: the logger, or its name (default ``None``: ``"latencykit.slow_calls"``).
        level: the records' level (default ``logging.WARNING``).
        failures: also log every call that failed, however fast (default ``True``). A call
            cancelled by its caller is logged only when slow.

    Each record's message is the call's story: duration, outcome (the error's class and
    :class:`~latencykit.ErrorKind`, never its message), the target that answered, whether it
    degraded, then each attempt in start order: number, why it was made (retry, hedge,
    failover, fallback, resume; a primary says nothing), start offset from the call's start,
    duration, outcome, and for a stream its first chunk. ``record.latencykit`` holds the same as
    a dict of JSON-ready values (docs/stats.md lists its keys). Nested calls (a decorated
    function calling ``lk.LLM``) are logged each on their own; ``parent_id`` ties them. Events
    are built for every call while anybody subscribes (microseconds per call); the record is
    written synchronously in the task that ended the call (use a ``QueueHandler`` if your
    handlers block).

    Attributes:
        threshold: seconds above which a call is logged.
        logger: the logger written to.
        level: the records' level.
        failures: whether failed calls are logged whatever their duration.
    """

    __slots__ = ("_parents", "_subscription", "failures", "level", "logger", "threshold")

    def __init__(
        self,
        threshold: float | datetime.timedelta = 1.0,
        *,
        logger: logging.Logger | str | None = None,
        level: int = logging.WARNING,
        failures: bool = True,
    ) -> None:
        self.threshold = _validation.wait("log_slow_calls.threshold", threshold)
        if isinstance(logger, str) or logger is None:
            logger = logging.getLogger(logger or LOGGER)
        self.logger = _validation.instance(
            "log_slow_calls.logger", logger, logging.Logger, "a logging.Logger or a name"
        )
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"log_slow_calls.level must be a logging level (int), got {level!r}")
        self.level = level
        self.failures = bool(failures)
        self._parents: dict[int, int] = {}  # call_id -> parent call_id, for nested calls
        self._subscription = events.subscribe(self._on_event)

    def __repr__(self) -> str:
        return (
            f"SlowCallLog(threshold={self.threshold:g}, logger={self.logger.name!r}, "
            f"level={logging.getLevelName(self.level)}, failures={self.failures})"
        )

    def close(self) -> None:
        """Stop logging. Idempotent."""
        self._subscription.close()
        self._parents.clear()

    def _on_event(self, event: events.Event) -> None:
        if isinstance(event, events.CallEnded):
            parent = self._parents.pop(event.call_id, None)
            failed = event.outcome == "error" and self.failures
            if (failed or event.duration > self.threshold) and self.logger.isEnabledFor(self.level):
                extra = {"latencykit": _fields(event, parent, self.threshold)}
                self.logger.log(self.level, "%s", _story(event), extra=extra)
        elif isinstance(event, events.CallStarted) and event.parent_id is not None:
            self._parents[event.call_id] = event.parent_id


def _attempts(event: events.CallEnded) -> list[Attempt]:
    return sorted(event.timeline, key=lambda attempt: attempt.start)


def _story(event: events.CallEnded) -> str:
    # e.g. "slow call 2.314s: ok from openai/backup (degraded); 2 attempts: #1 openai/primary
    # at +0.000s for 1.500s: cancelled; #2 (fallback) openai/backup at +1.501s for 0.813s: ok"
    failed = event.outcome == "error"
    first = "" if event.ttft is None else f", first chunk at {event.ttft:.3f}s"
    kind = "" if event.error_kind is None else f" [{event.error_kind.value}]"
    ended = {"ok": "ok from", "error": f"{event.error_type}{kind} on"}.get(
        event.outcome, "cancelled on"
    )
    attempts = _attempts(event)
    return (
        f"{'failed' if failed else 'slow'} call {event.duration:.3f}s"
        f"{f' (stream{first})' if event.stream else ''}"
        f": {ended} {event.target}{' (degraded)' if event.degraded else ''}"
        f"; {len(attempts)} attempt{'' if len(attempts) == 1 else 's'}"
        + "".join(f"{'; ' if i else ': '}{a}" for i, a in enumerate(attempts))
    )


def _fields(event: events.CallEnded, parent_id: int | None, threshold: float) -> dict[str, Any]:
    # The story as JSON-ready data (strings, numbers, booleans, None, lists, dicts).
    return {
        **{name: getattr(event, name) for name in _COPIED},
        "parent_id": parent_id,
        "threshold": threshold,
        "slow": event.duration > threshold,
        "error_kind": _value(event.error_kind),
        "attempts": [
            {**attempt._asdict(), "error_kind": _value(attempt.error_kind)}
            for attempt in _attempts(event)
        ],
    }


# What the record's data copies from the event as it is.
_COPIED = ("call_id", "outcome", "duration", "target", "degraded", "stream", "ttft", "error_type")


def _value(kind: ErrorKind | None) -> str | None:
    return None if kind is None else kind.value


log_slow_calls = SlowCallLog
"""The same class as :class:`SlowCallLog` (``lk.slow_calls.log_slow_calls(2.0)``)."""
