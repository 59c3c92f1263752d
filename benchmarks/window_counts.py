"""What a breaker's and a retry budget's sliding windows cost per call, against another source
tree, side by side in one process.

Run it from the repository root, naming the other tree's ``src/`` (e.g. an older commit's
``git archive``)::

    .venv/bin/python benchmarks/window_counts.py --baseline /tmp/before/src

The other tree's ``latencykit`` is loaded a second time under another name (its imports are
relative), so both run on the same event loop. In each round, in a shuffled order, a batch of
``batch`` calls of each operation is timed for each tree: admit and record a successful call
on a closed breaker with a count window, the same with a time window, a budget's ``deposit()``
(what every call through a hedge or retry pays) and ``deposit()`` plus ``try_withdraw()``.
Reported: the median over rounds of the per-round ratio (this tree / baseline) with a 95 %
bootstrap interval, and the baseline's median per call. Below 1: this tree is faster.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import latencykit


def _load(src: Path, name: str) -> ModuleType:
    """The ``latencykit`` package of ``src``, imported as ``name``."""
    copy = Path(tempfile.mkdtemp()) / name
    shutil.copytree(src / "latencykit", copy)
    spec = importlib.util.spec_from_file_location(name, copy / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _operations(lk: Any, tag: str) -> dict[str, Callable[[], None]]:
    breakers = {
        kind: lk.Breaker(f"{tag}-{kind}", window_type=kind, window_size=size)
        for kind, size in (("count", 100), ("time", 10.0))
    }
    budget, calls = lk.RetryBudget(0.5), lk.RetryBudget(0.5)

    def call(b: Any) -> Callable[[], None]:
        return lambda: b.record(b.acquire(), True, 0.01)

    def spend() -> None:
        budget.deposit()
        budget.try_withdraw()

    return {
        "breaker count window": call(breakers["count"]),
        "breaker time window": call(breakers["time"]),
        "budget deposit (every call)": calls.deposit,
        "budget deposit + withdraw": spend,
    }


def _batch(step: Callable[[], None], size: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(size):
        step()
    return (time.perf_counter_ns() - start) / size


async def _measure(trees: dict[str, Any], rounds: int, batch: int, rng: random.Random) -> Any:
    operations = {name: _operations(lk, name) for name, lk in trees.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        order = [(tree, op) for tree in trees for op in operations[tree]]
        rng.shuffle(order)
        gc.collect()
        gc.disable()
        for tree, op in order:
            times.setdefault((tree, op), []).append(_batch(operations[tree][op], batch))
        gc.enable()
        await asyncio.sleep(0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, required=True, help="the other tree's src/")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261126)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    trees = {"this": latencykit, "baseline": _load(args.baseline, "latencykit_baseline")}
    times = asyncio.run(_measure(trees, args.rounds, args.batch, rng))
    for op in _operations(latencykit, "names"):
        ratios = [a / b for a, b in zip(times["this", op], times["baseline", op], strict=True)]
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        print(
            f"{op:28} this/baseline {statistics.median(ratios):.3f} "
            f"[{medians[50]:.3f}, {medians[1949]:.3f}] "
            f"(baseline {statistics.median(times['baseline', op]):.0f} ns per call)"
        )


if __name__ == "__main__":
    main()
