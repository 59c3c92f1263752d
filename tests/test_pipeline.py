from __future__ import annotations

import inspect
import typing

import anyio
import pytest

import latencykit as lk
from latencykit.pipeline import pipeline_of

pytestmark = pytest.mark.anyio


@lk.deadline(5)
@lk.fallback("cheap", after=1)
async def documented(question: str, *, temperature: float = 0.0) -> str:
    """Answer a question."""
    return f"{question}@{temperature}"


def test_decorated_functions_keep_name_docstring_and_signature() -> None:
    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Answer a question."
    signature = inspect.signature(documented)
    assert list(signature.parameters) == ["question", "temperature"]
    assert signature.parameters["temperature"].kind is inspect.Parameter.KEYWORD_ONLY
    assert signature.parameters["temperature"].default == 0.0
    hints = typing.get_type_hints(documented)
    assert hints == {"question": str, "temperature": float, "return": str}
    assert inspect.iscoroutinefunction(documented)


def test_stacked_decorators_merge_into_one_pipeline_in_stage_order() -> None:
    pipeline = pipeline_of(documented)
    assert pipeline is not None
    assert [type(p) for p in pipeline.policies] == [
        lk.policies.deadline.Deadline,
        lk.policies.fallback.Fallback,
    ]


def test_composition_order_is_fixed_whatever_the_decorator_order() -> None:
    @lk.fallback("cheap", after=1)
    @lk.deadline(5)
    async def reversed_order() -> str:
        return "x"

    pipeline = pipeline_of(reversed_order)
    assert pipeline is not None
    assert [p.stage for p in pipeline.policies] == [
        lk.pipeline.Stage.DEADLINE,
        lk.pipeline.Stage.FALLBACK,
    ]


async def test_decorated_function_runs() -> None:
    assert await documented("q", temperature=0.5) == "q@0.5"


def test_sync_functions_are_rejected_at_decoration() -> None:
    def sync() -> str:
        return "x"

    with pytest.raises(TypeError, match="async callables"):
        lk.deadline(1)(sync)  # type: ignore[arg-type]


def test_objects_that_are_not_policies_are_rejected() -> None:
    with pytest.raises(TypeError, match="not a latencykit policy"):
        lk.pipeline.compose(object())  # type: ignore[arg-type]


async def test_custom_policy_plugs_into_the_pipeline() -> None:
    class Tag:
        stage = lk.pipeline.Stage.RETRY

        def __init__(self) -> None:
            self.seen: list[str] = []

        async def handle(self, call: lk.pipeline.Call, next: lk.pipeline.Next) -> typing.Any:
            self.seen.append(call.target.key)
            return await next(call.with_kwargs(suffix="!"))

    tag = Tag()

    async def shout(word: str, suffix: str = "") -> str:
        return word.upper() + suffix

    pipeline = lk.pipeline.compose(tag, lk.deadline(5))
    assert [type(p) for p in pipeline.policies] == [lk.policies.deadline.Deadline, Tag]
    loud = pipeline(shout)
    assert await loud("hey") == "HEY!"
    assert tag.seen == [shout.__qualname__]


async def test_attempts_are_recorded_in_the_trace() -> None:
    async def flaky() -> str:
        raise ConnectionError("down")

    pipeline = lk.pipeline.compose(lk.fallback("ok"))
    result, trace = await pipeline.run_traced(
        lk.pipeline.Call(flaky, target=lk.Target(name="provider-a"))
    )
    assert result == "ok"
    [attempt] = trace.attempts
    assert attempt.number == 1 and attempt.target == "provider-a"
    assert attempt.outcome == "error" and attempt.error_kind is lk.ErrorKind.CONNECTION
    assert trace.degraded and trace.fallback_reason == "error"


async def test_event_handler_failures_are_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(event: lk.events.Event) -> None:
        raise RuntimeError("observer bug")

    with lk.subscribe(broken):
        assert await documented("q") == "q@0.0"
    assert "event handler" in caplog.text


async def test_unsubscribed_handlers_get_nothing() -> None:
    seen: list[lk.events.Event] = []
    subscription = lk.subscribe(seen.append)
    subscription.close()
    subscription.close()  # idempotent
    await documented("q")
    assert seen == []


async def test_call_and_attempt_events_pair_up() -> None:
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        await documented("q")
    kinds = [type(e).__name__ for e in seen]
    assert kinds == ["CallStarted", "AttemptStarted", "AttemptEnded", "CallEnded"]
    assert len({e.call_id for e in seen}) == 1
    started, attempt, ended, call = seen
    assert isinstance(started, lk.events.CallStarted) and isinstance(call, lk.events.CallEnded)
    assert started.target == call.target and started.parameters == {}
    assert started.endpoint.model == "" and not started.stream
    assert isinstance(attempt, lk.events.AttemptStarted) and attempt.reason == "primary"
    assert isinstance(ended, lk.events.AttemptEnded)
    assert call.timeline == (ended.record,) and call.outcome == "ok"


async def test_an_attempt_says_which_policy_made_it() -> None:
    calls = 0

    @lk.retry(max_attempts=2, initial=0, max_wait=0)
    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("down")
        return "ok"

    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        assert await flaky() == "ok"
    reasons = [e.reason for e in seen if isinstance(e, lk.events.AttemptStarted)]
    assert reasons == ["primary", "retry"]
    [ended] = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert [a.reason for a in ended.timeline] == ["primary", "retry"]


def test_subscribe_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="callable"):
        lk.subscribe(42)  # type: ignore[arg-type]


def test_all_is_complete_and_exact() -> None:
    public = {  # dir(): also the names that load on first use
        name
        for name in dir(lk)
        if not name.startswith("_") and not inspect.ismodule(getattr(lk, name))
    }
    assert set(lk.__all__) == public
    assert len(lk.__all__) == len(set(lk.__all__))


def test_every_public_name_has_a_docstring() -> None:
    for name in lk.__all__:
        value = getattr(lk, name)
        if isinstance(value, str) or typing.get_origin(value) is not None:
            continue  # type aliases document themselves in the module docs
        assert (getattr(value, "__doc__", None) or "").strip(), name


async def test_concurrent_calls_keep_separate_traces() -> None:
    @lk.fallback("x")
    async def work(delay: float) -> int:
        await anyio.sleep(delay)
        return lk.pipeline.current_attempt()

    async with anyio.create_task_group() as tg:
        for delay in (0.02, 0.01, 0.0):
            tg.start_soon(work, delay)
    assert await work(0) == 1


def test_a_targets_key_is_its_name_set_at_construction_not_an_argument() -> None:
    from latencykit.policies.failover import Route
    from latencykit.target import as_target

    target = lk.Target("openai/a")
    assert target.key == "openai/a"
    assert "key" not in repr(target)
    assert target.replace(name="b").key == "b"
    assert target.replace(model="openai/c").key == "openai/c"  # named after its model
    assert target == lk.Target("openai/a", name="openai/a")
    with pytest.raises(TypeError):
        lk.Target("openai/a", key="x")  # type: ignore[call-arg]
    # In a dict of litellm arguments, "key" stays a litellm argument, as before.
    assert dict(as_target({"model": "openai/a", "key": "v"}).arguments) == {"key": "v"}
    assert Route(target.replace(name="b")).name == "b"


def test_subscribers_follow_subscribe_and_close() -> None:
    before = lk.events.subscribers
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        assert lk.events.subscribers == (*before, seen.append)
        assert lk.events.listening()
    assert lk.events.subscribers == before
