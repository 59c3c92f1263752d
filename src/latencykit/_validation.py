"""Validation of policy options at construction time, with messages that name the field.

Every check of an option lives here: ``name`` is the option's public name
(``"LLM.max_output_tokens"``) and starts the message, so a wrong value is found at once.
A number is never a ``bool``; an int is never a float.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

__all__ = [
    "choice",
    "fraction",
    "instance",
    "mapping",
    "non_empty",
    "number",
    "optional",
    "optional_seconds",
    "positive_int",
    "seconds",
    "since",
    "tags",
]

T = TypeVar("T")


def seconds(name: str, value: object, *, minimum: float = 0.0) -> float:
    """A positive finite number of seconds (int, float or ``timedelta``), at least ``minimum``
    when one is given, else a clear error.

    ``name`` is the option's public name (``"deadline.seconds"``) and starts the message.
    """
    result = _seconds(name, value)
    if not math.isfinite(result) or result <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    if result < minimum:
        raise ValueError(f"{name} must be at least {minimum:g} seconds, got {value!r}")
    return result


def optional_seconds(name: str, value: object) -> float | None:
    """``None``, or :func:`seconds`."""
    return None if value is None else seconds(name, value)


def since(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A number of seconds ``>= 0`` (int, float or ``timedelta``): finite, or with
    ``allow_inf`` also ``math.inf`` (never)."""
    result = _seconds(name, value)
    if math.isnan(result) or result < 0 or (result == math.inf and not allow_inf):
        bound = "a number of seconds >= 0 (math.inf: never)" if allow_inf else "a finite number"
        bound += "" if allow_inf else " of seconds >= 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return result


def _seconds(name: str, value: object) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    return float(value)


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


def fraction(name: str, value: object) -> float:
    """A number in ``[0, 1]``."""
    return number(name, value, low=0.0, high=1.0)


def choice(name: str, value: T, choices: Collection[object]) -> T:
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


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


def optional(name: str, value: T | None, kind: type[T], what: str = "") -> T | None:
    """``None``, or :func:`instance`."""
    return None if value is None else instance(name, value, kind, what)


def mapping(name: str, value: object) -> Mapping[str, Any]:
    """A mapping."""
    return instance(name, value, Mapping, "a mapping")


def tags(name: str, value: object) -> frozenset[str]:
    """A set of tags as a frozenset (a lone string is refused: ``{"prefill"}``, not
    ``"prefill"``)."""
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(f"{name} must be a set of tags, e.g. {{{value!r}}}")
    return frozenset(value)
