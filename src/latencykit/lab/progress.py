"""The lab's progress display: a live ``rich`` bar on a terminal, a few plain lines otherwise.

:func:`make_progress` picks the display for a stream: a :class:`RichProgress` when the stream is a
terminal and ``rich`` is installed (the ``lab`` extra), else a :class:`PlainProgress` that prints
one line per finished step (readable in CI logs and in captured output), or nothing for
``None``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as _RichBar
    from rich.progress import TaskID


class Step:
    """One step of the lab (a row, a scenario) in progress: call :meth:`advance` per request."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.started = time.monotonic()

    def advance(self, count: int = 1) -> None:
        """Count ``count`` more requests done (default ``1``)."""
        self.done += count

    @property
    def elapsed(self) -> float:
        """Seconds since the step started."""
        return time.monotonic() - self.started


class Progress(AbstractContextManager["Progress"]):
    """A progress display; this base class shows nothing (``make_progress(None)``).

    Use it as a context manager around the run, and :meth:`step` around each part of it.
    """

    @contextmanager
    def step(self, label: str, total: int | None = None) -> Iterator[Step]:
        """A step of ``total`` requests (``None``, the default: a step without a count)."""
        step = Step(label, total)
        self._started(step)
        try:
            yield step
        finally:
            self._finished(step)

    def _started(self, step: Step) -> None:
        pass

    def _finished(self, step: Step) -> None:
        pass

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class PlainProgress(Progress):
    """Plain text: one line per finished step (label, requests done, seconds) to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _finished(self, step: Step) -> None:
        count = f"{step.done:>5}/{step.total}" if step.total is not None else "     done"
        print(f"  {step.label:<44} {count}  {step.elapsed:5.1f}s", file=self.stream, flush=True)


class _RichStep(Step):
    def __init__(self, label: str, total: int | None, bar: _RichBar, task: TaskID) -> None:
        super().__init__(label, total)
        self._bar = bar
        self._task = task

    def advance(self, count: int = 1) -> None:
        super().advance(count)
        self._bar.advance(self._task, count)


class RichProgress(Progress):
    """A live ``rich`` progress bar on ``stream`` (a terminal): one bar per step, kept on screen
    when done. Needs ``rich`` (the ``lab`` extra)."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichBar

        # A few refreshes a second: the bar's thread competes for the GIL with the lab's
        # clients, and its latencies are what the lab measures.
        self._bar = RichBar(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description:<44}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=stream),
            refresh_per_second=4,
        )

    @contextmanager
    def step(self, label: str, total: int | None = None) -> Iterator[Step]:
        """A step of ``total`` requests (``None``, the default: a pulsing bar without a count)."""
        task = self._bar.add_task(label, total=total)
        step = _RichStep(label, total, self._bar, task)
        try:
            yield step
        finally:
            # A step without a count shows as one unit, complete.
            self._bar.update(task, total=total or 1, completed=total or 1)
            self._bar.stop_task(task)

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.stop()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def make_progress(stream: TextIO | None) -> Progress:
    """The progress display for ``stream``: nothing for ``None``; a ``rich`` bar when ``stream``
    is a terminal and ``rich`` is installed; else plain lines (CI, pipes, tests)."""
    if stream is None:
        return Progress()
    if _is_terminal(stream):
        try:
            return RichProgress(stream)
        except ImportError:
            pass
    return PlainProgress(stream)
