"""No key anywhere (issue 23, section 4): not in error messages, not in the printed traceback
of any error latencykit raises (its cause chain included), not in reprs; URL credentials are
never sent; the fast lane only goes where it can. Calls go through real litellm (or the fast
lane) to the fake provider."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

import latencykit as lk
import latencykit.testing._server as fake_server
from helpers import KEY
from latencykit.errors import scrub
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
# Keys that do not look like OpenAI's "sk-...": an Azure-style hex key, a proxy token.
HEX_KEY = "0123456789abcdef0123456789abcdef"
ENV_KEY = "proxy-token_7f3a9c2e1b"
PASSWORD = "pa55w0rd-in-url"


def printed(error: BaseException) -> str:
    """Everything a user may see of ``error``: what ``logging.exception`` prints, and more."""
    shown = ("".join(traceback.format_exception(error)), str(error), repr(error))
    return "\n".join((*shown, str(getattr(error, "provider_message", ""))))


async def fail(llm: lk.LLM, stream: bool) -> lk.ProviderError:
    call = read(llm) if stream else llm.acompletion(messages=MESSAGES)
    with pytest.raises(lk.ProviderError) as info:
        await call
    return info.value


async def read(llm: lk.LLM) -> None:
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    async with stream:
        async for _chunk in stream:
            pass


def test_a_key_of_any_shape_is_scrubbed_before_a_period() -> None:
    # OpenAI's 401 wording, with keys that no pattern recognises.
    for key in (HEX_KEY, ENV_KEY, "k3y"):
        assert scrub(f"Incorrect API key provided: {key}.", key) == (
            "Incorrect API key provided: ***."
        )
        assert scrub(f"key {key}. Next", key) == "key ***. Next"
    # Without being told the key, the wording alone gives it away.
    assert HEX_KEY not in scrub(f"Incorrect API key provided: {HEX_KEY}.")
    # Still whole tokens only: a key inside a longer word, or before ".word", is not a key.
    assert scrub("k3y.txt k3yboard", "k3y") == "k3y.txt k3yboard"


def test_url_credentials_are_scrubbed() -> None:
    text = scrub(f"POST https://user:{PASSWORD}@proxy.example/v1 failed")
    assert PASSWORD not in text and "user" not in text and "proxy.example/v1" in text
    # A password with an "@" in it: the URL's credentials end at the last one.
    assert scrub("http://u:p@ss@host/v1?to=me@x") == "http://***@host/v1?to=me@x"


@pytest.mark.parametrize("lane", ["litellm", "openai"])
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("status", [401, 500])
async def test_no_key_in_a_provider_error_nor_its_traceback(
    fake: FakeProvider, lane: str, stream: bool, status: int
) -> None:
    fake.script(
        "m",
        Behavior(
            fault=Fault.HTTP_ERROR,
            status=status,
            error_message=f"Incorrect API key provided: {HEX_KEY}.",
        ),
    )
    llm = lk.LLM("openai/m", api_base=fake.base_url, api_key=HEX_KEY, transport=lane)
    error = await fail(llm, stream)
    assert error.status_code == status
    assert "Incorrect API key provided: ***." in error.provider_message
    assert HEX_KEY not in printed(error)
    # litellm's exception stays reachable (the fast lane's own error on the fast lane).
    assert error.__cause__ is not None
    assert HEX_KEY not in "".join(traceback.format_exception(error.__cause__))


@pytest.mark.parametrize("lane", ["litellm", "openai"])
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_a_key_taken_from_the_environment_is_scrubbed(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, lane: str, stream: bool
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    fake.script(
        "m",
        Behavior(fault=Fault.HTTP_ERROR, status=401, error_message=f"bad token {ENV_KEY}."),
    )
    llm = lk.LLM("openai/m", api_base=fake.base_url, transport=lane)  # no api_key: the env's
    error = await fail(llm, stream)
    assert isinstance(error, lk.AuthenticationFailed)
    assert "bad token ***." in error.provider_message
    assert ENV_KEY not in printed(error)


async def test_a_degraded_paths_key_is_scrubbed(fake: FakeProvider) -> None:
    degraded_key = "degraded-0badc0ffee"
    fake.script("m", Behavior(fault=Fault.HTTP_503))
    fake.script(
        "cheap",
        Behavior(fault=Fault.HTTP_ERROR, status=401, error_message=f"key {degraded_key}."),
    )
    llm = lk.LLM(
        "openai/m",
        api_base=fake.base_url,
        api_key=HEX_KEY,
        degrade=lk.Degrade(model="openai/cheap", overrides={"api_key": degraded_key}),
    )
    with pytest.raises(lk.LatencykitError) as info:
        await llm.acompletion(messages=MESSAGES)
    assert degraded_key not in printed(info.value)


@pytest.mark.parametrize("lane", ["litellm", "openai"])
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_url_credentials_are_never_sent_and_both_lanes_send_the_bearer_key(
    fake: FakeProvider, monkeypatch: pytest.MonkeyPatch, lane: str, stream: bool
) -> None:
    # The fake provider records "***" for the authorization header; here the header itself
    # is the subject, so it records it as received.
    monkeypatch.setattr(fake_server, "_REDACTED", frozenset())
    fake.script("m", Behavior(output_tokens=3))
    base = fake.base_url.replace("://", f"://user:{PASSWORD}@", 1)
    llm = lk.LLM("openai/m", api_base=base, api_key=HEX_KEY, transport=lane)
    if stream:
        await read(llm)
    else:
        await llm.acompletion(messages=MESSAGES)
    [attempt] = fake.attempts
    assert attempt.request_headers["authorization"] == f"Bearer {HEX_KEY}"


async def test_url_credentials_stay_out_of_errors(fake: FakeProvider) -> None:
    fake.script("m", Behavior(fault=Fault.HTTP_ERROR, status=404))
    base = fake.base_url.replace("://", f"://user:{PASSWORD}@", 1)
    for lane in ("litellm", "openai"):
        llm = lk.LLM("openai/m", api_base=base, api_key=HEX_KEY, transport=lane)
        error = await fail(llm, stream=False)
        assert isinstance(error, lk.ModelNotFound)
        assert PASSWORD not in printed(error)


def test_url_credentials_are_redacted_in_reprs() -> None:
    base = f"https://user:{PASSWORD}@proxy.example/v1"
    target = lk.Target("openai/m", api_base=base, api_key=HEX_KEY)
    degrade = lk.Degrade(overrides={"api_base": base, "api_key": "other-key-123"})
    llm = lk.LLM("openai/m", api_base=base, api_key=HEX_KEY, degrade=degrade)
    for text in (repr(target), repr(llm.targets), repr(llm), repr(degrade), str(target.endpoint)):
        assert PASSWORD not in text and HEX_KEY not in text and "other-key-123" not in text
    assert "https://***@proxy.example/v1" in repr(target)
    assert target.api_base == base  # the value itself is kept


@pytest.mark.parametrize(
    "spec",
    [
        {"model": "anthropic/claude-3-5-sonnet"},
        {"model": "azure/gpt-4o"},
        {"model": "gemini/gemini-2.0-flash"},
        {"model": "groq/llama-3.1-8b"},  # OpenAI-compatible, but not at OpenAI's URL
    ],
)
def test_the_fast_lane_refuses_a_provider_it_cannot_reach(spec: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"target\.transport"):
        lk.Target(**spec, transport="openai")
    with pytest.raises(ValueError, match=r"target\.transport"):
        lk.LLM(spec["model"], transport="openai")
    with pytest.raises(ValueError, match=r"LLM\.failover\[0\].*target\.transport"):
        lk.LLM("openai/x", failover=[{**spec, "transport": "openai"}])


@pytest.mark.parametrize("model", ["openai/gpt-4o", "gpt-4o-mini"])
def test_the_fast_lane_goes_to_openai_without_an_api_base(model: str) -> None:
    assert lk.Target(model, transport="openai").transport == "openai"


@pytest.mark.parametrize("model", ["hosted_vllm/llama", "groq/llama-3.1-8b", "anthropic/c"])
def test_the_fast_lane_goes_anywhere_with_an_api_base(model: str) -> None:
    target = lk.Target(model, api_base="http://127.0.0.1:8000/v1", transport="openai")
    assert target.transport == "openai"


def test_a_short_key_does_not_mangle_ordinary_text() -> None:
    assert scrub("maximum context length is 4096 tokens", "k") == (
        "maximum context length is 4096 tokens"
    )
    assert scrub("bad key k given", "k") == "bad key *** given"
    assert scrub(f"Incorrect API key provided: {KEY}.", KEY) == "Incorrect API key provided: ***."


def test_a_key_is_never_sent_to_another_host() -> None:
    primary = lk.Target("openai/big", api_base="https://a.example/v1", api_key=KEY)
    assert primary.replace(api_base="https://b.example/v1").api_key is None
    assert primary.replace(model="openai/small").api_key == KEY  # same host: same key
    moved = lk.Degrade(overrides={"api_base": "https://b.example/v1"}).target(primary)
    assert moved.api_base == "https://b.example/v1" and moved.api_key is None
    own = lk.Degrade(overrides={"api_base": "https://b.example/v1", "api_key": "sk-b-999999"})
    assert own.target(primary).api_key == "sk-b-999999"


def test_keys_stay_out_of_reprs() -> None:
    degrade = lk.Degrade(model="openai/small", overrides={"api_key": "sk-secret-degraded-1"})
    llm = lk.LLM(
        "openai/big", api_key=KEY, degrade=degrade, failover=[{"model": "x/y", "api_key": "sk-2"}]
    )
    for text in (repr(llm), repr(degrade), repr(llm.targets)):
        assert KEY not in text and "sk-secret-degraded-1" not in text and "sk-2'" not in text
