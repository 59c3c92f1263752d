"""Python calls per ``lk.LLM.acompletion`` that latencykit makes, per policy stack.

Run it from the repository root (``PYTHONPATH`` picks the tree to count)::

    PYTHONPATH=src .venv/bin/python benchmarks/call_count.py
    PYTHONPATH=src .venv/bin/python benchmarks/call_count.py full --show 40

Method: ``mock_response`` calls (no network) under ``cProfile``, 400 per variant after 50
warm-up calls, the loop turning three times after each (litellm's logging tasks run there). A
function's calls count as latencykit's in the share its callers' do: all of a latencykit
function's, and of anything else's, the fraction made from latencykit's (directly or through
other counted functions); litellm's, the OpenAI SDK's, pydantic's and httpx's own functions
count for nothing (bare litellm's work). Reported per call: Python-level calls (a coroutine
resumed after it suspended counts again, as cProfile counts it) and builtin (C) calls. Counts
are deterministic to about one call; times are not measured here (``overhead.py`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
from collections.abc import Callable, Sequence
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import latencykit as lk

MODEL = "openai/gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "hi"}]
CALLS = 400
NOT_OURS = ("/litellm/", "/openai/", "/pydantic/", "/pydantic_core/", "/httpx/", "/tiktoken/")


def _degrade() -> lk.Degrade:
    return lk.Degrade(model=MODEL, max_tokens=16, after=20)


VARIANTS: dict[str, Callable[[], lk.LLM]] = {
    "plain": lambda: lk.LLM(MODEL),
    "deadline+degrade": lambda: lk.LLM(MODEL, deadline=30, degrade=_degrade()),
    "hedge": lambda: lk.LLM(MODEL, hedge=lk.Hedge(30)),
    "deadline+failover": lambda: lk.LLM(MODEL, deadline=30, failover=["openai/gpt-4o"]),
    "full": lambda: lk.LLM(
        MODEL,
        deadline=30,
        degrade=_degrade(),
        hedge=lk.Hedge(10),
        breaker={},
        failover=["openai/gpt-4o"],
        retry=lk.Retry(),
    ),
}
"""The stacks of ``overhead.py``'s part 2 (``full``: its full stack, hedge armed)."""

Key = tuple[str, int, str]


def attributed(stats: dict[Key, Any]) -> dict[Key, float]:
    """Each function's calls that latencykit made, directly or through others (see module)."""
    share = {key: 1.0 if "/latencykit/" in key[0] else 0.0 for key in stats}
    for _ in range(30):  # call chains are shallow: this settles long before
        for key, (_, calls, _, _, callers) in stats.items():
            if "/latencykit/" in key[0] or calls == 0 or any(p in key[0] for p in NOT_OURS):
                continue
            made = sum(edge[1] * share.get(caller, 0.0) for caller, edge in callers.items())
            share[key] = min(1.0, made / calls)
    return {key: stats[key][1] * share[key] for key in stats if share[key] > 0}


async def count(name: str, show: int) -> tuple[float, float]:
    """``(python, builtin)`` calls per call of variant ``name``; prints the top ``show``."""
    llm = VARIANTS[name]()
    for _ in range(50):
        await llm.acompletion(messages=MESSAGES, mock_response="hi")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        await llm.acompletion(messages=MESSAGES, mock_response="hi")
        for _ in range(3):
            await asyncio.sleep(0)
    profile.disable()
    ours = attributed(pstats.Stats(profile).stats)  # type: ignore[attr-defined]
    python = sum(n for key, n in ours.items() if key[0] != "~") / CALLS
    builtin = sum(n for key, n in ours.items() if key[0] == "~") / CALLS
    for key, n in sorted(ours.items(), key=lambda item: -item[1])[:show]:
        print(f"    {n / CALLS:6.1f}  {key[0].rsplit('/', 1)[-1]}:{key[2]}")
    return python, builtin


async def main(names: Sequence[str], show: int) -> None:
    print(f"latencykit from {os.path.dirname(lk.__file__)}; calls per acompletion ({CALLS})")
    for name in names:
        python, builtin = await count(name, show)
        print(f"{name:<18} python {python:6.1f}  builtin {builtin:6.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("variants", nargs="*", help=f"some of {', '.join(VARIANTS)} (all)")
    parser.add_argument("--show", type=int, default=0, help="list the N most-called functions")
    arguments = parser.parse_args()
    unknown = set(arguments.variants) - VARIANTS.keys()
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    asyncio.run(main(arguments.variants or list(VARIANTS), arguments.show))
    sys.exit(0)
