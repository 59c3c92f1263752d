"""The built-in policies, one per module.

The policies themselves are at the top level (``lk.hedge``, ``lk.Hedge``, ...); each module
also holds what only some users need: the breaker's state, metrics and stores
(:mod:`latencykit.policies.breaker`), the retry policy's events, the fallback's reasons, the
adaptive hedging delay, the limiter and its tenant quotas (:mod:`latencykit.policies.limiter`).
"""

import typing as _typing

from . import breaker as breaker
from . import deadline as deadline
from . import failover as failover
from . import fallback as fallback
from . import guard as guard
from . import hedge as hedge
from . import retry as retry

if _typing.TYPE_CHECKING:
    from . import limiter as limiter
else:

    def __getattr__(name: str) -> _typing.Any:
        # The limiter (and its fair queue) loads on first use: an LLM never needs it.
        if name == "limiter":
            import importlib

            return importlib.import_module(f"{__name__}.limiter")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
