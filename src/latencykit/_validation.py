"""Validation of policy options at construction time, with messages that name the field."""

from __future__ import annotations

import datetime
import math

__all__ = ["seconds"]


def seconds(name: str, value: object, *, minimum: float = 0.0) -> float:
    """A positive finite number of seconds (int, float or ``timedelta``), at least ``minimum``
    when one is given, else a clear error.

    ``name`` is the option's public name (``"deadline.seconds"``) and starts the message.
    """
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    result = float(value)
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    if result < minimum:
        raise ValueError(f"{name} must be at least {minimum:g} seconds, got {value!r}")
    return result
