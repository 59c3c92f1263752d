"""latencykit fan-out: several calls inside one budget, and the first good answer; offline.

Runs against the fake OpenAI-compatible provider from ``latencykit.testing`` on 127.0.0.1 (no API
key, no network). Point ``api_base``/``api_key`` at a real provider to use it for real.

    python examples/fanout.py
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no price-map download

import anyio

import latencykit as lk
from latencykit.fanout import GatherIncomplete, NoAcceptableResult
from latencykit.testing import Behavior, FakeProvider, Fault


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def content(response: object) -> str:
    return str(response.choices[0].message.content)  # type: ignore[attr-defined]


async def main(base_url: str) -> None:
    import litellm

    litellm.suppress_debug_info = True  # no help banner printed with every provider error

    def llm(model: str) -> lk.LLM:
        return lk.LLM(f"openai/{model}", api_base=base_url, api_key="not-a-real-key")

    # litellm's first request initialises its HTTP stack synchronously, blocking the event loop
    # for ~0.5 s (no deadline can preempt that): warm it up at start, as a server would.
    await llm("fast-model").acompletion(messages=ask("hi"))

    # 1. Three independent calls, 1 s for all of them inside a 3 s budget: the slow one is cut
    #    off (its HTTP request closed) and the rest of the budget is left for the final call.
    with lk.deadline(3.0):
        results = await lk.gather(
            llm("fast-model").acompletion(messages=ask("Summarise the ticket.")),
            llm("fast-model").acompletion(messages=ask("Extract keywords.")),
            llm("slow-model").acompletion(messages=ask("Find related tickets.")),
            within=1.0,
        )
        # One slot per call, in order: a value, or a marker saying why there is none.
        missing = {i: type(marker).__name__ for i, marker in results.missing.items()}
        print(f"gathered {len(results.values)} of 3, missing {missing}")
        notes = " / ".join(content(response) for response in results.values)
        final = await llm("fast-model").acompletion(messages=ask(f"Answer from: {notes}"))
        print(f"final answer: {content(final)[:9]!r}, {lk.remaining():.1f}s of budget left")

    # 2. All or nothing: a failure raises at once, with every result and what was missing.
    try:
        await lk.gather(
            llm("fast-model").acompletion(messages=ask("a")),
            llm("down-model").acompletion(messages=ask("b")),
            llm("slow-model").acompletion(messages=ask("c")),
            return_partial=False,
        )
    except GatherIncomplete as error:
        print(f"GatherIncomplete: {sorted(error.missing)} missing, caused by {error.__cause__!r}")

    # 3. The first acceptable answer wins; a source starts only 0.5 s after the previous one,
    #    or at once when an earlier one failed or gave an unacceptable answer.
    answer = await lk.first(
        llm("hasty-model").acompletion(messages=ask("Capital of France?")),
        llm("careful-model").acompletion(messages=ask("Capital of France?")),
        llm("fast-model").acompletion(messages=ask("Capital of France?")),
        accept=lambda response: "not sure" not in content(response),
        stagger=0.5,
    )
    print(f"first acceptable: {content(answer)!r} from {lk.report(answer).target}")

    # 4. Streams race to their first token; the loser's stream is closed.
    stream = await lk.first(
        llm("slow-model").acompletion(messages=ask("Stream it."), stream=True),
        llm("fast-model").acompletion(messages=ask("Stream it."), stream=True),
    )
    async with stream:
        chunks = [chunk async for chunk in stream]
    print(f"streamed {len(chunks)} chunks from {stream.target}")

    # 5. None acceptable: one typed error with every source's outcome.
    try:
        await lk.first(
            llm("down-model").acompletion(messages=ask("x")),
            llm("slow-model").acompletion(messages=ask("x")),
            within=0.5,
        )
    except NoAcceptableResult as error:
        print("NoAcceptableResult:", [type(outcome).__name__ for outcome in error.outcomes])


if __name__ == "__main__":
    with FakeProvider() as fake:
        fake.script("slow-model", Behavior(ttft=30.0))
        fake.script("down-model", Behavior(fault=Fault.HTTP_503, ttft=0.2))
        fake.script("hasty-model", Behavior(text="I am not sure."))
        fake.script("careful-model", Behavior(text="Paris.", ttft=0.1))
        anyio.run(main, fake.base_url)
