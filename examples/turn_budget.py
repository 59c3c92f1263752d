"""A turn's latency budget, enforced in code: stages with budgets and the turn's ledger; offline.

The classic budget of a chat turn that must answer within 2.5 s at p95: the network to the
client and back (kept aside, not spent here), retrieval, building the prompt, the model to its
final token, and tools. Each part runs as a stage with its own budget, carved out of the turn's
deadline; what a stage does not use stays with the turn. When the model is slow, its stage
overruns, and the error names it and carries the ledger.

Runs against the fake OpenAI-compatible provider from ``latencykit.testing`` on 127.0.0.1 (no API
key, no network).

    python examples/turn_budget.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider

NETWORK = 0.2  # the client's round trip: not ours to spend
BUDGET = {"retrieval": 0.3, "prompt": 0.05, "model": 1.6, "tools": 0.35}  # 2.3 s + 0.2 s


async def retrieve(question: str) -> list[str]:
    await anyio.sleep(0.05)  # a vector search
    return ["Tail latency comes from queueing.", "Long outputs take long."]


async def lookup(topic: str) -> str:
    await anyio.sleep(0.02)  # a tool call
    return f"{topic}: see the runbook"


async def answer(llm: lk.LLM, question: str) -> str:
    """One turn: 2.5 s in all, each stage within its own share."""
    with lk.deadline(2.5 - NETWORK):
        async with lk.stage("retrieval", budget=BUDGET["retrieval"]):
            documents = await retrieve(question)
        with lk.stage("prompt", budget=BUDGET["prompt"]):
            context = "\n".join(documents)
            messages = [{"role": "user", "content": f"{context}\n\nQ: {question}"}]
        async with lk.stage("model", budget=BUDGET["model"]):
            response = await llm.acompletion(messages=messages)
        async with lk.stage("tools", budget=BUDGET["tools"]):
            note = await lookup("latency")
        ledger = lk.ledger()
    assert ledger is not None
    print(ledger)
    return f"{response.choices[0].message.content} ({note})"


async def main(base_url: str) -> None:
    key = "not-a-real-key"
    fast = lk.LLM("openai/fast-model", api_base=base_url, api_key=key)
    await fast.acompletion(messages=[{"role": "user", "content": "warm up"}])  # litellm's start
    print("answer:", await answer(fast, "Why is P99 so much worse than P50?"))

    slow = lk.LLM("openai/slow-model", api_base=base_url, api_key=key)
    try:
        await answer(slow, "And today?")
    except lk.DeadlineExceeded as error:
        spent = {record.name: record.outcome for record in error.ledger or ()}
        print(f"DeadlineExceeded in stage {error.stage!r}: {spent}")


if __name__ == "__main__":
    with FakeProvider() as provider:
        provider.script("fast-model", Behavior(ttft=0.1, text="Queues at the provider."))
        provider.script("slow-model", Behavior(ttft=5.0))
        anyio.run(main, provider.base_url)
