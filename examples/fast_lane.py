"""latencykit's fast lane for OpenAI-compatible providers: the same calls, without litellm's
per-chunk CPU cost; offline.

Runs against the fake OpenAI-compatible provider from ``latencykit.testing`` on 127.0.0.1 (no API
key, no network). Point ``api_base``/``api_key`` at a vLLM, Ollama, Groq, ... endpoint to use it
for real.

    python examples/fast_lane.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "Name three causes of tail latency."}]


async def main(base_url: str) -> None:
    key = "not-a-real-key"
    # The primary is down; its failover target is on the fast lane (an OpenAI-compatible
    # server): every policy works the same whichever lane a target takes.
    llm = lk.LLM(
        "openai/primary-model",
        api_base=base_url,
        api_key=key,
        transport="openai",
        deadline=10.0,
        failover=[
            {
                "model": "openai/backup-model",
                "api_base": base_url,
                "api_key": key,
                "transport": "openai",
            }
        ],
    )
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    report = lk.report(stream)
    print(f"{text!r} from {report.target} in {report.chunks} chunks")
    print("attempts:", [(a.target, a.error_type or a.outcome) for a in report.attempts])
    response = await llm.acompletion(messages=MESSAGES)
    # The fast lane answers with latencykit.chunks.Response, which reads like litellm's
    # ModelResponse without building one (latencykit.llm.to_model_response converts it).
    print(type(response).__name__, response.choices[0].message.content)


if __name__ == "__main__":
    with FakeProvider() as provider:
        provider.script("primary-model", Behavior(fault=Fault.HTTP_503))
        provider.script("backup-model", Behavior(text="Queueing, long outputs, stalls."))
        anyio.run(main, provider.base_url)
