"""latencykit quickstart: bound the tail of an LLM call, offline.

Runs against the fake OpenAI-compatible provider from ``latencykit.testing`` on 127.0.0.1 (no API
key, no network). Point ``api_base``/``api_key`` at a real provider to use it for real.

    python examples/quickstart.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider

MESSAGES = [{"role": "user", "content": "Name three causes of tail latency."}]


async def main(base_url: str) -> None:
    # 1. A resilient litellm front: 2 s total, and after 0.5 s answer from a cheaper model.
    llm = lk.LLM(
        "openai/big-model",
        api_base=base_url,
        api_key="not-a-real-key",
        deadline=2.0,
        degrade=lk.Degrade(model="openai/small-model", max_tokens=64, after=0.5),
    )
    # litellm's first request initialises its HTTP stack synchronously, blocking the event loop
    # for ~0.5 s (no deadline can preempt that): warm it up at start, as a server would.
    await llm.acompletion(model="openai/small-model", messages=MESSAGES)

    response = await llm.acompletion(messages=MESSAGES)
    print(lk.report(response))  # who answered, after how many attempts, how, how long

    # 2. The same policies on any async function, as decorators.
    async def canned(reason: lk.policies.fallback.FallbackReason, question: str) -> str:
        return f"(cached answer; primary {reason.kind} after {reason.elapsed:.2f}s)"

    @lk.deadline(1.0)
    @lk.fallback(canned, after=0.2)
    async def ask(question: str) -> str:
        await anyio.sleep(5)  # a stuck dependency
        return "fresh answer"

    slow_cases: list[lk.events.FallbackUsed] = []
    with lk.subscribe(
        lambda e: slow_cases.append(e) if isinstance(e, lk.events.FallbackUsed) else None
    ):
        print(await ask("why is p99 so bad?"))
    print(f"slow-case log: {[(e.reason, round(e.elapsed, 2)) for e in slow_cases]}")

    # 3. A deadline as a block; the error is typed and carries the attempt history.
    stuck = lk.LLM("openai/stuck", api_base=base_url, api_key="not-a-real-key")
    try:
        with lk.deadline(0.3):
            await stuck.acompletion(messages=MESSAGES)
    except lk.DeadlineExceeded as exc:
        print(f"{type(exc).__name__}: budget {exc.budget}s, attempts: {len(exc.attempts)}")


if __name__ == "__main__":
    with FakeProvider() as fake:
        fake.script("big-model", Behavior(ttft=3.0))  # the primary is having a bad day
        fake.script("small-model", Behavior(ttft=0.05, output_tokens=8))
        fake.script("stuck", Behavior(ttft=30.0))
        anyio.run(main, fake.base_url)
