"""What a shared store (``lk.RedisStore``) costs per call, and how fast the fleet learns.

Run it from the repository root (it starts its own redis-server on 127.0.0.1)::

    .venv/bin/python benchmarks/fleet.py            # about a minute
    .venv/bin/python benchmarks/fleet.py --quick    # smoke run, a few seconds

**1. Per-call overhead.** Each variant runs a call through a circuit breaker that also pays
into a retry budget (what a call does to fleet state when nothing changes):

- ``in memory``: the breaker and budget with process-local state (the baseline);
- ``in memory (A/A)``: the same again: its difference to the baseline is the method's noise;
- ``RedisStore``: the same with ``shared=`` a RedisStore refreshing every 100 ms (the default).

Method (as benchmarks/stage.py): variants interleaved, shuffled per round, a batch of calls
timed per variant and round with the garbage collector off; reported: the median per-round
difference to the baseline, a 95 % bootstrap interval, p99. Target: at most 50 us (median).

**2. Time for the fleet to stop sending to a dead provider.** Two stores on one server stand
for two processes. Process A records the failures that cross the breaker's threshold; we time
until process B's breaker refuses calls. A writes its outcomes at its next refresh (within one
interval); the script that opens the breaker publishes the change, and B refreshes at once.
Without a shared store B never learns (it must fail ``minimum_calls`` times itself). Target
(the issue's): within one refresh interval, plus 50 ms of slack for the round trips and this
loaded machine.

**3. Calls per second with 1, 4 and 8 processes.** Each process (spawned: a fresh
interpreter) runs a closed loop of the calls of 1 (a breaker and a budget around a trivial async
function) for a few seconds, all processes at once, with process-local state and with one
``RedisStore`` per process on the same server; rounds alternate the two, in shuffled order.
Reported: the fleet's calls per second and the ratio store / no store of each round.

**4. Time for the fleet to stop sending to a dead provider.** Four (and eight) processes each
call a dead provider (an async function that raises a transient ``ProviderUnavailable``) every
50 ms through a breaker (``minimum_calls`` 20) under the same key, from the same instant. We
count the requests the fleet sent it and time until every process's breaker refuses: with a
shared store, and without one (each process must fail ``minimum_calls`` times on its own).

The script reports; it always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
from overhead import _load, _version, percentile, print_overheads, verdict

import latencykit as lk
from latencykit.policies.breaker import reset_breakers
from latencykit.testing import RedisServer

TARGET_US = 50.0

Batch = Callable[[int], Awaitable[None]]


async def checkpoint() -> None:
    await anyio.lowlevel.checkpoint()


def variant(store: lk.RedisStore | None, key: str) -> Batch:
    breaker = lk.Breaker(key, shared=store)
    budget = lk.RetryBudget(0.1, name=key, shared=store)
    guarded = breaker(checkpoint)

    async def run(n: int) -> None:
        for _ in range(n):
            budget.deposit()
            await guarded()

    return run


async def overhead(url: str, rounds: int, batch: int, seed: int) -> dict[str, list[float]]:
    store = lk.RedisStore(url)
    variants = {
        "in memory": variant(None, "mem"),
        "in memory (A/A)": variant(None, "mem2"),
        "RedisStore": variant(store, "fleet"),
    }
    for fn in variants.values():  # warm up, and let the store connect
        await fn(batch)
    with anyio.fail_after(10):
        while not store.available:  # noqa: ASYNC110 - the store's thread sets it
            await anyio.sleep(0.01)
    rng = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        gc.collect()
        gc.disable()
        try:
            for name in order:
                started = time.perf_counter_ns()
                await variants[name](batch)
                times[name].append((time.perf_counter_ns() - started) / batch / 1000)
        finally:
            gc.enable()
    store.close()
    return times


def report(times: dict[str, list[float]], seed: int) -> float:
    base = times["in memory"]
    print(f"\n1. per call, {len(base)} rounds (baseline median {statistics.median(base):.2f} us)")
    return print_overheads(times, "in memory", seed, width=18)["RedisStore"]


async def time_to_open(url: str, trials: int, interval: float) -> list[float]:
    """Seconds from the threshold-crossing failure in process A to process B refusing."""
    namespace = f"open{interval:g}"  # each run its own keys: the last run's are still open
    a = lk.RedisStore(url, interval=interval, namespace=namespace)
    b = lk.RedisStore(url, interval=interval, namespace=namespace)
    found: list[float] = []
    for trial in range(trials):
        pair = []
        for store in (a, b):  # each store stands for a process, with its own breaker of the key
            reset_breakers()
            pair.append(
                lk.Breaker(
                    f"dead{trial}",
                    window_size=10,
                    minimum_calls=5,
                    open_duration=60.0,
                    shared=store,
                )
            )
        seeing, other = pair
        with anyio.fail_after(10):
            while seeing._fleet_view()[1] is None or other._fleet_view()[1] is None:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        await anyio.sleep(random.random() * interval)  # any phase of the refresh cycle
        for _ in range(5):
            permit = seeing.acquire()
            assert permit is not None
            seeing.record(permit, False)
        started = time.perf_counter()
        with anyio.fail_after(10):
            while other.allows():  # noqa: ASYNC110 - polled: the refresh is in another thread
                await anyio.sleep(0.001)
        found.append(time.perf_counter() - started)
    a.close()
    b.close()
    return found


# --- 3 and 4: real processes ----------------------------------------------------------------

PERIOD = 0.05  # part 4: seconds between two calls of one process to the dead provider
MINIMUM_CALLS = 20  # part 4: the breaker's minimum_calls (its default)

Throughput = dict[int, dict[str, list[tuple[float, int]]]]  # calls/s and outages, per round
DeadRuns = dict[int, dict[str, list[tuple[int, float]]]]  # requests sent, s until all refuse


class Dead:
    """A dead provider: every call fails at once with a transient error; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        raise lk.ProviderUnavailable("down", target="dead", status_code=503)


class Outages(logging.Handler):
    """Counts the store's "unavailable" warnings (the ``latencykit`` logger's), silently:
    subscribing to events instead would make the policies build events on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "unavailable" in record.getMessage()


async def sleep_until(at: float) -> None:
    """Sleep until ``time.monotonic()`` (one clock for every process of the machine) is ``at``."""
    while (left := at - time.monotonic()) > 0:  # noqa: ASYNC110 - a time, not an event
        await anyio.sleep(left)


async def closed_loop(run: Batch, start_at: float, duration: float) -> float:
    """Calls per second of one process calling ``run`` back to back for ``duration`` seconds."""
    await sleep_until(start_at)
    calls = 0
    while time.monotonic() < start_at + duration:
        await run(100)
        calls += 100
    return calls / (time.monotonic() - start_at)


async def until_refused(
    store: lk.RedisStore | None, key: str, start_at: float, limit: float
) -> tuple[int, float | None]:
    """Call a dead provider every ``PERIOD`` seconds through the breaker ``key`` from
    ``start_at`` until the breaker refuses: ``(calls sent, seconds until refused)``."""
    breaker = lk.Breaker(
        key, window_size=100, minimum_calls=MINIMUM_CALLS, open_duration=60.0, shared=store
    )
    if store is not None:  # read the fleet's state from the first call on
        breaker.allows()
        while breaker._fleet_view()[1] is None and time.monotonic() < start_at:  # noqa: ASYNC110
            await anyio.sleep(0.005)
    dead = Dead()
    at = start_at
    while at < start_at + limit:
        await sleep_until(at)
        try:
            await breaker(dead)()
        except lk.CircuitOpen:
            return dead.calls, time.monotonic() - start_at
        except lk.ProviderUnavailable:
            pass
        at += PERIOD
    return dead.calls, None


async def serve(url: str, commands: Any, results: Any) -> None:
    """One benchmark process: answers the parent's commands until told to stop."""
    outages = Outages()
    logging.getLogger("latencykit").addHandler(outages)
    store = lk.RedisStore(url)
    loops = {"in memory": variant(None, "loop"), "RedisStore": variant(store, "loop")}
    await loops["RedisStore"](1)  # the store starts with its first breaker
    with anyio.fail_after(30):
        while not store.available:  # noqa: ASYNC110 - the store's thread sets it
            await anyio.sleep(0.01)
    results.put("ready")
    while (command := await anyio.to_thread.run_sync(commands.get))[0] != "stop":
        before = outages.count
        if command[0] == "throughput":
            _, name, start_at, duration = command
            rate = await closed_loop(loops[name], start_at, duration)
            await anyio.sleep(0.2)  # a refresh that timed out at the very end counts too
            results.put((rate, outages.count - before))
        else:  # "dead"
            _, name, key, start_at, limit = command
            shared = store if name == "RedisStore" else None
            results.put(await until_refused(shared, key, start_at, limit))
    store.close()


def process_main(url: str, commands: Any, results: Any) -> None:
    """A spawned process's entry point (module level, so that the child finds it)."""
    anyio.run(serve, url, commands, results)


class Processes:
    """``n`` benchmark processes (spawned: fresh interpreters, as replicas of an app are)."""

    def __init__(self, n: int, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.results: Any = context.Queue()
        self.commands: list[Any] = [context.Queue() for _ in range(n)]
        self.processes = [
            context.Process(target=process_main, args=(url, q, self.results), daemon=True)
            for q in self.commands
        ]
        for process in self.processes:
            process.start()
        self._collect()  # every process ready

    def _collect(self) -> list[Any]:
        return [self.results.get(timeout=120) for _ in self.processes]

    def ask(self, *command: Any) -> list[Any]:
        """Send ``command`` to every process; their answers (in no particular order)."""
        for q in self.commands:
            q.put(command)
        return self._collect()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for q in self.commands:
            q.put(("stop",))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


def fleet_runs(
    url: str, counts: Sequence[int], rounds: int, duration: float, trials: int, seed: int
) -> tuple[Throughput, DeadRuns]:
    """Parts 3 and 4, each process count in a pool of its own."""
    rng = random.Random(seed)
    rates: Throughput = {}
    dead: DeadRuns = {}
    for n in counts:
        rates[n] = {"in memory": [], "RedisStore": []}
        with Processes(n, url) as fleet:
            for _ in range(rounds):
                order = list(rates[n])
                rng.shuffle(order)
                for name in order:
                    found = fleet.ask("throughput", name, time.monotonic() + 0.2, duration)
                    rates[n][name].append(
                        (sum(rate for rate, _ in found), sum(down for _, down in found))
                    )
            if n < 4:
                continue
            dead[n] = {"in memory": [], "RedisStore": []}
            limit = 3 * MINIMUM_CALLS * PERIOD  # each process alone needs 20 calls
            for trial in range(trials):
                order = list(dead[n])
                rng.shuffle(order)
                for name in order:
                    key = f"dead-{n}-{name}-{trial}"  # fresh: the last trial's is still open
                    answers = fleet.ask("dead", name, key, time.monotonic() + 0.5, limit)
                    refused = [t for _, t in answers if t is not None]
                    sent = sum(calls for calls, _ in answers)
                    until_all = max(refused) if len(refused) == n else math.inf
                    dead[n][name].append((sent, until_all))
    return rates, dead


def _spread(values: Sequence[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report_fleet(rates: Throughput, dead: DeadRuns, duration: float) -> None:
    rounds = len(next(iter(rates.values()))["in memory"])
    print(
        f"\n3. calls/s of the fleet, each process a closed loop of calls through a breaker and a"
        f"\n   budget (as in 1), {duration:g} s per round; median (min-max) of {rounds} rounds"
    )
    print(
        f"  {'processes':>9} {'in memory':>26} {'RedisStore':>26} {'store/no store':>18}"
        f" {'outages':>8}"
    )
    for n, found in rates.items():
        memory = [rate for rate, _ in found["in memory"]]
        shared = [rate for rate, _ in found["RedisStore"]]
        ratios = [s / m for s, m in zip(shared, memory, strict=True)]
        outages = sum(down for _, down in found["RedisStore"])
        print(
            f"  {n:>9} {_spread(memory, ',.0f'):>26} {_spread(shared, ',.0f'):>26} "
            f"{_spread(ratios, '.2f'):>18} {outages:>8}"
        )
    print(
        "  outages: the store's refreshes that failed (it then falls back to local state)"
        "\n  during the RedisStore rounds, all processes and rounds together"
    )
    if not dead:
        return
    trials = len(next(iter(dead.values()))["in memory"])
    print(
        f"\n4. a dead provider: every process calls it every {PERIOD * 1000:.0f} ms through a "
        f"breaker\n   (minimum_calls {MINIMUM_CALLS}); requests the fleet sent it and time "
        f"until every process refuses;\n   median (min-max) of {trials} trials"
    )
    print(f"  {'processes':>9} {'state':<11} {'requests sent':>16} {'all refuse after (s)':>22}")
    for n, runs in dead.items():
        for name in ("RedisStore", "in memory"):
            sent = [float(s) for s, _ in runs[name]]
            until_all = [t for _, t in runs[name]]
            print(f"  {n:>9} {name:<11} {_spread(sent, '.0f'):>16} {_spread(until_all, '.2f'):>22}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, for smoke tests")
    parser.add_argument("--seed", type=int, default=20261125, help="shuffle seed")
    args = parser.parse_args(argv)
    rounds, batch, trials = (10, 200, 5) if args.quick else (100, 1000, 30)
    print(
        f"latencykit {lk.__version__}, redis-py {_version('redis')}, hiredis "
        f"{_version('hiredis')}, python {sys.version.split()[0]}, load {_load()}"
    )
    with RedisServer() as server:
        times = anyio.run(overhead, server.url, rounds, batch, args.seed)
        added = report(times, args.seed)
        print(
            f"\n  target: RedisStore adds <= {TARGET_US:g} us per call (median): "
            f"{added:.2f} us {verdict(added <= TARGET_US)}"
        )
        print("\n2. time for another process's breaker to refuse calls after the failures")
        for interval in (0.1, 0.5):
            found = anyio.run(time_to_open, server.url, trials, interval)
            p50, p95 = statistics.median(found), percentile(found, 95)
            print(
                f"  interval {interval * 1000:.0f} ms: p50 {p50 * 1000:.0f} ms, p95 "
                f"{p95 * 1000:.0f} ms, max {max(found) * 1000:.0f} ms "
                f"(target <= {interval * 1000 + 50:.0f} ms: "
                f"{verdict(max(found) <= interval + 0.05)})"
            )
        print("  without a shared store: never (each process must see the failures itself)")

        counts, fleet_rounds, duration, fleet_trials = (
            ((1, 4), 1, 0.3, 1) if args.quick else ((1, 4, 8), 3, 2.0, 5)
        )
        rates, dead = fleet_runs(
            server.url, counts, fleet_rounds, duration, fleet_trials, args.seed
        )
        report_fleet(rates, dead, duration)
        print(f"\n  load at the end: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
