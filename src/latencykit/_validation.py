"""Validation of policy options at construction time, with messages that name the field."""

from __future__ import annotations

import datetime
import math
from collections.abc import Collection
from typing import TypeVar

__all__ = ["seconds"]

T = TypeVar("T")


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


# --- checks for cache, routing and fan-out ------------------------------------------------------


def positive_int(name: str, value: object) -> int:
    """An ``int >= 1`` (``ValueError`` for anything else, a float or a bool included)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def number(
    name: str, value: object, *, low: float = -math.inf, high: float = math.inf, open: bool = False
) -> float:
    """A finite number in ``[low, high]`` (``(low, high)`` with ``open``), as a float."""
    found = math.nan if isinstance(value, bool) or not isinstance(value, (int, float)) else value
    inside = low < found < high if open else low <= found <= high
    if not (inside and math.isfinite(found)):
        if high < math.inf:
            bounds = f" in {'(' if open else '['}{low:g}, {high:g}{')' if open else ']'}"
        else:
            bounds = f" >= {low:g}" if low > -math.inf else ""
        raise ValueError(f"{name} must be a finite number{bounds}, got {value!r}")
    return float(found)


def non_empty(name: str, value: object, what: str = "string") -> str:
    """A non-empty string (``what`` says what it is: ``"model string"``, ``"URL"``)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty {what}, got {value!r}")
    return value


def instance(name: str, value: object, kind: type[T] | tuple[type, ...], what: str = "") -> T:
    """``value`` if it is a ``kind`` (``TypeError`` naming ``what``, or the class, otherwise)."""
    if not isinstance(value, kind):
        what = what or f"a latencykit.{kind.__name__}"  # type: ignore[union-attr]
        raise TypeError(f"{name} must be {what}, got {value!r}")
    return value  # type: ignore[return-value]


def tags(name: str, value: object) -> frozenset[str]:
    """A set of tags as a frozenset (a lone string is refused: ``{"prefill"}``, not
    ``"prefill"``)."""
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(f"{name} must be a set of tags, e.g. {{{value!r}}}")
    return frozenset(value)


def non_negative_int(name: str, value: object) -> int:
    """An ``int >= 0`` (``ValueError`` for anything else, a float or a bool included)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def function(name: str, value: object) -> None:
    """A ``TypeError`` unless ``value`` is callable."""
    if not callable(value):
        raise TypeError(f"{name} must be a function, got {value!r}")
