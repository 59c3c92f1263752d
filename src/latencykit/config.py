"""Configuration as data: an ``LLM`` and its policies from a dict, a YAML or JSON file, or
environment variables, and back.

Each option's default and description come from the constructor that takes it (its signature
and its docstring's ``Args:``): the models here only say which options are data and of what
type, so a default cannot drift between the code and the config. Models are frozen pydantic
models that reject unknown keys, naming the field's path (``hedge.max_extra_lod: Extra inputs
are not permitted``); the constructors then check what they always check.

Options that are code (a predicate, a router function, a custom breaker factory, a cache
key) have no config form. Error filters (``on``, ``counts``, ``failover_on``) are lists of
:class:`~latencykit.ErrorKind` values (``["rate_limited", "timeout"]``). API keys are never
written by :meth:`LLMConfig.of`: give ``api_key_env``, the name of the variable that holds
the key, and it is read when the ``LLM`` is built.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, overload
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ._docstrings import arguments
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
from .target import Target

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


Kinds = list[ErrorKind]


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
    model_config = ConfigDict(frozen=True, extra="forbid")


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
    overrides: dict[str, Any] = Field(
        default_factory=dict, description=_arg_docs(Degrade).get("overrides")
    )

    def build(self) -> Degrade:
        """The :class:`~latencykit.Degrade`."""
        return Degrade(**self.model_dump(exclude={"on"}), on=_filter(self.on))

    @classmethod
    def of(cls, degrade: Degrade) -> DegradeConfig:
        """The config of a :class:`~latencykit.Degrade`."""
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
    api_key: SecretStr | None = Field(default=None, description="The API key (prefer api_key_env).")
    api_key_env: str | None = Field(
        default=None, description="The environment variable holding the API key."
    )
    timeout: float | None = _option(Target, "timeout")
    context_window: int | None = _option(Target, "context_window")
    capabilities: list[str] = Field(
        default_factory=list, description=_arg_docs(Target).get("capabilities")
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, description=_arg_docs(Target).get("arguments")
    )
    transport: Literal["litellm", "openai"] = _option(Target, "transport")

    def build(self) -> Target:
        """The :class:`~latencykit.Target`."""
        return Target(
            self.model,
            name=self.name,
            api_base=self.api_base,
            api_key=_key(self.api_key, self.api_key_env, "failover target"),
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


def _target_config(target: object, index: int) -> str | TargetConfig:
    where = f"LLM.failover[{index}]"
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):
        data = dict(target)
        if isinstance(data.get("api_key"), str):
            del data["api_key"]  # never written out
        return TargetConfig(**data)
    if isinstance(target, Target):
        fields = _fields_of(TargetConfig, target)
        fields.pop("api_key", None)
        return TargetConfig(**fields)
    raise ValueError(f"{where} has no config form: {target!r}")


def _key(key: SecretStr | None, env: str | None, where: str) -> str | None:
    if key is not None:
        return key.get_secret_value()
    if env is None:
        return None
    found = os.environ.get(env)
    if found is None:
        raise ValueError(f"{where}: api_key_env names {env!r}, which is not set")
    return found


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
    api_key: SecretStr | None = Field(default=None, description="The API key (prefer api_key_env).")
    api_key_env: str | None = Field(
        default=None, description="The environment variable holding the API key."
    )
    transport: Literal["litellm", "openai"] = _option(LLM, "transport")
    defaults: dict[str, Any] = Field(
        default_factory=dict, description=_arg_docs(LLM).get("defaults")
    )
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
            api_key=_key(self.api_key, self.api_key_env, "LLM"),
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
        function, a custom policy object) and so has no config form. An API key given as a
        string is left out: configs never hold secrets unless written by hand.
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
        if given["api_key_env"] is not None:
            found["api_key_env"] = given["api_key_env"]
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
        found["failover"] = [_target_config(t, i) for i, t in enumerate(given["failover"])]
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

        Each value is read as YAML (``10`` a number, ``true`` a boolean, ``[a, b]`` a list).
        """
        return cls.model_validate(_merge(dict(base or {}), _env(prefix)))


M = TypeVar("M", bound=BaseModel)


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
    """
    if isinstance(source, BaseModel):
        data: dict[str, Any] = source.model_dump(exclude_unset=True)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        if path.suffix not in (".yaml", ".yml", ".json"):
            raise ValueError(f"config file {path}: expected .yaml, .yml or .json")
        text = path.read_text(encoding="utf-8")
        loaded = json.loads(text) if path.suffix == ".json" else _yaml(text)
        if not isinstance(loaded, Mapping):
            raise ValueError(f"config file {path}: expected a mapping at the top level")
        data = dict(loaded)
    if env_prefix is not None:
        data = _merge(data, _env(env_prefix))
    return model.model_validate(data)


@functools.cache
def _yaml_loader() -> type[Any]:
    """YAML 1.2's booleans: only ``true``/``false``. YAML 1.1 (PyYAML's default) also reads
    ``on``, ``off``, ``yes`` and ``no`` as booleans, and ``on:`` is an option name here."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    return Loader


def _yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader: no arbitrary objects


def _env(prefix: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, text in os.environ.items():
        if not name.startswith(prefix) or name == prefix:
            continue
        path = name[len(prefix) :].lower().split("__")
        node = found
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _yaml(text) if text else ""
    return found


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
