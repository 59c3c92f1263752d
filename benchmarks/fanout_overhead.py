"""What ``lk.gather`` and ``lk.first`` cost next to an anyio task group written by hand.

Run it from the repository root::

    .venv/bin/python benchmarks/fanout_overhead.py          # about a minute
    .venv/bin/python benchmarks/fanout_overhead.py --quick  # smoke run, a few seconds

Each variant fans out ``--width`` (default 10) trivial coroutines (one checkpoint,
``await anyio.sleep(0)``, then return their index) and collects the results:

- ``by hand``: ``async with anyio.create_task_group()``, one ``start_soon`` per coroutine, each
  storing its result into a list (the leanest correct hand-written gather: one module-level
  helper, no closure per call);
- ``by hand (A/A)``: the same code again, a second variant measured like the others: its
  difference to ``by hand`` is the noise floor of the method;
- ``lk.gather``: ``await lk.gather(*coroutines)``;
- ``lk.gather(within=60)``: the same with a budget (a deadline on the task group, and the
  branches' deadline in their context);
- ``lk.first``: ``await lk.first(*coroutines)`` (the first answer wins, the others are
  cancelled), against ``first by hand``: a task group whose first finisher stores its result
  and cancels the group.

Method (as benchmarks/overhead.py; same helpers): the variants are interleaved side by side in
one loop. In each round, every variant times a batch of ``batch`` fan-outs with
``time.perf_counter_ns``, in a freshly shuffled order; a variant's overhead in a round is its
per-fan-out time minus its baseline's in the same round. Reported: median of the per-round
overheads, a 95 % percentile-bootstrap interval of that median (rounds resampled, so pairs stay
paired), p99, and the ratio of medians. The garbage collector is off during timed batches and
collects between rounds. On asyncio, then on trio.

Target: ``lk.gather`` adds at most 10 us per gather over the hand-written task group (asyncio,
median). The script reports; it always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from overhead import _ci, _load, _version, bootstrap_ci, percentile, verdict

import latencykit as lk

TARGET_US = 10.0

Fanout = Callable[[int], Awaitable[object]]


async def trivial(index: int) -> int:
    await anyio.lowlevel.checkpoint()
    return index


async def _store(results: list[Any], index: int, coroutine: Coroutine[Any, Any, Any]) -> None:
    results[index] = await coroutine


async def by_hand(width: int) -> list[Any]:
    results: list[Any] = [None] * width
    async with anyio.create_task_group() as group:
        for index in range(width):
            group.start_soon(_store, results, index, trivial(index))
    return results


async def by_hand_again(width: int) -> list[Any]:
    results: list[Any] = [None] * width
    async with anyio.create_task_group() as group:
        for index in range(width):
            group.start_soon(_store, results, index, trivial(index))
    return results


async def with_gather(width: int) -> list[Any]:
    return await lk.gather(*[trivial(index) for index in range(width)])


async def with_gather_within(width: int) -> list[Any]:
    return await lk.gather(*[trivial(index) for index in range(width)], within=60.0)


async def _race(
    box: list[Any], group: anyio.abc.TaskGroup, coroutine: Coroutine[Any, Any, Any]
) -> None:
    value = await coroutine
    if not box:
        box.append(value)
        group.cancel_scope.cancel()


async def first_by_hand(width: int) -> Any:
    box: list[Any] = []
    async with anyio.create_task_group() as group:
        for index in range(width):
            group.start_soon(_race, box, group, trivial(index))
    return box[0]


async def with_first(width: int) -> Any:
    return await lk.first(*[trivial(index) for index in range(width)])


VARIANTS: dict[str, Fanout] = {
    "by hand": by_hand,
    "by hand (A/A)": by_hand_again,
    "lk.gather": with_gather,
    "lk.gather(within=60)": with_gather_within,
    "first by hand": first_by_hand,
    "lk.first": with_first,
}
BASELINE = {
    "by hand (A/A)": "by hand",
    "lk.gather": "by hand",
    "lk.gather(within=60)": "by hand",
    "lk.first": "first by hand",
}


async def _timed_batch(fn: Fanout, width: int, batch: int) -> int:
    start = time.perf_counter_ns()
    for _ in range(batch):
        await fn(width)
    return time.perf_counter_ns() - start


async def _rounds(
    width: int, rounds: int, batch: int, warmup: int, seed: int
) -> dict[str, list[float]]:
    """Per-round time per fan-out in microseconds, per variant (warm-up rounds dropped)."""
    assert await with_gather(3) == [0, 1, 2] and await with_first(1) == 0
    rng = random.Random(seed)
    per_call: dict[str, list[float]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    gc.collect()
    try:
        for number in range(warmup + rounds):
            rng.shuffle(order)
            gc.disable()
            timings = {name: await _timed_batch(VARIANTS[name], width, batch) for name in order}
            gc.enable()
            gc.collect()
            if number >= warmup:
                for name, elapsed in timings.items():
                    per_call[name].append(elapsed / batch / 1000.0)
    finally:
        gc.enable()
    return per_call


def _paired(values: Sequence[float], base: Sequence[float], seed: int) -> tuple[float, Any]:
    """Median of the per-round differences, with its 95 % bootstrap interval."""
    diffs = [v - b for v, b in zip(values, base, strict=True)]
    ci = bootstrap_ci(len(diffs), lambda idx: statistics.median([diffs[i] for i in idx]), seed)
    return statistics.median(diffs), ci


def report(backend: str, per_call: dict[str, list[float]], seed: int) -> bool:
    """Print one backend's table; whether lk.gather met the target."""
    rounds = len(per_call["by hand"])
    print(f"\n{backend}: {rounds} rounds")
    print(
        "   variant               | per fan-out, median (us) |   p99 | overhead vs baseline, "
        "median [95 % CI] (us) | p99 | ratio of medians"
    )
    met = True
    for name, values in per_call.items():
        median = statistics.median(values)
        base = BASELINE.get(name)
        if base is None:
            print(f"   {name:21} | {median:24.1f} | {percentile(values, 99):5.1f} |")
            continue
        added, ci = _paired(values, per_call[base], seed)
        diffs = [v - b for v, b in zip(values, per_call[base], strict=True)]
        ratio = median / statistics.median(per_call[base])
        print(
            f"   {name:21} | {median:24.1f} | {percentile(values, 99):5.1f} | "
            f"{added:+8.2f} {_ci(ci, '+.2f'):>20} | {percentile(diffs, 99):+5.1f} | {ratio:.3f}x"
        )
        if name == "lk.gather":
            met = added <= TARGET_US
    return met


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--width", type=int, default=10, help="coroutines per fan-out")
    parser.add_argument("--seed", type=int, default=20261125)
    args = parser.parse_args(argv)
    rounds, batch, warmup = (20, 50, 3) if args.quick else (200, 100, 10)
    print(
        f"latencykit fan-out benchmark: Python {sys.version.split()[0]}, anyio "
        f"{_version('anyio')}, trio {_version('trio')}, width {args.width}, {batch} fan-outs "
        f"per batch, load average {_load()}",
        flush=True,
    )
    verdicts = {}
    for backend in ("asyncio", "trio"):
        per_call = anyio.run(_rounds, args.width, rounds, batch, warmup, args.seed, backend=backend)
        verdicts[backend] = report(backend, per_call, args.seed)
    print("\nTarget")
    print(
        f"   {verdict(verdicts['asyncio'])}  lk.gather adds <= {TARGET_US:g} us per gather of "
        f"{args.width} over a task group by hand (asyncio, median); trio: "
        f"{verdict(verdicts['trio'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
