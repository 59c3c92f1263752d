"""The public surface: what ``lk.`` offers, that a policy's lowercase name is its class, and
that every public name says what it does."""

from __future__ import annotations

import importlib
import inspect
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest

import latencykit as lk

# What users call and catch daily. A change here is a change of the public API: say so in
# CHANGELOG.md. Everything else lives in a documented submodule (latencykit.events,
# latencykit.errors, latencykit.pipeline, latencykit.policies.*, latencykit.stats, ...).
TOP_LEVEL = {
    # calling a model
    "LLM",
    "Target",
    "Degrade",
    "SLO",
    "Stream",
    "report",
    # policies: a class that is also the decorator, and its lowercase name
    "deadline",
    "fallback",
    "hedge",
    "Hedge",
    "quantile",
    "retry",
    "Retry",
    "RetryBudget",
    "breaker",
    "Breaker",
    "failover",
    "stream_guard",
    "StreamGuard",
    "guard_stream",
    # a turn: stages with budgets and their ledger, fan-out
    "stage",
    "ledger",
    "gather",
    "first",
    # fleet-wide state
    "use_store",
    "RedisStore",
    # during a call
    "remaining",
    "subscribe",
    # what errors carry and how they are sorted
    "Attempt",
    "ErrorKind",
    # the errors users catch
    "LatencykitError",
    "DeadlineExceeded",
    "FallbackFailed",
    "ProviderError",
    "TransientError",
    "RateLimited",
    "ProviderUnavailable",
    "ProviderConnectionError",
    "AttemptTimeout",
    "FirstTokenTimeout",
    "StreamBroken",
    "StreamStalled",
    "ContextLengthExceeded",
    "ContentPolicyViolation",
    "AuthenticationFailed",
    "BadRequest",
    "ModelNotFound",
    "CircuitOpen",
    "LimitExceeded",
}

SUBMODULES = {
    "errors",
    "events",
    "fleet",
    "llm",
    "pipeline",
    "policies",
    "routing",
    "stats",
    "turn",
}
# Submodules loaded on first use: what they import is paid for only by those who use them.
LAZY_SUBMODULES = {"cache", "fanout", "slow_calls", "telemetry"}
# Top-level names offered by the package's __getattr__: each loads its module on first use.
LAZY_NAMES = {"first": "fanout", "gather": "fanout", "SLO": "autopilot"}

# A policy is a class that is also the decorator: its lowercase name is the class itself.
ALIASES = [
    ("deadline", "Deadline"),
    ("fallback", "Fallback"),
    ("hedge", "Hedge"),
    ("quantile", "Quantile"),
    ("retry", "Retry"),
    ("failover", "Failover"),
    ("stream_guard", "StreamGuard"),
    ("breaker", "Breaker"),
]


def test_the_top_level_offers_what_users_call_and_catch() -> None:
    assert set(lk.__all__) == TOP_LEVEL
    # Submodules become attributes of the package as they are imported; other names do not.
    public = {name for name in vars(lk) if name.isidentifier() and not name.startswith("_")}
    public |= LAZY_NAMES.keys()  # offered by the module's __getattr__, until first use
    assert {name for name in public if not isinstance(getattr(lk, name), ModuleType)} == TOP_LEVEL
    assert public >= SUBMODULES


@pytest.mark.parametrize("name", sorted(LAZY_SUBMODULES))
def test_a_lazy_submodule_loads_on_first_use(name: str) -> None:
    module = getattr(lk, name)
    assert module is importlib.import_module(f"latencykit.{name}")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lk.nothing  # type: ignore[attr-defined]  # noqa: B018


# What `import latencykit` must not load (issue 27, item 5: import under 100 ms): each is loaded
# on first use by what needs it.
NOT_LOADED_AT_IMPORT = {
    "litellm",  # seconds; the litellm lane loads it
    "httpx",  # the fast lane's client
    "pydantic",  # latencykit.config
    "opentelemetry",  # latencykit.telemetry
    "redis",  # a RedisStore's connection
    "cachetools",  # the response cache's memory store
    "urllib.parse",  # a RedisStore's URL
    "urllib.request",
    *(f"latencykit.{name}" for name in (*LAZY_SUBMODULES, "config", "lab", "testing", "_openai")),
    "latencykit.policies.limiter",  # and its fair queue: an LLM never needs them
    "latencykit._fair",
    "latencykit.autopilot",  # an LLM with an SLO loads it
}


def _fresh_python(code: str, tmp_path: Path) -> str:
    """The output of ``code`` in a fresh interpreter, with cached bytecode (as from a wheel)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_import_loads_none_of_the_heavy_modules(tmp_path: Path) -> None:
    loaded = _fresh_python("import sys, latencykit; print(*sys.modules)", tmp_path).split()
    assert NOT_LOADED_AT_IMPORT.isdisjoint(loaded), NOT_LOADED_AT_IMPORT.intersection(loaded)


@pytest.mark.slow
def test_import_takes_less_than_three_times_asyncio_s(tmp_path: Path) -> None:
    """A timing guard with a wide margin (the machine may be loaded): the median, over fresh
    interpreters run in turns, of ``import latencykit``'s time over ``import asyncio``'s, a
    yardstick from the standard library measured in the same run (about 2 in 2026-11)."""
    timed = "import time; t = time.perf_counter(); import {}; print(time.perf_counter() - t)"
    ratios = []
    for round in range(8):  # round 0 writes the bytecode
        ours = float(_fresh_python(timed.format("latencykit"), tmp_path))
        yardstick = float(_fresh_python(timed.format("asyncio"), tmp_path))
        if round:
            ratios.append(ours / yardstick)
    assert statistics.median(ratios) < 3.0, ratios


def test_every_public_name_has_a_docstring() -> None:
    for name in sorted(TOP_LEVEL):
        assert inspect.getdoc(getattr(lk, name)), name


def _class(cls: str, function: str) -> Any:
    # Classes that are not at the top level live in their policy's module.
    home = {"Quantile": "hedge", "Deadline": "deadline", "Fallback": "fallback"}
    return getattr(lk, cls, None) or getattr(getattr(lk.policies, home.get(cls, function)), cls)


@pytest.mark.parametrize(("lower", "cls"), ALIASES)
def test_a_policy_s_lowercase_name_is_its_class(lower: str, cls: str) -> None:
    assert getattr(lk, lower) is _class(cls, lower)


@pytest.mark.anyio
async def test_failover_decorates_a_plain_async_function() -> None:
    async def backup(question: str) -> str:
        return f"backup: {question}"

    @lk.failover(backup)
    async def primary(question: str) -> str:
        raise ConnectionError("down")

    assert await primary("hi") == "backup: hi"


def test_failover_refuses_mixed_or_missing_alternatives() -> None:
    async def backup() -> None: ...

    with pytest.raises(ValueError, match="at least one"):
        lk.failover()
    with pytest.raises(TypeError, match="all async callables or all Routes"):
        lk.failover(backup, lk.policies.failover.Route(lk.Target("openai/x")))


def test_an_event_is_a_frozen_value_whose_repr_keeps_captured_text_out() -> None:
    from latencykit.events import CallEnded, CallStarted
    from latencykit.target import Endpoint

    prompt = [{"role": "user", "content": "a secret prompt"}]
    started = CallStarted(1, target="t", endpoint=Endpoint("m"), input_messages=prompt)

    def call_ended() -> CallEnded:
        return CallEnded(
            1,
            target="t",
            duration=0.5,
            outcome="ok",
            attempts=1,
            degraded=False,
            output_text="a secret",
        )

    ended = call_ended()
    assert repr(ended).startswith("CallEnded(call_id=1, target='t', duration=0.5, outcome='ok'")
    assert "input_messages" not in repr(started)
    assert "secret" not in repr(started) + repr(ended)
    twin = call_ended()
    assert ended == twin
    assert hash(ended) == hash(twin)
    assert ended != CallEnded(1, target="t", duration=0.5, outcome="ok", attempts=2, degraded=False)
    with pytest.raises(AttributeError):
        ended.target = "u"  # type: ignore[misc]
    # Captured text is the subscriber's to keep: the fields, as a dict, hold it.
    assert msgspec.structs.asdict(started)["input_messages"] == prompt


@pytest.mark.parametrize(("name", "module"), sorted(LAZY_NAMES.items()))
def test_a_lazy_name_is_its_submodule_s(name: str, module: str) -> None:
    assert getattr(lk, name) is getattr(importlib.import_module(f"latencykit.{module}"), name)


def test_the_limiter_loads_on_first_use() -> None:
    assert lk.policies.limiter is importlib.import_module("latencykit.policies.limiter")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lk.policies.nothing  # type: ignore[attr-defined]  # noqa: B018


def test_dir_shows_the_names_that_load_on_first_use() -> None:
    assert {*LAZY_NAMES, *LAZY_SUBMODULES, *TOP_LEVEL} <= set(dir(lk))
