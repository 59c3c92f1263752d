"""Cold start: ``LLM.warm()``, the first-token clock of a process's first call, and litellm's
printed noise on latencykit's calls (issue 23, section 9).

litellm's one-time set-up is process-wide, so what is about a cold litellm runs in a fresh
interpreter (a subprocess); the rest runs here, on asyncio and trio.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "hello"}]
SECRET = "sk-warm-secret-0123456789"
UNREACHABLE = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there


def _run(code: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )


def _target(fake: FakeProvider, model: str, transport: str, key: str = SECRET) -> dict[str, Any]:
    return {"model": f"openai/{model}", "api_base": fake.base_url, "api_key": key,
            "transport": transport}  # fmt: skip


# --- warm() ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["litellm", "openai"])
async def test_warm_opens_a_connection_per_target_that_the_first_calls_reuse(
    fake_provider: FakeProvider, transport: str
) -> None:
    fake = fake_provider
    llm = lk.LLM(
        "openai/primary",
        api_base=fake.base_url,
        api_key=SECRET,
        transport=transport,
        failover=[_target(fake, "backup", transport, key="sk-other-key-0123456789")],
    )
    warmed = await llm.warm()
    assert list(warmed) == ["openai/primary", "openai/backup"]
    assert all(isinstance(seconds, float) and seconds >= 0 for seconds in warmed.values())
    assert fake.attempts == []  # no completion was asked for: it would cost tokens
    opened = fake.connections_opened
    assert opened == 2  # one per target: their keys differ, so do litellm's clients

    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        async for _ in stream:
            pass
    fake.script("primary", Behavior(fault=Fault.HTTP_503))  # to the backup
    await llm.acompletion(messages=MESSAGES)
    assert [a.model for a in fake.attempts] == ["primary", "primary", "backup"]
    assert fake.connections_opened == opened  # each call went on a warm connection


@pytest.mark.anyio
async def test_warm_does_the_degraded_path_too_and_reports_errors_without_raising(
    fake_provider: FakeProvider,
) -> None:
    llm = lk.LLM(
        "openai/primary",
        api_base=fake_provider.base_url,
        api_key=SECRET,
        failover=[{"model": "openai/far", "api_base": UNREACHABLE, "api_key": SECRET}],
        degrade=lk.Degrade(model="openai/cheap"),
    )
    warmed = await llm.warm(timeout=5)
    assert list(warmed) == ["openai/primary", "openai/far", "openai/cheap"]
    assert isinstance(warmed["openai/primary"], float)
    assert isinstance(warmed["openai/cheap"], float)
    error = warmed["openai/far"]
    assert isinstance(error, lk.ProviderError)
    assert error.kind is lk.ErrorKind.CONNECTION
    assert SECRET not in repr(error) and SECRET not in str(error)

    with pytest.raises(lk.ProviderError) as raised:
        await llm.warm(raise_errors=True)
    assert raised.value.target == "openai/far"


@pytest.mark.anyio
async def test_warm_without_connect_sends_nothing(fake_provider: FakeProvider) -> None:
    llm = lk.LLM("openai/quiet", api_base=fake_provider.base_url, api_key=SECRET)
    assert isinstance((await llm.warm(connect=False))["openai/quiet"], float)
    assert fake_provider.connections_opened == 0
    assert fake_provider.attempts == []


def test_warm_validates_its_timeout() -> None:
    import anyio

    llm = lk.LLM("openai/x", api_base=UNREACHABLE, api_key=SECRET)
    with pytest.raises(ValueError, match=r"LLM\.warm\(timeout\)"):
        anyio.run(lambda: llm.warm(timeout=-1))


# --- the first call of a process ------------------------------------------------------------

_FIRST_CALL = """
import sys, anyio
import latencykit as lk
from latencykit.testing import FakeProvider

backend, transport, warm = sys.argv[1:]

async def main():
    with FakeProvider() as fake:
        llm = lk.LLM("openai/m", api_base=fake.base_url, api_key="sk-x", transport=transport)
        if warm == "warm":
            await llm.warm()
            from latencykit import _litellm

            # What the first call would otherwise set up first.
            fast_lane = llm._transports["openai"]
            assert fast_lane.ready() if transport == "openai" else _litellm.is_set_up("openai/m")
        stream = await llm.acompletion(messages=[{"role": "user", "content": "hi"}], stream=True)
        async with stream:
            async for _ in stream:
                pass
        print(stream.ttft, lk.report(stream).ttft)

anyio.run(main, backend=backend)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["litellm", "openai"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_clients_first_call_set_up_is_not_the_providers_first_token_time(
    backend: str, transport: str
) -> None:
    # A process's first call spends 0.1-0.9 s in the client's set-up (litellm's provider
    # config, tokenizer and response types; the fast lane's HTTP client) before its request
    # goes out: the call waits for it (report().ttft), the provider's first-token time
    # (Stream.ttft: StreamGuard.first_token, the hedge's statistics) does not include it.
    cold = _run(_FIRST_CALL, backend, transport, "cold")
    assert cold.returncode == 0, cold.stderr
    ttft, call_ttft = map(float, cold.stdout.split())
    # The set-up, measured: ~0.2 s (litellm), 0.03-0.1 s (the fast lane's client; httpcore
    # imports trio's parts unless trio is already in); a load only makes it longer.
    assert call_ttft - ttft > 0.01

    warmed = _run(_FIRST_CALL, backend, transport, "warm")
    assert warmed.returncode == 0, warmed.stderr
    ttft, call_ttft = map(float, warmed.stdout.split())
    assert 0 < ttft <= call_ttft


# --- quiet ----------------------------------------------------------------------------------

_NOISE = """
import gc, sys, time, anyio
import litellm
import latencykit as lk
from latencykit.testing import Behavior, FakeProvider, Fault

MESSAGES = [{"role": "user", "content": "hi"}]

async def main():
    with FakeProvider() as fake:
        fake.script("bad", Behavior(fault=Fault.HTTP_503))
        fake.script("cut", Behavior(fault=Fault.CUT))
        fake.script("slow", Behavior(ttft=5.0))
        base = {"api_base": fake.base_url, "api_key": "sk-x"}
        # The process's first call, cancelled while litellm sets up (0.2 s and more, cold).
        slow = lk.LLM("openai/slow", **base)
        with anyio.move_on_after(0.02):
            await slow.acompletion(messages=MESSAGES)
        with anyio.move_on_after(0.3):
            await slow.acompletion(messages=MESSAGES, stream=True)
        # A failing attempt, then failover; a stream cut mid-way, continued elsewhere.
        llm = lk.LLM(
            "openai/bad", **base, failover=[{"model": "openai/good", **base}],
            stream_guard=lk.StreamGuard(on_break="continue"),
        )
        await llm.acompletion(messages=MESSAGES)
        stream = await llm.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                pass
        cut = lk.LLM(
            "openai/cut", **base, failover=[{"model": "openai/good", **base}],
            stream_guard=lk.StreamGuard(on_break="continue"),
        )
        stream = await cut.acompletion(messages=MESSAGES, stream=True)
        async with stream:
            async for _ in stream:
                pass
        # A model no provider is known for (litellm's "Provider List" banner).
        try:
            await lk.LLM("no-such-provider-model", **base).acompletion(messages=MESSAGES)
        except lk.ProviderError:
            pass
        print("LATENCYKIT CALLS DONE", flush=True)
    time.sleep(0.5)  # litellm's set-up threads of the cancelled calls end
    gc.collect()
    print("COLLECTED", flush=True)

anyio.run(main, backend=sys.argv[1])

async def direct():
    with FakeProvider() as fake:
        fake.script("bad", Behavior(fault=Fault.HTTP_503))
        try:
            await litellm.acompletion(
                model="openai/bad", api_base=fake.base_url, api_key="sk-x",
                messages=MESSAGES, max_retries=0,
            )
        except Exception:
            pass
        try:
            await litellm.acompletion(model="no-such-provider-model", messages=MESSAGES)
        except Exception:
            pass

anyio.run(direct, backend="asyncio")  # litellm runs on asyncio only
"""

_NOISE_LINES = (
    "Give Feedback / Get Help",
    "turn_on_debug",
    "Provider List",
    "was never awaited",
    "Task was destroyed",
    "Task exception was never retrieved",
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_latencykits_calls_are_quiet_and_the_users_own_litellm_calls_are_not(
    backend: str,
) -> None:
    result = _run(_NOISE, backend)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    ours, _, theirs = output.partition("COLLECTED")
    assert "LATENCYKIT CALLS DONE" in ours
    assert [line for line in ours.splitlines() if any(n in line for n in _NOISE_LINES)] == []
    # The user's own litellm calls are unchanged: litellm still prints its banners for them.
    assert "Give Feedback / Get Help" in theirs
    assert "Provider List" in theirs


def test_suppress_debug_info_keeps_the_users_setting() -> None:
    from latencykit._litellm import litellm

    module = litellm()
    before = module.suppress_debug_info
    try:
        module.suppress_debug_info = False
        assert module.suppress_debug_info is False  # litellm tests `is False`
        assert vars(module)["suppress_debug_info"] is False
        module.suppress_debug_info = True
        assert module.suppress_debug_info is True
    finally:
        module.suppress_debug_info = before
