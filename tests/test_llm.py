"""lk.LLM through real litellm against the fake provider on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any

import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, make_llm, target
from latencykit._context import Outcome, priority_var
from latencykit.llm import CallReport
from latencykit.pipeline import AttemptReason
from latencykit.testing import Behavior, FakeProvider, Fault, RequestInfo

pytestmark = pytest.mark.anyio


async def test_plain_call_returns_litellm_response_with_report(fake: FakeProvider) -> None:
    llm = make_llm(fake)
    response = await llm.acompletion(messages=MESSAGES)
    assert type(response).__name__ == "ModelResponse"
    assert response.choices[0].message.content
    report = lk.report(response)
    assert report.target == "openai/primary"
    assert report.answering_attempt == 1
    assert not report.degraded and report.fallback_reason is None
    assert [a.outcome for a in report.attempts] == ["ok"]
    assert report.duration > 0
    [seen] = fake.attempts
    assert seen.model == "primary" and seen.completed


async def test_deadline_cancels_the_request_and_closes_its_connection(
    fake: FakeProvider,
) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    llm = make_llm(fake, "slow", deadline=0.3)
    with pytest.raises(lk.DeadlineExceeded) as info:
        await llm.acompletion(messages=MESSAGES)
    raised_at = time.monotonic()
    assert info.value.budget == pytest.approx(0.3)
    assert [a.outcome for a in info.value.attempts] == ["cancelled"]
    [attempt] = await fake.wait_for_async(lambda a: len(a) == 1 and a[0].disconnected, 2.0)
    assert attempt.disconnected_at is not None and attempt.ended_at is None
    # The connection is closed when the cancel lands, before the error even reaches us.
    assert attempt.disconnected_at - raised_at <= 0.05


async def test_degrade_after_timeout_answers_from_the_cheap_model(fake: FakeProvider) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("cheap", Behavior(output_tokens=3))
    llm = make_llm(
        fake,
        "slow",
        deadline=5.0,
        degrade=lk.Degrade(model="openai/cheap", max_tokens=16, after=0.2),
    )
    await llm.warm()  # litellm's first call of a model may take longer than `after` alone
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.degraded and report.fallback_reason == "timeout"
    assert report.target == "openai/cheap"
    assert report.answering_attempt == 2
    assert str(report).startswith("openai/cheap answered after 2 attempts (degraded: timeout), ")
    assert [(a.target, a.outcome) for a in report.attempts] == [
        ("openai/slow", "cancelled"),
        ("openai/cheap", "ok"),
    ]
    [used] = [e for e in seen if isinstance(e, lk.events.FallbackUsed)]
    assert used.reason == "timeout" and used.elapsed >= 0.2
    slow, cheap = await fake.wait_for_async(lambda a: len(a) == 2 and a[0].disconnected, 2.0)
    assert slow.model == "slow" and cheap.model == "cheap"
    assert cheap.request_headers is not None


async def test_degrade_before_the_deadline_when_the_primary_cannot_finish(
    fake: FakeProvider,
) -> None:
    fake.script("steady", Behavior(ttft=0.3))
    fake.script("cheap", Behavior(output_tokens=3))
    degrade = lk.Degrade(model="openai/cheap", max_tokens=16)
    llm = make_llm(fake, "steady", deadline=10.0, degrade=degrade)
    for _ in range(5):  # the primary's recent median duration: about 0.3 s
        await llm.acompletion(messages=MESSAGES)
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append), lk.deadline(0.2):  # less time left than that
        response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.fallback_reason == "predicted" and report.target == "openai/cheap"
    assert [a.target for a in report.attempts] == ["openai/cheap"]  # the primary not started
    assert [a.model for a in fake.attempts] == ["steady"] * 5 + ["cheap"]
    [used] = [e for e in seen if isinstance(e, lk.events.FallbackUsed)]
    assert used.reason == "predicted" and used.elapsed == 0.0
    with lk.deadline(5.0):  # time enough: the primary answers
        assert lk.report(await llm.acompletion(messages=MESSAGES)).target == "openai/steady"


async def test_degrade_after_a_provider_error(fake: FakeProvider) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    llm = make_llm(fake, "down", degrade=lk.Degrade(model="openai/cheap"))
    response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.degraded and report.fallback_reason == "error"
    assert [a.error_kind for a in report.attempts] == [lk.ErrorKind.SERVER_ERROR, None]
    assert report.model == "cheap"


async def test_degrade_rewrites_max_tokens_down_only(fake: FakeProvider) -> None:
    seen: list[tuple[object, object]] = []

    def first_fails(request: RequestInfo) -> Behavior:
        seen.append((request.body.get("max_tokens"), request.body.get("temperature")))
        return Behavior(fault=Fault.HTTP_500) if len(seen) % 2 else Behavior()

    fake.script("flaky", first_fails)
    llm = make_llm(fake, "flaky", degrade=lk.Degrade(max_tokens=8, overrides={"temperature": 0}))
    await llm.acompletion(messages=MESSAGES, max_tokens=100, temperature=1)
    await llm.acompletion(messages=MESSAGES, max_tokens=4)
    assert seen == [(100, 1), (8, 0), (4, None), (4, 0)]


async def test_non_transient_errors_skip_the_degraded_path(fake: FakeProvider) -> None:
    fake.script("strict", Behavior(fault=Fault.CONTENT_POLICY))
    llm = make_llm(fake, "strict", degrade=lk.Degrade(model="openai/cheap"))
    with pytest.raises(lk.ContentPolicyViolation) as info:
        await llm.acompletion(messages=MESSAGES)
    assert "flagged: violence" in info.value.provider_message
    assert len(info.value.attempts) == 1
    assert [a.model for a in fake.attempts] == ["strict"]


@pytest.mark.parametrize(
    ("behavior", "error_type", "kind"),
    [
        (Behavior(fault=Fault.HTTP_429, retry_after=2), lk.RateLimited, lk.ErrorKind.RATE_LIMITED),
        (Behavior(fault=Fault.HTTP_500), lk.ProviderUnavailable, lk.ErrorKind.SERVER_ERROR),
        (Behavior(fault=Fault.HTTP_503), lk.ProviderUnavailable, lk.ErrorKind.SERVER_ERROR),
        (
            Behavior(fault=Fault.RESET_BEFORE_HEADERS),
            lk.ProviderConnectionError,
            lk.ErrorKind.CONNECTION,
        ),
        (
            Behavior(fault=Fault.CONTEXT_LENGTH),
            lk.ContextLengthExceeded,
            lk.ErrorKind.CONTEXT_LENGTH,
        ),
        (
            Behavior(fault=Fault.CONTENT_POLICY),
            lk.ContentPolicyViolation,
            lk.ErrorKind.CONTENT_POLICY,
        ),
        (Behavior(fault=Fault.HANG), lk.AttemptTimeout, lk.ErrorKind.TIMEOUT),
    ],
)
async def test_provider_errors_are_typed_and_carry_the_history(
    fake: FakeProvider, behavior: Behavior, error_type: type[lk.ProviderError], kind: lk.ErrorKind
) -> None:
    fake.script("faulty", behavior)
    llm = make_llm(fake, "faulty", timeout=0.5)
    with pytest.raises(lk.ProviderError) as info:
        await llm.acompletion(messages=MESSAGES)
    error = info.value
    assert type(error) is error_type
    assert error.kind is kind and lk.errors.classify(error) is kind
    assert error.target == "openai/faulty"
    assert error.__cause__ is not None and type(error.__cause__).__module__.startswith("litellm")
    assert lk.errors.classify(error.__cause__) is kind  # the classifier knows litellm's own types
    [attempt] = error.attempts
    assert attempt.outcome == "error" and attempt.error_kind is kind
    assert KEY not in str(error) and KEY not in repr(error)
    if kind is lk.ErrorKind.RATE_LIMITED:
        assert error.retry_after == 2.0 and error.status_code == 429


async def test_connection_refused_is_a_connection_error() -> None:
    with FakeProvider() as closed:
        base_url = closed.base_url
    llm = lk.LLM("openai/gone", api_base=base_url, api_key=KEY)
    with pytest.raises(lk.ProviderConnectionError) as info:
        await llm.acompletion(messages=MESSAGES)
    assert info.value.kind is lk.ErrorKind.CONNECTION
    assert KEY not in str(info.value)


async def test_missing_credentials_are_not_a_provider_outage(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # litellm reports a missing API key as a 500; retrying or hedging it would be pointless.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    llm = lk.LLM("openai/primary", api_base=fake.base_url, degrade=lk.Degrade(model="openai/x"))
    with pytest.raises(lk.ProviderError) as info:
        await llm.acompletion(messages=MESSAGES)
    assert info.value.kind is lk.ErrorKind.UNKNOWN and not lk.errors.is_transient(info.value)
    assert "Missing credentials" in info.value.provider_message
    assert fake.attempts == []


async def test_context_window_from_the_prompt_size(fake: FakeProvider) -> None:
    fake.script("small", Behavior(context_window=8))
    llm = make_llm(fake, "small")
    with pytest.raises(lk.ContextLengthExceeded):
        await llm.acompletion(messages=[{"role": "user", "content": "word " * 200}])


async def test_api_key_stays_out_of_reprs_and_reports(fake: FakeProvider) -> None:
    llm = make_llm(fake)
    response = await llm.acompletion(messages=MESSAGES)
    assert KEY not in repr(llm)
    assert KEY not in repr(lk.report(response)) and KEY not in str(lk.report(response))
    [seen] = fake.attempts
    assert KEY not in str(seen.request_headers)


def test_a_report_reads_as_one_line() -> None:
    def attempt(number: int, target: str, reason: AttemptReason, outcome: Outcome) -> lk.Attempt:
        return lk.Attempt(number, target, 0.0, 0.1, outcome, reason=reason)

    plain = CallReport(
        "openai/a", "a", (attempt(1, "openai/a", "primary", "ok"),), 1, False, None, 0.25
    )
    assert str(plain) == "openai/a answered after 1 attempt, total 0.250s"
    assert "attempts=(Attempt(number=1" in repr(plain)  # repr keeps every field
    everything = CallReport(
        "openai/cheap",
        "cheap",
        (
            attempt(1, "openai/a", "primary", "error"),
            attempt(2, "openai/a", "retry", "cancelled"),
            attempt(3, "openai/a", "hedge", "cancelled"),
            attempt(4, "openai/b", "failover", "error"),
            attempt(5, "openai/cheap", "fallback", "ok"),
        ),
        5,
        True,
        "error",
        2.0,
        truncated=True,
    )
    assert str(everything) == (
        "openai/cheap answered after 5 attempts "
        "(retried, hedged, failed over, degraded: error, truncated), total 2.000s"
    )
    # An open stream: its answering attempt (3) is not recorded yet, its first token is.
    stream = CallReport(
        "openai/b",
        "openai/b",
        (attempt(1, "openai/a", "primary", "cancelled"), attempt(2, "openai/b", "hedge", "error")),
        3,
        False,
        None,
        1.5,
        ttft=0.4123,
    )
    assert str(stream) == (
        "openai/b answered after 3 attempts (hedged), first token 0.412s, total 1.500s"
    )
    hit = CallReport("openai/a", "a", (), 0, False, None, 0.001, ttft=0.0005, cache="hit")
    assert str(hit) == "openai/a answered from the cache, first token 0.001s, total 0.001s"


def test_report_of_a_foreign_object() -> None:
    with pytest.raises(LookupError):
        lk.report(object())


@pytest.mark.parametrize("name", ["max_retries", "timeout", "num_retries", "api_key", "api_base"])
async def test_arguments_latencykit_or_the_target_owns_are_refused(
    fake: FakeProvider, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        await make_llm(fake).acompletion(messages=MESSAGES, **{name: "1"})
    assert fake.attempts == []


async def test_priority_is_latencykit_s_own_and_checked(fake: FakeProvider) -> None:
    llm = make_llm(fake)
    with pytest.raises(ValueError, match=r"priority=.*interactive, default, batch.*'urgent'"):
        await llm.acompletion(messages=MESSAGES, priority="urgent")
    assert fake.attempts == []
    await llm.acompletion(messages=MESSAGES, priority="batch")
    assert len(fake.attempts) == 1
    assert priority_var.get() == "default"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"deadline": -1}, r"LLM\.deadline"),
        ({"deadline": 0}, r"LLM\.deadline"),
        ({"timeout": 0}, r"LLM\.timeout"),
        ({"deadline": 3, "degrade": lk.Degrade(model="m", after=5)}, r"degrade\.after"),
        ({"defaults": {"max_retries": 3}}, r"max_retries"),
        ({"defaults": {"model": "x"}}, r"model"),
    ],
)
def test_invalid_llm_configuration_names_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lk.LLM("openai/x", **options)


def test_unknown_llm_option_is_rejected() -> None:
    with pytest.raises(TypeError, match="deadlin"):
        lk.LLM("openai/x", deadlin=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"LLM\.degrade"):
        lk.LLM("openai/x", degrade={"model": "m"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": "m", "after": -1}, r"Degrade\.after"),
        ({"model": "m", "max_tokens": 0}, r"Degrade\.max_tokens"),
        ({"model": ""}, r"Degrade\.model"),
        ({}, "at least one of"),
        ({"overrides": {"timeout": 1}}, r"Degrade\.overrides"),
    ],
)
def test_invalid_degrade_names_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lk.Degrade(**options)


def test_unknown_degrade_option_is_rejected() -> None:
    with pytest.raises(TypeError, match="modle"):
        lk.Degrade(modle="m")  # type: ignore[call-arg]


async def test_many_calls_reuse_connections(fake: FakeProvider) -> None:
    llm = make_llm(fake)
    for _ in range(10):
        await llm.acompletion(messages=MESSAGES)
    assert fake.connections_opened <= 2


async def test_hedge_wins_and_the_loser_connection_is_closed(fake: FakeProvider) -> None:
    fake.script("tail", [Behavior(ttft=30.0), Behavior(output_tokens=4)])
    llm = make_llm(fake, "tail", deadline=10, hedge=lk.Hedge(0.2, max_extra_load=1.0))
    # litellm's first call of a model sets itself up for up to a second before its request:
    # without warm(), the hedge's request may reach the server first and be the slow one.
    await llm.warm(connect=False)
    response = await llm.acompletion(messages=MESSAGES)
    returned_at = time.monotonic()
    report = lk.report(response)
    assert report.answering_attempt == 2
    assert sorted((a.number, a.outcome) for a in report.attempts) == [(1, "cancelled"), (2, "ok")]
    # The loser was cancelled and awaited before the call returned: its socket was closed by
    # then, and the server sees the disconnect within milliseconds.
    slow, fast = await fake.wait_for_async(lambda a: len(a) == 2 and a[0].disconnected, 2.0)
    assert fast.completed and slow.disconnected_at is not None
    assert slow.disconnected_at - returned_at <= 0.05


@pytest.mark.slow
async def test_hedged_calls_leave_no_connection_open(fake: FakeProvider) -> None:
    def one_in_four_slow(request: RequestInfo) -> Behavior:
        return Behavior(ttft=0.4 if request.nth % 4 == 0 else 0.0, output_tokens=2)

    fake.script("mixed", one_in_four_slow)
    llm = make_llm(fake, "mixed", hedge=lk.Hedge(0.05, max_extra_load=1.0))
    for _ in range(200):
        await llm.acompletion(messages=MESSAGES)
    # The client closes a loser's connection when it loses; the server notices a moment later
    # (the last loser's close may still be in flight when the last call returns).
    attempts = await fake.wait_for_async(lambda a: all(x.completed or x.disconnected for x in a))
    hedges = len(attempts) - 200
    assert hedges >= 40  # a quarter of the primaries are slow
    # Every attempt either completed or was abandoned with its connection closed...
    losers = [a for a in attempts if not a.completed]
    assert all(a.disconnected for a in losers) and len(losers) >= 40
    # ...and what stays open is the client's keep-alive pool, not leaked connections.
    assert fake.open_connections <= 4


def test_hedge_to_the_next_target_needs_failover_targets() -> None:
    with pytest.raises(ValueError, match="target='next'"):
        lk.LLM("openai/x", hedge=lk.Hedge(0.1, target="next"))
    with pytest.raises(TypeError, match=r"LLM\.hedge"):
        lk.LLM("openai/x", hedge=0.1)  # type: ignore[arg-type]


async def test_hedge_to_the_next_failover_target(fake: FakeProvider) -> None:
    # Provider-wide slowness: every request to the primary is slow; the hedge escapes to the
    # second provider instead of asking the slow one again.
    fake.script("slow-provider", Behavior(ttft=30.0))
    fake.script("other-provider", Behavior(output_tokens=3))
    llm = make_llm(
        fake,
        "slow-provider",
        deadline=10,
        hedge=lk.Hedge(0.1, max_extra_load=1.0, target="next"),
        failover=[{"model": "openai/other-provider", "api_base": fake.base_url, "api_key": KEY}],
    )
    response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.target == "openai/other-provider"
    assert sorted((a.target, a.outcome) for a in report.attempts) == [
        ("openai/other-provider", "ok"),
        ("openai/slow-provider", "cancelled"),
    ]
    slow, other = await fake.wait_for_async(lambda a: len(a) == 2 and a[0].disconnected, 2.0)
    assert slow.model == "slow-provider" and other.model == "other-provider"


async def test_a_corrupt_200_is_a_transient_provider_fault(fake: FakeProvider) -> None:
    fake.script("corrupt", Behavior(fault=Fault.MALFORMED_CHUNK))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(fake, "corrupt", failover=[target(fake, "good")])
    response = await llm.acompletion(messages=MESSAGES)
    first, answered = lk.report(response).attempts
    assert first.error_kind is lk.ErrorKind.SERVER_ERROR
    assert answered.target == "openai/good" and answered.outcome == "ok"


async def test_a_caller_bug_is_neither_retried_nor_held_against_a_provider(
    fake: FakeProvider,
) -> None:
    llm = make_llm(
        fake,
        "primary",
        failover=[target(fake, "secondary")],
        retry=lk.Retry(max_attempts=3, initial=0.01),
        breaker={"minimum_calls": 1, "window_size": 5},
    )
    for _ in range(3):
        with pytest.raises(lk.ProviderError) as info:
            await llm.acompletion(messages="hi")
        assert lk.errors.classify(info.value) is lk.ErrorKind.UNKNOWN
        assert len(info.value.attempts) == 1  # no retry, no failover
    assert fake.attempts == []  # nothing was ever sent
    for key in ("openai/primary", "openai/secondary"):
        assert lk.policies.breaker.breakers()[key].state is lk.policies.breaker.BreakerState.CLOSED


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"api_key": 12345}, r"api_key"),
        ({"capabilities": "prefill"}, r"capabilities"),
        ({"failover": 5}, r"LLM\.failover"),
        ({"failover_on": ConnectionError}, r"LLM\.failover_on needs LLM\(failover="),
    ],
)
def test_invalid_targets_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        lk.LLM("openai/x", **options)


async def test_degrade_to_another_endpoint_works_with_failover_targets(
    fake: FakeProvider, fake_provider: FakeProvider
) -> None:
    fake.script("slow", Behavior(ttft=30.0))
    fake.script("backup", Behavior(ttft=30.0))
    with FakeProvider() as other:
        other.script("cheap", Behavior(output_tokens=3))
        llm = make_llm(
            fake,
            "slow",
            deadline=5.0,
            failover=[target(fake, "backup")],
            degrade=lk.Degrade(
                model="openai/cheap",
                after=0.3,
                overrides={"api_base": other.base_url, "api_key": "sk-other-0000000"},
            ),
        )
        seen: list[lk.events.Event] = []
        with lk.subscribe(seen.append):
            response = await llm.acompletion(messages=MESSAGES)
        assert lk.report(response).degraded
        assert [a.model for a in other.attempts] == ["cheap"]  # the other host answered
    [ended] = [e for e in seen if isinstance(e, lk.events.CallEnded)]
    assert ended.target == "openai/cheap"  # the target that answered, not the primary


async def test_a_hanging_primary_fails_over_within_the_deadline(fake: FakeProvider) -> None:
    # The README's quickstart shape: a deadline, a failover target, the default 600 s timeout.
    fake.script("hangs", Behavior(fault=Fault.HANG))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(fake, "hangs", deadline=3.0, failover=[target(fake, "good")])
    seen: list[lk.events.Event] = []
    with lk.subscribe(seen.append):
        response = await llm.acompletion(messages=MESSAGES)
    hung, answered = lk.report(response).attempts
    assert hung.outcome == "cancelled" and 1.3 <= hung.duration <= 1.5 + 0.5  # its share: 3 / 2
    assert answered.target == "openai/good"
    assert any(isinstance(e, lk.events.FailedOver) for e in seen)


async def test_retries_stay_within_their_targets_share(fake: FakeProvider) -> None:
    fake.script("flaky", Behavior(fault=Fault.HTTP_503, ttft=0.2))
    fake.script("good", Behavior(output_tokens=3))
    llm = make_llm(
        fake,
        "flaky",
        deadline=2.0,
        retry=lk.Retry(max_attempts=50, initial=0.01, max_wait=0.02, budget=lk.RetryBudget(10)),
        failover=[target(fake, "good")],
    )
    response = await llm.acompletion(messages=MESSAGES)
    report = lk.report(response)
    assert report.target == "openai/good"
    flaky = [a for a in report.attempts if a.target == "openai/flaky"]
    assert flaky and sum(a.duration for a in flaky) <= 1.0 + 0.3  # its share of 2 s


async def test_a_half_open_probe_is_one_attempt_never_retried(fake: FakeProvider) -> None:
    fake.script("down", Behavior(fault=Fault.HTTP_503))
    llm = make_llm(
        fake,
        "down",
        retry=lk.Retry(max_attempts=3, initial=0.001, max_wait=0.002, budget=lk.RetryBudget(10)),
        breaker={"minimum_calls": 2, "window_size": 2, "open_duration": 0.2, "half_open_calls": 1},
    )
    for _ in range(2):  # two calls of 3 attempts each: the breaker sees 2 failed calls, opens
        with pytest.raises(lk.ProviderUnavailable):
            await llm.acompletion(messages=MESSAGES)
    assert len(fake.attempts) == 6
    breaker = lk.policies.breaker.breakers()["openai/down"]
    assert breaker.state is lk.policies.breaker.BreakerState.OPEN
    sent = len(fake.attempts)
    import anyio

    await anyio.sleep(0.3)  # half-open: the next call is a probe
    with pytest.raises(lk.ProviderUnavailable):
        await llm.acompletion(messages=MESSAGES)
    assert len(fake.attempts) == sent + 1  # one probe, not retried
    assert breaker.state is lk.policies.breaker.BreakerState.OPEN


def test_misspelt_target_fields_are_rejected_and_misspelt_defaults_warned() -> None:
    with pytest.raises(ValueError, match=r"LLM\.failover\[0\].*'contxt_window'.*'context_window'"):
        lk.LLM("openai/x", failover=[{"model": "openai/y", "contxt_window": 5}])
    with pytest.warns(UserWarning, match=r"LLM\.defaults.*'temprature'.*'temperature'"):
        lk.LLM("openai/x", defaults={"temprature": 0})
    # Provider-specific arguments litellm passes through are not typos.
    lk.LLM("openai/x", failover=[{"model": "vertex_ai/y", "vertex_project": "p"}])
