"""How much time latencykit adds: per policy, around litellm, and at import.

Run it from the repository root::

    .venv/bin/python benchmarks/overhead.py            # full run, about a minute
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run, under 30 seconds
    .venv/bin/python benchmarks/overhead.py --json results.json
    .venv/bin/python benchmarks/overhead.py --policies-only      # part 1 only, about a minute
    .venv/bin/python benchmarks/overhead.py --llm-only           # part 2a only, about 2 minutes
    .venv/bin/python benchmarks/overhead.py --llm-only --llm-baseline /tmp/before/src

It measures three things and prints each next to its target with PASS/FAIL. It always exits 0:
it reports, it does not gate. Progress goes to stderr, the report to stdout.

Method. The machine this was written on has two noisy cores, so absolute times drift by tens of
percent between (and within) runs. Every comparison is therefore made *side by side, in the same
loop*: the variants being compared are interleaved, in a freshly shuffled order in each round,
and an overhead is always a difference (or ratio) between measurements taken in the same round,
never between two separate runs. Medians of those paired differences are robust to bursts of
noise; the p99 shows how bad a noisy round gets; a 95 % percentile-bootstrap interval (rounds
resampled, so pairs stay paired) shows how precisely the median is known.

1. **Policy overhead** on a no-op coroutine (``async def noop(x): return x``). Variants: the raw
   ``await noop(1)``, ``@lk.deadline(60)``, ``@lk.fallback("x", after=30)``, ``@lk.fallback("x")``
   (no timer), the whole stack ``@lk.deadline(60)`` over ``@lk.fallback("x", after=30)``, and the
   same stack with an event subscriber attached (``lk.subscribe(lambda e: None)``, attached just
   before its batch and closed right after, both outside the timed region), ``@lk.hedge(30)`` (a
   hedge armed on every call that never fires) and ``@lk.hedge(lk.quantile(0.9))`` (its window holds
   only ~1 ms samples, a light tail: the timer is armed at the p90 plus the fastest call).
   ``--hedge-baseline PATH`` adds the same two hedges built from another ``hedge.py`` (e.g. an
   older commit's), measured in the same rounds. In
   each of ``rounds`` rounds, a batch of ``batch`` calls of every variant is timed with
   ``time.perf_counter_ns`` in a shuffled order; the per-call time of a batch is its time divided by
   ``batch``; the overhead of a variant in a round is its per-call time minus the raw variant's
   per-call time *in the same round*. Reported: median [95 % CI] and p99 of those per-round
   overheads, in microseconds. The loop's own cost is in every variant and cancels out. The garbage
   collector is disabled during timed batches and a full collection runs between rounds, so a
   collection never lands inside one variant's batch. ``noop`` never suspends, so after each batch
   (untimed) the event loop gets one turn, as it would between real calls: it drops the cancelled
   timers the deadline scopes left behind (without that turn the timer heap grows for the whole run
   and every gc pass walks it). Each round also times a fixed 100-step Python loop (no latencykit)
   as a machine-speed yardstick; ``xref`` is the median of overhead / that loop's time per round,
   which stays put when the machine runs slower or faster, so it compares runs. Run on asyncio and
   on trio (through anyio), reported separately.

2. **``lk.LLM`` versus bare ``litellm.acompletion``** with ``mock_response="hi"`` (no network:
   litellm builds a real ``ModelResponse`` through its normal code path, so what remains is
   litellm's own per-call cost plus latencykit's). Variants: bare
   ``litellm.acompletion(model=..., mock_response="hi", messages=...)``; the same with the two
   arguments ``lk.LLM`` always adds (``max_retries=0, timeout=600``), a control separating
   latencykit's own cost from litellm's cost of those arguments; ``lk.LLM("openai/gpt-4o-mini")``
   with no policies; ``lk.LLM`` with ``deadline=30`` and
   ``degrade=lk.Degrade(model=..., max_tokens=16, after=20)``; ``lk.LLM`` with
   ``hedge=lk.Hedge(30)`` (armed on every call, never fires); ``lk.LLM`` with ``deadline=30``
   and a failover target (never called); ``lk.LLM`` with the full stack, none of which acts
   (``deadline=30``, that ``degrade``, ``hedge=lk.Hedge(10)``: armed on every call, ``breaker={}``,
   a failover target, ``retry=lk.Retry()``), and the same with ``hedge=lk.Hedge(30)``, whose
   backup could never start before the deadline; and litellm's ``Router`` with one deployment of
   the same model and its default settings (``num_retries=2``, as the full stack retries too;
   ``num_retries=0`` measured the same on calls that succeed), the alternative users would pick.
   The full stack's added cost is also given as a fraction of the Router's (ratio of the two
   median paired differences, bootstrap 95 % CI). ``--llm-baseline DIR`` adds the ``lk.LLM``
   variants built from another version's ``latencykit`` package under ``DIR`` (say an older
   commit's ``src``, imported side by side as ``latencykit_baseline``) to the same rounds, each
   reported right after the current one it compares with: on a noisy machine, two versions
   are compared only within one run. After a warm-up, each round makes one call
   of every variant in a shuffled order, each call timed on its own. After every call
   the loop turns a few times, untimed, so the logging tasks litellm leaves behind after each
   call run there rather than inside whichever call comes next (they would add about +-0.5 ms of
   jitter to a ~1.5 ms call). Reported: median and p99 per call in milliseconds, the ratio of
   medians against bare litellm [95 % CI] and the overhead percent it implies, and the median of
   the per-round paired differences in microseconds [95 % CI]. The garbage collector is disabled
   within blocks of rounds and collected between blocks. asyncio only: bare litellm runs on
   asyncio only (``lk.LLM`` on trio goes through a bridge thread, a different comparison).

3. **``import latencykit``**: fresh interpreters (``sys.executable``) run, interleaved in a
   shuffled order, ``python -c "pass"``, ``python -c "import latencykit"`` (wall time) and
   ``python -X importtime -c "import latencykit"``. Reported: the median cumulative import time
   of ``latencykit`` from ``-X importtime`` (the figure the target is checked against), the
   median wall times and their difference, whether litellm was imported (it must not be), and
   what the import pulls in (third-party packages, heaviest stdlib modules).

Targets: deadline + fallback add <= 15 us per call at the median (each backend); ``lk.LLM`` (with
deadline and degrade) adds <= 2 % over bare litellm at the median; the full stack adds at most
1/20 of what the Router adds; ``import latencykit`` takes
<= 150 ms and does not import litellm.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import trio

import latencykit as lk

# litellm fetches a model price map from the internet at import unless told not to.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

MODEL = "openai/gpt-4o-mini"
BACKUP_MODEL = "openai/gpt-4o"  # the failover target of part 2, never called
MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "Say hi."}]

POLICY_TARGET_US = 15.0
LLM_TARGET_PCT = 2.0
ROUTER_SHARE_TARGET = 1 / 20  # the full stack's added cost, as a fraction of the Router's
IMPORT_TARGET_MS = 150.0

LLM_GC_BLOCK = 50  # rounds between garbage collections in the LLM benchmark
LLM_SETTLE_YIELDS = 5  # untimed event-loop turns after each LLM call

GC_NOTE = (
    "disabled during timed batches (gc.disable); full gc.collect() between rounds "
    f"(policies) and between blocks of {LLM_GC_BLOCK} rounds (LLM)"
)


@dataclass(frozen=True)
class Settings:
    """How much to measure; ``--quick`` shrinks everything."""

    policy_rounds: int
    policy_batch: int
    policy_warmup_rounds: int
    llm_calls: int
    llm_warmup: int
    import_runs: int


FULL = Settings(
    policy_rounds=200,
    policy_batch=200,
    policy_warmup_rounds=10,
    llm_calls=3000,
    llm_warmup=200,
    import_runs=15,
)
QUICK = Settings(
    policy_rounds=30,
    policy_batch=100,
    policy_warmup_rounds=3,
    llm_calls=150,
    llm_warmup=30,
    import_runs=4,
)


# --- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


BOOTSTRAP_RESAMPLES = 300


def bootstrap_ci(
    n: int, statistic: Callable[[Sequence[int]], float], seed: int
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of ``statistic`` over resampled indices ``0..n-1``.

    Indices (rounds) are resampled, not values, so paired samples stay paired.
    """
    rng = random.Random(seed)
    population = range(n)
    estimates = [statistic(rng.choices(population, k=n)) for _ in range(BOOTSTRAP_RESAMPLES)]
    return percentile(estimates, 2.5), percentile(estimates, 97.5)


@dataclass(frozen=True)
class Summary:
    """Median and p99 of a sample, its size and (for differences) a 95 % CI of the median."""

    median: float
    p99: float
    n: int
    median_ci95: tuple[float, float] | None = None

    @classmethod
    def of(cls, values: Sequence[float], *, ci_seed: int | None = None) -> Summary:
        ci = None
        if ci_seed is not None:
            ci = bootstrap_ci(
                len(values), lambda idx: statistics.median([values[i] for i in idx]), ci_seed
            )
        return cls(statistics.median(values), percentile(values, 99.0), len(values), ci)


# --- 1. policy overhead on a no-op coroutine -------------------------------------------------


async def noop(x: int) -> int:
    return x


async def reference(x: int) -> int:
    """Fixed pure-Python work, no latencykit: a yardstick of how fast the machine ran."""
    total = 0
    for i in range(100):
        total += i * x
    return total


AsyncFn = Callable[[int], Awaitable[int]]
ABSOLUTE = ("raw", "reference")  # variants reported as absolute times, not as overheads


@dataclass(frozen=True)
class Variant:
    """One way of calling ``noop``; ``events`` attaches a subscriber around its batches."""

    key: str
    label: str
    fn: AsyncFn
    events: bool = False


def policy_variants() -> list[Variant]:
    """Fresh decorated functions (one pipeline each) for the policy benchmark."""
    stack: AsyncFn = lk.deadline(60)(lk.fallback("x", after=30)(noop))
    stack_events: AsyncFn = lk.deadline(60)(lk.fallback("x", after=30)(noop))
    return [
        Variant("raw", "raw `await noop(1)`", noop),
        Variant("reference", "reference: 100-step Python loop", reference),
        Variant("deadline", "@deadline(60)", lk.deadline(60)(noop)),
        Variant("fallback_after", '@fallback("x", after=30)', lk.fallback("x", after=30)(noop)),
        Variant("fallback_no_timer", '@fallback("x")  (no timer)', lk.fallback("x")(noop)),
        Variant("stack", "@deadline(60) @fallback(after=30)", stack),
        Variant("stack_events", "  same + events subscriber", stack_events, events=True),
        Variant("hedge_armed", "@hedge(30)  (armed, never fires)", lk.hedge(30)(noop)),
        Variant("hedge_idle", "@hedge(quantile(0.9))  (light tail)", _warm_adaptive_hedge()),
        *_baseline_hedge_variants(),
    ]


BASELINE_HEDGE: Path | None = None
"""``--hedge-baseline PATH``: another version of ``latencykit/policies/hedge.py`` (e.g. from an
older commit) measured side by side with the current one, as extra variants."""


def _baseline_hedge_variants() -> list[Variant]:
    if BASELINE_HEDGE is None:
        return []
    # Loaded as a sibling module of latencykit.policies.hedge, so its relative imports resolve
    # against the installed package (the rest of latencykit is the current code).
    spec = importlib.util.spec_from_file_location(
        "latencykit.policies._baseline_hedge", BASELINE_HEDGE
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return [
        Variant("hedge_armed_base", "  baseline hedge.py, armed", module.hedge(30)(noop)),
        Variant(
            "hedge_idle_base",
            "  baseline hedge.py, light tail",
            module.hedge(module.quantile(0.9))(noop),
        ),
    ]


def _warm_adaptive_hedge() -> AsyncFn:
    """``@hedge(quantile(0.9))`` on ``noop``: its window fills with ~1 ms samples (every call
    is clamped to 1 ms), a light tail: the timer is armed at the p90 plus the fastest call, and
    never fires."""
    return lk.hedge(lk.quantile(0.9))(noop)


async def _timed_batch(fn: AsyncFn, calls: int) -> int:
    start = time.perf_counter_ns()
    for _ in range(calls):
        await fn(1)
    return time.perf_counter_ns() - start


def _ignore_event(event: lk.events.Event) -> None:
    return None


async def _policy_rounds(
    variants: list[Variant], rounds: int, batch: int, warmup: int, seed: int
) -> dict[str, list[float]]:
    """Per-round per-call times in microseconds, per variant key (warm-up rounds dropped)."""
    rng = random.Random(seed)
    per_call: dict[str, list[float]] = {v.key: [] for v in variants}
    order = list(variants)
    gc.collect()
    try:
        for round_number in range(warmup + rounds):
            rng.shuffle(order)
            gc.disable()
            timings: dict[str, int] = {}
            for variant in order:
                subscription = lk.subscribe(_ignore_event) if variant.events else None
                try:
                    timings[variant.key] = await _timed_batch(variant.fn, batch)
                finally:
                    if subscription is not None:
                        subscription.close()
                # noop never suspends, so the event loop never runs inside a batch: let it run
                # once (untimed) so it drops the cancelled timers the scopes left behind, as it
                # would between real calls. Without this the timer heap grows all run long.
                await anyio.lowlevel.checkpoint()
            gc.enable()
            gc.collect()
            if round_number >= warmup:
                for key, elapsed in timings.items():
                    per_call[key].append(elapsed / batch / 1000.0)
    finally:
        gc.enable()
    return per_call


@dataclass
class PolicyResult:
    """Policy overheads on one backend, in microseconds per call."""

    backend: str
    rounds: int
    batch: int
    raw_per_call_us: Summary
    reference_per_call_us: Summary
    per_call_us: dict[str, Summary]
    overhead_us: dict[str, Summary]
    overhead_in_reference_loops: dict[str, float]
    labels: dict[str, str]


def _summarise_policy(
    backend: str,
    variants: list[Variant],
    per_call: dict[str, list[float]],
    settings: Settings,
    seed: int,
) -> PolicyResult:
    raw = per_call["raw"]
    ref = per_call["reference"]
    overhead: dict[str, Summary] = {}
    in_ref: dict[str, float] = {}
    for variant in variants:
        if variant.key in ABSOLUTE:
            continue
        diffs = [t - r for t, r in zip(per_call[variant.key], raw, strict=True)]
        overhead[variant.key] = Summary.of(diffs, ci_seed=seed)
        in_ref[variant.key] = statistics.median(d / r for d, r in zip(diffs, ref, strict=True))
    return PolicyResult(
        backend=backend,
        rounds=settings.policy_rounds,
        batch=settings.policy_batch,
        raw_per_call_us=Summary.of(raw),
        reference_per_call_us=Summary.of(per_call["reference"]),
        per_call_us={key: Summary.of(values) for key, values in per_call.items()},
        overhead_us=overhead,
        overhead_in_reference_loops=in_ref,
        labels={v.key: v.label for v in variants},
    )


def bench_policies(backend: str, settings: Settings, seed: int) -> PolicyResult:
    """Run the policy benchmark on ``backend`` ("asyncio" or "trio")."""
    variants = policy_variants()

    async def main() -> dict[str, list[float]]:
        return await _policy_rounds(
            variants,
            settings.policy_rounds,
            settings.policy_batch,
            settings.policy_warmup_rounds,
            seed,
        )

    per_call = asyncio.run(main()) if backend == "asyncio" else trio.run(main)
    return _summarise_policy(backend, variants, per_call, settings, seed)


# --- 2. lk.LLM versus bare litellm.acompletion ----------------------------------------------

LLM_LABELS = {
    "bare": "bare litellm.acompletion",
    "bare_same_args": "  bare + max_retries=0, timeout=600",
    "bare_in_timeout": "  same inside anyio.fail_after(30)",
    "llm_plain": 'lk.LLM("openai/gpt-4o-mini")',
    "llm_full": "lk.LLM(deadline=30, degrade=...)",
    "llm_hedge": "lk.LLM(hedge=lk.Hedge(30))  (armed)",
    "llm_failover_deadline": "lk.LLM(deadline=30, failover=[...])",
    "llm_stack": "lk.LLM(full stack, nothing fires)",
    "llm_stack_late_hedge": "  same, hedge delay = the deadline",
    "router": "litellm.Router (one deployment)",
}
"""The control row "inside anyio.fail_after(30)" is no latencykit code at all: the cost of one
cancel scope around a litellm call, the mechanism any structured deadline needs."""


@dataclass
class LLMResult:
    """Per-call times in milliseconds and the overheads against bare litellm."""

    mode: str
    calls: int
    warmup: int
    per_call_ms: dict[str, Summary]
    ratio_of_medians: dict[str, float]
    ratio_ci95: dict[str, tuple[float, float]]
    overhead_pct: dict[str, float]
    paired_diff_us: dict[str, Summary]
    labels: dict[str, str]
    router_share: float
    """The full stack's added cost as a fraction of the Router's: the ratio of their median
    paired differences over bare litellm."""
    router_share_ci95: tuple[float, float]
    baseline_router_share: float | None = None
    """The same for ``--llm-baseline``'s full stack (``None``: no baseline measured)."""
    baseline_router_share_ci95: tuple[float, float] | None = None


async def _llm_rounds(
    settings: Settings, seed: int, base_url: str | None
) -> dict[str, list[float]]:
    """Per-call times in milliseconds, per variant (warm-up dropped), interleaved call by call.

    ``base_url=None`` uses ``mock_response``; otherwise real HTTP to the fake provider there.
    """
    import litellm
    from litellm.router import Router

    litellm.suppress_debug_info = True
    target: dict[str, Any] = (
        {"mock_response": "hi"}
        if base_url is None
        else {"api_base": base_url, "api_key": "bench-key-not-secret"}
    )
    per_call = {"mock_response": "hi"} if base_url is None else {}
    # litellm's Router with its default settings (num_retries=2: our stack retries too; on
    # calls that succeed, num_retries=0 measured the same).
    deployment = {"model": MODEL, **({} if base_url is None else target)}
    router = Router(model_list=[{"model_name": "bench", "litellm_params": deployment}])

    async def bare() -> object:
        return await litellm.acompletion(model=MODEL, messages=MESSAGES, **target)

    async def bare_same_args() -> object:
        return await litellm.acompletion(
            model=MODEL, messages=MESSAGES, max_retries=0, timeout=600.0, **target
        )

    async def bare_in_timeout() -> object:
        with anyio.fail_after(30):
            return await bare_same_args()

    async def routed() -> object:
        return await router.acompletion(model="bench", messages=MESSAGES, **per_call)

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "bare": bare,
        "bare_same_args": bare_same_args,
        "bare_in_timeout": bare_in_timeout,
        **_llm_calls(lk, base_url, per_call),
        "router": routed,
    }
    if BASELINE_LLM is not None:
        baseline = _llm_calls(_load_baseline(BASELINE_LLM), base_url, per_call)
        calls.update({f"baseline_{name}": call for name, call in baseline.items()})
    times: dict[str, list[float]] = {key: [] for key in calls}
    keys = list(calls)
    rng = random.Random(seed)
    gc.collect()
    try:
        for round_number in range(settings.llm_warmup + settings.llm_calls):
            if round_number % LLM_GC_BLOCK == 0:
                gc.enable()
                gc.collect()
                gc.disable()
            rng.shuffle(keys)
            for key in keys:
                start = time.perf_counter_ns()
                await calls[key]()
                elapsed = time.perf_counter_ns() - start
                if round_number >= settings.llm_warmup:
                    times[key].append(elapsed / 1e6)
                # Every litellm call leaves logging tasks behind; let them run here, untimed,
                # rather than inside whichever call comes next (that adds +-0.5 ms of jitter).
                for _ in range(LLM_SETTLE_YIELDS):
                    await asyncio.sleep(0)
    finally:
        gc.enable()
        gc.collect()
    return times


def _report_order(key: str) -> tuple[int, int]:
    """Baseline rows right after the current ones they are compared with."""
    name = key.removeprefix("baseline_")
    return list(LLM_LABELS).index(name), name != key


def _llm_calls(
    lk: Any, base_url: str | None, per_call: Mapping[str, Any]
) -> dict[str, Callable[[], Awaitable[object]]]:
    """The ``lk.LLM`` variants of part 2, built from the latencykit module ``lk``."""
    key = None if base_url is None else "bench-key-not-secret"
    backup = {"model": BACKUP_MODEL, "api_base": base_url, "api_key": key}
    degrade = {"deadline": 30, "degrade": lk.Degrade(model=MODEL, max_tokens=16, after=20)}

    def full_stack(hedge_delay: float) -> Any:
        return lk.LLM(
            MODEL,
            **degrade,
            hedge=lk.Hedge(hedge_delay),
            breaker={},
            failover=[backup],
            retry=lk.Retry(),
            api_base=base_url,
            api_key=key,
        )

    llms = {
        "llm_plain": lk.LLM(MODEL, api_base=base_url, api_key=key),
        "llm_full": lk.LLM(MODEL, **degrade, api_base=base_url, api_key=key),
        "llm_hedge": lk.LLM(MODEL, hedge=lk.Hedge(30.0), api_base=base_url, api_key=key),
        "llm_failover_deadline": lk.LLM(
            MODEL, deadline=30, failover=[backup], api_base=base_url, api_key=key
        ),
        "llm_stack": full_stack(10.0),  # the hedge is armed on every call (10 s < deadline)
        "llm_stack_late_hedge": full_stack(30.0),  # no backup could start before the deadline
    }

    def calling(llm: Any) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            return await llm.acompletion(messages=MESSAGES, **per_call)

        return call

    return {name: calling(llm) for name, llm in llms.items()}


BASELINE_LLM: Path | None = None
"""``--llm-baseline DIR``: a source directory holding another version's ``latencykit``
package (e.g. an older commit's ``src``), whose ``lk.LLM`` variants are measured in the same
rounds as the current ones (part 2)."""


def _load_baseline(source: Path) -> Any:
    """The ``latencykit`` package under ``source``, imported as ``latencykit_baseline`` (its
    modules import one another relatively, so the two versions live side by side)."""
    name = "latencykit_baseline"
    if name in sys.modules:
        return sys.modules[name]
    init = source / "latencykit" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _labels(keys: Iterable[str]) -> dict[str, str]:
    """The report's label of every measured variant, baseline ones marked."""
    return {key: LLM_LABELS.get(key, "    the same, baseline") for key in keys}


def bench_llm(settings: Settings, seed: int, *, http: bool = False) -> LLMResult:
    """Run the LLM-versus-litellm benchmark on asyncio (``http``: over loopback HTTP)."""
    if http:
        from latencykit.testing import FakeProvider

        with FakeProvider() as fake:
            times = asyncio.run(_llm_rounds(settings, seed, fake.base_url))
    else:
        times = asyncio.run(_llm_rounds(settings, seed, None))
    bare = times["bare"]
    others = [key for key in times if key != "bare"]
    per_call = {key: Summary.of(values) for key, values in times.items()}
    ratio: dict[str, float] = {}
    ratio_ci: dict[str, tuple[float, float]] = {}
    paired: dict[str, Summary] = {}
    for key in others:
        values = times[key]
        ratio[key] = per_call[key].median / per_call["bare"].median

        def ratio_of(idx: Sequence[int], values: list[float] = values) -> float:
            return statistics.median([values[i] for i in idx]) / statistics.median(
                [bare[i] for i in idx]
            )

        ratio_ci[key] = bootstrap_ci(len(values), ratio_of, seed)
        diffs = [(t - b) * 1000.0 for t, b in zip(values, bare, strict=True)]
        paired[key] = Summary.of(diffs, ci_seed=seed)
    router_diffs = [(t - b) for t, b in zip(times["router"], bare, strict=True)]

    def share(stack: str) -> Callable[[Sequence[int]], float]:
        stack_diffs = [(t - b) for t, b in zip(times[stack], bare, strict=True)]

        def share_of(idx: Sequence[int]) -> float:
            return statistics.median([stack_diffs[i] for i in idx]) / statistics.median(
                [router_diffs[i] for i in idx]
            )

        return share_of

    share_of = share("llm_stack")
    baseline_share = share("baseline_llm_stack") if "baseline_llm_stack" in times else None

    return LLMResult(
        mode="loopback HTTP (fake provider)" if http else "mock_response",
        calls=settings.llm_calls,
        warmup=settings.llm_warmup,
        per_call_ms=per_call,
        ratio_of_medians=ratio,
        ratio_ci95=ratio_ci,
        overhead_pct={key: (value - 1.0) * 100.0 for key, value in ratio.items()},
        paired_diff_us=paired,
        labels=_labels(sorted(times, key=_report_order)),
        router_share=share_of(range(len(bare))),
        router_share_ci95=bootstrap_ci(len(bare), share_of, seed),
        baseline_router_share=baseline_share and baseline_share(range(len(bare))),
        baseline_router_share_ci95=baseline_share and bootstrap_ci(len(bare), baseline_share, seed),
    )


# --- 3. import time -------------------------------------------------------------------------


@dataclass
class ImportResult:
    """Import-time figures from fresh interpreters."""

    runs: int
    importtime_cumulative_ms: Summary
    importtime_uncached_cumulative_ms: Summary
    wall_pass_ms: Summary
    wall_import_ms: Summary
    wall_difference_ms: float
    litellm_imported: bool
    third_party_ms: dict[str, float] = field(default_factory=dict)
    heaviest_stdlib_ms: dict[str, float] = field(default_factory=dict)


def _parse_importtime(stderr: str, module: str) -> dict[str, int]:
    """``{name: cumulative microseconds}`` for ``module`` and everything its import pulled in.

    ``-X importtime`` prints one line per module when its import finishes, indented two spaces
    per nesting level, so a top-level import's subtree is the run of deeper lines just before
    its own unindented line. (Modules that ``site`` imported earlier are not part of it.)
    """
    rows: list[tuple[int, str, int]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        label = parts[2].rstrip()
        name = label.lstrip()
        depth = (len(label) - len(name) - 1) // 2
        rows.append((depth, name, int(parts[1])))
    for index in range(len(rows) - 1, -1, -1):
        depth, name, micros = rows[index]
        if depth == 0 and name == module:
            subtree = {name: micros}
            for child_depth, child, child_micros in reversed(rows[:index]):
                if child_depth == 0:
                    break
                subtree.setdefault(child, child_micros)
            return subtree
    return {}


def _run(args: list[str], env: Mapping[str, str]) -> tuple[float, str]:
    start = time.perf_counter_ns()
    done = subprocess.run(args, capture_output=True, text=True, check=True, env=dict(env))
    return (time.perf_counter_ns() - start) / 1e6, done.stderr


def _import_envs(cache_dir: str) -> tuple[dict[str, str], dict[str, str]]:
    """Environments with bytecode cached (as from an installed wheel) and with none written.

    The cached one keeps its .pyc files under ``cache_dir`` (PYTHONPYCACHEPREFIX), so nothing is
    written into the source tree. The other compiles latencykit's sources on every import, as
    happens with PYTHONDONTWRITEBYTECODE=1 and an editable install.
    """
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = cache_dir
    uncached = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    uncached["PYTHONDONTWRITEBYTECODE"] = "1"
    return cached, uncached


def bench_import(settings: Settings, seed: int) -> ImportResult:
    """Time ``import latencykit`` in fresh interpreters, interleaved with a bare interpreter."""
    python = sys.executable
    importtime = [python, "-X", "importtime", "-c", "import latencykit"]
    with tempfile.TemporaryDirectory(prefix="latencykit-bench-pyc-") as cache_dir:
        cached, uncached = _import_envs(cache_dir)
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "pass": ([python, "-c", "pass"], cached),
            "import": ([python, "-c", "import latencykit"], cached),
            "importtime": (importtime, cached),
            "importtime_uncached": (importtime, uncached),
        }
        rng = random.Random(seed)
        walls: dict[str, list[float]] = {key: [] for key in commands}
        cumulative_ms: dict[str, list[float]] = {"importtime": [], "importtime_uncached": []}
        litellm_imported = False
        heaviest: dict[str, list[float]] = {}
        keys = list(commands)
        for run_number in range(settings.import_runs + 1):  # run 0 fills the caches
            rng.shuffle(keys)
            for key in keys:
                args, env = commands[key]
                wall, stderr = _run(args, env)
                if run_number == 0:
                    continue
                walls[key].append(wall)
                if key not in cumulative_ms:
                    continue
                modules = _parse_importtime(stderr, "latencykit")
                if "latencykit" not in modules:
                    raise RuntimeError(f"no latencykit line in -X importtime output:\n{stderr}")
                cumulative_ms[key].append(modules["latencykit"] / 1000.0)
                litellm_imported = litellm_imported or any(
                    name == "litellm" or name.startswith("litellm.") for name in modules
                )
                if key != "importtime":
                    continue
                for name, micros in modules.items():
                    if "." not in name and name != "latencykit" and not name.startswith("_"):
                        heaviest.setdefault(name, []).append(micros / 1000.0)
    ranked = sorted(
        ((name, statistics.median(values)) for name, values in heaviest.items()),
        key=lambda item: item[1],
        reverse=True,
    )
    stdlib = sys.stdlib_module_names
    # find_spec: -X importtime also lists failed attempts (copy.py tries Jython's "org").
    third_party = {
        name: ms
        for name, ms in ranked
        if name not in stdlib and importlib.util.find_spec(name) is not None
    }
    heaviest_stdlib = {name: ms for name, ms in ranked if name in stdlib}
    wall_pass = Summary.of(walls["pass"])
    wall_import = Summary.of(walls["import"])
    return ImportResult(
        runs=settings.import_runs,
        importtime_cumulative_ms=Summary.of(cumulative_ms["importtime"]),
        importtime_uncached_cumulative_ms=Summary.of(cumulative_ms["importtime_uncached"]),
        wall_pass_ms=wall_pass,
        wall_import_ms=wall_import,
        wall_difference_ms=wall_import.median - wall_pass.median,
        litellm_imported=litellm_imported,
        third_party_ms=dict(list(third_party.items())[:6]),
        heaviest_stdlib_ms=dict(list(heaviest_stdlib.items())[:5]),
    )


# --- report ---------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _ci(ci: tuple[float, float] | None, fmt: str) -> str:
    return "" if ci is None else f"[{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def print_overheads(
    times: Mapping[str, Sequence[float]], baseline: str, seed: int, *, width: int = 24
) -> dict[str, float]:
    """Print each variant's per-round overhead over ``baseline`` (median [95 % bootstrap
    interval], p99), measured side by side; return the medians by variant."""
    base = times[baseline]
    print(f"  {'variant':<{width}} {'overhead us':>12} {'95% CI':>16} {'p99':>8}")
    medians: dict[str, float] = {}
    for name, values in times.items():
        if name == baseline:
            continue
        diffs = [v - b for v, b in zip(values, base, strict=True)]
        median = medians[name] = statistics.median(diffs)

        def median_of(indices: Sequence[int], d: list[float] = diffs) -> float:
            return statistics.median([d[i] for i in indices])

        ci = bootstrap_ci(len(diffs), median_of, seed)
        print(
            f"  {name:<{width}} {median:>12.2f} {_ci(ci, '.2f'):>16} {percentile(diffs, 99):>8.2f}"
        )
    return medians


def targets(
    policies: Sequence[PolicyResult], llms: Sequence[LLMResult], imports: ImportResult
) -> list[dict[str, Any]]:
    """Every target, its measured value (with a 95 % CI where there is one) and the verdict."""
    checks: list[dict[str, Any]] = []
    for result in policies:
        stack = result.overhead_us["stack"]
        checks.append(
            {
                "name": f"deadline + fallback add, median ({result.backend})",
                "value": round(stack.median, 2),
                "ci95": stack.median_ci95,
                "unit": "us",
                "target": f"<= {POLICY_TARGET_US:g} us",
                "pass": stack.median <= POLICY_TARGET_US,
            }
        )
    for llm in llms:
        pct = llm.overhead_pct["llm_full"]
        low, high = llm.ratio_ci95["llm_full"]
        checks.append(
            {
                "name": f"lk.LLM(deadline, degrade) over bare litellm ({llm.mode}), median",
                "value": round(pct, 2),
                "ci95": ((low - 1.0) * 100.0, (high - 1.0) * 100.0),
                "unit": "%",
                "target": f"<= {LLM_TARGET_PCT:g} %",
                "pass": pct <= LLM_TARGET_PCT,
            }
        )
        checks.append(
            {
                "name": f"lk.LLM full stack's added cost / Router's ({llm.mode}), median",
                "value": round(llm.router_share, 3),
                "ci95": llm.router_share_ci95,
                "unit": "",
                "target": f"<= {ROUTER_SHARE_TARGET:.3f} (1/20)",
                "pass": llm.router_share <= ROUTER_SHARE_TARGET,
            }
        )
    for label, summary in (
        ("bytecode cached", imports.importtime_cumulative_ms),
        ("no bytecode cache", imports.importtime_uncached_cumulative_ms),
    ):
        checks.append(
            {
                "name": f"import latencykit (-X importtime cumulative, {label}), median",
                "value": round(summary.median, 1),
                "ci95": None,
                "unit": "ms",
                "target": f"<= {IMPORT_TARGET_MS:g} ms",
                "pass": summary.median <= IMPORT_TARGET_MS,
            }
        )
    checks.append(
        {
            "name": "import latencykit imports litellm",
            "value": imports.litellm_imported,
            "ci95": None,
            "unit": "",
            "target": "must be False",
            "pass": not imports.litellm_imported,
        }
    )
    return checks


def render_policies(meta: Mapping[str, Any], policies: Sequence[PolicyResult]) -> str:
    """The report of part 1 alone (``--policies-only``)."""
    lines = [
        f"latencykit {meta['latencykit']} policy overhead, {meta['date']}, {meta['mode']} run: "
        f"Python {meta['python']}, anyio {meta['anyio']}, trio {meta['trio']}, "
        f"{meta['cpus']} CPUs",
        f"load average (1 min) at start {meta['load_start']}, at end {meta['load_end']}",
        "",
        *_render_policy_rows(policies),
    ]
    return "\n".join(line.rstrip() for line in lines)


def _render_policy_rows(policies: Sequence[PolicyResult]) -> list[str]:
    lines: list[str] = []
    add = lines.append
    first = policies[0]
    add(
        "1. Policies on `async def noop(x): return x`: us per call added over raw `await noop(1)`,"
        " paired per round"
    )
    add(
        f"   ({first.rounds} rounds x {first.batch} calls per variant, variants shuffled in each "
        "round; median [95% CI of the median], p99;"
    )
    add(
        "   xref = median of overhead / machine-speed loop in the same round: comparable across "
        "runs and machines)"
    )
    header = f"   {'variant':<36}"
    for result in policies:
        header += f" | {result.backend + ' median':>14} {'95% CI':>12} {'p99':>6} {'xref':>5}"
    add(header)
    add("   " + "-" * (len(header) - 3))
    absolute_rows = (
        ("raw await noop(1): absolute us", "raw_per_call_us"),
        ("machine speed: 100-step loop, abs us", "reference_per_call_us"),
    )
    for label, attribute in absolute_rows:
        row = f"   {label:<36}"
        for result in policies:
            summary: Summary = getattr(result, attribute)
            row += f" | {summary.median:>14.2f} {'':>12} {summary.p99:>6.2f} {'':>5}"
        add(row)
    for key, label in first.labels.items():
        if key in ABSOLUTE:
            continue
        row = f"   {label:<36}"
        for result in policies:
            summary = result.overhead_us[key]
            row += (
                f" | {summary.median:>+14.2f} {_ci(summary.median_ci95, '.1f'):>12}"
                f" {summary.p99:>+6.1f} {result.overhead_in_reference_loops[key]:>5.2f}"
            )
        add(row)
    add("")
    return lines


def _render_llm_rows(llm: LLMResult, number: str) -> list[str]:
    lines: list[str] = []
    add = lines.append
    add(
        f"{number}. lk.LLM vs bare litellm.acompletion, {llm.mode}, asyncio: "
        f"{llm.calls} calls each after {llm.warmup} warm-up,"
    )
    add(
        "   interleaved call by call in shuffled order; ms per call; ratio of medians vs bare "
        "[95% CI]; paired diff = median of"
    )
    add("   (variant - bare) in the same round, us [95% CI]")
    header = (
        f"   {'variant':<36} | {'median':>6} {'p99':>6} | {'ratio':>5} {'95% CI':>14} "
        f"{'overhead':>8} | {'paired diff':>11} {'95% CI':>12}"
    )
    add(header)
    add("   " + "-" * (len(header) - 3))
    for key, label in llm.labels.items():
        summary = llm.per_call_ms[key]
        if key == "bare":
            tail = f"{'1':>5} {'':>14} {'':>8} | {'':>11} {'':>12}"
        else:
            diff = llm.paired_diff_us[key]
            tail = (
                f"{llm.ratio_of_medians[key]:>5.3f} {_ci(llm.ratio_ci95[key], '.3f'):>14} "
                f"{llm.overhead_pct[key]:>+7.1f}% | {diff.median:>+11.0f} "
                f"{_ci(diff.median_ci95, '.0f'):>12}"
            )
        add(f"   {label:<36} | {summary.median:>6.3f} {summary.p99:>6.3f} | {tail}")
    low, high = llm.router_share_ci95
    add(
        f"   full stack's added cost / Router's: {llm.router_share:.3f} "
        f"[{low:.3f}, {high:.3f}] (1/{1 / llm.router_share:.0f})"
    )
    if llm.baseline_router_share is not None and llm.baseline_router_share_ci95 is not None:
        low, high = llm.baseline_router_share_ci95
        add(
            f"   baseline full stack's added cost / Router's: {llm.baseline_router_share:.3f} "
            f"[{low:.3f}, {high:.3f}] (1/{1 / llm.baseline_router_share:.0f})"
        )
    add("")

    return lines


def render_llm(meta: Mapping[str, Any], llm: LLMResult) -> str:
    """The report of part 2a alone (``--llm-only``)."""
    lines = [
        f"latencykit {meta['latencykit']} per-call overhead, {meta['date']}, {meta['mode']} run: "
        f"Python {meta['python']}, litellm {meta['litellm']}, {meta['cpus']} CPUs",
        f"load average (1 min) at start {meta['load_start']}, at end {meta['load_end']}",
        "",
        *_render_llm_rows(llm, "2a"),
    ]
    return "\n".join(line.rstrip() for line in lines)


def render(
    meta: Mapping[str, Any],
    policies: Sequence[PolicyResult],
    llms: Sequence[LLMResult],
    imports: ImportResult,
    checks: Sequence[Mapping[str, Any]],
) -> str:
    """The human-readable report."""
    lines: list[str] = []
    add = lines.append
    add(
        f"latencykit {meta['latencykit']} overhead benchmark, {meta['date']}, {meta['mode']} run: "
        f"Python {meta['python']}, litellm {meta['litellm']}, anyio {meta['anyio']}, "
        f"trio {meta['trio']}, {meta['cpus']} CPUs"
    )
    add(f"gc: {GC_NOTE}")
    add(f"load average (1 min) at start {meta['load_start']}, at end {meta['load_end']}")
    add("")
    lines.extend(_render_policy_rows(policies))

    for number, llm in enumerate(llms):
        lines.extend(_render_llm_rows(llm, f"2{'ab'[number]}"))
    add(f"3. import latencykit in fresh interpreters ({imports.runs} runs each, interleaved)")
    cumulative = imports.importtime_cumulative_ms
    uncached = imports.importtime_uncached_cumulative_ms
    add(
        f"   -X importtime, cumulative for latencykit, median: {cumulative.median:.1f} ms with "
        f"bytecode cached (p99 {cumulative.p99:.1f}); {uncached.median:.1f} ms compiling "
        f"latencykit's sources (p99 {uncached.p99:.1f})"
    )
    add(
        f"   wall, median, cached: python -c pass {imports.wall_pass_ms.median:.1f} ms; "
        f"python -c 'import latencykit' {imports.wall_import_ms.median:.1f} ms; "
        f"difference {imports.wall_difference_ms:+.1f} ms"
    )
    add(f"   litellm imported: {imports.litellm_imported}")
    third = ", ".join(f"{name} {ms:.1f}" for name, ms in imports.third_party_ms.items())
    add(f"   third-party packages imported (cumulative ms): {third or 'none'}")
    std = ", ".join(f"{name} {ms:.1f}" for name, ms in imports.heaviest_stdlib_ms.items())
    add(f"   heaviest stdlib modules (cumulative ms): {std}")
    add("")

    add("Targets")
    for check in checks:
        value = check["value"]
        shown = f"{value} {check['unit']}".strip()
        ci = check["ci95"]
        if ci is not None:
            digits = 3 if check["name"].startswith("lk.LLM full stack") else 1  # a fraction
            shown += f" (95% CI {ci[0]:.{digits}f} to {ci[1]:.{digits}f})"
        ok = verdict(bool(check["pass"]))
        add(f"   {ok}  {check['name']}: {shown}; target {check['target']}")
    return "\n".join(line.rstrip() for line in lines)


def _load() -> float | None:
    """The 1-minute load average (how busy the machine was), where the OS reports one."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small run (< 30 s), for smoke tests")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write results as JSON")
    parser.add_argument("--seed", type=int, default=20261122, help="shuffle seed")
    parser.add_argument(
        "--policies-only",
        action="store_true",
        help="only part 1 (policy overhead on a no-op coroutine), printed without targets",
    )
    parser.add_argument(
        "--llm-only",
        action="store_true",
        help="only part 2a (lk.LLM vs bare litellm and the Router, mock_response)",
    )
    parser.add_argument(
        "--llm-baseline",
        metavar="DIR",
        type=Path,
        help="a source directory with another latencykit package, measured side by side (part 2)",
    )
    parser.add_argument(
        "--hedge-baseline",
        metavar="PATH",
        type=Path,
        help="another hedge.py to measure side by side with the current one (part 1)",
    )
    args = parser.parse_args(argv)
    global BASELINE_HEDGE, BASELINE_LLM
    BASELINE_HEDGE = args.hedge_baseline
    BASELINE_LLM = args.llm_baseline
    settings = QUICK if args.quick else FULL

    started = time.perf_counter()
    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "mode": "quick" if args.quick else "full",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "latencykit": lk.__version__,
        "litellm": _version("litellm"),
        "anyio": _version("anyio"),
        "trio": _version("trio"),
        "settings": asdict(settings),
        "gc": GC_NOTE,
        "load_start": _load(),
    }
    sections: dict[str, float] = {}

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:5.1f} s] {message}", file=sys.stderr, flush=True)

    if args.llm_only:
        progress("lk.LLM vs litellm ...")
        llm = bench_llm(settings, args.seed)
        meta["load_end"] = _load()
        print(render_llm(meta, llm))
        return 0
    policies: list[PolicyResult] = []
    for backend in ("asyncio", "trio"):
        progress(f"policy overhead on {backend} ...")
        begin = time.perf_counter()
        policies.append(bench_policies(backend, settings, args.seed))
        sections[f"policies_{backend}"] = round(time.perf_counter() - begin, 1)
    if args.policies_only:
        meta["load_end"] = _load()
        print(render_policies(meta, policies))
        return 0
    # Before litellm is imported into this process (the subprocesses never import it).
    progress("import time ...")
    begin = time.perf_counter()
    imports = bench_import(settings, args.seed)
    sections["import"] = round(time.perf_counter() - begin, 1)
    progress("lk.LLM vs litellm ...")
    begin = time.perf_counter()
    llms = [bench_llm(settings, args.seed)]
    sections["llm_mock"] = round(time.perf_counter() - begin, 1)
    progress("lk.LLM vs litellm over loopback HTTP ...")
    begin = time.perf_counter()
    llms.append(bench_llm(settings, args.seed, http=True))
    sections["llm_http"] = round(time.perf_counter() - begin, 1)
    meta["section_seconds"] = sections
    meta["load_end"] = _load()
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    checks = targets(policies, llms, imports)

    print(render(meta, policies, llms, imports, checks))
    timing = ", ".join(f"{name} {seconds} s" for name, seconds in sections.items())
    print(f"\n(took {meta['elapsed_s']} s: {timing})")
    if args.json is not None:
        payload = {
            "meta": meta,
            "policy_overhead": [asdict(result) for result in policies],
            "llm_vs_litellm": [asdict(llm) for llm in llms],
            "import": asdict(imports),
            "targets": checks,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
