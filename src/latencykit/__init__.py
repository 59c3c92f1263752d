"""latencykit: client-side latency and resilience policies for LLM calls.

Public API only: what users call and catch daily, re-exported from the modules where it lives.
The rest is in documented submodules: ``latencykit.events`` (event types), ``latencykit.errors``
(classification), ``latencykit.pipeline`` (writing a policy), ``latencykit.policies.*`` (each
policy's options, breaker registry and stores), ``latencykit.stats`` (latency windows,
per-target statistics), ``latencykit.llm`` (``CallReport``), ``latencykit.turn`` (the stages'
``Ledger``), ``latencykit.routing`` (``Router``, ``Rule``), ``latencykit.fanout`` (``gather``'s
markers), ``latencykit.fleet`` (state shared by a fleet of processes: ``SharedStore``,
``StoreUnavailable``), ``latencykit.wrap`` (litellm's ``acompletion`` as a latencykit
attempt, for code guarded by the decorators); ``latencykit.cache`` (``ResponseCache``),
``latencykit.slow_calls`` (the slow-call log), ``latencykit.telemetry`` (OpenTelemetry),
``latencykit.fanout`` (with ``first`` and ``gather``), ``latencykit.autopilot`` (with ``SLO``)
and ``latencykit.policies.limiter`` are imported on first use.
``import latencykit`` never imports litellm (it takes seconds); litellm loads on first use.
"""

import typing as _typing

from . import errors as errors
from . import events as events
from . import fleet as fleet
from . import llm as llm
from . import pipeline as pipeline
from . import policies as policies
from . import routing as routing
from . import stats as stats
from . import turn as turn
from ._context import Attempt as Attempt
from ._context import remaining as remaining
from ._version import __version__ as __version__
from .budget import RetryBudget as RetryBudget
from .errors import AttemptTimeout as AttemptTimeout
from .errors import AuthenticationFailed as AuthenticationFailed
from .errors import BadRequest as BadRequest
from .errors import CircuitOpen as CircuitOpen
from .errors import ContentPolicyViolation as ContentPolicyViolation
from .errors import ContextLengthExceeded as ContextLengthExceeded
from .errors import DeadlineExceeded as DeadlineExceeded
from .errors import ErrorKind as ErrorKind
from .errors import FallbackFailed as FallbackFailed
from .errors import FirstTokenTimeout as FirstTokenTimeout
from .errors import LatencykitError as LatencykitError
from .errors import LimitExceeded as LimitExceeded
from .errors import ModelNotFound as ModelNotFound
from .errors import ProviderConnectionError as ProviderConnectionError
from .errors import ProviderError as ProviderError
from .errors import ProviderUnavailable as ProviderUnavailable
from .errors import RateLimited as RateLimited
from .errors import StreamBroken as StreamBroken
from .errors import StreamStalled as StreamStalled
from .errors import TransientError as TransientError
from .events import subscribe as subscribe
from .fleet import use_store as use_store
from .fleet.redis import RedisStore as RedisStore
from .llm import LLM as LLM
from .llm import Degrade as Degrade
from .llm import report as report
from .policies.breaker import Breaker as Breaker
from .policies.breaker import breaker as breaker
from .policies.deadline import deadline as deadline
from .policies.failover import failover as failover
from .policies.fallback import fallback as fallback
from .policies.guard import StreamGuard as StreamGuard
from .policies.guard import guard_stream as guard_stream
from .policies.guard import stream_guard as stream_guard
from .policies.hedge import Hedge as Hedge
from .policies.hedge import hedge as hedge
from .policies.hedge import quantile as quantile
from .policies.retry import Retry as Retry
from .policies.retry import retry as retry
from .stream import Stream as Stream
from .target import Target as Target
from .turn import ledger as ledger
from .turn import stage as stage

if _typing.TYPE_CHECKING:
    from . import cache as cache
    from . import fanout as fanout
    from . import slow_calls as slow_calls
    from . import telemetry as telemetry
    from .autopilot import SLO as SLO
    from .fanout import first as first
    from .fanout import gather as gather
else:
    # Loaded on first use, by those who use them (telemetry imports OpenTelemetry; an LLM
    # needs neither the fan-out helpers nor, without an SLO, the autopilot): name -> the
    # submodule that holds it.
    _LAZY = {
        "SLO": "autopilot",
        "cache": "cache",
        "fanout": "fanout",
        "first": "fanout",
        "gather": "fanout",
        "slow_calls": "slow_calls",
        "telemetry": "telemetry",
    }

    def __getattr__(name: str) -> _typing.Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'latencykit' has no attribute {name!r}")
        import importlib

        found = importlib.import_module(f"{__name__}.{module}")
        value = globals()[name] = found if module == name else getattr(found, name)
        return value  # kept: the next look-up does not come here

    def __dir__() -> list[str]:
        # What is loaded and what loads on first use: completion in a REPL shows both.
        return sorted({*globals(), *_LAZY})


__all__ = [
    "LLM",
    "Attempt",
    "AttemptTimeout",
    "AuthenticationFailed",
    "BadRequest",
    "Breaker",
    "CircuitOpen",
    "ContentPolicyViolation",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "Degrade",
    "ErrorKind",
    "FallbackFailed",
    "FirstTokenTimeout",
    "Hedge",
    "LatencykitError",
    "LimitExceeded",
    "ModelNotFound",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderUnavailable",
    "RateLimited",
    "RedisStore",
    "Retry",
    "RetryBudget",
    "SLO",
    "Stream",
    "StreamBroken",
    "StreamGuard",
    "StreamStalled",
    "Target",
    "TransientError",
    "breaker",
    "deadline",
    "failover",
    "fallback",
    "first",
    "gather",
    "guard_stream",
    "hedge",
    "ledger",
    "quantile",
    "remaining",
    "report",
    "retry",
    "stage",
    "stream_guard",
    "subscribe",
    "use_store",
]
