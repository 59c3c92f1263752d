"""The public surface: what ``lk.`` offers, that a policy's lowercase name is its class, and
that every public name says what it does."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

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
    "cache",
    "errors",
    "events",
    "fanout",
    "fleet",
    "llm",
    "pipeline",
    "policies",
    "routing",
    "slow_calls",
    "stats",
    "turn",
}

# A policy is a class that is also the decorator: its lowercase name is the class itself.
ALIASES = [
    ("deadline", "Deadline"),
    ("fallback", "Fallback"),
    ("hedge", "Hedge"),
    ("quantile", "Quantile"),
    ("retry", "Retry"),
    ("failover", "Failover"),
]
PAIRS = [("breaker", "Breaker"), ("stream_guard", "StreamGuard")]


def test_the_top_level_offers_what_users_call_and_catch() -> None:
    assert set(lk.__all__) == TOP_LEVEL
    # Submodules become attributes of the package as they are imported; other names do not.
    public = {name for name in vars(lk) if name.isidentifier() and not name.startswith("_")}
    assert {name for name in public if not isinstance(getattr(lk, name), ModuleType)} == TOP_LEVEL
    assert public >= SUBMODULES


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


@pytest.mark.parametrize(("function", "cls"), PAIRS)
def test_a_policy_function_and_its_class_take_the_same_arguments(function: str, cls: str) -> None:
    lower: Any = getattr(lk, function)
    upper: Any = _class(cls, function)

    def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert parameters(lower) == parameters(upper)


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
