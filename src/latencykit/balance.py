"""Load spread over equivalent targets: power of two choices over a peak-EWMA cost.

The same model in several regions or accounts answers the same calls; ``LLM(router=
Balanced(["east", "west", "central"]))`` spreads the calls over them the way Finagle's and
Linkerd's balancers do. Each call draws two members at random (among those whose breaker is not
open) and takes the cheaper; failover then tries the other members, cheapest first, before the
LLM's other targets.

A member's **cost** is its latency estimate times (its outstanding attempts + 1). The estimate is
a *peak* EWMA: a sample slower than the estimate replaces it at once; a faster one moves it with
weight ``1 - exp(-dt / decay)`` (``dt``: seconds since the member's previous sample); without
samples it fades towards zero with the same time constant, so a member that was avoided is
tried again. The sample is an attempt's time to first content chunk for a stream and its
duration for a response; a transient failure is a sample of at least ``error_penalty`` seconds,
so a failing member is avoided before its breaker opens. An attempt still waiting for its
sample bounds the latency from below: a member that has kept one waiting for 3 s costs at least
3 s per attempt, before the slow answer arrives.

The counting is a stage of the ``LLM``'s pipeline, innermost (after the connection slot: the
wait for a slot is not the member's latency), present only when a ``Balanced`` router is.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from . import _validation
from ._cancel import clock as loop_clock
from ._values import RouteDecision
from .errors import is_transient
from .pipeline import Call, Next, Stage
from .stream import Stream, StreamOutcome

__all__ = ["Balanced"]


class Balanced:
    """A router that spreads calls over equivalent targets (see the module docs).

    Args:
        members: the keys (names) of two or more of the LLM's targets that serve the same
            model; distinct. The LLM's other targets come after them in failover order.
        decay: the time constant of the latency estimate, in seconds (default ``10``, as in
            Finagle and Linkerd): how fast older samples weigh less and an unsampled member's
            estimate fades.
        error_penalty: the sample a transient failure counts as, in seconds, when it failed
            faster (default ``5``). Failures that say nothing of the member's health (a bad
            request, content policy) are not samples.
        rng: the random draws (default ``None``: a fresh ``random.Random()``); pass a seeded
            one for reproducible picks.
        clock: time source in seconds (default: the event loop's clock).

    A member never sampled costs the mean estimate of those that were (``1`` if none was), so
    it is neither avoided nor flooded. A cancelled attempt (a hedge that lost, a deadline) is a
    sample only when it already ran longer than the estimate. Its state (estimates and
    outstanding attempts) is the object's: ``LLM`` s sharing one share the view.
    """

    stage = Stage.ATTEMPT + 6  # innermost: inside the connection slot (ATTEMPT + 5)
    __slots__ = ("_clock", "_rng", "_state", "_ticket", "decay", "error_penalty", "members")

    def __init__(
        self,
        members: Sequence[str],
        *,
        decay: float | datetime.timedelta = 10.0,
        error_penalty: float | datetime.timedelta = 5.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = loop_clock,
    ) -> None:
        if isinstance(members, str) or not isinstance(members, Sequence):
            raise TypeError(f"Balanced.members must be a list of target names, got {members!r}")
        for index, member in enumerate(members):
            _validation.text(f"Balanced.members[{index}]", member, "target name")
        if len(set(members)) != len(members):
            raise ValueError(f"Balanced.members must be distinct, got {list(members)}")
        if len(members) < 2:
            raise ValueError(f"Balanced.members needs two or more targets, got {list(members)}")
        self.members = tuple(members)
        self.decay = _validation.seconds("Balanced.decay", decay)
        self.error_penalty = _validation.seconds("Balanced.error_penalty", error_penalty)
        rng = _validation.optional("Balanced.rng", rng, random.Random, "a random.Random")
        self._rng = rng or random.Random()
        self._clock = _validation.function("Balanced.clock", clock)
        self._state = {member: _Member() for member in self.members}
        self._ticket = itertools.count().__next__

    def __repr__(self) -> str:
        return f"Balanced({list(self.members)}, decay={self.decay:g})"

    def check(self, targets: Sequence[str]) -> None:
        """Raise ``ValueError`` if a member is none of ``targets``."""
        _validation.known_targets(
            {f"Balanced.members[{i}]": m for i, m in enumerate(self.members)}, targets
        )

    # --- the cost ------------------------------------------------------------------------------

    def latency(self, member: str) -> float | None:
        """``member``'s latency estimate now, in seconds (``None``: never sampled)."""
        state = self._state[member]
        return None if state.sampled_at is None else self._faded(state, self._clock())

    def _faded(self, state: _Member, now: float) -> float:
        assert state.sampled_at is not None
        return state.estimate * math.exp(-max(0.0, now - state.sampled_at) / self.decay)

    def outstanding(self, member: str) -> int:
        """``member``'s attempts started and not ended (a stream's: until it ends)."""
        return self._state[member].outstanding

    def costs(self) -> dict[str, float]:
        """Each member's cost now: latency x (outstanding attempts + 1), where the latency is
        the estimate, or how long its oldest attempt still waiting for its sample has waited
        when that is longer (it will take at least that long)."""
        now = self._clock()
        states = self._state
        known = {m: self._faded(s, now) for m, s in states.items() if s.sampled_at is not None}
        neutral = sum(known.values()) / len(known) if known else 1.0
        found = {}
        for member, state in states.items():
            latency = known.get(member, neutral)
            if state.waiting:
                latency = max(latency, now - next(iter(state.waiting.values())))
            found[member] = latency * (state.outstanding + 1)
        return found

    def observe(self, member: str, seconds: float) -> None:
        """Take a latency sample of ``member``: a slower one than the estimate replaces it, a
        faster one is averaged in (see the module docs)."""
        now, state = self._clock(), self._state[member]
        if state.sampled_at is not None:
            current = self._faded(state, now)
            if seconds < current:
                weight = math.exp(-max(0.0, now - state.sampled_at) / self.decay)
                seconds = current + seconds * (1.0 - weight)  # current: already decayed
        state.estimate, state.sampled_at = seconds, now

    # --- the pick ------------------------------------------------------------------------------

    def pick(self, is_open: Callable[[str], bool] | None = None) -> tuple[RouteDecision, list[str]]:
        """The call's member by power of two choices, and the members in the order to try them
        (the picked one, then the others cheapest first). ``is_open(member)``: whether its
        breaker refuses calls (default ``None``: none does); such members are drawn only when
        every member's is open."""
        costs = self.costs()
        closed = [m for m in self.members if is_open is None or not is_open(m)] or self.members
        first, second = self._two(closed)
        chosen = first if costs[first] <= costs[second] else second
        order = [chosen, *sorted((m for m in self.members if m != chosen), key=costs.__getitem__)]
        if first == second:
            reason = f"balanced: {chosen} (the one member whose breaker is not open)"
        else:
            reason = f"balanced: {first} cost {costs[first]:.3g} vs {second} {costs[second]:.3g}"
        return RouteDecision(chosen, reason), order

    def _two(self, members: Sequence[str]) -> tuple[str, str]:
        """Two distinct members drawn at random (the same one twice when there is one)."""
        count, draw = len(members), self._rng.random
        first = int(draw() * count)
        second = int(draw() * (count - 1)) if count > 1 else -1
        return members[first], members[second + (second >= first)]

    def __call__(self, request: object) -> RouteDecision:
        """Pick the member for a call, whatever its request (a router's signature); breakers
        are not consulted: ``LLM`` uses :meth:`pick`."""
        return self.pick()[0]

    # --- the stage that counts -----------------------------------------------------------------

    async def handle(self, call: Call, next: Next) -> Any:
        """Count a member's attempt as outstanding while it runs, and take its sample."""
        member = call.target.key
        state = self._state.get(member)
        if state is None:  # the LLM's other targets
            return await next(call)
        state.outstanding += 1
        ticket, started = self._ticket(), self._clock()
        state.waiting[ticket] = started
        try:
            result = await next(call)
        except BaseException as exc:
            state.outstanding -= 1
            if not isinstance(exc, Exception):  # cancelled: at least that long
                self._censored(member, self._clock() - started)
            elif is_transient(exc):
                self.observe(member, max(self._clock() - started, self.error_penalty))
            raise
        finally:
            del state.waiting[ticket]
        if isinstance(result, Stream):
            ttft = result.ttft
            self.observe(member, self._clock() - started if ttft is None else ttft)
            result.on_close(functools.partial(self._stream_ended, member), attempt=True)
        else:
            state.outstanding -= 1
            self.observe(member, self._clock() - started)
        return result

    def _censored(self, member: str, seconds: float) -> None:
        """An attempt cancelled after ``seconds``: it would have taken at least that long."""
        latency = self.latency(member)
        if latency is None or seconds > latency:
            self.observe(member, seconds)

    def _stream_ended(
        self, member: str, stream: Stream[Any], outcome: StreamOutcome, error: BaseException | None
    ) -> None:
        # May run from a garbage-collection finaliser: plain updates only.
        self._state[member].outstanding -= 1
        if outcome == "error" and error is not None and is_transient(error):
            self.observe(member, self.error_penalty)  # it broke: avoid it like a failure


class _Member:
    """What a :class:`Balanced` router knows of one member."""

    __slots__ = ("estimate", "outstanding", "sampled_at", "waiting")

    def __init__(self) -> None:
        self.estimate = 0.0  # seconds, as of sampled_at
        self.sampled_at: float | None = None  # None: never sampled
        self.outstanding = 0
        self.waiting: OrderedDict[int, float] = OrderedDict()  # ticket: start, oldest first
