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


# --- checks of the breaker, the limiter, the retry budget and the fleet's store --------------


def count(name: str, value: object) -> int:
    """An int of at least 1 (not a bool), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def number(
    name: str, value: object, low: float = 0.0, high: float = math.inf, *, above: bool = False
) -> float:
    """A finite real number (not a bool) in ``[low, high]``, or ``(low, high]`` if ``above``,
    else ``ValueError`` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not (value > low if above else value >= low)
        or value > high
    ):
        bounds = f"{'(' if above else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a finite number in {bounds}, got {value!r}")
    return float(value)


def wait(name: str, value: object) -> float:
    """A finite number of seconds ``>= 0`` (int, float or ``timedelta``; ``0``: no waiting),
    else a ``TypeError`` or ``ValueError`` naming ``name``."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    return number(name, value)


def text(name: str, value: object) -> str:
    """A non-empty string, else a ``TypeError`` (not a string) or ``ValueError`` (empty)
    naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a non-empty string, got {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def instance(name: str, value: object, kind: type, what: str) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is ``None`` or an instance of ``kind``
    (``what`` names it in the message)."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, got {value!r}")


def function(name: str, value: object) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` is ``None`` or callable."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a function, got {value!r}")
