"""Scripts: how a model's successive requests map to :class:`Behavior` values."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._behavior import Behavior
from ._request import RequestInfo

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeAlias

Script: TypeAlias = Behavior | Sequence[Behavior] | Callable[[RequestInfo], Behavior]
"""A Behavior (every request), a sequence (one per request, the last repeats) or a callable."""


class Resolver:
    """Turns a script into one Behavior per request. Used on the server thread only."""

    __slots__ = ("_fixed", "_func", "_position", "_sequence", "script")

    def __init__(self, script: Script) -> None:
        self.script = script
        self._fixed: Behavior | None = None
        self._func: Callable[[RequestInfo], Behavior] | None = None
        self._sequence: tuple[Behavior, ...] = ()
        self._position = 0
        if isinstance(script, Behavior):
            self._fixed = script
        elif callable(script):
            self._func = script
        elif isinstance(script, (str, bytes)) or not hasattr(script, "__iter__"):
            raise TypeError(
                "a script must be a Behavior, a sequence of Behavior or a callable "
                f"RequestInfo -> Behavior, got {script!r}"
            )
        else:
            items = tuple(script)
            if not items:
                raise ValueError("a script sequence must contain at least one Behavior")
            for i, item in enumerate(items):
                if not isinstance(item, Behavior):
                    raise TypeError(f"script sequence item {i} is not a Behavior: {item!r}")
            self._sequence = items

    def next(self, request: RequestInfo) -> Behavior:
        """The Behavior for this request (advances a sequence; the last item repeats)."""
        if self._fixed is not None:
            return self._fixed
        if self._func is not None:
            behavior = self._func(request)
            if not isinstance(behavior, Behavior):
                raise TypeError(
                    f"script callable {self._func!r} returned {behavior!r}, not a Behavior"
                )
            return behavior
        item = self._sequence[min(self._position, len(self._sequence) - 1)]
        self._position += 1
        return item
