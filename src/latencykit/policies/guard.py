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
import dataclasses
import datetime
import functools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .. import _response, _validation, events
from .._cancel import backend, clock, now
from .._context import Trace, deadline_var, trace_var
from ..errors import ErrorKind, classify, is_transient
from ..pipeline import Call, Next, PolicyDecorator, Stage
from ..stream import ANY_ITEM, ChunkReader, Limit, LimitSource, Resume, SkipPrefix, Stream
from ..target import Target

if TYPE_CHECKING:
    from ..stats import LatencyWindow, Recorder, StatsTable

__all__ = [
    "FIRST_TOKEN_FLOOR",
    "LEARN_MIN_SAMPLES",
    "LEARN_MULTIPLE",
    "STALL_FLOOR",
    "OnBreak",
    "StreamGuard",
    "guard_stream",
    "stream_guard",
]

LEARN_MIN_SAMPLES = 20
"""Completed samples a target needs in its window before a limit is learned from them."""
LEARN_MULTIPLE = 3.0
"""A learned limit is this multiple of the p99 of the target's recent samples."""
FIRST_TOKEN_FLOOR = 1.0
"""The shortest learned first-token limit, in seconds."""
STALL_FLOOR = 2.0
"""The shortest learned stall limit, in seconds (a break mid-answer costs more than a late
first token: the partial answer)."""
_MOST_DOUBLINGS = 64  # a limit doubled this often is past any timeout

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
            limit of its own; in ``LLM`` learned per target from its recent times to first
            chunk, and the target's attempt ``timeout`` until then: see docs/streaming.md).
        stall: longest gap between two content chunks after the first; past it the stream
            breaks with :class:`~latencykit.StreamStalled` (default ``None``: no limit of its
            own; in ``LLM`` learned per target from its complete streams' longest gaps, and the
            target's attempt ``timeout`` until then).
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

    A limit you set always wins (capped by the attempt timeout), except over one the SLO
    autopilot set: ``tuned`` (default ``None``) maps ``(target key, stall)`` to its limits
    (see docs/autopilot.md). The total deadline holds on every chunk whatever the guard says.
    """

    stage = Stage.ATTEMPT
    __slots__ = (
        "_attempt_on",
        "_learner",
        "_run",
        "_targets",
        "first_token",
        "max_resumes",
        "on_break",
        "raise_truncated",
        "stall",
        "tuned",
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
        self._learner: _Learner | None = None
        # The SLO autopilot's limits by (target key, stall), over the others.
        self.tuned: dict[tuple[str, bool], float] | None = None

    def bound(
        self,
        targets: Sequence[Target],
        attempt_on: Callable[[Target], Callable[..., Any]],
        run: Callable[[Call, Trace], Awaitable[Any]],
        *,
        raise_truncated: bool,
        recorder: Recorder | None = None,
    ) -> StreamGuard:
        """This guard, for the calls of one front (:class:`~latencykit.LLM`): with
        ``on_break="continue"`` a broken stream goes on from ``targets`` (in failover order),
        whose streaming attempt ``attempt_on(target)`` makes, each run by ``run(call, trace)``
        (the per-target policies, within the call's trace); ``raise_truncated``: an answer cut
        at its output cap raises :class:`~latencykit.errors.OutputTruncated` after its last
        chunk; ``recorder`` (default ``None``: no learning): the record of the front's
        attempts, from which the limits left unset are learned."""
        guard = copy.copy(self)
        guard._targets, guard._attempt_on, guard._run = targets, attempt_on, run
        guard.raise_truncated = raise_truncated
        unset = self.first_token is None or self.stall is None
        guard._learner = _Learner(recorder) if recorder is not None and unset else None
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

    def limits(self, target: Target, *, input_size: int = 0) -> tuple[Limit | None, Limit | None]:
        """``(first_token, stall)`` for an attempt on ``target``, each a
        :class:`~latencykit.stream.Limit` that says where it came from (``None``: no limit):
        the guard's own, else the learned one (``input_size``: the prompt's characters, for
        the first-token limit; default ``0``), else the target's attempt timeout; each capped
        by that timeout."""
        at = clock() if self._learner is not None else 0.0
        return (
            self._limit(self.first_token, target, at, stall=False, input_size=input_size),
            self._limit(self.stall, target, at, stall=True, input_size=0),
        )

    def _limit(
        self, configured: float | None, target: Target, at: float, *, stall: bool, input_size: int
    ) -> Limit | None:
        timeout = target.timeout
        source: LimitSource = "configured"
        seconds = configured
        tuned = self.tuned
        if tuned is not None and (found := tuned.get((target.key, stall))) is not None:
            seconds, source = found, "slo"
        elif seconds is None and self._learner is not None:
            seconds = self._learner.limit(target.key, at, stall=stall, input_size=input_size)
            source = "learned"
        if timeout is not None and (seconds is None or timeout < seconds):
            seconds, source = timeout, "timeout"
        return None if seconds is None else Limit(seconds, source)

    def learned(self, target: str) -> tuple[float | None, float | None]:
        """The ``(first_token, stall)`` limits learned for the target key ``target`` now
        (before scaling for a long prompt and the timeout's cap); ``None``: not learned (or
        set in this guard)."""
        learner, at = self._learner, clock()
        if learner is None:
            return None, None
        return (
            None if self.first_token is not None else learner.limit(target, at, stall=False),
            None if self.stall is not None else learner.limit(target, at, stall=True),
        )

    def with_learned(self, table: StatsTable) -> StatsTable:
        """``table`` with each target's learned limits (``TargetStats.first_token_limit`` and
        ``stall_limit``)."""
        if self._learner is None:
            return table
        from ..stats import StatsTable

        return StatsTable(
            dataclasses.replace(row, first_token_limit=first, stall_limit=stall)
            for key, row in table.items()
            for first, stall in (self.learned(key),)
        )

    def handle(self, call: Call, next: Next) -> Awaitable[Any]:
        """Apply this guard to a streaming call (a non-streaming call goes through as is)."""
        if call.stream is None:
            return next(call)
        learner = self._learner
        if learner is None:
            return next(call._replace(stream=self))
        return self._limited(call, next, learner)

    async def _limited(self, call: Call, next: Next, learner: _Learner) -> Any:
        """A streaming call with the limits learned for its target and prompt."""
        size = 0 if self.first_token is not None else learner.input_size(call)
        first_token, stall = self.limits(call.target, input_size=size)
        stream = await next(call._replace(stream=_Limited(self, first_token, stall)))
        learner.answered(stream, size, gaps=self.stall is None)
        return stream


class _Limited:
    """One attempt's limits, worked out by its guard (``Call.stream`` below the guard)."""

    __slots__ = ("_guard", "_limits", "raise_truncated")

    def __init__(self, guard: StreamGuard, first_token: Limit | None, stall: Limit | None):
        self._guard = guard
        self._limits = first_token, stall
        self.raise_truncated = guard.raise_truncated

    def limits(self, target: Target) -> tuple[Limit | None, Limit | None]:
        return self._limits

    def resumer(self, call: Call, trace: Trace) -> Resume | None:
        return self._guard.resumer(call, trace)


class _Learned:
    """A limit learned for one target: its seconds, the window's ``changes`` it was learned at
    (a quantile is estimated again once the window changed enough) and when the window last
    held enough samples to back it."""

    __slots__ = ("at", "changes", "seconds")

    def __init__(self, seconds: float, changes: int, at: float) -> None:
        self.seconds, self.changes, self.at = seconds, changes, at


class _Longest:
    """The largest value added in the last ``window`` seconds (the newest kept past that, so
    that a target gone quiet keeps a reference): a deque of decreasing values, each the
    largest since it arrived."""

    __slots__ = ("_entries", "_window")

    def __init__(self, window: float) -> None:
        self._entries: deque[tuple[float, int]] = deque()
        self._window = window

    def add(self, at: float, value: int) -> None:
        entries = self._entries
        while entries and entries[-1][1] <= value:
            entries.pop()
        entries.append((at, value))

    def value(self, now: float) -> int:
        entries, cutoff = self._entries, now - self._window
        while len(entries) > 1 and entries[0][0] < cutoff:
            entries.popleft()
        return entries[0][1] if entries else 0


class _Learner:
    """The limits of one front's guard learned from its recorder (see the module's docs)."""

    __slots__ = ("_inputs", "_limits", "_recorder")

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._limits: dict[tuple[str, bool], _Learned] = {}
        self._inputs: dict[str, _Longest] = {}

    def input_size(self, call: Call) -> int:
        """The characters of ``call``'s prompt (its ``messages``, or a Responses ``input``)."""
        kwargs = call.kwargs
        return _response.characters(kwargs.get("messages") or kwargs.get("input") or ())

    def limit(self, target: str, now: float, *, stall: bool, input_size: int = 0) -> float | None:
        """``target``'s learned first-token (``stall``: stall) limit at ``now``, for a prompt
        of ``input_size`` characters, uncapped; ``None`` before any was learned."""
        recorder = self._recorder
        window: LatencyWindow | None = (
            recorder.gaps.get(target) if stall else recorder.latency_window(target, ttft=True)
        )
        learned = self._limits.get((target, stall))
        if window is not None:
            count = window.count()
            if count - window.censored() >= LEARN_MIN_SAMPLES:
                if learned is None or window.changes - learned.changes >= max(1, count >> 5):
                    p99 = window.quantile(0.99) or 0.0
                    floor = STALL_FLOOR if stall else FIRST_TOKEN_FLOOR
                    seconds = max(floor, LEARN_MULTIPLE * p99)
                    learned = self._limits[target, stall] = _Learned(seconds, window.changes, now)
                learned.at = now
                return learned.seconds * self._longer(target, input_size, now)
        if learned is None:
            return None
        # Cold again (no sample for a while: silent, or slower than the limit, or idle):
        # the last limit, doubled for every window gone by without enough samples.
        idle = min(_MOST_DOUBLINGS, int((now - learned.at) / recorder.window))
        return learned.seconds * 2.0**idle * self._longer(target, input_size, now)

    def _longer(self, target: str, input_size: int, now: float) -> float:
        """How many times longer than the longest recent prompt ``target`` answered this one
        is (at least 1): TTFT grows with the prompt."""
        inputs = self._inputs.get(target)
        longest = 0 if inputs is None else inputs.value(now)
        return input_size / longest if longest and input_size > longest else 1.0

    def answered(self, stream: Stream[Any], input_size: int, *, gaps: bool) -> None:
        """``stream`` committed, for a prompt of ``input_size`` characters; ``gaps``: learn
        from its longest gap once it ends complete."""
        if input_size:
            inputs = self._inputs.get(stream.target)
            if inputs is None:
                inputs = self._inputs[stream.target] = _Longest(self._recorder.window)
            inputs.add(clock(), input_size)
        if gaps:
            stream.on_close(self._ended)

    def _ended(self, stream: Stream[Any], outcome: str, error: BaseException | None) -> None:
        longest = stream.longest_gap
        if outcome == "ok" and longest is not None and not stream.resumes:
            self._recorder.longest_gap(stream.target, longest)


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
