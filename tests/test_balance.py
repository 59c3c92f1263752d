"""Load spread over equivalent targets (``LLM(router=Balanced([...]))``): power of two choices
over a peak-EWMA cost, on a fake clock; then through real litellm to the fake provider."""

from __future__ import annotations

import math
import random
from typing import Any

import anyio
import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, make_llm, target
from latencykit.pipeline import Call
from latencykit.routing import Balanced
from latencykit.target import Target
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def balanced(*members: str, **options: Any) -> tuple[Balanced, FakeClock]:
    clock = FakeClock()
    return Balanced(members, rng=random.Random(7), clock=clock, **options), clock


# --- the cost and the pick, on a fake clock ------------------------------------------------------


def test_power_of_two_choices_takes_the_cheaper_of_two() -> None:
    pool, _ = balanced("a", "b", "c")
    pool.observe("a", 0.1)
    pool.observe("b", 0.2)
    pool.observe("c", 0.9)
    picked = [pool.pick()[0].target for _ in range(300)]
    assert "c" not in picked  # it loses every pair it is drawn in
    assert picked.count("a") > picked.count("b") > 0  # "b" wins only the pairs without "a"
    decision, order = pool.pick()
    assert order == [decision.target, *sorted({"a", "b", "c"} - {decision.target})]
    assert decision.reason.startswith("balanced: ")


async def test_outstanding_attempts_multiply_the_cost() -> None:
    pool, _ = balanced("a", "b")
    pool.observe("a", 0.1)
    pool.observe("b", 0.25)
    release = anyio.Event()

    async def held(call: Call) -> None:
        await release.wait()

    async with anyio.create_task_group() as group:
        for _ in range(2):
            group.start_soon(pool.handle, _call("a"), held)
        await anyio.wait_all_tasks_blocked()
        assert pool.outstanding("a") == 2  # three times as busy: 0.3 > 0.25
        assert pool.costs() == {"a": pytest.approx(0.3), "b": pytest.approx(0.25)}
        assert pool.pick()[0].target == "b"
        release.set()
    assert pool.outstanding("a") == 0


def test_a_new_member_costs_the_mean_of_the_others() -> None:
    pool, _ = balanced("a", "b", "new")
    assert pool.costs() == {"a": 1.0, "b": 1.0, "new": 1.0}  # nobody sampled: load decides
    pool.observe("a", 0.1)
    pool.observe("b", 0.3)
    assert pool.latency("new") is None
    assert pool.costs()["new"] == pytest.approx(0.2)


def test_peak_ewma_jumps_to_a_slow_sample_and_decays() -> None:
    pool, clock = balanced("a", "b", decay=10.0)
    pool.observe("a", 0.1)
    clock.now = 1.0
    pool.observe("a", 2.0)  # slower than the estimate: taken at once
    assert pool.latency("a") == 2.0
    clock.now = 6.0
    pool.observe("a", 0.1)  # faster: averaged in with weight 1 - e^(-5/10)
    weight = math.exp(-0.5)
    assert pool.latency("a") == pytest.approx(2.0 * weight + 0.1 * (1 - weight))
    estimate = pool.latency("a")
    assert estimate is not None
    clock.now = 16.0  # ten seconds without a sample: it fades by e^-1
    assert pool.latency("a") == pytest.approx(estimate * math.exp(-1.0))


def test_members_with_an_open_breaker_are_not_picked() -> None:
    pool, _ = balanced("a", "b", "c")
    pool.observe("a", 0.01)  # the cheapest, but open
    picked = {pool.pick(lambda m: m == "a")[0].target for _ in range(100)}
    assert picked == {"b", "c"}
    decision, order = pool.pick(lambda m: m != "c")
    assert decision.target == "c" and "not open" in decision.reason
    assert order[0] == "c"
    # all open: picked among all (failover then skips them and says so)
    assert pool.pick(lambda m: True)[0].target in {"a", "b", "c"}


def _call(member: str) -> Call:
    return Call(lambda: None, target=Target(name=member))


async def test_outstanding_is_released_on_success_error_and_cancel() -> None:
    pool, clock = balanced("a", "b", error_penalty=5.0)
    seen: list[int] = []

    async def answer(call: Call) -> str:
        seen.append(pool.outstanding("a"))
        clock.now += 0.2
        return "ok"

    assert await pool.handle(_call("a"), answer) == "ok"
    assert seen == [1] and pool.outstanding("a") == 0
    assert pool.latency("a") == pytest.approx(0.2)

    async def fail(call: Call) -> None:
        clock.now += 0.01
        raise ConnectionError("reset by peer")  # transient: a sample of the penalty

    with pytest.raises(ConnectionError):
        await pool.handle(_call("a"), fail)
    assert pool.outstanding("a") == 0
    assert pool.latency("a") == 5.0

    async def bad_request(call: Call) -> None:
        raise ValueError("not the member's fault")  # not transient: no sample

    with pytest.raises(ValueError, match="fault"):
        await pool.handle(_call("b"), bad_request)
    assert pool.outstanding("b") == 0 and pool.latency("b") is None

    async def hang(call: Call) -> None:
        clock.now += 3.0
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await pool.handle(_call("b"), hang)
    assert pool.outstanding("b") == 0
    assert pool.latency("b") == 3.0  # cancelled after 3 s: at least that slow

    async def hang_briefly(call: Call) -> None:
        clock.now += 1.0
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await pool.handle(_call("a"), hang_briefly)  # 1 s, under a's estimate: tells nothing
    assert pool.outstanding("a") == 0
    assert pool.latency("a") == pytest.approx(5.0 * math.exp(-(clock.now - 0.21) / 10.0))

    async def other(call: Call) -> str:
        return "elsewhere"

    assert await pool.handle(_call("not-a-member"), other) == "elsewhere"


def test_invalid_pools_fail_at_construction_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"Balanced\.members needs two or more"):
        Balanced(["a"])
    with pytest.raises(ValueError, match=r"Balanced\.members must be distinct"):
        Balanced(["a", "b", "a"])
    with pytest.raises(TypeError, match=r"Balanced\.members must be a list"):
        Balanced("ab")
    with pytest.raises(ValueError, match=r"Balanced\.members\[1\]"):
        Balanced(["a", ""])
    with pytest.raises(ValueError, match=r"Balanced\.decay"):
        Balanced(["a", "b"], decay=0)
    with pytest.raises(ValueError, match=r"Balanced\.error_penalty"):
        Balanced(["a", "b"], error_penalty=-1.0)
    with pytest.raises(TypeError, match=r"Balanced\.rng"):
        Balanced(["a", "b"], rng=7)  # type: ignore[arg-type]


# --- over HTTP: real litellm, the fake provider ---------------------------------------------------

EAST, WEST, OTHER = "openai/east", "openai/west", "openai/other"


def pooled(fake: FakeProvider, pool: Balanced, **options: Any) -> lk.LLM:
    """East and west in the pool; ``other`` is a failover target outside it, listed before
    west: failover inside the pool goes first all the same."""
    return make_llm(
        fake, "east", failover=[target(fake, "other"), target(fake, "west")], router=pool, **options
    )


def models(fake: FakeProvider) -> list[str]:
    return [a.model for a in fake.attempts]


async def test_an_unknown_member_fails_at_construction(fake: FakeProvider) -> None:
    with pytest.raises(ValueError, match=r"Balanced\.members\[1\] names 'openai/north'"):
        make_llm(fake, "east", failover=[target(fake, "west")], router=Balanced([EAST, NORTH]))


NORTH = "openai/north"


async def test_calls_move_to_the_fast_member(fake: FakeProvider) -> None:
    fake.script("west", Behavior(ttft=1.0))  # far slower than a loaded machine's hiccups
    pool = Balanced([EAST, WEST], rng=random.Random(1))
    llm = pooled(fake, pool)
    await llm.warm()  # litellm's first-call set-up is no member's latency
    for _ in range(20):
        await llm.acompletion(messages=MESSAGES)
    seen = models(fake)
    assert seen.count("east") >= 17, seen  # west is tried at most until its first sample
    assert "other" not in seen
    west = pool.latency(WEST)
    assert west is None or west >= 0.9


async def test_a_failing_member_fails_over_inside_the_pool_first(fake: FakeProvider) -> None:
    fake.script("east", Behavior(fault=Fault.HTTP_503))
    pool = Balanced([EAST, WEST], rng=random.Random(1))
    pool.observe(EAST, 0.001)  # east looks cheapest: it is picked first
    pool.observe(WEST, 1.0)
    llm = pooled(fake, pool)
    first = await llm.acompletion(messages=MESSAGES)
    assert models(fake) == ["east", "west"]  # not "other", though it comes first in failover
    report = lk.report(first)
    assert report.target == WEST and report.route is not None and report.route.target == EAST
    assert pool.latency(EAST) == pytest.approx(5.0, rel=0.01)  # the failure's penalty
    second = await llm.acompletion(messages=MESSAGES)  # east is avoided now
    assert models(fake) == ["east", "west", "west"]
    assert lk.report(second).attempts[0].target == WEST
    assert pool.outstanding(EAST) == pool.outstanding(WEST) == 0


async def test_a_member_whose_breaker_is_open_is_not_picked(fake: FakeProvider) -> None:
    pool = Balanced([EAST, WEST], rng=random.Random(1))
    pool.observe(EAST, 0.001)
    pool.observe(WEST, 1.0)
    llm = pooled(fake, pool, breaker={"minimum_calls": 5})
    lk.breaker(EAST, minimum_calls=5).isolate()  # the LLM's own: the registry's
    for _ in range(3):
        response = await llm.acompletion(messages=MESSAGES)
        route = lk.report(response).route
        assert route is not None and route.target == WEST, route
    assert models(fake) == ["west"] * 3


async def test_concurrent_calls_spread_by_outstanding_attempts(fake: FakeProvider) -> None:
    fake.default = Behavior(ttft=0.3)
    pool = Balanced([EAST, WEST], rng=random.Random(1))
    pool.observe(EAST, 0.1)
    pool.observe(WEST, 0.1)
    llm = pooled(fake, pool)
    answered: list[str] = []

    async def call() -> None:
        answered.append(lk.report(await llm.acompletion(messages=MESSAGES)).target)

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.fail_after(10):
            while pool.outstanding(EAST) + pool.outstanding(WEST) == 0:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        group.start_soon(call)  # the first is outstanding on its member: the other is cheaper
    assert sorted(answered) == [EAST, WEST]
    assert pool.outstanding(EAST) == pool.outstanding(WEST) == 0


async def test_a_stream_is_outstanding_until_it_ends(fake: FakeProvider) -> None:
    fake.default = Behavior(itl=0.01)
    pool = Balanced([EAST, WEST], rng=random.Random(1))
    llm = pooled(fake, pool)
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    member = stream.target
    assert pool.outstanding(member) == 1
    ttft = pool.latency(member)
    assert ttft is not None and ttft < 5.0  # sampled at its first chunk, before its end
    async for _ in stream:
        pass
    assert pool.outstanding(member) == 0
    opened = await llm.acompletion(messages=MESSAGES, stream=True)
    assert pool.outstanding(opened.target) == 1
    await opened.aclose()  # closed early
    assert pool.outstanding(EAST) == pool.outstanding(WEST) == 0


async def test_the_llm_keys_the_pool_by_target_name(fake: FakeProvider) -> None:
    # The same model in two regions: two targets named apart.
    pool = Balanced(["east", "west"], rng=random.Random(1))
    llm = lk.LLM(
        "openai/gpt",
        api_base=fake.base_url,
        api_key=KEY,
        failover=[
            {"model": "openai/gpt", "api_base": fake.base_url, "api_key": KEY, "name": "east"},
            {"model": "openai/gpt", "api_base": fake.base_url, "api_key": KEY, "name": "west"},
        ],
        router=pool,
    )
    response = await llm.acompletion(messages=MESSAGES)
    assert lk.report(response).target in {"east", "west"}
    assert pool.latency(lk.report(response).target) is not None
    assert "Balanced" in repr(llm.pipeline)


async def test_an_attempt_still_waiting_bounds_the_latency_from_below() -> None:
    pool, clock = balanced("a", "b")
    pool.observe("a", 0.1)
    pool.observe("b", 0.3)
    release = anyio.Event()

    async def slow(call: Call) -> str:
        await release.wait()
        return "late"

    async with anyio.create_task_group() as group:
        group.start_soon(pool.handle, _call("a"), slow)
        await anyio.wait_all_tasks_blocked()
        assert pool.costs()["a"] == pytest.approx(0.1 * 2)  # waiting 0 s: the estimate rules
        clock.now = 2.0  # a's attempt has waited 2 s: a costs at least 2 s x 2
        assert pool.costs()["a"] == pytest.approx(4.0)
        assert pool.pick()[0].target == "b"
        release.set()
    assert pool.outstanding("a") == 0
    assert pool.latency("a") == 2.0  # the slow answer, taken at once
