"""Validation of policy options at construction time, with messages that name the field.

Every check of an option lives here: ``name`` is the option's public name
(``"LLM.max_output_tokens"``) and starts the message, so a wrong value is found at once. A
number is never a ``bool``; an int is never a float. Each check returns the value it accepts
(as a ``float`` for seconds and numbers), so that a constructor assigns what it checked.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Collection, Mapping
from typing import Any, TypeVar, cast

__all__ = [
    "choice",
    "count",
    "function",
    "instance",
    "known_targets",
    "mapping",
    "number",
    "optional",
    "optional_seconds",
    "seconds",
    "tags",
    "text",
    "wait",
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


def wait(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A number of seconds ``>= 0`` (int, float or ``timedelta``; ``0``: no waiting): finite,
    or with ``allow_inf`` also ``math.inf`` (never)."""
    result = _seconds(name, value)
    if math.isnan(result) or result < 0 or (result == math.inf and not allow_inf):
        bound = "(math.inf: never)" if allow_inf else "and finite"
        raise ValueError(f"{name} must be a number of seconds >= 0 {bound}, got {value!r}")
    return result


def _seconds(name: str, value: object) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    return float(value)


def count(name: str, value: object, *, minimum: int = 1) -> int:
    """An int of at least ``minimum`` (default ``1``); ``ValueError`` for anything else, a float
    or a bool included."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def number(
    name: str,
    value: object,
    low: float = 0.0,
    high: float = math.inf,
    *,
    above: bool = False,
    open: bool = False,
) -> float:
    """A finite number in ``[low, high]`` (default ``[0, inf)``) as a float; ``above``: the
    low bound excluded, ``open``: both bounds excluded."""
    first, last = "(" if above or open else "[", ")" if open else "]"
    found = _real(value)
    if not (math.isfinite(found) and _between(found, low, high, first + last)):
        raise ValueError(
            f"{name} must be a finite number in {first}{low:g}, {high:g}{last}, got {value!r}"
        )
    return found


def _real(value: object) -> float:
    """``value`` as a float, NaN for what is not a number (a bool is not)."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if is_number else math.nan  # type: ignore[arg-type]


def _between(found: float, low: float, high: float, brackets: str) -> bool:
    over = found > low if brackets[0] == "(" else found >= low
    return over and (found < high if brackets[1] == ")" else found <= high)


def choice(name: str, value: T, choices: Collection[object]) -> T:
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def text(name: str, value: object, what: str = "string") -> str:
    """A non-empty string (``what`` says what it is: ``"model string"``, ``"URL"``):
    ``TypeError`` for another type, ``ValueError`` for ``""``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a non-empty {what}, got {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty {what}, got ''")
    return value


def instance(name: str, value: object, kind: type[T] | tuple[type, ...], what: str = "") -> T:
    """``value`` if it is a ``kind``, else ``TypeError`` naming ``what`` (default:
    ``"a latencykit.<kind>"``)."""
    if not isinstance(value, kind):
        what = what or f"a latencykit.{kind.__name__}"  # type: ignore[union-attr]
        raise TypeError(f"{name} must be {what}, got {value!r}")
    return cast("T", value)


def optional(
    name: str, value: object, kind: type[T] | tuple[type, ...], what: str = ""
) -> T | None:
    """``None`` (an option left unset), or :func:`instance`."""
    return None if value is None else instance(name, value, kind, what)


def function(name: str, value: T) -> T:
    """``value`` if it is ``None`` or callable, else ``TypeError``."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a function, got {value!r}")
    return value


def known_targets(names: Mapping[str, str | None], targets: Collection[str]) -> None:
    """``ValueError`` for the first of ``names`` (option -> the target it names; ``None``:
    unset) that is none of ``targets``."""
    for name, target in names.items():
        if target is not None and target not in targets:
            raise ValueError(f"{name} names {target!r}, which is not one of {list(targets)}")


def mapping(name: str, value: object) -> Mapping[str, Any]:
    """A mapping (``TypeError`` for anything else, ``None`` included)."""
    return instance(name, value, Mapping, "a mapping")


def tags(name: str, value: object) -> frozenset[str]:
    """A set of tags as a frozenset (a lone string is refused: ``{"prefill"}``, not
    ``"prefill"``)."""
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(f"{name} must be a set of tags, e.g. {{{value!r}}}")
    return frozenset(value)
