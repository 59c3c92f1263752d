"""What one ``lk.stage`` costs, next to the same block without it and to ``anyio.fail_after``.

Run it from the repository root::

    .venv/bin/python benchmarks/stage.py            # about 30 seconds
    .venv/bin/python benchmarks/stage.py --quick    # smoke run, a few seconds

Every variant runs, inside one ``lk.deadline(60)`` turn, a block that does one checkpoint
(``await anyio.lowlevel.checkpoint()``):

- ``bare``: the block alone (the baseline);
- ``bare (A/A)``: the same again, measured like the others: its difference to ``bare`` is the
  noise floor of the method;
- ``fail_after by hand``: the block in ``anyio.fail_after(1.0)`` (a cancel scope with a
  deadline: what a hand-written stage budget costs at least);
- ``lk.stage``: the block in ``with lk.stage("retrieval", budget=1.0)`` (the stage's cancel
  scope, its trace and its ledger entry);
- ``lk.stage (no budget)``: ``with lk.stage("model")``: the turn's deadline bounds it, so it
  needs no cancel scope of its own (nor does a stage whose budget is longer than what remains);
- ``lk.stage + subscriber``: the same with an event subscriber attached (its two events built).

Method (as benchmarks/overhead.py; same helpers): the variants are interleaved side by side in
one loop. In each round every variant times a batch of ``batch`` blocks with
``time.perf_counter_ns``, in a freshly shuffled order; a variant's overhead in a round is its
per-block time minus ``bare``'s in the same round. Reported: median of the per-round overheads,
a 95 % percentile-bootstrap interval (rounds resampled), p99. The garbage collector is off
during timed batches. A fresh turn every batch keeps the ledger short. On asyncio, then trio.

Target: a stage adds at most 10 us (asyncio, median). The script reports; it always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel
from overhead import _load, _version, print_overheads, verdict

import latencykit as lk

TARGET_US = 10.0

Batch = Callable[[int], Awaitable[None]]


async def bare(n: int) -> None:
    with lk.deadline(60):
        for _ in range(n):
            await anyio.lowlevel.checkpoint()


async def bare_again(n: int) -> None:
    with lk.deadline(60):
        for _ in range(n):
            await anyio.lowlevel.checkpoint()


async def by_hand(n: int) -> None:
    with lk.deadline(60):
        for _ in range(n):
            with anyio.fail_after(1.0):
                await anyio.lowlevel.checkpoint()


RETRIEVAL = lk.stage("retrieval", budget=1.0)


async def staged(n: int) -> None:
    with lk.deadline(60):
        for _ in range(n):
            with RETRIEVAL:
                await anyio.lowlevel.checkpoint()


MODEL = lk.stage("model")  # no budget of its own: the turn's deadline bounds it


async def staged_without_budget(n: int) -> None:
    with lk.deadline(60):
        for _ in range(n):
            with MODEL:
                await anyio.lowlevel.checkpoint()


async def staged_with_subscriber(n: int) -> None:
    with lk.subscribe(lambda event: None), lk.deadline(60):
        for _ in range(n):
            with RETRIEVAL:
                await anyio.lowlevel.checkpoint()


VARIANTS: dict[str, Batch] = {
    "bare": bare,
    "bare (A/A)": bare_again,
    "fail_after by hand": by_hand,
    "lk.stage": staged,
    "lk.stage (no budget)": staged_without_budget,
    "lk.stage + subscriber": staged_with_subscriber,
}


async def measure(rounds: int, batch: int, seed: int) -> dict[str, list[float]]:
    """Per round, each variant's per-block time in microseconds."""
    rng = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for fn in VARIANTS.values():  # warm up
        await fn(batch)
    for _ in range(rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        gc.collect()
        gc.disable()
        try:
            for name in order:
                started = time.perf_counter_ns()
                await VARIANTS[name](batch)
                times[name].append((time.perf_counter_ns() - started) / batch / 1000)
        finally:
            gc.enable()
    return times


def report(backend: str, times: dict[str, list[float]], seed: int) -> float:
    """Print the table; the median overhead of ``lk.stage`` over ``bare``, in microseconds."""
    base = times["bare"]
    print(
        f"\n{backend}: per block, {len(base)} rounds (bare median {statistics.median(base):.2f} us)"
    )
    return print_overheads(times, "bare", seed)["lk.stage"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run, for smoke tests")
    parser.add_argument("--seed", type=int, default=20261124, help="shuffle seed")
    args = parser.parse_args(argv)
    rounds, batch = (20, 200) if args.quick else (150, 500)
    print(
        f"latencykit {lk.__version__}, anyio {_version('anyio')}, trio {_version('trio')}, "
        f"python {sys.version.split()[0]}, load {_load()}"
    )
    overhead = {}
    for backend in ("asyncio", "trio"):
        times = anyio.run(measure, rounds, batch, args.seed, backend=backend)
        overhead[backend] = report(backend, times, args.seed)
    ok = overhead["asyncio"] <= TARGET_US
    print(
        f"\ntarget: a stage adds <= {TARGET_US:g} us (asyncio median): "
        f"{overhead['asyncio']:.2f} us {verdict(ok)} (trio {overhead['trio']:.2f} us)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
