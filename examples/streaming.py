"""latencykit streaming: first-token failover, a stall caught, every stream closed; offline.

Runs against the fake OpenAI-compatible provider from ``latencykit.testing`` on 127.0.0.1 (no API
key, no network). Point ``api_base``/``api_key`` at a real provider to use it for real.

    python examples/streaming.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "Name three causes of tail latency."}]
ANSWER = "Queueing at the provider, long outputs, and stalled streams."


async def main(base_url: str) -> None:
    key = "not-a-real-key"
    # litellm's first request initialises its HTTP stack (about 0.5 s, blocking the event loop):
    # make it at start-up, not inside a call whose first token is timed.
    warm_up = lk.LLM("openai/backup-model", api_base=base_url, api_key=key)
    await warm_up.acompletion(messages=MESSAGES)
    # The primary sends keep-alives but no token for a long time; the guard gives it 0.5 s to
    # produce its first content chunk, then the call fails over to the backup.
    llm = lk.LLM(
        "openai/busy-model",
        api_base=base_url,
        api_key=key,
        failover=[{"model": "openai/backup-model", "api_base": base_url, "api_key": key}],
        deadline=10.0,
        stream_guard=lk.StreamGuard(first_token=0.5, stall=1.0),
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    report = lk.report(stream)
    print(f"{text!r} from {report.target}, first token after {report.ttft:.1f}s")
    print("attempts:", [(a.target, a.error_type or a.outcome) for a in report.attempts])

    # A stream that stalls mid-answer is never passed off as complete.
    stalling = lk.LLM(
        "openai/stalling-model",
        api_base=base_url,
        api_key=key,
        stream_guard=lk.StreamGuard(stall=0.3),
    )
    stream = await stalling.acompletion(messages=MESSAGES, stream=True)
    try:
        async with stream:
            async for _ in stream:
                pass
    except lk.StreamStalled as broken:
        print(f"StreamStalled after {broken.chunks} chunks: {broken.partial_text!r}")


if __name__ == "__main__":
    with FakeProvider() as fake:
        fake.script(
            "busy-model",
            Behavior(fault=Fault.KEEPALIVE_THEN_TOKENS, ttft=30.0, keepalive_every=0.1),
        )
        fake.script("backup-model", Behavior(text=ANSWER))
        fake.script("stalling-model", Behavior(text=ANSWER, fault=Fault.STALL, stall_after=3))
        anyio.run(main, fake.base_url)
