"""The base of handles that stop something: ``close()`` it, or let a ``with`` block do it."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import TypeVar

__all__ = ["Handle"]

_H = TypeVar("_H", bound="Handle")


class Handle(abc.ABC):
    """Something running until ``close()`` (idempotent); ``with handle:`` closes it at the end
    of the block, however the block ends."""

    __slots__ = ()

    @abc.abstractmethod
    def close(self) -> None:
        """Stop. Closing twice does nothing."""

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
