"""``import latencykit`` from several source trees, side by side, in fresh interpreters.

Each round starts, for every tree in a shuffled order, one interpreter that times the import
in-process (``time.perf_counter`` around ``import latencykit``) and one under ``-X importtime``
(latencykit's cumulative line). Bytecode is cached (``PYTHONPYCACHEPREFIX``, one directory per
tree, as from an installed wheel); round 0 writes it and is not counted. Reported: each tree's
medians and the median, over rounds, of its ratio to the first tree's (the figure to quote on
a machine whose load changes from one minute to the next).

    python benchmarks/import_time.py --rounds 21 before=/tmp/before/src after=src
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile

TIMED = "import time; t = time.perf_counter(); import latencykit; print(time.perf_counter() - t)"


def _run(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(arguments, env=env, capture_output=True, text=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("trees", nargs="+", help="NAME=PYTHONPATH (the first is the baseline)")
    options = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in options.trees)
    wall: dict[str, list[float]] = {name: [] for name in trees}
    cumulative: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="latencykit-import-") as cache:
        for round_number in range(options.rounds + 1):
            for name in random.sample(list(trees), len(trees)):
                env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
                env.update(PYTHONPATH=trees[name], PYTHONPYCACHEPREFIX=f"{cache}/{name}")
                timed = _run([sys.executable, "-c", TIMED], env)
                tree = _run([sys.executable, "-X", "importtime", "-c", "import latencykit"], env)
                if round_number:
                    wall[name].append(float(timed.stdout) * 1000)
                    last = tree.stderr.strip().splitlines()[-1]  # latencykit's own line
                    cumulative[name].append(int(last.split("|")[1]) / 1000)
    base = next(iter(trees))
    print(f"{options.rounds} rounds; ratios are medians of per-round ratios to {base!r}")
    for name in trees:
        for label, values in (("wall", wall), ("-X importtime", cumulative)):
            pairs = zip(values[name], values[base], strict=True)
            ratio = statistics.median(value / baseline for value, baseline in pairs)
            print(
                f"{name:>14} {label:>14}: median {statistics.median(values[name]):6.1f} ms,"
                f" ratio {ratio:.3f}"
            )


if __name__ == "__main__":
    main()
