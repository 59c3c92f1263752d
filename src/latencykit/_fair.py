"""Fair slots: a counting semaphore whose waiters are served by weight across queues (FIFO
within a queue), shared by the limiter's tenants and adaptive concurrency's lanes."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import anyio

from ._cancel import Backend, effective_deadline, threadsafe_caller
from ._context import deadline_var

__all__ = ["FairSlots", "Queue", "Waiter", "wait_granted"]

logger = logging.getLogger("latencykit")


@dataclass(slots=True, eq=False)
class Waiter:
    """One call waiting for a slot; ``granted`` is set (under its owner's lock) when a slot is
    handed to it, then ``event`` wakes it."""

    queue: Queue
    event: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False
    # A limiter shared by event loops in several threads may free a slot in another thread
    # than the waiter's: the wake-up must then go through the waiter's loop.
    thread: int = field(default_factory=threading.get_ident)
    threadsafe: Callable[[Callable[[], object]], object] = field(default_factory=threadsafe_caller)

    def wake(self) -> None:
        try:
            if threading.get_ident() == self.thread:
                self.event.set()
            else:
                self.threadsafe(self.event.set)
        except RuntimeError:  # its event loop is gone (closed at shutdown): nobody to wake
            logger.debug("latencykit: a waiter's event loop is closed", exc_info=True)


@dataclass(slots=True, eq=False)
class Queue:
    """The waiters of one tenant for one set of slots (FIFO), and its place in the rotation."""

    key: str
    weight: float
    pass_: float  # virtual time of its next turn: lower goes first
    queued: bool = False  # has an entry in the heap
    waiters: deque[Waiter] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class FairSlots:
    """A counting semaphore whose waiters are served fairly across queues (tenants).

    Stride scheduling: each queue's next turn is at virtual time ``pass_``; a turn advances it
    by ``1 / weight``; the queue with the lowest ``pass_`` is served next (FIFO within it). A
    queue that starts waiting starts at the current virtual time, so a tenant that was idle
    neither saved up turns nor queues behind a busy tenant's backlog: it gets the next free
    slot. A freed slot is handed straight to the next waiter (no barging). Not thread-safe:
    its owner holds its lock around every method.
    """

    limit: float
    in_use: int = 0
    queues: dict[str, Queue] = field(default_factory=dict)
    _heap: list[tuple[float, int, Queue]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _vtime: float = 0.0

    @property
    def idle(self) -> bool:
        return self.in_use == 0 and not self.queues

    def take(self) -> bool:
        """Take a free slot, if there is one (a free slot means nobody waits: a freed slot is
        handed to a waiter first)."""
        if self.in_use < self.limit:
            self.in_use += 1
            return True
        return False

    def first_turn(self, weight: float) -> float:
        """The virtual time of a queue's first turn: now (a tenant that was idle is next)."""
        del weight
        return self._vtime

    def enqueue(self, key: str, weight: float) -> Waiter:
        """Queue a waiter under ``key`` (a tenant)."""
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = Queue(key, weight, self.first_turn(weight))
        waiter = Waiter(queue)
        queue.waiters.append(waiter)
        if not queue.queued:
            queue.queued = True
            heapq.heappush(self._heap, (queue.pass_, next(self._seq), queue))
        return waiter

    def admits(self, key: str) -> bool:
        """Whether the slot being freed may go to the queue ``key`` (all may, here; adaptive
        concurrency's lanes keep a reserve for the lanes above)."""
        del key
        return True

    def release(self) -> Waiter | None:
        """Free a slot: hand it to the next waiter its queue :meth:`admits` (returned, to be
        woken) or put it back."""
        heap = self._heap
        skipped: list[tuple[float, int, Queue]] = []
        while heap:
            entry = heapq.heappop(heap)
            pass_, _, queue = entry
            if queue.waiters and not self.admits(queue.key):
                skipped.append(entry)  # keeps its turn
                continue
            queue.queued = False
            if not queue.waiters:  # its waiters gave up
                if self.queues.get(queue.key) is queue:
                    del self.queues[queue.key]
                continue
            for other in skipped:
                heapq.heappush(heap, other)
            waiter = queue.waiters.popleft()
            waiter.granted = True
            self._vtime = pass_
            queue.pass_ = pass_ + 1.0 / queue.weight
            if queue.waiters:
                queue.queued = True
                heapq.heappush(heap, (queue.pass_, next(self._seq), queue))
            else:
                del self.queues[queue.key]
            return waiter
        for other in skipped:
            heapq.heappush(heap, other)
        self.in_use -= 1
        return None

    def leave(self, waiter: Waiter) -> Waiter | None:
        """A waiter gives up: leave the queue, or hand on the slot it was just granted."""
        if waiter.granted:
            return self.release()
        waiter.queue.waiters.remove(waiter)
        return None


async def wait_granted(waiter: Waiter, end: float, loop: Backend) -> None:
    """Wait for ``waiter``'s slot until ``end`` at most (then return without one)."""
    if end < min(deadline_var.get(), effective_deadline()):
        with loop.scope(deadline=end):
            await waiter.event.wait()
    else:
        # The enclosing deadline (or cancel scope) ends first: its cancellation wins.
        await waiter.event.wait()
