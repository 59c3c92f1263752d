"""Targets: where an ``LLM`` call can go (a model, its endpoint, its limits).

A target is given as a litellm model string (``"openai/gpt-4o"``) or a dict of litellm arguments
plus two latencykit keys: ``context_window`` (tokens; lets a context-length error go to a
larger model) and ``capabilities`` (free-form tags, e.g. ``{"prefill"}``). Everything else in
the dict (``api_base``, ``api_key``, ``timeout``, ...) is passed to litellm for that target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from . import _validation

__all__ = ["Target", "as_target"]

_LATENCYKIT_KEYS = {"model", "context_window", "capabilities", "timeout", "api_key", "name"}
_FORBIDDEN = {"max_retries", "num_retries", "stream", "messages"}


@dataclass(frozen=True, slots=True)
class Target:
    """One place an LLM call can go.

    Attributes:
        model: the litellm model string.
        name: how attempts, events and breakers call it (default: ``model``).
        timeout: per-attempt timeout handed to litellm, constant per target so litellm reuses
            its HTTP client (default ``None``: the ``LLM``'s ``timeout``).
        context_window: the model's context window in tokens (default ``None``: unknown).
        capabilities: free-form tags (default empty).
        api_key: the target's key (default ``None``: litellm's environment lookup); never
            shown in reprs.
        arguments: other litellm arguments for this target (``api_base``, ...).
    """

    model: str
    name: str = ""
    timeout: float | None = None
    context_window: int | None = None
    capabilities: frozenset[str] = frozenset()
    api_key: str | None = field(default=None, repr=False)
    arguments: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"target.model must be a non-empty model string, got {self.model!r}")
        if not self.name:
            object.__setattr__(self, "name", self.model)
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _validation.seconds("target.timeout", self.timeout))
        window = self.context_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise ValueError(f"target.context_window must be a positive int, got {window!r}")
        bad = sorted(set(self.arguments) & _FORBIDDEN)
        if bad:
            raise ValueError(f"target {self.name!r} cannot set {bad[0]!r}: latencykit owns it")
        object.__setattr__(self, "arguments", MappingProxyType(dict(self.arguments)))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))

    def litellm_arguments(self, default_timeout: float) -> dict[str, Any]:
        """The litellm arguments that send a call to this target."""
        arguments = {**self.arguments, "model": self.model}
        if self.api_key is not None:
            arguments["api_key"] = self.api_key
        arguments["timeout"] = self.timeout if self.timeout is not None else default_timeout
        return arguments


def as_target(spec: object, *, where: str = "target") -> Target:
    """A :class:`Target` from a model string, a dict of litellm arguments, or a Target."""
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, str):
        return Target(spec)
    if isinstance(spec, Mapping):
        if "model" not in spec:
            raise ValueError(f"{where} needs a 'model', got keys {sorted(spec)}")
        extra = {k: v for k, v in spec.items() if k not in _LATENCYKIT_KEYS}
        return Target(
            model=spec["model"],
            name=spec.get("name", ""),
            timeout=spec.get("timeout"),
            context_window=spec.get("context_window"),
            capabilities=frozenset(spec.get("capabilities", ())),
            api_key=spec.get("api_key"),
            arguments=extra,
        )
    raise TypeError(f"{where} must be a model string, a dict of litellm arguments or a Target")
