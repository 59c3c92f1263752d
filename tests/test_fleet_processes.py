"""Fleet-wide state shared by real OS processes through one real redis-server.

Each test starts worker processes (``multiprocessing``, "spawn": fresh interpreters, as
separate replicas of an app would be) that run ``tests/fleet_worker.py`` on asyncio or trio,
and moves them from phase to phase with events; they report on a queue. Every wait is bounded:
a worker that fails reports its traceback, one that dies or hangs fails the test by name.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Coroutine, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

import fleet_worker
from latencykit.testing import Behavior, FakeProvider, Fault, RedisServer

pytestmark = pytest.mark.slow  # subprocesses: each starts Python and imports litellm

CTX = multiprocessing.get_context("spawn")
BACKENDS = ("asyncio", "trio")  # the workers alternate: both backends share the fleet
STARTUP = 60.0  # seconds for fresh interpreters to import everything (litellm takes seconds)
PHASE = 20.0  # seconds for any later phase (each takes well under one)


class Workers:
    """Worker processes and the queue they report on."""

    def __init__(self) -> None:
        self.report: Any = CTX.Queue()
        self.processes: list[BaseProcess] = []
        self._early: list[tuple[int, str, Any]] = []  # reports of a later phase

    def start(self, main: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        index = len(self.processes)
        process = CTX.Process(
            target=fleet_worker.run,
            args=(main, index, self.report, BACKENDS[index % 2], *args),
            name=f"fleet-worker-{index}",
            daemon=True,
        )
        process.start()
        self.processes.append(process)

    def expect(
        self, kind: str, timeout: float = PHASE, among: range | None = None
    ) -> dict[int, Any]:
        """Each worker's (of ``among``, default all) report of ``kind``, within ``timeout``."""
        wanted = set(range(len(self.processes)) if among is None else among)
        found: dict[int, Any] = {}
        for message in list(self._early):
            if message[1] == kind and message[0] in wanted:
                self._early.remove(message)
                found[message[0]] = message[2]
        deadline = time.monotonic() + timeout
        while wanted - found.keys():
            try:
                index, got, payload = self.report.get(timeout=0.2)
            except queue.Empty:
                dead = [p.name for p in self.processes if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    missing = sorted(wanted - found.keys())
                    pytest.fail(f"no {kind!r} from workers {missing} (dead: {dead})")
                continue
            if got == "error":
                pytest.fail(f"worker {index} failed:\n{payload}")
            if got == kind and index in wanted:
                found[index] = payload
            else:
                self._early.append((index, got, payload))
        return found

    def close(self) -> None:
        for process in self.processes:
            process.join(10.0)
        for process in self.processes:
            if process.is_alive():  # only if the test failed: no orphan
                process.kill()
                process.join()
        self.report.close()
        self.report.join_thread()


@pytest.fixture
def workers() -> Iterator[Workers]:
    made = Workers()
    try:
        yield made
    finally:
        made.close()


def test_four_processes_share_one_breaker_and_one_budget(
    redis_server: RedisServer, workers: Workers
) -> None:
    fail, spend = CTX.Event(), CTX.Event()
    granted_total: Any = CTX.Value("i", 0)
    tokens = 10  # 4 processes x 10 calls x ratio 0.25 (each alone could take only 2: 8 in all)
    for _ in range(4):
        workers.start(
            fleet_worker.share_breaker_and_budget,
            redis_server.url,
            fail,
            spend,
            granted_total,
            tokens,
        )
    workers.expect("ready", STARTUP)

    # Worker 0 fails 8 calls: the fleet's breaker opens, and every process refuses.
    fail.set()
    opened = workers.expect("open")
    assert opened[0]["sent"] == 8
    for index, seen in opened.items():
        assert seen["refused"] == 3 and seen["more"] == 0, (index, seen)
        if index:
            assert seen["sent"] == 0  # it never called the dead provider itself
        assert seen["after"] < 5.0  # within a few refreshes (0.05 s each), with margin

    # The fleet's budget holds 10 tokens: the 4 processes get exactly 10, none from
    # process-local state.
    spend.set()
    spent = workers.expect("spent")
    assert sum(s["granted"] for s in spent.values()) == tokens, spent
    assert granted_total.value == tokens
    assert all(s["local"] == 0 for s in spent.values()), spent


def test_calls_go_on_while_redis_is_down_and_the_fleet_resyncs(
    redis_server: RedisServer, workers: Workers
) -> None:
    fail, stop = CTX.Event(), CTX.Event()
    for _ in range(4):
        workers.start(fleet_worker.ride_out_an_outage, redis_server.url, fail, stop, 2)
    workers.expect("up", STARTUP)
    time.sleep(0.3)  # calls through the fleet's state

    # Killed: connections refused at once.
    redis_server.kill()
    down = workers.expect("down 0")
    time.sleep(1.0)  # calls on process-local state
    redis_server.start()  # an empty server on the same port
    back = workers.expect("back 0")

    # Frozen: connections accepted, nothing answered (the store's timeout must cut waits).
    redis_server.pause()
    try:
        workers.expect("down 1")
        time.sleep(1.0)
    finally:
        redis_server.resume()
    workers.expect("back 1")

    # After both outages a breaker opened by worker 0 is seen, and refuses, everywhere.
    fail.set()
    opened = workers.expect("open")
    assert opened[0]["sent"] == 5
    for index, seen in opened.items():
        assert seen["refused"], (index, seen)
        assert seen["sent"] == (5 if index == 0 else 0)
        assert seen["after"] < 5.0
    stop.set()
    stats = workers.expect("stats")
    for index, got in stats.items():
        assert got["errors"] == 0, (index, got["error_list"])  # no call failed for the store
        assert got["while_down"] > 0, (index, down[index], back[index], got)
        assert got["calls"] > back[index]["calls"] > down[index]["calls"] > 0
        # A call waits for the store at most its timeout (0.25 s, for the quota while the
        # server is frozen); margin for a loaded machine.
        assert got["max_seconds"] < 2.0, (index, got)
        assert got["unavailable"] >= 2 and got["recovered"] >= 2, (index, got)


def test_a_provider_outage_seen_by_one_process_protects_the_others(
    redis_server: RedisServer, fake_provider: FakeProvider, workers: Workers
) -> None:
    fake_provider.script("down", Behavior(fault=Fault.HTTP_503))
    go, protect = CTX.Event(), CTX.Event()
    for role in ("seer", "refused", "failover"):
        workers.start(
            fleet_worker.llm_outage,
            redis_server.url,
            fake_provider.base_url,
            role,
            go,
            protect,
        )
    workers.expect("ready", STARTUP)

    go.set()
    seer = workers.expect("done", among=range(1))[0]
    assert seer["refused"]
    # At least the breaker's minimum_calls (4) reached the dead provider, and not many more:
    # the seer stops within a refresh or two of the fleet opening (10 ms between calls).
    assert 4 <= seer["sent"] <= 60, seer
    down = [a for a in fake_provider.attempts if a.model == "down"]
    assert len(down) == seer["sent"]

    protect.set()
    protected = workers.expect("done", among=range(1, 3))
    assert protected[1]["outcomes"] == ["CircuitOpen"] * 5, protected[1]
    assert protected[2]["outcomes"] == ["answered by openai/backup"] * 5, protected[2]
    for seen in protected.values():
        assert seen["after"] < 5.0
        assert seen["slowest"] < 2.0  # refused at once (the backup answers in milliseconds)
    # Nothing more went to the dead provider; everything that did came from the seer.
    down = [a for a in fake_provider.attempts if a.model == "down"]
    assert len(down) == seer["sent"]
    assert {a.request_headers.get("x-fleet-worker") for a in down} == {"0"}
    backup = [a for a in fake_provider.attempts if a.model == "backup"]
    assert len(backup) == 5
    assert {a.request_headers.get("x-fleet-worker") for a in backup} == {"2"}
