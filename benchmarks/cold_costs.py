"""Where ``lk.LLM``'s per-call time goes: in a hot loop, and in place after litellm's work.

Run it from the repository root (``PYTHONPATH`` picks the tree to measure)::

    PYTHONPATH=src .venv/bin/python benchmarks/cold_costs.py            # about a minute

1. **Hot loop, each policy left out**: ``lk.LLM`` with litellm's ``acompletion`` replaced by a
   coroutine that returns a canned answer (nothing of litellm's runs), calls back to back: us
   per call for a plain ``LLM``, the full stack of ``overhead.py`` (deadline, degrade, hedge
   armed, breaker, failover, retry) and the full stack without each policy in turn; the
   difference is what the policy adds to the full stack. Best of 7 rounds of 2,000 calls.
2. **A function's time, hot and in place**: latencykit's bookkeeping functions timed by a
   wrapper (``perf_counter_ns`` around each call, the wrapper's own ~0.1-0.3 us included),
   in the hot loop of 1 and around real ``mock_response`` calls (each after about a
   millisecond of litellm's Python, which leaves the caches cold: what ``overhead.py``
   measures). Medians over 1,200 calls after 300 warm-up ones.

Neither part compares with litellm or the Router (``overhead.py`` does): they say where the
time of one tree goes, for choosing what to cut.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import litellm

import latencykit as lk
from latencykit import _cancel, pipeline, stats
from latencykit import llm as llm_module
from latencykit.policies import breaker

MODEL = "openai/gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hi"}]
FULL: dict[str, Any] = {
    "deadline": 30,
    "degrade": None,  # made per LLM (a Degrade belongs to one)
    "hedge": 10.0,  # armed on every call: 10 s < the deadline
    "breaker": {},
    "failover": [{"model": "openai/gpt-4o"}],
    "retry": None,
}


def _llm(**options: Any) -> lk.LLM:
    made = dict(options)
    if "degrade" in made:
        made["degrade"] = lk.Degrade(model=MODEL, max_tokens=16, after=20)
    if "hedge" in made:
        made["hedge"] = lk.Hedge(made["hedge"])
    if "retry" in made:
        made["retry"] = lk.Retry()
    return lk.LLM(MODEL, **made)


def _variants() -> dict[str, lk.LLM]:
    variants = {"plain": _llm(), "full stack": _llm(**FULL)}
    for name in FULL:
        options = {key: value for key, value in FULL.items() if key != name}
        variants[f"  without {name}"] = _llm(**options)
    return variants


async def _canned(**_: Any) -> Any:
    return _CANNED


_CANNED: Any = None


async def hot_loop() -> None:
    global _CANNED
    variants = _variants()
    for llm in variants.values():
        await llm.acompletion(messages=MESSAGES, mock_response="hi")
    _CANNED = await litellm.acompletion(model=MODEL, messages=MESSAGES, mock_response="hi")
    real, litellm.acompletion = litellm.acompletion, _canned
    best: dict[str, float] = {}
    gc.disable()
    try:
        for _ in range(7):
            for name, llm in variants.items():
                started = time.perf_counter()
                for _ in range(2000):
                    await llm.acompletion(messages=MESSAGES, mock_response="hi")
                took = (time.perf_counter() - started) / 2000 * 1e6
                best[name] = min(best.get(name, took), took)
    finally:
        gc.enable()
        litellm.acompletion = real
    full = best["full stack"]
    print("1. hot loop (litellm's call replaced by a canned answer), us per call, best of 7")
    for name, took in best.items():
        adds = f"   adds {full - took:5.1f} to the full stack" if "without" in name else ""
        print(f"   {name:<22} {took:6.1f}{adds}")


TIMED: list[tuple[Any, str, str]] = [
    (pipeline, "_record", "recording the attempt (pipeline._record)"),
    (stats.LatencyWindow, "_add", "  a latency window's add"),
    (breaker.Breaker, "record", "the breaker's record"),
    (llm_module.LLM, "_predicted", "degrade's prediction (LLM._predicted)"),
    (_cancel.Expiry, "__enter__", "a cancel scope's enter (Expiry)"),
    (_cancel.Expiry, "__exit__", "a cancel scope's exit"),
]


def _wrapped(found: Callable[..., Any], times: list[int]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        result = found(*args, **kwargs)
        times.append(time.perf_counter_ns() - started)
        return result

    return timed


async def in_place(hot: bool) -> dict[str, tuple[float, float]]:
    """Per timed function: its calls per ``acompletion`` and median us."""
    times: dict[str, list[int]] = collections.defaultdict(list)
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in TIMED]
    for (owner, name, found), (_, _, label) in zip(originals, TIMED, strict=True):
        setattr(owner, name, _wrapped(found, times[label]))
    real = litellm.acompletion
    try:
        stack = _llm(**FULL)
        await stack.acompletion(messages=MESSAGES, mock_response="hi")
        if hot:
            global _CANNED
            _CANNED = await real(model=MODEL, messages=MESSAGES, mock_response="hi")
            litellm.acompletion = _canned
        gc.disable()
        for number in range(1500):
            if number == 300:
                for kept in times.values():
                    kept.clear()
            await stack.acompletion(messages=MESSAGES, mock_response="hi")
            for _ in range(0 if hot else 5):  # litellm's logging tasks run here, untimed
                await asyncio.sleep(0)
    finally:
        gc.enable()
        litellm.acompletion = real
        for owner, name, found in originals:
            setattr(owner, name, found)
    return {
        label: (len(kept) / 1200, statistics.median(kept) / 1e3)
        for label, kept in times.items()
        if kept
    }


async def main() -> None:
    litellm.suppress_debug_info = True
    print(f"latencykit from {os.path.dirname(lk.__file__)}; Python {sys.version.split()[0]}")
    await hot_loop()
    hot = await in_place(hot=True)
    cold = await in_place(hot=False)
    print("\n2. the full stack's bookkeeping: calls per acompletion, median us (wrapper included)")
    print(f"   {'function':<42} {'per call':>8} {'hot':>7} {'in place':>9}")
    for label, (count, hot_us) in hot.items():
        print(f"   {label:<42} {count:8.1f} {hot_us:7.2f} {cold[label][1]:9.2f}")


if __name__ == "__main__":
    asyncio.run(main())
