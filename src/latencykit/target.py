"""Targets: where a call can go (a model, its endpoint, its key, its limits).

A :class:`Target` is one value object carried on every :class:`~latencykit.pipeline.Call`. Policies
know a target by its :attr:`Target.key` (breakers, latency windows, failover routes); the
``LLM`` turns it into litellm arguments with :meth:`Target.litellm_arguments`. A key belongs
to its target: it is sent only with that target's ``api_base``, never to another host.

For ``LLM``, a target is given as a litellm model string (``"openai/gpt-4o"``), a dict of litellm
arguments plus latencykit's own keys (``name``, ``context_window``, ``capabilities``,
``timeout``), or a ``Target``. For a decorated function, the target is the function itself:
``Target(name="module.fn")``, with no model.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import _validation
from .errors import scrub

__all__ = ["Endpoint", "Target", "as_target"]

TRANSPORTS = ("litellm", "openai")
_FORBIDDEN = {"max_retries", "num_retries", "stream", "messages"}


@dataclass(frozen=True, slots=True)
class Target:
    """One place a call can go.

    Attributes:
        model: the litellm model string (default ``""``: not an LLM target, e.g. a function).
        name: the target's identity in attempts, events, breakers and latency windows
            (default: ``model``). Two targets with the same name share that state.
        api_base: the endpoint (default ``None``: litellm's default for the provider).
            Credentials in it (``https://user:password@host/v1``) are shown as ``***`` and
            never sent, on either lane: litellm's HTTP transports disagree on them (aiohttp,
            its default, refuses the request; httpx sends them as Basic auth in place of the
            key). Give the key as ``api_key`` (sent as ``Authorization: Bearer``), or a proxy's
            own header in ``extra_headers``.
        api_key: the key for ``api_base`` (default ``None``: litellm's environment lookup);
            never shown in reprs, events or errors, never sent to another host.
        timeout: per-attempt timeout handed to litellm, constant per target so that litellm
            reuses its HTTP client (default ``None``: the ``LLM``'s ``timeout``).
        context_window: the model's context window in tokens (default ``None``: unknown).
        capabilities: tags of what the target supports (default empty), e.g.
            ``{"prefill"}``: accepts an assistant message prefill (used to continue a broken
            stream).
        arguments: other litellm arguments for this target (default empty).
        transport: how its requests are made (default ``"litellm"``: through
            ``litellm.acompletion``, any provider litellm supports). ``"openai"``: the fast
            lane, straight to an OpenAI-compatible chat-completions endpoint (``api_base``,
            default OpenAI's) over httpx, without litellm's per-chunk work; only for providers
            that speak that protocol (OpenAI, vLLM, SGLang, TGI, Ollama, Together, Groq,
            Fireworks, DeepSeek, OpenRouter, Mistral, ...). Without an ``api_base`` it goes to
            OpenAI (or ``OPENAI_BASE_URL``), so a model with another provider's prefix
            (``groq/...``) is refused (``ValueError``) and a name without a prefix is sent as
            it is; Azure (its own URL scheme and key header) is refused either way.
        dimensions: the length of the vectors the model embeds into (default ``None``:
            undeclared). :meth:`~latencykit.LLM.aembedding` fails over only between targets
            that declare the same dimensions (vectors of another length are useless to the
            index they go to), and refuses an answer of another length. A declaration: it is
            not sent (a call's own ``dimensions=`` is, and is then the length expected).
    """

    model: str = ""
    name: str = ""
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float | None = None
    context_window: int | None = None
    capabilities: frozenset[str] = frozenset()
    arguments: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    transport: str = "litellm"
    dimensions: int | None = None
    key: str = field(init=False, repr=False, compare=False)
    """The target's identity: its :attr:`name` (an attribute, read by every policy on every
    call)."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"target.transport must be one of {list(TRANSPORTS)}, got {self.transport!r}"
            )
        _validation.instance("target.model", self.model, str, "a model string")
        _validation.instance("target.name", self.name, str, "a string")
        if not self.name:
            if not self.model:
                raise ValueError("a target needs a model or a name")
            object.__setattr__(self, "name", self.model)
        object.__setattr__(self, "key", self.name)
        if self.api_base is not None:
            _validation.text("target.api_base", self.api_base, "URL")
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise TypeError("target.api_key must be a string")  # not shown: it is a secret
        if self.transport == "openai":
            _check_fast_lane(self.model, self.api_base)
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _validation.seconds("target.timeout", self.timeout))
        if self.context_window is not None:
            _validation.count("target.context_window", self.context_window)
        if self.dimensions is not None:
            _validation.count("target.dimensions", self.dimensions)
        tags = _validation.tags("target.capabilities", self.capabilities)
        object.__setattr__(self, "capabilities", tags)
        object.__setattr__(self, "arguments", _own_arguments(self.name, self.arguments))

    def __repr__(self) -> str:
        # The dataclass's repr (without api_key), with the credentials of api_base hidden.
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        if self.api_base is not None:
            shown["api_base"] = scrub(self.api_base)
        return "Target(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def endpoint(self) -> Endpoint:
        """Where this target's requests go, as telemetry may show it (no key, no path)."""
        return _endpoint(self.model, self.api_base)

    def supports(self, capability: str) -> bool:
        """Whether ``capability`` is among the target's :attr:`capabilities`."""
        return capability in self.capabilities

    def replace(self, **changes: Any) -> Target:
        """A copy with ``changes``. Moving to another ``api_base`` drops the key unless a new
        ``api_key`` is given: a key is never sent to another host."""
        if (
            "api_base" in changes
            and changes["api_base"] != self.api_base
            and "api_key" not in changes
        ):
            changes["api_key"] = None
        if "model" in changes and "name" not in changes and self.name == self.model:
            changes["name"] = ""  # named after its model: follow the new model
        return dataclasses.replace(self, **changes)

    def litellm_arguments(self, call: Mapping[str, Any] = MappingProxyType({})) -> dict[str, Any]:
        """The litellm arguments that send a call with arguments ``call`` to this target: the
        target's ``arguments`` as defaults, the call's, then the target's identity (model,
        endpoint, key, timeout), which a call cannot change."""
        arguments = {**self.arguments, **call, "model": self.model}
        if self.api_base is not None:
            arguments["api_base"] = without_credentials(self.api_base)
        if self.api_key is not None:
            arguments["api_key"] = self.api_key
        if self.timeout is not None:
            arguments["timeout"] = self.timeout
        return arguments


# A target's own fields, which its ``arguments`` (other litellm arguments) cannot set.
_OWN_KEYS = tuple(f.name for f in dataclasses.fields(Target) if f.init and f.name != "arguments")


def _own_arguments(name: str, arguments: object) -> Mapping[str, Any]:
    """A target's other litellm arguments, read-only (none that latencykit or a field owns)."""
    found = _validation.mapping("target.arguments", arguments)
    bad = sorted(set(found) & (_FORBIDDEN | set(_OWN_KEYS)))
    if bad:
        raise ValueError(
            f"target {name!r} cannot set {bad[0]!r} in arguments: "
            + ("latencykit owns it" if bad[0] in _FORBIDDEN else "it is a Target field")
        )
    return MappingProxyType(dict(found))


_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")


def without_credentials(url: str) -> str:
    """``url`` without its ``user:password@`` part, which is never sent (see
    :attr:`Target.api_base`)."""
    return _CREDENTIALS.sub(r"\1", url)


def _check_fast_lane(model: str, api_base: str | None) -> None:
    """Refuse ``transport="openai"`` where the fast lane would send the request to the wrong
    place: an Azure model (its own URL scheme and key header), or, without an ``api_base``,
    a model with another provider's prefix than ``openai/`` (the request would go to OpenAI's
    URL). Read from the prefix alone: a target never imports litellm."""
    provider = model.split("/", 1)[0] if "/" in model else None
    if provider == "azure":
        raise ValueError(
            f"target.transport='openai' cannot call {model!r}: Azure has its own URL scheme "
            "and key header; use transport='litellm'"
        )
    if api_base is None and provider not in (None, "openai"):
        raise ValueError(
            f"target.transport='openai' without an api_base sends to OpenAI, which does not "
            f"serve {model!r}: give the provider's OpenAI-compatible api_base, or use "
            "transport='litellm'"
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a target's requests go, as it may be shown in telemetry and events: never a key,
    credentials or a URL path.

    Attributes:
        model: the model the provider is asked for (the litellm model string without its
            provider prefix; ``""`` for a function target).
        provider: the provider litellm routes to (``"openai"``, ``"anthropic"``, ...; ``None``
            for a function target or when litellm cannot tell).
        address: the host of the target's ``api_base`` (``None``: the provider's default).
        port: the port of ``api_base``, given or implied by its scheme (``None`` with no
            address).
    """

    model: str
    provider: str | None = None
    address: str | None = None
    port: int | None = None


@functools.cache
def _endpoint(model: str, api_base: str | None) -> Endpoint:
    if not model:
        return Endpoint("")
    provider: str | None = None
    name = model
    import sys

    litellm = sys.modules.get("litellm")  # only if loaded: a function target never needs it
    if litellm is not None:
        try:
            name, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
        except Exception:  # litellm does not know the model: read its prefix
            provider = None
    if provider is None and "/" in model:
        provider, name = model.split("/", 1)
    address = port = None
    if api_base is not None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(api_base)
            address = parts.hostname
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
        except ValueError:  # not a URL we can read: show nothing rather than guess
            address = port = None
    return Endpoint(name, provider, address, port)


def as_target(spec: object, *, where: str = "target") -> Target:
    """A :class:`Target` from a model string, a dict of litellm arguments, or a Target.

    Unknown dict keys are litellm arguments for that target (``temperature``, ...).
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, str):
        return Target(_validation.text(where, spec, "model string"))
    if isinstance(spec, Mapping):
        if "model" not in spec:
            raise ValueError(f"{where} needs a 'model', got keys {sorted(spec)}")
        own = {k: spec[k] for k in _OWN_KEYS if k in spec}
        extra = {k: v for k, v in spec.items() if k not in _OWN_KEYS}
        try:
            return Target(**own, arguments=extra)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
    raise TypeError(f"{where} must be a model string, a dict of litellm arguments or a Target")
