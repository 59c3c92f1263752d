"""The first hang after a light tail (issue 23, section 8), through ``lk.LLM`` and the fake
provider.

30 calls of 45-73 ms warm the hedge's window (a light tail: no call took longer than the p90
plus the fastest call), then one call whose primary answers only after 4 s. Timed under
``lk.Hedge(lk.quantile(0.9))`` and, for comparison, ``lk.Hedge(0.2)``, on asyncio and trio::

    .venv/bin/python benchmarks/first_hang.py      # a few seconds
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

import latencykit as lk
from latencykit.policies.hedge import Quantile
from latencykit.testing import Behavior, FakeProvider, Latency

MESSAGES = [{"role": "user", "content": "hi"}]
FAST = Behavior(ttft=Latency.uniform(0.045, 0.073))


async def first_hang(fake: FakeProvider, delay: float | Quantile) -> str:
    fake.script("m", FAST)
    llm = lk.LLM("openai/m", api_base=fake.base_url, api_key="sk-bench", hedge=lk.Hedge(delay))
    for _ in range(30):
        await llm.acompletion(messages=MESSAGES)
    fake.script("m", [Behavior(ttft=4.0), FAST])
    started = time.monotonic()
    report = lk.report(await llm.acompletion(messages=MESSAGES))
    took = time.monotonic() - started
    return f"{took:.3f} s: {report}"


async def main() -> None:
    with FakeProvider() as fake:
        # litellm's first call in a process is slow (imports, clients): keep it out of the runs.
        warm = lk.LLM("openai/warm-up", api_base=fake.base_url, api_key="sk-bench")
        await warm.acompletion(messages=MESSAGES)
        for name, delay in (("quantile(0.9)", lk.quantile(0.9)), ("0.2", 0.2)):
            print(f"  Hedge({name}): {await first_hang(fake, delay)}")


if __name__ == "__main__":
    for backend in ("asyncio", "trio"):
        print(f"{backend}:")
        anyio.run(main, backend=backend)
