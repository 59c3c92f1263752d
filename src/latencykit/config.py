"""Configuration as data: an ``LLM`` and its policies from a dict, a YAML or JSON file, or
environment variables, and back.

Each option is declared once, by the constructor that takes it: its annotated signature says
its type and default, its docstring's ``Args:`` its description. The models here are derived
from those signatures (:func:`_derive`), so an option cannot drift between the code and the
config; only the options that are code (a predicate, a router function, a custom store, a
clock) are left out. Models are frozen pydantic models that reject unknown keys, naming the
field's path (``hedge.max_extra_lod: Extra inputs are not permitted``); the constructors then
check what they always check.

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

import collections.abc
import contextlib
import dataclasses
import datetime
import difflib
import functools
import inspect
import json
import operator
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
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
    create_model,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ._docstrings import arguments
from ._litellm import GC_FREEZE_VARIABLE
from .autopilot import SLO
from .cache import ResponseCache
from .errors import ErrorKind, classify
from .fleet.redis import RedisStore
from .llm import LLM, Degrade
from .policies.breaker import breaker
from .policies.guard import StreamGuard
from .policies.hedge import Hedge, Quantile
from .policies.limiter import Limiter, Quota
from .policies.retry import Retry
from .routing import Router, Rule
from .target import TRANSPORTS, Target, as_target

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
    "SLOConfig",
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


# --- error filters --------------------------------------------------------------------------


class KindFilter:
    """An error filter made of error kinds: ``KindFilter({ErrorKind.TIMEOUT})(exc)`` is whether
    ``classify(exc)`` is one of them. What a config's ``on: [timeout, rate_limited]`` builds."""

    __slots__ = ("kinds",)

    def __init__(self, kinds: Iterable[ErrorKind]) -> None:
        self.kinds = frozenset(kinds)

    def __call__(self, exc: BaseException) -> bool:
        """Whether ``exc`` is of one of the kinds."""
        return classify(exc) in self.kinds

    def __repr__(self) -> str:
        return f"KindFilter({sorted(kind.value for kind in self.kinds)!r})"


# Not strict: a kind is written by its name ("timeout").
Kinds = list[Annotated[ErrorKind, Strict(False)]]


class _ErrorFilter:
    """Stands for :data:`~latencykit.errors.ErrorFilter` (a type alias written as a string)
    while a signature is read: its config form is :data:`Kinds`."""


# --- secrets ----------------------------------------------------------------------------------

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
_KEY_ENV = Field(
    default=None,
    description="The environment variable holding the API key (a config never holds it).",
)


# --- models derived from the constructors ------------------------------------------------------

M = TypeVar("M", bound=BaseModel)
Path_ = tuple[str | int, ...]  # a field's path in a config: ("failover", 0, "api_base")


class _Model(BaseModel):
    """A policy's options as data; :meth:`build` makes the policy, :meth:`of` reads one back."""

    # strict: a number field takes a number, not a bool or "5" (as the constructors do).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    if typing.TYPE_CHECKING:  # the fields derived from a constructor's signature

        def __getattr__(self, name: str) -> Any: ...

    def options(self) -> dict[str, Any]:
        """The constructor's arguments this config gives, by name (nested configs built)."""
        form = _FORMS[type(self)]
        return {name: form.code(name, value) for name, value in self if name in form.parameters}

    def build(self) -> Any:
        """The object this config describes (``load(path, model=RetryConfig).build()``)."""
        form = _FORMS[type(self)]
        found = self.options()
        star = found.pop(form.star) if form.star else ()
        return form.owner(*star, **found)  # no owner has positional-only parameters

    @classmethod
    def of(cls: type[M], obj: object, where: str = "") -> M:
        """The config of ``obj``, read off its attributes of the options' names: ``ValueError``
        naming the first option that is code, with no config form."""
        return cls(**_data_of(cls, obj, where or _FORMS[cls].owner.__name__))


C = TypeVar("C", bound=_Model)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Form:
    """How a derived model maps to its constructor."""

    owner: Callable[..., Any]
    parameters: frozenset[str]  # the fields that are the constructor's arguments
    star: str | None  # the ``*args`` field (a router's rules)
    # what takes a field's list: an error filter's kinds a KindFilter, a set's items a frozenset
    collect: Mapping[str, Callable[[list[Any]], Any]]

    def code(self, name: str, value: Any) -> Any:
        """A field's value as the constructor takes it."""
        if value is not None and name in self.collect:
            return self.collect[name](value)
        return _built(value)


_FORMS: dict[type[BaseModel], _Form] = {}
_CONFIGS: dict[type, type[_Model]] = {}  # a policy's class -> its config model


def _built(value: Any) -> Any:
    if isinstance(value, _Model):
        return value.build()
    if isinstance(value, list):
        return [_built(item) for item in value]
    if isinstance(value, dict):
        return {key: _built(item) for key, item in value.items()}
    return value


def _options_of(
    owner: Callable[..., Any],
    *,
    override: Mapping[str, Any] | None = None,
    skip: frozenset[str] = frozenset(),
) -> Callable[[type[C]], type[C]]:
    """Derive the decorated model's fields from ``owner``'s options: one per parameter whose
    type has a data form (or is given in ``override``), with the parameter's default and its
    description in ``owner``'s docstring. ``skip``: parameters that are not options (a
    breaker's key); fields the model declares itself are kept as they are."""

    def derive(cls: type[C]) -> type[C]:
        hints = _hints(owner)
        docs = arguments(inspect.getdoc(owner))
        fields: dict[str, Any] = {}
        star, collect = None, {}
        for parameter in inspect.signature(owner).parameters.values():
            name, hint = parameter.name, hints.get(parameter.name)
            data = (override or {}).get(name) or _data(hint)
            if name in skip or name in cls.model_fields or data is None:
                continue
            if parameter.kind is parameter.VAR_POSITIONAL:
                star, data = name, types.GenericAlias(list, (data,))
            fields[name] = (data, _field(owner, parameter, docs.get(name)))
            if (collector := _collector(hint)) is not None:
                collect[name] = collector
        model: type[C] = create_model(
            cls.__name__, __base__=cls, __doc__=cls.__doc__, __module__=__name__, **fields
        )
        _FORMS[model] = _Form(owner, frozenset(fields), star, collect)
        if isinstance(owner, type):
            _CONFIGS[owner] = model
        return model

    return derive


_NEW = ("__init__", "__new__")


def _hints(owner: Any) -> dict[str, Any]:
    """The types of ``owner``'s parameters (:class:`_ErrorFilter` for an ``ErrorFilter``)."""
    # SLO: imported by latencykit.llm for type checking only (it loads on first use there).
    namespace = {**vars(sys.modules[owner.__module__]), "ErrorFilter": _ErrorFilter, "SLO": SLO}
    if isinstance(owner, type):  # the constructor that declares the options
        owner = getattr(owner, next(n for k in owner.__mro__ for n in _NEW if n in vars(k)))
    return typing.get_type_hints(owner, globalns=namespace)


def _collector(hint: Any) -> Callable[[list[Any]], Any] | None:
    """What takes the list a config holds for a parameter of type ``hint``, when it is not a
    list: an error filter's kinds a :class:`KindFilter`, a set's items a ``frozenset``."""
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if is_union else (hint,)
    if _ErrorFilter in members:
        return KindFilter
    if any(typing.get_origin(m) in (set, frozenset) for m in members):
        return frozenset
    return None


_COLLECTIONS = (set, frozenset, list, collections.abc.Sequence, collections.abc.Collection)


def _data(hint: Any) -> Any:
    """The config form of a parameter's type (``float | timedelta``: ``float``; a policy: its
    config model; an error filter: :data:`Kinds`), or ``None``: code, no config form."""
    if hint in (bool, int, float, str, type(None)) or typing.get_origin(hint) is Literal:
        return hint
    if hint is datetime.timedelta:
        return float
    if hint is _ErrorFilter:
        return Kinds
    return _CONFIGS.get(hint) or _generic_data(typing.get_origin(hint), typing.get_args(hint))


def _generic_data(origin: Any, args: tuple[Any, ...]) -> Any:
    """The config form of a union (its members' forms), a collection (a list) or a mapping
    (a dict; of any litellm arguments: :data:`Arguments`)."""
    if origin in (typing.Union, types.UnionType):
        found = [m for m in dict.fromkeys(map(_data, args)) if m is not None]
        return functools.reduce(operator.or_, found) if set(found) - {type(None)} else None
    if origin in _COLLECTIONS and (item := _data(args[0])) is not None:
        return types.GenericAlias(list, (item,))
    if origin is collections.abc.Mapping:
        return Arguments if args[1] is Any else _dict_of(_data(args[1]))
    return None


def _dict_of(value: Any) -> Any:
    return None if value is None else types.GenericAlias(dict, (str, value))


def _field(owner: Callable[..., Any], parameter: inspect.Parameter, doc: str | None) -> Any:
    """A pydantic ``Field`` with the parameter's default (as data) and description."""
    if parameter.kind is parameter.VAR_POSITIONAL:
        return Field(default_factory=list, description=doc)
    if dataclasses.is_dataclass(owner):
        factory = next(f for f in dataclasses.fields(owner) if f.name == parameter.name)
        if factory.default_factory is not dataclasses.MISSING:
            empty = type(_as_data(factory.default_factory(), ""))  # dict or list
            return Field(default_factory=empty, description=doc)
    if parameter.default is parameter.empty:
        return Field(default=..., description=doc)
    return Field(default=_as_data(parameter.default, ""), description=doc)


def _as_data(value: Any, where: str) -> Any:
    """``value`` (an option as its object holds it) as config data: seconds for a
    ``timedelta``, a list of kinds for a :class:`KindFilter`, a policy object's config;
    ``ValueError`` naming ``where`` for code."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, KindFilter):
        return sorted(value.kinds, key=lambda kind: kind.value)
    if isinstance(value, (Mapping, frozenset, set, list, tuple)):
        return _collection_as_data(value, where)
    model = _CONFIGS.get(type(value))
    if model is None:
        raise ValueError(f"{where} is code ({value!r}): it has no config form")
    return model.of(value, where)


def _collection_as_data(value: Any, where: str) -> Any:
    """A mapping as a dict, a set as a sorted list, a sequence as a list, items as data."""
    if isinstance(value, Mapping):
        return {key: _as_data(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    return [_as_data(item, f"{where}[{i}]") for i, item in enumerate(value)]


_MISSING = object()


def _data_of(model: type[BaseModel], obj: object, where: str) -> dict[str, Any]:
    """``model``'s fields read off ``obj`` (a mapping's keys or an object's attributes), as
    data."""
    get: Callable[[str, object], Any]
    get = obj.get if isinstance(obj, Mapping) else functools.partial(getattr, obj)
    found = {name: get(name, _MISSING) for name in model.model_fields}
    return {k: _as_data(v, f"{where}.{k}") for k, v in found.items() if v is not _MISSING}


# --- the models ---------------------------------------------------------------------------------


@_options_of(Quantile)
class QuantileConfig(_Model):
    """An adaptive hedging delay (:class:`latencykit.quantile`)."""


@_options_of(SLO)
class SLOConfig(_Model):
    """:class:`latencykit.SLO` (the autopilot's objective)."""


@_options_of(Hedge)
class HedgeConfig(_Model):
    """:class:`latencykit.hedge`; ``delay`` is seconds or ``{"q": 0.9, ...}`` (adaptive)."""


@_options_of(Retry)
class RetryConfig(_Model):
    """:class:`latencykit.Retry`."""


@_options_of(breaker, skip=frozenset({"key"}))
class BreakerConfig(_Model):
    """The options of each target's :func:`latencykit.breaker` (the key is the target's)."""

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~latencykit.breaker` but its key (a count window's
        size as an int)."""
        found = super().options()
        if found["window_type"] == "count":
            found["window_size"] = int(found["window_size"])
        return found

    def build(self) -> dict[str, Any]:
        """:meth:`options`: a breaker needs its key too (``lk.breaker(key, **config.build())``);
        ``LLM(breaker=...)`` takes these options and gives each target's."""
        return self.options()


@_options_of(StreamGuard)
class StreamGuardConfig(_Model):
    """:class:`latencykit.StreamGuard`."""


@_options_of(Degrade)
class DegradeConfig(_Model):
    """:class:`latencykit.Degrade`."""

    @classmethod
    def of(cls, obj: object, where: str = "LLM.degrade") -> DegradeConfig:
        """The config of a :class:`~latencykit.Degrade` (``ValueError`` if its overrides hold
        a secret: an ``api_key``, a password in ``api_base``)."""
        overrides = getattr(obj, "overrides", {})
        if "api_key" in overrides:
            raise ValueError(f"{where}.overrides.api_key is a secret, and a config never holds one")
        _no_password(overrides.get("api_base"), f"{where}.overrides.api_base")
        return super().of(obj, where)


@_options_of(Quota)
class QuotaConfig(_Model):
    """:class:`latencykit.policies.limiter.Quota`."""


@_options_of(Limiter)
class LimiterConfig(_Model):
    """:class:`latencykit.policies.limiter.Limiter`."""


@_options_of(ResponseCache)
class CacheConfig(_Model):
    """:class:`latencykit.cache.ResponseCache` (in memory)."""


@_options_of(Rule)
class RuleConfig(_Model):
    """:class:`latencykit.routing.Rule`."""


@_options_of(Router)
class RouterConfig(_Model):
    """:class:`latencykit.routing.Router`: ``rules`` in order, then the options."""


_TRANSPORT = Literal[TRANSPORTS]  # type: ignore[valid-type]


@_options_of(Target, override={"api_key": InlineKey, "transport": _TRANSPORT})
class TargetConfig(_Model):
    """A failover :class:`latencykit.Target`."""

    api_key_env: str | None = _KEY_ENV

    def build(self) -> Target:
        """The :class:`~latencykit.Target` (its key read from ``api_key_env``)."""
        found = self.options()
        where = f"failover target {found['name'] or found['model']!r}"
        return Target(**{**found, "api_key": _variable(self.api_key_env, f"{where}: api_key_env")})


@_options_of(RedisStore)
class StoreConfig(_Model):
    """A :class:`latencykit.RedisStore` shared by the fleet (``url`` or ``url_env``)."""

    url: str | None = Field(
        default=None, description="The server's URL (prefer url_env when it holds a password)."
    )
    url_env: str | None = Field(
        default=None, description="The environment variable holding the URL."
    )

    def build(self) -> RedisStore:
        """The :class:`~latencykit.RedisStore` (nothing connects until a policy uses it)."""
        url = self.url if self.url_env is None else _variable(self.url_env, "store: url_env")
        if url is None:
            raise ValueError("store needs url or url_env")
        return RedisStore(url, **self.options())


def _store_config(store: object, url_env: str | None) -> StoreConfig:
    """The config of ``LLM.shared`` (its URL only if it holds no password)."""
    if not isinstance(store, RedisStore):
        raise ValueError(f"LLM.shared is not a RedisStore ({store!r}): it has no config form")
    fields = _data_of(StoreConfig, store, "LLM.shared")
    fields.pop("url", None)  # decided below: a URL may hold a password
    if url_env is not None:
        fields["url_env"] = url_env
    elif urlsplit(store.url).password is not None:
        raise ValueError("LLM.shared's URL holds a password: build it with url_env")
    else:
        fields["url"] = store.url
    if store.stale_after == max(1.0, 5 * store.interval):
        fields.pop("stale_after", None)  # the default, derived from the interval
    return StoreConfig(**fields)


def _target_config(target: object, index: int, built_from: object) -> str | TargetConfig:
    """The config of failover target ``index``; ``built_from``: the config it was built from,
    if any (its ``api_key_env`` names the key)."""
    if isinstance(target, str):
        return target
    where = f"LLM.failover[{index}]"
    target = as_target(target, where=where)  # a dict as the target it made (LLM checked it)
    fields = _data_of(TargetConfig, target, where)
    env = built_from.api_key_env if isinstance(built_from, TargetConfig) else None
    fields["api_key_env"] = _key_env(fields.pop("api_key", None), env, f"{where}.api_key")
    _no_password(target.api_base, f"{where}.api_base")
    return TargetConfig(**fields)


def _variable(env: str | None, where: str) -> str | None:
    """The value of environment variable ``env`` (``None`` for none), which must be set:
    ``where`` is the field that names it (``"store: url_env"``)."""
    if env is None:
        return None
    found = os.environ.get(env)
    if found is None:
        raise ValueError(f"{where} names {env!r}, which is not set")
    return found


def _key_env(key: object, env: str | None, where: str) -> str | None:
    """How a config names ``key``: the environment variable it was read from (``env``). A key
    with no such variable raises ``ValueError``: left out, it would be replaced by litellm's own
    lookup in the environment, which may send another provider's key to this host."""
    if key is not None and env is None:
        raise ValueError(
            f"{where} was given as a string, and a config never holds a secret: build the LLM "
            "from a config with api_key_env for its config to name the key's variable"
        )
    return None if key is None else env


def _no_password(url: object, where: str) -> None:
    if isinstance(url, str) and urlsplit(url).password is not None:
        raise ValueError(f"{where} holds a password, and a config never holds a secret")


# LLM options whose config form is not their type's: a failover target is a model string or
# a target's config, a breaker a dict of options, a limiter, cache, router or store built in
# code has none (they come from the config the LLM was built from).
_LLM_TYPES = {
    "failover": list[str | TargetConfig],
    "breaker": BreakerConfig | None,
    "limiter": LimiterConfig | None,
    "cache": CacheConfig | None,
    "router": RouterConfig | None,
    "shared": StoreConfig | None,
    "api_key": InlineKey,
    "transport": _TRANSPORT,
}


def _remembered(given: Mapping[str, Any], configs: Mapping[str, Any]) -> dict[str, Any]:
    """The limiter, cache and router configs an LLM was built from (see :func:`_from_config`):
    built in code, they have no config form."""
    for name in ("limiter", "cache", "router"):
        if given[name] is not None and configs.get(name) is None:
            raise ValueError(f"LLM.{name} was built in code: it has no config form")
    return {name: configs.get(name) for name in ("limiter", "cache", "router")}


@_options_of(LLM, override=_LLM_TYPES)
class LLMConfig(_Model):
    """Everything :class:`latencykit.LLM` takes that is data (see its arguments)."""

    api_key_env: str | None = _KEY_ENV
    if typing.TYPE_CHECKING:  # the fields LLM's signature declares

        def __init__(self, **data: Any) -> None: ...

    def build(self, kind: type[LLM] = LLM) -> LLM:
        """The :class:`~latencykit.LLM` this config describes (``kind``: a subclass to build
        instead; default ``LLM``)."""
        return kind(
            **{**self.options(), "api_key": _variable(self.api_key_env, "LLM: api_key_env")}
        )

    @classmethod
    def of(cls, obj: object, where: str = "LLM") -> LLMConfig:
        """The config of an :class:`~latencykit.LLM` (what :meth:`LLM.to_config` returns, as a
        model).

        Raises ``ValueError`` naming the first option that is code (a predicate, a router
        function, a custom policy object) and so has no config form, or that holds a secret. A
        key read from an environment variable (``api_key_env``, for the ``LLM`` or a failover
        target) is written as that variable's name; any other secret (a key given as a
        string, a password in a URL, a key in ``Degrade`` overrides) raises rather than being
        left out, because an ``LLM`` rebuilt without it would send no key, or litellm's lookup
        in the environment would pick one meant for another provider.
        """
        if not isinstance(obj, LLM):
            raise TypeError(f"LLMConfig.of takes an LLM, got {obj!r}")
        given, configs = obj._arguments, obj._configs
        plain = {k: v for k, v in given.items() if k not in _LLM_TYPES and k != "api_key_env"}
        found = _data_of(cls, plain, where)
        found["api_key_env"] = _key_env(given["api_key"], given["api_key_env"], "LLM.api_key")
        _no_password(given["api_base"], "LLM.api_base")
        found["breaker"] = _as_data(given["breaker"], "LLM.breaker")
        built_from = configs.get("failover") or [None] * len(given["failover"])
        found["failover"] = [
            _target_config(target, i, entry)
            for i, (target, entry) in enumerate(zip(given["failover"], built_from, strict=True))
        ]
        if given["shared"] is not None:
            found["shared"] = _store_config(given["shared"], configs.get("store_url_env"))
        return cls(**found, **_remembered(given, configs))

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

    def checked(pattern: str, what: str, construct: Callable[[Any, Any], Any]) -> Any:
        def constructor(loader: Any, node: Any) -> Any:
            text = loader.construct_scalar(node)
            if re.fullmatch(pattern, text) is None:  # an explicit tag: !!int 1_000
                raise yaml.constructor.ConstructorError(
                    None, None, f"{text!r} is not {what} in YAML 1.2", node.start_mark
                )
            return construct(loader, node)

        return constructor

    def to_int(loader: Any, node: Any) -> int:  # 010 is 10, as YAML 1.1's constructor says 8
        text: str = loader.construct_scalar(node)
        return int(text, 0) if text[:2] in ("0o", "0x") else int(text)

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
    for name, pattern, first, what, construct in (
        ("bool", _BOOL, "tTfF", "a boolean", yaml.SafeLoader.construct_yaml_bool),
        ("int", _INT, "-+0123456789", "an integer", to_int),
        ("float", _FLOAT, "-+.0123456789", "a number", yaml.SafeLoader.construct_yaml_float),
    ):
        Loader.add_implicit_resolver(_TAG + name, re.compile(f"^(?:{pattern})$"), list(first))
        Loader.add_constructor(_TAG + name, checked(pattern, what, construct))
    return Loader


def _yaml(text: str) -> Any:
    """The document in ``text`` read as YAML 1.2 (also what ``lab tune --values`` reads)."""
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
    found: dict[str, Any] = {}
    names: dict[Path_, str] = {}
    for name in sorted(os.environ):  # sorted: HEDGE before HEDGE__DELAY
        if not name.startswith(prefix) or name == prefix or name in _NOT_OPTIONS:
            continue
        path = tuple(name[len(prefix) :].lower().split("__"))
        for other, set_by in names.items():  # one sets a field, or a field on the other's way
            if path[: len(other)] == other or other[: len(path)] == path:
                raise ValueError(
                    f"environment variables {set_by} and {name} both set {'.'.join(path)}"
                )
        names[path] = name
        node = found
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _env_value(name)
    return found, names


def _env_value(name: str) -> Any:
    """The value of environment variable ``name``, read as YAML (empty: ``""``)."""
    import yaml

    text = os.environ[name]
    try:
        return _yaml(text) if text else ""
    except yaml.YAMLError as exc:
        raise ValueError(f"environment variable {name}{_yaml_problem(exc, text)}") from None


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
        notes = _notes(loc, item["type"], model, lines, names, prefix)
        message = item["msg"] + (f" ({'; '.join(notes)})" if notes else "")
        error_type = PydanticCustomError(item["type"], message)
        details.append({"type": error_type, "loc": loc, "input": item["input"]})
    return ValidationError.from_exception_data(title, details)


def _notes(
    loc: Path_,
    kind: str,
    model: type[BaseModel],
    lines: Mapping[Path_, int],
    names: Mapping[Path_, str],
    prefix: str | None,
) -> list[str]:
    """Where the value at ``loc`` came from, and for an unknown name the known one closest."""
    notes: list[str] = []
    variable, line = _deepest(loc, names), _deepest(loc, lines)
    if variable is not None:
        notes.append(f"environment variable {variable}")
    elif line is not None:
        notes.append(f"line {line}")
    if kind == "extra_forbidden" and loc:
        known = _model_at(model, loc[:-1])
        for close in difflib.get_close_matches(str(loc[-1]), list(known.model_fields), n=1):
            spelled = "__".join([*map(str, loc[:-1]), close]).upper()
            shown = repr(close) if variable is None else f"{prefix}{spelled}"
            notes.append(f"did you mean {shown}?")
    return notes


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
    return frozenset(name for model in _FORMS for name in model.model_fields)


def _deepest(loc: Path_, table: Mapping[Path_, T]) -> T | None:
    """What ``table`` holds for the deepest field of ``loc`` it has (a file's line or an
    environment variable: a field left out, or set by a variable of its parent, has none)."""
    return next((table[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in table), None)


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
