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


# --- ints, flags and functions (cache, routing, fan-out) ----------------------------------------


def integer(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An ``int`` (not a ``bool``) from ``minimum`` to ``maximum`` (default ``None``: no upper
    bound), else a ``TypeError`` (not an int) or ``ValueError`` (out of range) naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    """``value`` if it is a ``bool``, else a ``TypeError`` naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def function(name: str, value: object) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is callable."""
    if not callable(value):
        raise TypeError(f"{name} must be a function, got {value!r}")


def fraction(name: str, value: object) -> float:
    """A number strictly between 0 and 1 (a quantile), else a ``TypeError`` (not a number) or
    ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in (0, 1), got {value!r}")
    if not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)
