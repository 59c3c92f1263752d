"""Routing by job (LLM(router=...)) and output caps that respect the budget
(LLM(max_output_tokens=..., budget_aware=True)), through real litellm to the fake provider."""

from __future__ import annotations

import re
from typing import Any

import pytest

import latencykit as lk
from latencykit.errors import OutputTruncated
from latencykit.routing import RouteDecision, Router, RouteRequest, Rule
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "is this spam?"}]
SECRET = "sk-routing-secret-0123456789"


def target(fake: FakeProvider, model: str, **fields: Any) -> dict[str, Any]:
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": SECRET, **fields}


def routed_llm(fake: FakeProvider, router: Any, **options: Any) -> lk.LLM:
    """Three targets: a large general model, a small fast one, a long-context one."""
    return lk.LLM(
        "openai/large",
        api_base=fake.base_url,
        api_key=SECRET,
        context_window=2_000,
        failover=[
            target(fake, "small", context_window=2_000, capabilities={"json"}),
            target(fake, "long", context_window=200_000),
        ],
        router=router,
        **options,
    )


def models_seen(fake: FakeProvider) -> list[str]:
    return [a.model for a in fake.attempts]


async def test_a_task_rule_sends_classification_to_the_small_model(fake: FakeProvider) -> None:
    router = Router(Rule(to="openai/small", task="classify"), default="openai/large")
    llm = routed_llm(fake, router)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        small = await llm.acompletion(messages=MESSAGES, task="classify")
        large = await llm.acompletion(messages=MESSAGES, task="summarise")
    assert models_seen(fake) == ["small", "large"]
    assert lk.report(small).route == RouteDecision("openai/small", "rule 1: task=['classify']")
    assert lk.report(small).target == "openai/small"
    assert lk.report(large).route == RouteDecision("openai/large", "default")
    routed = [e for e in seen if isinstance(e, lk.events.Routed)]
    assert [(e.target, e.task) for e in routed] == [
        ("openai/small", "classify"),
        ("openai/large", "summarise"),
    ]


async def test_a_long_document_goes_to_the_long_context_model(fake: FakeProvider) -> None:
    router = Router(Rule(to="openai/small", max_prompt_tokens=500), default="openai/large")
    llm = routed_llm(fake, router)
    document = [{"role": "user", "content": "lorem ipsum dolor " * 1_500}]  # ~4,500 tokens
    response = await llm.acompletion(messages=document)
    # Neither the rule's small model nor the default fits the prompt: the long-context one does.
    assert models_seen(fake) == ["long"]
    assert lk.report(response).route == RouteDecision("openai/long", "default")
    await llm.acompletion(messages=MESSAGES)  # a short one: the rule
    assert models_seen(fake)[-1] == "small"


JSON = {"type": "json_object"}


async def test_a_request_in_json_mode_goes_to_a_target_that_supports_it(
    fake: FakeProvider,
) -> None:
    # (A tools request would do the same; litellm 1.106 cannot send tools without the `mcp`
    # package installed, so this test asks for JSON mode.)
    llm = routed_llm(fake, Router())
    response = await llm.acompletion(messages=MESSAGES, response_format=JSON)
    assert models_seen(fake) == ["small"]  # the one declaring "json"
    assert lk.report(response).route == RouteDecision("openai/small", "default")


async def test_when_the_budget_cannot_fit_the_large_models_p95_the_fast_one_answers(
    fake: FakeProvider,
) -> None:
    fake.script("large", Behavior(ttft=0.25))
    llm = routed_llm(fake, Router(default="openai/large", min_samples=5))
    for _ in range(5):  # the large model's recent latency: ~0.25 s
        await llm.acompletion(messages=MESSAGES)
    for _ in range(5):  # the small one's: fast
        await llm.acompletion(messages=MESSAGES, response_format=JSON)
    with lk.deadline(0.15):  # does not fit 0.25 s
        response = await llm.acompletion(messages=MESSAGES)
    decision = lk.report(response).route
    assert decision is not None and decision.target == "openai/small"
    # Its p95 of 5 samples is their slowest: about 0.25 s, more if the first call was slow.
    found = re.match(r"budget: openai/large p95 (\d+\.\d+)s > 0\.150s left", decision.reason)
    assert found is not None and 0.2 <= float(found[1]) < 2.0, decision.reason
    with lk.deadline(5.0):  # fits
        response = await llm.acompletion(messages=MESSAGES)
    assert lk.report(response).route == RouteDecision("openai/large", "default")


async def test_failover_goes_on_from_the_chosen_target_to_the_other_eligible_ones(
    fake: FakeProvider,
) -> None:
    fake.script("long", Behavior(fault=Fault.HTTP_503))
    llm = routed_llm(fake, lambda request: "openai/long")
    response = await llm.acompletion(messages=MESSAGES)
    assert models_seen(fake) == ["long", "large"]  # from the chosen one, then back to the first
    report = lk.report(response)
    assert report.route == RouteDecision("openai/long", "router")
    assert [a.target for a in report.attempts] == ["openai/long", "openai/large"]


async def test_a_router_function_sees_the_request(fake: FakeProvider) -> None:
    seen: list[RouteRequest] = []

    def router(request: RouteRequest) -> str:
        seen.append(request)
        return "openai/small" if request.prompt_tokens < 100 else "openai/large"

    llm = routed_llm(fake, router)
    with lk.deadline(10.0):
        await llm.acompletion(messages=MESSAGES, task="spam", response_format=JSON)
    [request] = seen
    assert request.task == "spam" and request.needs == {"json"}
    assert request.remaining is not None and 0 < request.remaining <= 10.0
    assert [t.key for t in request.targets] == ["openai/large", "openai/small", "openai/long"]
    assert models_seen(fake) == ["small"]

    llm = routed_llm(fake, lambda request: "openai/nowhere")
    with pytest.raises(ValueError, match="openai/nowhere"):
        await llm.acompletion(messages=MESSAGES)


async def test_bad_routing_options_fail_naming_the_field(fake: FakeProvider) -> None:
    with pytest.raises(ValueError, match=r"Router\.rules\[0\]\.to"):
        routed_llm(fake, Router(Rule(to="openai/missing")))
    with pytest.raises(ValueError, match=r"Router\.default"):
        routed_llm(fake, Router(default="openai/missing"))
    with pytest.raises(ValueError, match=r"Rule\.to"):
        Rule(to="")
    with pytest.raises(ValueError, match=r"Rule\.min_prompt_tokens"):
        Rule(to="x", min_prompt_tokens=-1)
    with pytest.raises(ValueError, match=r"Router\.quantile"):
        Router(quantile=1.5)
    with pytest.raises(ValueError, match=r"Router\.min_samples"):
        Router(min_samples=0)
    with pytest.raises(TypeError, match=r"Router\.rules\[0\] must be a latencykit\.routing\.Rule"):
        Router("openai/small")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Rule\.needs must be a set"):
        Rule(to="x", needs="json")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"LLM\.router"):
        routed_llm(fake, "openai/small")
    llm = lk.LLM("openai/x", api_base=fake.base_url, api_key=SECRET)
    with pytest.raises(ValueError, match=r"task=.*router"):
        await llm.acompletion(messages=MESSAGES, task="classify")


# --- output caps ------------------------------------------------------------------------------


def bodies(fake: FakeProvider, model: str, behavior: Behavior) -> list[dict[str, Any]]:
    """Script ``model`` with ``behavior``; the request bodies it receives, as they arrive."""
    received: list[dict[str, Any]] = []

    def script(request: RequestInfo) -> Behavior:
        received.append(dict(request.body))
        return behavior

    fake.script(model, script)
    return received


def capped_llm(fake: FakeProvider, model: str = "writer", **options: Any) -> lk.LLM:
    return lk.LLM(f"openai/{model}", api_base=fake.base_url, api_key=SECRET, **options)


async def test_an_answer_cut_at_the_cap_is_a_typed_outcome(fake: FakeProvider) -> None:
    received = bodies(fake, "writer", Behavior(output_tokens=16))
    llm = capped_llm(fake, max_output_tokens=5)
    with pytest.raises(OutputTruncated) as info:
        await llm.acompletion(messages=MESSAGES)
    error = info.value
    assert error.partial_text == "tok0 tok1 tok2 tok3 tok4"
    assert error.max_tokens == 5 and not error.budget_capped
    assert error.response.choices[0].finish_reason == "length"
    assert lk.report(error.response).truncated
    [request] = received
    assert request["max_tokens"] == 5

    llm = capped_llm(fake, max_output_tokens=5, on_truncated="accept")
    response = await llm.acompletion(messages=MESSAGES, max_tokens=3)  # the call's own is lower
    report = lk.report(response)
    assert report.truncated and report.max_tokens == 3
    assert received[-1]["max_tokens"] == 3
    response = await llm.acompletion(messages=MESSAGES, max_tokens=50)  # the cap is lower
    assert received[-1]["max_tokens"] == 5


async def test_an_answer_under_the_cap_is_not_truncated(fake: FakeProvider) -> None:
    received = bodies(fake, "writer", Behavior(output_tokens=4))
    llm = capped_llm(fake, max_output_tokens=8)
    response = await llm.acompletion(messages=MESSAGES)
    assert not lk.report(response).truncated
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        async for _ in stream:
            pass
    assert stream.finish_reason == "stop" and not lk.report(stream).truncated
    assert [body["max_tokens"] for body in received] == [8, 8]


async def test_a_truncated_stream_raises_after_its_last_chunk(fake: FakeProvider) -> None:
    fake.script("writer", Behavior(output_tokens=16))
    llm = capped_llm(fake, max_output_tokens=3)
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    read: list[str] = []

    async def drain() -> None:
        async with stream:
            async for chunk in stream:
                read.append(chunk.choices[0].delta.content or "")

    with pytest.raises(OutputTruncated) as info:
        await drain()
    assert "".join(read) == info.value.partial_text == "tok0 tok1 tok2"
    assert info.value.response is None
    assert stream.finish_reason == "length" and lk.report(stream).truncated
    assert [a.outcome for a in lk.report(stream).attempts] == ["ok"]  # a whole answer, capped

    accepting = capped_llm(fake, max_output_tokens=3, on_truncated="accept")
    stream = await accepting.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        async for _ in stream:
            pass
    assert stream.partial_text == "tok0 tok1 tok2" and lk.report(stream).truncated


@pytest.mark.slow
async def test_a_budget_aware_cap_fits_the_answer_in_the_time_left(fake: FakeProvider) -> None:
    # 60 tokens at 10 ms each: 0.6 s for the whole answer.
    fake.script("writer", Behavior(output_tokens=60, itl=0.01))
    llm = capped_llm(fake, max_output_tokens=1_000, budget_aware=True, on_truncated="accept")
    for _ in range(5):  # learn the target's time per output token (no deadline: no lowering)
        response = await llm.acompletion(messages=MESSAGES)
        assert lk.report(response).max_tokens == 1_000
    with lk.deadline(0.5):  # not enough for 60 tokens: the cap is lowered to fit
        response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.max_tokens is not None and 10 <= report.max_tokens < 50
    assert report.truncated
    # With "raise", the error says the cap was lowered for the budget.
    llm_raising = capped_llm(fake, max_output_tokens=1_000, budget_aware=True)
    for _ in range(5):
        await llm_raising.acompletion(messages=MESSAGES)
    with pytest.raises(OutputTruncated) as info, lk.deadline(0.5):
        await llm_raising.acompletion(messages=MESSAGES)
    assert info.value.budget_capped


async def test_bad_cap_options_fail_naming_the_field(fake: FakeProvider) -> None:
    with pytest.raises(ValueError, match=r"LLM\.max_output_tokens"):
        capped_llm(fake, max_output_tokens=0)
    with pytest.raises(ValueError, match=r"LLM\.budget_aware"):
        capped_llm(fake, budget_aware=True)
    with pytest.raises(ValueError, match=r"LLM\.on_truncated"):
        capped_llm(fake, max_output_tokens=5, on_truncated="continue")
