"""Configuration as data: an ``LLM`` and its policies from a dict, a YAML or JSON file, or
environment variables, and back.

Each option's default and description come from the constructor that takes it (its signature
and its docstring's ``Args:``): the models here only say which options are data and of what
type, so a default cannot drift between the code and the config. Models are frozen pydantic
models that reject unknown keys, naming the field's path (``hedge.max_extra_lod: Extra inputs
are not permitted``); the constructors then check what they always check.

A number field takes a number: not a boolean, not a string (``"5"``), not infinity or NaN; an
integer field takes an integer. Files are read as YAML 1.2 (``1:30``, ``1_000``, ``yes`` and
``off`` are strings there, not 90, 1000, true and false), and every error raised by :func:`load`
names the file, the field's path and the line (or the environment variable) it came from.

Options that are code (a predicate, a router function, a custom breaker factory, a cache
key) have no config form. Error filters (``on``, ``counts``, ``failover_on``) are lists of
:class:`~latencykit.ErrorKind` values (``["rate_limited", "timeout"]``). A config never holds
an API key: give ``api_key_env``, the name of the variable that holds the key, and it is read
when the ``LLM`` is built (an inline ``api_key`` is refused).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar, overload
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ._docstrings import arguments
from ._litellm import GC_FREEZE_VARIABLE
from .cache import ResponseCache
from .errors import ErrorKind, classify
from .fleet.redis import RedisStore
from .llm import LLM, Degrade
from .policies.breaker import breaker
from .policies.guard import StreamGuard
from .policies.hedge import hedge, quantile
from .policies.limiter import Limiter, Quota
from .policies.retry import Retry
from .routing import Router, Rule
from .target import Target, as_target

__all__ = [
    "BreakerConfig",
    "CacheConfig",
    "DegradeConfig",
    "HedgeConfig",
    "KindFilter",
    "LLMConfig",
    "LimiterConfig",
    "QuantileConfig",
    "QuotaConfig",
    "RetryConfig",
    "RouterConfig",
    "RuleConfig",
    "StoreConfig",
    "StreamGuardConfig",
    "TargetConfig",
    "load",
]

ENV_PREFIX = "LATENCYKIT_"
"""Prefix of the environment variables :meth:`LLMConfig.from_env` reads."""
_NOT_OPTIONS = frozenset({GC_FREEZE_VARIABLE})  # latencykit's own variables, not config options


# --- defaults and descriptions from the constructors -------------------------------------------


@functools.cache
def _arg_docs(owner: Callable[..., Any]) -> dict[str, str]:
    """``name -> description`` from ``owner``'s docstring (``Args:``, else ``Attributes:``)."""
    return arguments(inspect.getdoc(owner))


def _option(owner: Callable[..., Any], name: str) -> Any:
    """A pydantic ``Field`` with ``owner``'s default and description for argument ``name``."""
    parameter = inspect.signature(owner).parameters[name]
    default = parameter.default
    if default is inspect.Parameter.empty:
        default = ...
    elif isinstance(default, (frozenset, set, tuple)):
        default = list(default)
    return Field(default=default, description=_arg_docs(owner).get(name))


# --- error filters --------------------------------------------------------------------------


class KindFilter:
    """An error filter made of error kinds: ``KindFilter({ErrorKind.TIMEOUT})(exc)`` is whether
    ``classify(exc)`` is one of them. What a config's ``on: [timeout, rate_limited]`` builds."""

    __slots__ = ("kinds",)

    def __init__(self, kinds: frozenset[ErrorKind]) -> None:
        self.kinds = kinds

    def __call__(self, exc: BaseException) -> bool:
        """Whether ``exc`` is of one of the kinds."""
        return classify(exc) in self.kinds

    def __repr__(self) -> str:
        return f"KindFilter({sorted(kind.value for kind in self.kinds)!r})"


# Not strict: a kind is written by its name ("timeout").
Kinds = list[Annotated[ErrorKind, Strict(False)]]


def _filter(kinds: Kinds | None) -> KindFilter | None:
    return None if kinds is None else KindFilter(frozenset(kinds))


def _kinds_of(value: object, where: str) -> Kinds | None:
    if value is None:
        return None
    if isinstance(value, KindFilter):
        return sorted(value.kinds, key=lambda kind: kind.value)
    raise ValueError(f"{where} is code ({value!r}): it has no config form; use a list of kinds")


# --- the models -----------------------------------------------------------------------------


class _Model(BaseModel):
    # strict: a number field takes a number, not a bool or "5" (as the constructors do).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


_NO_KEY = (
    "a config never holds an API key: put the key in an environment variable and give that "
    "variable's name as api_key_env"
)


def _refuse_key(value: object) -> NoReturn:
    raise PydanticCustomError("inline_secret", _NO_KEY)


def _keyless(arguments: dict[str, Any]) -> dict[str, Any]:
    if "api_key" in arguments:
        raise PydanticCustomError("inline_secret", "api_key: " + _NO_KEY)
    return arguments


# An ``api_key`` in a config is refused with a message that says what to write instead (an
# unknown key would only be "Extra inputs are not permitted"); the schema leaves it out.
InlineKey = Annotated[SkipJsonSchema[None], BeforeValidator(_refuse_key)]
Arguments = Annotated[dict[str, Any], AfterValidator(_keyless)]


def _seconds(value: object) -> object:
    total = getattr(value, "total_seconds", None)
    return total() if callable(total) else value


def _fields_of(model: type[_Model], obj: object, **overrides: Any) -> dict[str, Any]:
    """``model``'s fields read off ``obj``'s attributes of the same names (then ``overrides``),
    those equal to their defaults left out."""
    found: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name in overrides:
            value = overrides[name]
        elif hasattr(obj, name):
            value = _seconds(getattr(obj, name))
        else:
            continue
        if isinstance(value, (frozenset, set, tuple)):
            value = sorted(value) if isinstance(value, (frozenset, set)) else list(value)
        elif isinstance(value, Mapping):
            value = dict(value)  # a MappingProxyType, say
        if value is not None and value == info.default and not isinstance(value, bool):
            continue
        if value is None and info.default is None:
            continue
        if isinstance(value, bool) and value is info.default:
            continue
        found[name] = value
    return found


class QuantileConfig(_Model):
    """An adaptive hedging delay (:func:`latencykit.quantile`)."""

    q: float = _option(quantile, "q")
    min_samples: int = _option(quantile, "min_samples")
    window: float = _option(quantile, "window")
    max_samples: int = _option(quantile, "max_samples")

    def build(self) -> Any:
        """The :class:`~latencykit.policies.hedge.Quantile`."""
        return quantile(
            self.q, min_samples=self.min_samples, window=self.window, max_samples=self.max_samples
        )


class HedgeConfig(_Model):
    """:func:`latencykit.hedge`; ``delay`` is seconds or ``{"q": 0.9, ...}`` (adaptive)."""

    delay: float | QuantileConfig = _option(hedge, "delay")
    max_attempts: int = _option(hedge, "max_attempts")
    max_extra_load: float = _option(hedge, "max_extra_load")
    target: Literal["same", "next"] = _option(hedge, "target")
    on: Kinds | None = _option(hedge, "on")

    def build(self) -> Any:
        """The :class:`~latencykit.Hedge`."""
        delay = self.delay if isinstance(self.delay, float) else self.delay.build()
        return hedge(
            delay,
            max_attempts=self.max_attempts,
            max_extra_load=self.max_extra_load,
            target=self.target,
            on=_filter(self.on),
        )

    @classmethod
    def of(cls, policy: Any) -> HedgeConfig:
        """The config of a :class:`~latencykit.Hedge`."""
        delay = policy.delay
        spec: Any = (
            delay
            if isinstance(delay, float)
            else QuantileConfig(**_fields_of(QuantileConfig, delay))
        )
        return cls(
            **_fields_of(
                cls,
                policy,
                delay=spec,
                max_extra_load=policy.budget.ratio,
                on=_kinds_of(policy.on, "hedge.on"),
            )
        )


class RetryConfig(_Model):
    """:class:`latencykit.Retry`."""

    max_attempts: int = _option(Retry, "max_attempts")
    initial: float = _option(Retry, "initial")
    max_wait: float = _option(Retry, "max_wait")
    multiplier: float = _option(Retry, "multiplier")
    on: Kinds | None = _option(Retry, "on")
    honor_retry_after: bool = _option(Retry, "honor_retry_after")
    max_retry_after: float | None = _option(Retry, "max_retry_after")
    slow_failure: float | None = _option(Retry, "slow_failure")

    def build(self) -> Retry:
        """The :class:`~latencykit.Retry`."""
        options = self.model_dump(exclude={"on"})
        return Retry(**options, on=_filter(self.on))

    @classmethod
    def of(cls, policy: Retry) -> RetryConfig:
        """The config of a :class:`~latencykit.Retry`."""
        return cls(**_fields_of(cls, policy, on=_kinds_of(policy.on, "retry.on")))


class BreakerConfig(_Model):
    """The options of each target's :func:`latencykit.breaker` (the key is the target's)."""

    window_type: Literal["count", "time"] = _option(breaker, "window_type")
    window_size: float = _option(breaker, "window_size")
    minimum_calls: int = _option(breaker, "minimum_calls")
    failure_rate: float = _option(breaker, "failure_rate")
    slow_call_rate: float = _option(breaker, "slow_call_rate")
    slow_call_duration: float = _option(breaker, "slow_call_duration")
    open_duration: float = _option(breaker, "open_duration")
    max_open_duration: float | None = _option(breaker, "max_open_duration")
    half_open_calls: int = _option(breaker, "half_open_calls")
    counts: Kinds | None = _option(breaker, "counts")

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~latencykit.breaker` (a count window's size as an
        int)."""
        found = self.model_dump(exclude={"counts"})
        if self.window_type == "count":
            found["window_size"] = int(self.window_size)
        found["counts"] = _filter(self.counts)
        return found


class StreamGuardConfig(_Model):
    """:class:`latencykit.StreamGuard`."""

    first_token: float | None = _option(StreamGuard, "first_token")
    stall: float | None = _option(StreamGuard, "stall")
    on_break: Literal["raise", "continue"] = _option(StreamGuard, "on_break")
    max_resumes: int = _option(StreamGuard, "max_resumes")

    def build(self) -> StreamGuard:
        """The :class:`~latencykit.StreamGuard`."""
        return StreamGuard(**self.model_dump())


class DegradeConfig(_Model):
    """:class:`latencykit.Degrade`."""

    model: str | None = _option(Degrade, "model")
    max_tokens: int | None = _option(Degrade, "max_tokens")
    after: float | None = _option(Degrade, "after")
    on: Kinds | None = _option(Degrade, "on")
    overrides: Arguments = Field(
        default_factory=dict, description=_arg_docs(Degrade).get("overrides")
    )

    def build(self) -> Degrade:
        """The :class:`~latencykit.Degrade`."""
        return Degrade(**self.model_dump(exclude={"on"}), on=_filter(self.on))

    @classmethod
    def of(cls, degrade: Degrade) -> DegradeConfig:
        """The config of a :class:`~latencykit.Degrade` (``ValueError`` if its overrides hold
        a secret: an ``api_key``, a password in ``api_base``)."""
        if "api_key" in degrade.overrides:
            raise ValueError(
                "LLM.degrade.overrides.api_key is a secret, and a config never holds one"
            )
        _no_password(degrade.overrides.get("api_base"), "LLM.degrade.overrides.api_base")
        return cls(**_fields_of(cls, degrade, on=_kinds_of(degrade.on, "degrade.on")))


class QuotaConfig(_Model):
    """:class:`latencykit.policies.limiter.Quota`."""

    requests_per_second: float | None = _option(Quota, "requests_per_second")
    tokens_per_minute: float | None = _option(Quota, "tokens_per_minute")
    request_burst: float | None = _option(Quota, "request_burst")
    token_burst: float | None = _option(Quota, "token_burst")
    concurrency: int | None = _option(Quota, "concurrency")
    weight: float = _option(Quota, "weight")

    def build(self) -> Quota:
        """The :class:`~latencykit.policies.limiter.Quota`."""
        return Quota(**self.model_dump())


class LimiterConfig(_Model):
    """:class:`latencykit.policies.limiter.Limiter`."""

    concurrency: int | dict[str, int] | None = _option(Limiter, "concurrency")
    tenant_quota: QuotaConfig | None = _option(Limiter, "tenant_quota")
    quotas: dict[str, QuotaConfig] | None = _option(Limiter, "quotas")
    max_wait: float | None = _option(Limiter, "max_wait")

    def build(self) -> Limiter:
        """The :class:`~latencykit.policies.limiter.Limiter`."""
        return Limiter(
            concurrency=self.concurrency,
            tenant_quota=None if self.tenant_quota is None else self.tenant_quota.build(),
            quotas=None
            if self.quotas is None
            else {name: quota.build() for name, quota in self.quotas.items()},
            max_wait=self.max_wait,
        )


class CacheConfig(_Model):
    """:class:`latencykit.cache.ResponseCache` (in memory)."""

    ttl: float | None = _option(ResponseCache, "ttl")
    max_entries: int | None = _option(ResponseCache, "max_entries")
    cache_degraded: bool = _option(ResponseCache, "cache_degraded")
    cache_truncated: bool = _option(ResponseCache, "cache_truncated")
    normalize_whitespace: bool = _option(ResponseCache, "normalize_whitespace")
    store_timeout: float = _option(ResponseCache, "store_timeout")

    def build(self) -> ResponseCache:
        """The :class:`~latencykit.cache.ResponseCache`."""
        return ResponseCache(**self.model_dump())


class RuleConfig(_Model):
    """:class:`latencykit.routing.Rule`."""

    to: str = _option(Rule, "to")
    task: str | list[str] | None = _option(Rule, "task")
    min_prompt_tokens: int | None = _option(Rule, "min_prompt_tokens")
    max_prompt_tokens: int | None = _option(Rule, "max_prompt_tokens")
    needs: list[str] = Field(default_factory=list, description=_arg_docs(Rule).get("needs"))

    def build(self) -> Rule:
        """The :class:`~latencykit.routing.Rule`."""
        return Rule(
            to=self.to,
            task=self.task,
            min_prompt_tokens=self.min_prompt_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            needs=frozenset(self.needs),
        )


class RouterConfig(_Model):
    """:class:`latencykit.routing.Router`: ``rules`` in order, then the options."""

    rules: list[RuleConfig] = Field(
        default_factory=list, description="The rules, first match wins."
    )
    default: str | None = _option(Router, "default")
    fit_budget: bool = _option(Router, "fit_budget")
    quantile: float = _option(Router, "quantile")
    min_samples: int = _option(Router, "min_samples")

    def build(self) -> Router:
        """The :class:`~latencykit.routing.Router`."""
        return Router(
            *(rule.build() for rule in self.rules),
            default=self.default,
            fit_budget=self.fit_budget,
            quantile=self.quantile,
            min_samples=self.min_samples,
        )


class TargetConfig(_Model):
    """A failover :class:`latencykit.Target`."""

    model: str = _option(Target, "model")
    name: str = _option(Target, "name")
    api_base: str | None = _option(Target, "api_base")
    api_key: InlineKey = None
    api_key_env: str | None = Field(
        default=None,
        description="The environment variable holding the API key (a config never holds it).",
    )
    timeout: float | None = _option(Target, "timeout")
    context_window: int | None = _option(Target, "context_window")
    capabilities: list[str] = Field(
        default_factory=list, description=_arg_docs(Target).get("capabilities")
    )
    arguments: Arguments = Field(
        default_factory=dict, description=_arg_docs(Target).get("arguments")
    )
    transport: Literal["litellm", "openai"] = _option(Target, "transport")

    def build(self) -> Target:
        """The :class:`~latencykit.Target`."""
        return Target(
            self.model,
            name=self.name,
            api_base=self.api_base,
            api_key=_key(self.api_key_env, f"failover target {self.name or self.model!r}"),
            timeout=self.timeout,
            context_window=self.context_window,
            capabilities=frozenset(self.capabilities),
            arguments=self.arguments,
            transport=self.transport,
        )


class StoreConfig(_Model):
    """A :class:`latencykit.RedisStore` shared by the fleet (``url`` or ``url_env``)."""

    url: str | None = Field(
        default=None, description="The server's URL (prefer url_env when it holds a password)."
    )
    url_env: str | None = Field(
        default=None, description="The environment variable holding the URL."
    )
    namespace: str = _option(RedisStore, "namespace")
    interval: float = _option(RedisStore, "interval")
    timeout: float = _option(RedisStore, "timeout")
    stale_after: float | None = _option(RedisStore, "stale_after")

    def build(self) -> RedisStore:
        """The :class:`~latencykit.RedisStore` (nothing connects until a policy uses it)."""
        if self.url_env is not None:
            url = os.environ.get(self.url_env)
            if url is None:
                raise ValueError(f"store: url_env names {self.url_env!r}, which is not set")
        elif self.url is not None:
            url = self.url
        else:
            raise ValueError("store needs url or url_env")
        return RedisStore(
            url,
            namespace=self.namespace,
            interval=self.interval,
            timeout=self.timeout,
            stale_after=self.stale_after,
        )

    @classmethod
    def of(cls, store: object, url_env: str | None) -> StoreConfig:
        """The config of a :class:`~latencykit.RedisStore` (its URL only if it holds no
        password)."""
        if not isinstance(store, RedisStore):
            raise ValueError(f"LLM.shared is not a RedisStore ({store!r}): it has no config form")
        fields = _fields_of(cls, store)
        fields.pop("url", None)  # decided below: a URL may hold a password
        if url_env is not None:
            fields["url_env"] = url_env
        elif urlsplit(store.url).password is not None:
            raise ValueError("LLM.shared's URL holds a password: build it with url_env")
        else:
            fields["url"] = store.url
        if store.stale_after == max(1.0, 5 * store.interval):
            fields.pop("stale_after", None)  # the default, derived from the interval
        return cls(**fields)


def _target_config(target: object, index: int, built_from: object) -> str | TargetConfig:
    """The config of failover target ``index``; ``built_from``: the config it was built from,
    if any (its ``api_key_env`` names the key)."""
    where = f"LLM.failover[{index}]"
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):
        target = as_target(target, where=where)
    if not isinstance(target, Target):
        raise ValueError(f"{where} has no config form: {target!r}")
    fields = _fields_of(TargetConfig, target)
    env = built_from.api_key_env if isinstance(built_from, TargetConfig) else None
    fields["api_key_env"] = _key_env(fields.pop("api_key", None), env, f"{where}.api_key")
    _no_password(target.api_base, f"{where}.api_base")
    return TargetConfig(**fields)


def _key(env: str | None, where: str) -> str | None:
    if env is None:
        return None
    found = os.environ.get(env)
    if found is None:
        raise ValueError(f"{where}: api_key_env names {env!r}, which is not set")
    return found


def _key_env(key: object, env: str | None, where: str) -> str | None:
    """How a config names ``key``: the environment variable it was read from (``env``). A key
    with no such variable raises ``ValueError``: left out, it would be replaced by litellm's own
    lookup in the environment, which may send another provider's key to this host."""
    if key is None:
        return None
    if env is None:
        raise ValueError(
            f"{where} was given as a string, and a config never holds a secret: build the LLM "
            "from a config with api_key_env for its config to name the key's variable"
        )
    return env


def _no_password(url: object, where: str) -> None:
    if isinstance(url, str) and urlsplit(url).password is not None:
        raise ValueError(f"{where} holds a password, and a config never holds a secret")


class LLMConfig(_Model):
    """Everything :class:`latencykit.LLM` takes that is data (see its arguments)."""

    model: str = _option(LLM, "model")
    deadline: float | None = _option(LLM, "deadline")
    timeout: float = _option(LLM, "timeout")
    degrade: DegradeConfig | None = _option(LLM, "degrade")
    hedge: HedgeConfig | None = _option(LLM, "hedge")
    failover: list[str | TargetConfig] = Field(
        default_factory=list, description=_arg_docs(LLM).get("failover")
    )
    failover_on: Kinds | None = _option(LLM, "failover_on")
    retry: RetryConfig | None = _option(LLM, "retry")
    breaker: BreakerConfig | None = _option(LLM, "breaker")
    stream_guard: StreamGuardConfig | None = _option(LLM, "stream_guard")
    context_window: int | None = _option(LLM, "context_window")
    capabilities: list[str] = Field(
        default_factory=list, description=_arg_docs(LLM).get("capabilities")
    )
    api_base: str | None = _option(LLM, "api_base")
    api_key: InlineKey = None
    api_key_env: str | None = Field(
        default=None,
        description="The environment variable holding the API key (a config never holds it).",
    )
    transport: Literal["litellm", "openai"] = _option(LLM, "transport")
    defaults: Arguments = Field(default_factory=dict, description=_arg_docs(LLM).get("defaults"))
    limiter: LimiterConfig | None = _option(LLM, "limiter")
    cache: CacheConfig | None = _option(LLM, "cache")
    router: RouterConfig | None = _option(LLM, "router")
    max_output_tokens: int | None = _option(LLM, "max_output_tokens")
    budget_aware: bool = _option(LLM, "budget_aware")
    on_truncated: Literal["raise", "accept"] = _option(LLM, "on_truncated")
    shared: StoreConfig | None = _option(LLM, "shared")

    def build(self, kind: type[LLM] = LLM) -> LLM:
        """The :class:`~latencykit.LLM` this config describes (``kind``: a subclass to build
        instead; default ``LLM``)."""
        return kind(
            self.model,
            deadline=self.deadline,
            timeout=self.timeout,
            degrade=None if self.degrade is None else self.degrade.build(),
            hedge=None if self.hedge is None else self.hedge.build(),
            failover=[t if isinstance(t, str) else t.build() for t in self.failover],
            failover_on=_filter(self.failover_on),
            retry=None if self.retry is None else self.retry.build(),
            breaker=None if self.breaker is None else self.breaker.options(),
            stream_guard=None if self.stream_guard is None else self.stream_guard.build(),
            context_window=self.context_window,
            capabilities=frozenset(self.capabilities),
            api_base=self.api_base,
            api_key=_key(self.api_key_env, "LLM"),
            transport=self.transport,
            defaults=self.defaults or None,
            limiter=None if self.limiter is None else self.limiter.build(),
            cache=None if self.cache is None else self.cache.build(),
            router=None if self.router is None else self.router.build(),
            max_output_tokens=self.max_output_tokens,
            budget_aware=self.budget_aware,
            on_truncated=self.on_truncated,
            shared=None if self.shared is None else self.shared.build(),
        )

    @classmethod
    def of(cls, llm: LLM) -> LLMConfig:
        """The config of ``llm`` (what :meth:`LLM.to_config` returns, as a model).

        Raises ``ValueError`` naming the first option that is code (a predicate, a router
        function, a custom policy object) and so has no config form, or that holds a secret. A
        key read from an environment variable (``api_key_env``, for the ``LLM`` or a failover
        target) is written as that variable's name; any other secret (a key given as a
        string, a password in a URL, a key in ``Degrade`` overrides) raises rather than being
        left out, because an ``LLM`` rebuilt without it would send no key, or litellm's lookup
        in the environment would pick one meant for another provider.
        """
        given = llm._arguments
        found: dict[str, Any] = {"model": given["model"]}
        for name in ("deadline", "timeout"):
            if given[name] is not None:
                found[name] = _seconds(given[name])
        for name in (
            "context_window",
            "api_base",
            "transport",
            "max_output_tokens",
            "budget_aware",
            "on_truncated",
        ):
            found[name] = given[name]
        found["capabilities"] = sorted(given["capabilities"])
        found["defaults"] = dict(given["defaults"] or {})
        found["failover_on"] = _kinds_of(given["failover_on"], "LLM.failover_on")
        found["api_key_env"] = _key_env(given["api_key"], given["api_key_env"], "LLM.api_key")
        _no_password(given["api_base"], "LLM.api_base")
        if (degrade := given["degrade"]) is not None:
            found["degrade"] = DegradeConfig.of(degrade)
        if (policy := given["hedge"]) is not None:
            found["hedge"] = HedgeConfig.of(policy)
        if (retry := given["retry"]) is not None:
            found["retry"] = RetryConfig.of(retry)
        if (options := given["breaker"]) is not None:
            if not isinstance(options, Mapping):
                raise ValueError("LLM.breaker is a function: it has no config form")
            counts = options.get("counts")
            found["breaker"] = BreakerConfig(
                **{**options, "counts": _kinds_of(counts, "LLM.breaker.counts")}
            )
        if (guard := given["stream_guard"]) is not None:
            found["stream_guard"] = StreamGuardConfig(**_fields_of(StreamGuardConfig, guard))
        built_from = llm._configs.get("failover") or [None] * len(given["failover"])
        found["failover"] = [
            _target_config(target, i, entry)
            for i, (target, entry) in enumerate(zip(given["failover"], built_from, strict=True))
        ]
        if given["shared"] is not None:
            found["shared"] = StoreConfig.of(given["shared"], llm._configs.get("store_url_env"))
        for name in ("limiter", "cache", "router"):
            config = llm._configs.get(name)
            if given[name] is not None and config is None:
                raise ValueError(f"LLM.{name} was built in code: it has no config form")
            found[name] = config
        return cls(**{k: v for k, v in found.items() if v is not None})

    @classmethod
    def from_env(
        cls, prefix: str = ENV_PREFIX, *, base: Mapping[str, Any] | None = None
    ) -> LLMConfig:
        """The config in environment variables ``<prefix><FIELD>`` (``__`` between nested
        fields: ``LATENCYKIT_HEDGE__MAX_EXTRA_LOAD=0.05``), over ``base`` (default none).

        Each value is read as YAML (``10`` a number, ``true`` a boolean, ``[a, b]`` a list). A
        variable that names no option is an error naming it (``LATENCYKIT_DEDLINE``: did you
        mean ``LATENCYKIT_DEADLINE``?), except latencykit's own ``LATENCYKIT_GC_FREEZE``.
        """
        return load(dict(base or {}), env_prefix=prefix)


M = TypeVar("M", bound=BaseModel)
Path_ = tuple[str | int, ...]  # a field's path in a config: ("failover", 0, "api_base")


@overload
def load(
    source: str | os.PathLike[str] | Mapping[str, Any] | BaseModel,
    *,
    env_prefix: str | None = None,
) -> LLMConfig: ...
@overload
def load(
    source: str | os.PathLike[str] | Mapping[str, Any] | BaseModel,
    *,
    env_prefix: str | None = None,
    model: type[M],
) -> M: ...
def load(
    source: str | os.PathLike[str] | Mapping[str, Any] | BaseModel,
    *,
    env_prefix: str | None = None,
    model: type[BaseModel] = LLMConfig,
) -> BaseModel:
    """A config from a mapping, a model, or a ``.yaml``/``.yml``/``.json`` file, with the
    environment variables starting with ``env_prefix`` on top (default ``None``: none).

    ``model`` is the config's model (default :class:`LLMConfig`; any policy's, such as
    :class:`RetryConfig`, whose ``build()`` then makes the policy:
    ``load("retry.yaml", model=RetryConfig).build()``).

    A file that cannot be read as a config (not UTF-8, not YAML or JSON, a key given twice, not
    a mapping) raises ``ValueError`` naming the file and the line. Wrong options raise
    ``pydantic.ValidationError`` naming the file, each field's path and the line or the
    environment variable it came from, with the close match of a misspelt name.
    """
    lines: dict[Path_, int] = {}
    title = model.__name__
    if isinstance(source, BaseModel):
        data: dict[str, Any] = source.model_dump(exclude_unset=True)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        data, lines = _read(path)
        title = f"{title} from {path}"
    names: dict[Path_, str] = {}
    if env_prefix is not None:
        found, names = _env(env_prefix)
        data = _merge(data, found)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        # from None: this error says all the original did, plus where each value came from.
        raise _located(error, data, model, title, lines, names, env_prefix) from None


def _from_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | BaseModel,
    *,
    env_prefix: str | None = None,
) -> LLM:
    """What :meth:`LLM.from_config` does: :func:`load`, then the ``LLM``, which remembers the
    parts of its config that :meth:`LLM.to_config` cannot read off it (variables' names, and
    the limiter, cache and router configs). A constructor's ``ValueError`` names the file."""
    config = load(source, env_prefix=env_prefix)
    try:
        llm = config.build()
    except (ValueError, TypeError) as exc:
        if not isinstance(source, (str, os.PathLike)):
            raise
        where = f"config file {Path(source)}"
        if env_prefix is not None:
            where += f" with the environment variables {env_prefix}*"
        raise ValueError(f"{where}: {exc}") from None  # the message is the whole story
    llm._arguments["api_key_env"] = config.api_key_env
    llm._configs = {
        "limiter": config.limiter,
        "cache": config.cache,
        "router": config.router,
        "store_url_env": None if config.shared is None else config.shared.url_env,
        "failover": config.failover,
    }
    return llm


def _read(path: Path) -> tuple[dict[str, Any], dict[Path_, int]]:
    """A config file's mapping and the line of each field in it (YAML only)."""
    where = f"config file {path}"
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{where}: expected .yaml, .yml or .json")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{where}, line {line}: not UTF-8 text (byte {raw[exc.start]:#04x})"
        ) from None
    import yaml

    lines: dict[Path_, int] = {}
    if path.suffix == ".json":
        try:
            loaded = json.loads(text, object_pairs_hook=_once_each)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}, line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        with contextlib.suppress(yaml.YAMLError):
            lines = _yaml_with_lines(text)[1]  # JSON is YAML: read again for the lines only
    else:
        try:
            loaded, lines = _yaml_with_lines(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{where}{_yaml_problem(exc, text)}") from None
    if not isinstance(loaded, Mapping):
        raise ValueError(f"{where}: expected a mapping at the top level")
    return dict(loaded), lines


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, each key at most once (json.loads keeps the last one silently)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise json.JSONDecodeError(f"the key {key!r} is given twice", "", 0)
        found[key] = value
    return found


# YAML 1.2's scalars (its core schema). PyYAML reads YAML 1.1, where ``yes``, ``off`` and ``on``
# are booleans (``on:`` is an option name here), ``1:30`` is 90 (base 60), ``1_000`` is 1000,
# ``010`` is 8 and ``2024-05-13`` is a date: in YAML 1.2 these are strings (``010`` is 10).
_BOOL = r"true|True|TRUE|false|False|FALSE"
_INT = r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
_FLOAT = (
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_TAG = "tag:yaml.org,2002:"


@functools.cache
def _yaml_loader() -> type[Any]:
    """A safe YAML loader of YAML 1.2's booleans and numbers, refusing a key given twice."""
    import yaml

    def scalar(loader: Any, node: Any, pattern: str, what: str) -> str:
        text: str = loader.construct_scalar(node)
        if re.fullmatch(pattern, text) is None:  # an explicit tag: !!int 1_000
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not {what} in YAML 1.2", node.start_mark
            )
        return text

    def to_bool(loader: Any, node: Any) -> bool:
        return scalar(loader, node, _BOOL, "a boolean").lower() == "true"

    def to_int(loader: Any, node: Any) -> int:
        text = scalar(loader, node, _INT, "an integer")
        base = {"0o": 8, "0x": 16}.get(text[:2])
        return int(text) if base is None else int(text[2:], base)

    def to_float(loader: Any, node: Any) -> float:
        text = scalar(loader, node, _FLOAT, "a number").lower()
        if text.endswith(".inf"):
            return -math.inf if text.startswith("-") else math.inf
        return math.nan if text == ".nan" else float(text)

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[object, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != _TAG + "merge":
                    if key.value in seen:
                        raise yaml.constructor.ConstructorError(
                            f"while reading the mapping at line {node.start_mark.line + 1}",
                            node.start_mark,
                            f"the key {key.value!r} is given twice "
                            f"(first at line {seen[key.value]})",
                            key.start_mark,
                        )
                    seen[key.value] = key.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    replaced = {_TAG + name for name in ("bool", "int", "float", "timestamp")}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for name, pattern, first in (
        ("bool", _BOOL, "tTfF"),
        ("int", _INT, "-+0123456789"),
        ("float", _FLOAT, "-+.0123456789"),
    ):
        Loader.add_implicit_resolver(_TAG + name, re.compile(f"^(?:{pattern})$"), list(first))
    Loader.add_constructor(_TAG + "bool", to_bool)
    Loader.add_constructor(_TAG + "int", to_int)
    Loader.add_constructor(_TAG + "float", to_float)
    return Loader


def _yaml(text: str) -> Any:
    return _yaml_with_lines(text)[0]


def _yaml_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """The document in ``text`` and the line of each field in it."""
    import yaml

    loader = _yaml_loader()(text)  # a SafeLoader: no arbitrary objects
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
    lines: dict[Path_, int] = {}
    seen: set[int] = set()

    def walk(node: Any, path: Path_) -> None:
        if id(node) in seen:  # an alias: walked once, which also bounds an alias bomb
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [(key.value, value, key) for key, value in node.value]
        elif isinstance(node, yaml.SequenceNode):
            children = [(index, item, item) for index, item in enumerate(node.value)]
        else:
            return
        for name, child, marked in children:
            if isinstance(name, (str, int)):
                where = (*path, name)
                lines[where] = marked.start_mark.line + 1
                walk(child, where)

    if node is not None:
        walk(node, ())
    return data, lines


def _yaml_problem(exc: Exception, text: str) -> str:
    """``exc`` (a YAML error) as ``", line 3, column 5: what is wrong"``, without PyYAML's
    ``"<unicode string>"``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        parts = (getattr(exc, "context", None), getattr(exc, "problem", None))
        what = " ".join(part for part in parts if part)
        if "'\\t'" in what:
            what += " (indent with spaces: YAML does not allow tabs)"
        return f", line {mark.line + 1}, column {mark.column + 1}: {what}"
    position = getattr(exc, "position", None)
    if isinstance(position, int):  # a ReaderError: a character YAML does not allow
        line = text[:position].count("\n") + 1
        character = getattr(exc, "character", 0)
        return f", line {line}: the character #x{character:04x} is not allowed in YAML"
    return f": {exc}"


def _env(prefix: str) -> tuple[dict[str, Any], dict[Path_, str]]:
    """The options set by environment variables starting with ``prefix``, and the variable
    that set each."""
    import yaml

    found: dict[str, Any] = {}
    names: dict[Path_, str] = {}
    for name in sorted(os.environ):  # sorted: HEDGE before HEDGE__DELAY
        if not name.startswith(prefix) or name == prefix or name in _NOT_OPTIONS:
            continue
        path = tuple(name[len(prefix) :].lower().split("__"))
        text = os.environ[name]
        try:
            value = _yaml(text) if text else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"environment variable {name}{_yaml_problem(exc, text)}") from None
        node: Any = found
        for depth, part in enumerate(path, 1):
            if not isinstance(node, dict) or (depth == len(path) and part in node):
                other = next(v for k, v in names.items() if k == path[: len(k)])
                raise ValueError(
                    f"environment variables {other} and {name} both set {'.'.join(path)}"
                )
            if depth < len(path):
                node = node.setdefault(part, {})
        node[path[-1]] = value
        names[path] = name
    return found, names


def _located(
    error: ValidationError,
    data: Mapping[str, Any],
    model: type[BaseModel],
    title: str,
    lines: Mapping[Path_, int],
    names: Mapping[Path_, str],
    prefix: str | None,
) -> ValidationError:
    """``error``, each message followed by where its value came from (a file's line or an
    environment variable) and, for an unknown name, the known one it is closest to.

    A value that matches no member of a union (``failover: [str | TargetConfig]``) gets one
    error per member, each under the member's name (``failover.0.TargetConfig.timeout``): the
    names go, and so does a member's error when another member's goes deeper (the value was a
    ``TargetConfig``, so "should be a valid string" is noise)."""
    found = [(_in_data(item["loc"], data), item) for item in error.errors()]
    tagged = [loc for loc, item in found if loc != item["loc"]]
    details: list[Any] = []
    for loc, item in found:
        if loc != item["loc"] and any(len(o) > len(loc) and o[: len(loc)] == loc for o in tagged):
            continue
        notes: list[str] = []
        variable = next((names[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in names), None)
        if variable is not None:
            notes.append(f"environment variable {variable}")
        elif (line := _line(loc, lines)) is not None:
            notes.append(f"line {line}")
        if item["type"] == "extra_forbidden" and loc:
            known = _model_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), list(known.model_fields), n=1)
            if close and variable is not None and prefix is not None:
                spelled = "__".join([*(str(p) for p in loc[:-1]), close[0]]).upper()
                notes.append(f"did you mean {prefix}{spelled}?")
            elif close:
                notes.append(f"did you mean {close[0]!r}?")
        message = item["msg"] + (f" ({'; '.join(notes)})" if notes else "")
        details.append(
            {
                "type": PydanticCustomError(item["type"], message),
                "loc": loc,
                "input": item["input"],
            }
        )
    return ValidationError.from_exception_data(title, details)


def _in_data(loc: Path_, data: object) -> Path_:
    """``loc`` without the union members' names in it: only the keys and items of ``data``."""
    kept: list[str | int] = []
    for part in loc:
        is_item = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if is_item or (isinstance(data, Mapping) and part in data):
            data = data[part]  # type: ignore[index]  # a list's item or a mapping's key
        elif part in _field_names():
            data = None  # a missing field
        else:
            continue  # a union member's name: "float", "TargetConfig"
        kept.append(part)
    return tuple(kept)


@functools.cache
def _field_names() -> frozenset[str]:
    return frozenset(name for model in _Model.__subclasses__() for name in model.model_fields)


def _line(loc: Path_, lines: Mapping[Path_, int]) -> int | None:
    """The line of the deepest field of ``loc`` found in ``lines`` (``loc`` may hold a union
    member's name, as in ``("hedge", "delay", "QuantileConfig", "q")``, which no file has)."""
    path: Path_ = ()
    line = None
    for part in loc:
        if (*path, part) in lines:
            path = (*path, part)
            line = lines[path]
    return line


def _model_at(model: type[BaseModel], loc: Path_) -> type[BaseModel]:
    """The config model the field at ``loc`` belongs to (items, keys and union members'
    names on the way are passed over)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is not None:
            model = next(_models_in(field.annotation), model)
    return model


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The config models in a type (``list[str | TargetConfig]``: ``TargetConfig``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in getattr(annotation, "__args__", ()):
        yield from _models_in(argument)


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def schema() -> str:
    """The JSON Schema of :class:`LLMConfig`, as text (what ``python -m latencykit.config``
    prints, and docs/latencykit-config.schema.json holds)."""
    return json.dumps(LLMConfig.model_json_schema(), indent=2, sort_keys=True)


if __name__ == "__main__":
    print(schema())
