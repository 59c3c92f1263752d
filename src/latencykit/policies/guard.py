"""``StreamGuard``: bound the time to the first content chunk and the gaps between chunks.

A stream that never starts, or stops in the middle while the connection stays open (SSE
keep-alive comments flowing, or nothing at all), is the streaming tail no HTTP timeout catches.
The guard turns both into typed transient errors: :class:`~latencykit.FirstTokenTimeout` before
the first content chunk (failover and hedging move on, like any attempt timeout) and
:class:`~latencykit.StreamStalled` after it. Keep-alives and empty deltas never reset either
clock: only content does.
"""

from __future__ import annotations

import contextvars
import copy
import datetime
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from .. import _validation, events
from .._cancel import backend, now
from .._context import Trace, deadline_var, trace_var
from ..errors import ErrorKind, classify, is_transient
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stream import ANY_ITEM, ChunkReader, Resume, SkipPrefix, Stream
from ..target import Target

__all__ = ["OnBreak", "StreamGuard", "guard_stream", "stream_guard"]

OnBreak = Literal["raise", "continue"]
"""What a stream does when it breaks after its first content chunk (see :class:`StreamGuard`)."""

T = TypeVar("T")

_continuing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "latencykit_continuing", default=False
)
"""Set while a broken stream's continuation opens: the stream it opens is not continued itself
(the stream it continues is)."""


class StreamGuard(PolicyDecorator):
    """Limits on a streaming call; a policy (stage ``ATTEMPT``), a decorator for async-generator
    functions, and the ``stream_guard=`` of :class:`~latencykit.LLM`.

    Args:
        first_token: seconds from the start of an attempt to its first content chunk; past it the
            attempt fails with :class:`~latencykit.FirstTokenTimeout` (default ``None``: no
            limit of its own; in ``LLM`` the target's attempt ``timeout``, so that a default
            stream never waits forever).
        stall: longest gap between two content chunks after the first; past it the stream
            breaks with :class:`~latencykit.StreamStalled` (default ``None``: no limit of its
            own; in ``LLM`` the target's attempt ``timeout``).
        on_break: what a stream that breaks after its first content chunk (cut, stall,
            transient error event) does: ``"raise"`` (default) raises
            :class:`~latencykit.StreamBroken` with the partial text; ``"continue"`` (honoured by
            :class:`~latencykit.LLM`) asks the same target, then the others in failover order,
            to continue within the remaining budget: with an assistant prefill on targets that
            declare ``capabilities={"prefill"}``, otherwise by regenerating the answer, checking
            that it repeats the text already delivered and skipping it (``StreamBroken`` with
            ``reason="recovery_diverged"`` if it does not: two answers are never spliced). A
            target that rejects the prefill (a 400) is not counted as a failure; the original
            break is raised if nothing can continue.
        max_resumes: how many times one stream may be continued (default ``2``).

    The total deadline holds on every chunk whatever the guard says.
    """

    stage = Stage.ATTEMPT
    __slots__ = (
        "_attempt_on",
        "_run",
        "_targets",
        "first_token",
        "max_resumes",
        "on_break",
        "raise_truncated",
        "stall",
    )

    def __init__(
        self,
        *,
        first_token: float | datetime.timedelta | None = None,
        stall: float | datetime.timedelta | None = None,
        on_break: OnBreak = "raise",
        max_resumes: int = 2,
    ) -> None:
        self.first_token = _validation.optional_seconds("StreamGuard.first_token", first_token)
        self.stall = _validation.optional_seconds("StreamGuard.stall", stall)
        self.on_break: OnBreak = _validation.choice(
            "StreamGuard.on_break", on_break, ("raise", "continue")
        )
        self.max_resumes = _validation.count("StreamGuard.max_resumes", max_resumes, minimum=0)
        self.raise_truncated = False
        self._targets: Sequence[Target] = ()  # what bound() gives: see there
        self._attempt_on: Callable[[Target], Callable[..., Any]] | None = None
        self._run: Callable[[Call, Trace], Awaitable[Any]] | None = None

    def bound(
        self,
        targets: Sequence[Target],
        attempt_on: Callable[[Target], Callable[..., Any]],
        run: Callable[[Call, Trace], Awaitable[Any]],
        *,
        raise_truncated: bool,
    ) -> StreamGuard:
        """This guard, for the calls of one front (:class:`~latencykit.LLM`): with
        ``on_break="continue"`` a broken stream goes on from ``targets`` (in failover order),
        whose streaming attempt ``attempt_on(target)`` makes, each run by ``run(call, trace)``
        (the per-target policies, within the call's trace); ``raise_truncated``: an answer cut
        at its output cap raises :class:`~latencykit.errors.OutputTruncated` after its last
        chunk."""
        guard = copy.copy(self)
        guard._targets, guard._attempt_on, guard._run = targets, attempt_on, run
        guard.raise_truncated = raise_truncated
        return guard

    def resumer(self, call: Call, trace: Trace) -> Resume | None:
        """What continues a broken stream of ``call`` (``None``: it is not continued)."""
        if self.on_break != "continue" or self._run is None or _continuing.get():
            return None
        return functools.partial(self._resume, call, trace, set())

    async def _resume(
        self, call: Call, trace: Trace, broke: set[str], broken: Stream[Any], error: Exception
    ) -> Stream[Any] | SkipPrefix | None:
        """A source continuing ``broken``, or ``None`` when no target could within the budget
        and ``max_resumes``.

        The targets are asked in failover order, those that broke this stream (``broke``: the
        keys, kept across the stream's resumes) last: a target that cut or stalled once is
        likely to do it again (the same overloaded replica, the same fault at the same point),
        while regenerating elsewhere costs the same as on it. Each is asked through its own
        breaker and retry policies, within the call's trace (its attempts join the call's); a
        target that cannot now (a transient error) passes to the next, another error ends the
        search (the break stands)."""
        loop = backend()
        broke.add(broken.target)
        if broken.resumes >= self.max_resumes or loop.now() >= broken.deadline:
            return None
        known = any(t.key == call.target.key for t in self._targets)
        # Stable: the failover order is kept among those that did not break it, and those that did.
        targets = sorted(self._targets if known else [call.target], key=lambda t: t.key in broke)
        deadline_token = deadline_var.set(broken.deadline)
        continuing = _continuing.set(True)
        try:
            with loop.scope(deadline=broken.deadline):
                for target in targets:
                    try:
                        return await self._resume_on(target, call, trace, broken)
                    except Exception as exc:
                        if not is_transient(exc):
                            return None
        finally:
            _continuing.reset(continuing)
            deadline_var.reset(deadline_token)
        return None

    async def _resume_on(
        self, target: Target, call: Call, trace: Trace, broken: Stream[Any]
    ) -> Stream[Any] | SkipPrefix:
        """``broken`` continued on ``target``: with the text delivered as an assistant prefill
        where it declares ``capabilities={"prefill"}`` (a target that refuses it, a 400, then
        regenerates), otherwise regenerated with that text skipped."""
        assert self._run is not None and self._attempt_on is not None
        delivered = broken.partial_text
        resuming = call._replace(fn=self._attempt_on(target), target=target)
        if delivered and target.supports("prefill"):
            prefill = {"role": "assistant", "content": delivered}
            messages = [*(call.kwargs.get("messages") or ()), prefill]
            try:
                continued = await self._run(resuming.with_kwargs(messages=messages), trace)
            except Exception as exc:
                if classify(exc) is not ErrorKind.BAD_REQUEST:
                    raise
            else:
                _resumed(trace, continued, "prefill", broken)
                return continued  # type: ignore[no-any-return]
        continued = await self._run(resuming, trace)
        _resumed(trace, continued, "regenerate", broken)
        return SkipPrefix(continued, delivered)

    def __repr__(self) -> str:
        return (
            f"StreamGuard(first_token={self.first_token}, stall={self.stall}, "
            f"on_break={self.on_break!r}, max_resumes={self.max_resumes})"
        )

    def limits(self, target: Target) -> tuple[float | None, float | None]:
        """``(first_token, stall)`` for an attempt on ``target``: the guard's own, capped by the
        target's attempt timeout when it has one."""
        first_token, stall = self.first_token, self.stall
        if target.timeout is not None:
            first_token = min(first_token or math.inf, target.timeout)
            stall = min(stall or math.inf, target.timeout)
        return first_token, stall

    def handle(self, call: Call, next: Next) -> Awaitable[Any]:
        """Apply this guard to a streaming call (a non-streaming call goes through as is)."""
        return next(call if call.stream is None else call._replace(stream=self))


def _resumed(
    trace: Trace,
    continued: Stream[Any],
    mode: Literal["prefill", "regenerate"],
    broken: Stream[Any],
) -> None:
    if events.listening():
        events.emit(
            events.StreamResumed(
                trace.call_id,
                attempt=continued.attempt,
                target=continued.target,
                mode=mode,
                chunks=broken.chunks,
            )
        )


stream_guard = StreamGuard
"""``lk.stream_guard`` is :class:`StreamGuard` (one signature); as a decorator on an
async-generator function::

    @lk.deadline(30)
    @lk.stream_guard(first_token=2.0, stall=5.0)
    async def tokens(prompt: str) -> AsyncIterator[str]: ...
"""


def guard_stream(
    source: AsyncIterator[T],
    *,
    first_token: float | datetime.timedelta | None = None,
    stall: float | datetime.timedelta | None = None,
    reader: ChunkReader = ANY_ITEM,
) -> Stream[T]:
    """Guard an async iterator you already have: ``async for x in lk.guard_stream(it, ...)``.

    ``first_token`` counts from this call; ``stall`` as in :class:`StreamGuard` (both default
    ``None``: no limit); an enclosing :func:`~latencykit.deadline` bounds every item. Every item
    is content unless ``reader`` says otherwise. Must be called inside an event loop. Close the
    result (``async with``, ``aclose()``), which closes ``source``.
    """
    guard = StreamGuard(first_token=first_token, stall=stall)
    return Stream(
        source,
        reader=reader,
        first_token=guard.first_token,
        stall=guard.stall,
        deadline=deadline_var.get(),
        started=now(),
        target=getattr(source, "__qualname__", type(source).__qualname__),
        trace=trace_var.get(),
    )
