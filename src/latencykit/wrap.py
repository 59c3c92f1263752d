"""Drop-in replacements for litellm's call functions (``acompletion``, ``aembedding``,
``aresponses``), for code that keeps its own calls.

An app that calls ``litellm.acompletion`` in its own functions, and guards those functions with
latencykit's decorators (``@lk.retry``, ``@lk.deadline``, ``@lk.hedge``, ...), swaps one import::

    from latencykit.wrap import acompletion  # was: from litellm import acompletion

    @lk.deadline(5)
    @lk.retry(max_attempts=3)
    async def answer(question: str) -> str:
        response = await acompletion(model="openai/gpt-4o-mini", messages=[...])
        return response.choices[0].message.content

Each call is one attempt made the way :class:`~latencykit.LLM` makes it (one target, no
policies of its own), so the decorators around it see what an ``LLM`` sees:

- failures are latencykit's typed errors (:class:`~latencykit.RateLimited`,
  :class:`~latencykit.ProviderUnavailable`, ...; litellm's exception is the ``__cause__``),
  classified by the one table whatever the provider, API keys scrubbed, carrying the attempts;
- litellm's own retries are off (passing ``num_retries``/``max_retries`` is refused): the
  decorator's retry is the only one, so ``@lk.retry(max_attempts=2)`` makes at most 2
  requests (with litellm's retries on, it made 6);
- ``stream=True`` returns a :class:`~latencykit.Stream` read by latencykit's content rule: it
  is complete only when the provider said so, a cut or a mid-stream error event raises
  :class:`~latencykit.StreamBroken` with the partial text, the first-token and stall limits
  apply (the attempt ``timeout``);
- the enclosing deadline (``lk.deadline``, ``lk.remaining()``) closes the HTTP request;
- the attempt is reported (``lk.report(result)``, events, OpenTelemetry) like an ``LLM``'s.

What the decorator form does not do, compared with :class:`~latencykit.LLM`: it has one
target per call (failover and hedging to another model are the app's, e.g. ``lk.first``), and
a hedge or retry decorator counts the decorated function as the attempt: the function's own
work (prompt building, parsing) is inside it.

``model``, ``api_base``, ``api_key`` and ``timeout`` name the target (``timeout``: the attempt
timeout, default 600 s as litellm's); the other arguments are litellm's. One ``LLM`` is kept
per target (at most :data:`KEPT_TARGETS`, least recently used first out).
"""

from __future__ import annotations

import functools
from typing import Any

from .llm import LLM

__all__ = ["KEPT_TARGETS", "acompletion", "aembedding", "aresponses"]

KEPT_TARGETS = 64
"""How many targets (model, endpoint, key, timeout) keep their ``LLM`` between calls."""


@functools.lru_cache(maxsize=KEPT_TARGETS)
def _llm(model: str, api_base: str | None, api_key: str | None, timeout: float) -> LLM:
    return LLM(model, api_base=api_base, api_key=api_key, timeout=timeout)


async def acompletion(
    *,
    model: str,
    api_base: str | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    **kwargs: Any,
) -> Any:
    """``litellm.acompletion(model=..., **kwargs)`` as one latencykit attempt (see the module).

    Returns litellm's ``ModelResponse``, or with ``stream=True`` a :class:`~latencykit.Stream`.
    Raises a :class:`~latencykit.ProviderError` subclass (``DeadlineExceeded`` when an
    enclosing deadline ends it). Invalid arguments raise ``ValueError``/``TypeError`` naming
    them, ``num_retries``/``max_retries`` too: retrying is the decorators' business.
    """
    return await _llm(model, api_base, api_key, timeout).acompletion(**kwargs)


async def aembedding(
    *,
    model: str,
    api_base: str | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    **kwargs: Any,
) -> Any:
    """``litellm.aembedding(model=..., **kwargs)`` as one latencykit attempt, as
    :func:`acompletion` makes a chat call (see :meth:`~latencykit.LLM.aembedding`)."""
    return await _llm(model, api_base, api_key, timeout).aembedding(**kwargs)


async def aresponses(
    *,
    model: str,
    api_base: str | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    **kwargs: Any,
) -> Any:
    """``litellm.aresponses(model=..., **kwargs)`` (OpenAI's Responses API) as one latencykit
    attempt, as :func:`acompletion` makes a chat call (see
    :meth:`~latencykit.LLM.aresponses`: complete only on ``response.completed``)."""
    return await _llm(model, api_base, api_key, timeout).aresponses(**kwargs)
