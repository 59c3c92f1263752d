"""latencykit: client-side latency and resilience policies for LLM calls.

Public API only; everything is re-exported from the private modules where it lives.
``import latencykit`` never imports litellm (it takes seconds); litellm loads on first use.
"""

from . import errors as errors
from . import events as events
from . import llm as llm
from . import pipeline as pipeline
from . import policies as policies
from . import stats as stats
from ._context import Attempt as Attempt
from ._context import Outcome as Outcome
from ._context import Trace as Trace
from ._context import current_attempt as current_attempt
from ._context import remaining as remaining
from .budget import RetryBudget as RetryBudget
from .errors import AttemptTimeout as AttemptTimeout
from .errors import AuthenticationFailed as AuthenticationFailed
from .errors import BadRequest as BadRequest
from .errors import ContentPolicyViolation as ContentPolicyViolation
from .errors import ContextLengthExceeded as ContextLengthExceeded
from .errors import DeadlineExceeded as DeadlineExceeded
from .errors import ErrorFilter as ErrorFilter
from .errors import ErrorKind as ErrorKind
from .errors import FallbackFailed as FallbackFailed
from .errors import FirstTokenTimeout as FirstTokenTimeout
from .errors import LatencykitError as LatencykitError
from .errors import ModelNotFound as ModelNotFound
from .errors import ProviderConnectionError as ProviderConnectionError
from .errors import ProviderError as ProviderError
from .errors import ProviderUnavailable as ProviderUnavailable
from .errors import RateLimited as RateLimited
from .errors import StreamBroken as StreamBroken
from .errors import StreamStalled as StreamStalled
from .errors import TransientError as TransientError
from .errors import classify as classify
from .errors import is_transient as is_transient
from .errors import retry_after as retry_after
from .events import AttemptEnded as AttemptEnded
from .events import AttemptStarted as AttemptStarted
from .events import CallEnded as CallEnded
from .events import DeadlineExpired as DeadlineExpired
from .events import Event as Event
from .events import EventHandler as EventHandler
from .events import FailedOver as FailedOver
from .events import FallbackUsed as FallbackUsed
from .events import FirstToken as FirstToken
from .events import HedgeFired as HedgeFired
from .events import HedgeSkipped as HedgeSkipped
from .events import HedgeWon as HedgeWon
from .events import StallDetected as StallDetected
from .events import StreamResumed as StreamResumed
from .events import Subscription as Subscription
from .events import TargetSkipped as TargetSkipped
from .events import subscribe as subscribe
from .llm import LLM as LLM
from .llm import CallReport as CallReport
from .llm import Degrade as Degrade
from .llm import report as report
from .pipeline import Call as Call
from .pipeline import Next as Next
from .pipeline import Pipeline as Pipeline
from .pipeline import Policy as Policy
from .pipeline import Stage as Stage
from .pipeline import compose as compose
from .policies.breaker import Breaker as Breaker
from .policies.breaker import BreakerMetrics as BreakerMetrics
from .policies.breaker import BreakerPermit as BreakerPermit
from .policies.breaker import BreakerRejected as BreakerRejected
from .policies.breaker import BreakerSnapshot as BreakerSnapshot
from .policies.breaker import BreakerState as BreakerState
from .policies.breaker import BreakerStateChanged as BreakerStateChanged
from .policies.breaker import BreakerStore as BreakerStore
from .policies.breaker import CircuitOpen as CircuitOpen
from .policies.breaker import InMemoryBreakerStore as InMemoryBreakerStore
from .policies.breaker import breaker as breaker
from .policies.breaker import breakers as breakers
from .policies.breaker import reset_breakers as reset_breakers
from .policies.deadline import Deadline as Deadline
from .policies.deadline import DeadlineScope as DeadlineScope
from .policies.deadline import deadline as deadline
from .policies.failover import Failover as Failover
from .policies.failover import Route as Route
from .policies.failover import failover as failover
from .policies.fallback import Fallback as Fallback
from .policies.fallback import FallbackReason as FallbackReason
from .policies.fallback import fallback as fallback
from .policies.guard import StreamGuard as StreamGuard
from .policies.guard import guard_stream as guard_stream
from .policies.guard import stream_guard as stream_guard
from .policies.hedge import Hedge as Hedge
from .policies.hedge import Quantile as Quantile
from .policies.hedge import hedge as hedge
from .policies.hedge import quantile as quantile
from .policies.retry import Retry as Retry
from .policies.retry import RetryGaveUp as RetryGaveUp
from .policies.retry import RetryScheduled as RetryScheduled
from .policies.retry import retry as retry
from .stats import LatencyWindow as LatencyWindow
from .stream import Stream as Stream
from .target import Target as Target

__version__ = "0.1.0.dev0"

__all__ = [
    "LLM",
    "Attempt",
    "AttemptEnded",
    "AttemptStarted",
    "AttemptTimeout",
    "AuthenticationFailed",
    "BadRequest",
    "Breaker",
    "BreakerMetrics",
    "BreakerPermit",
    "BreakerRejected",
    "BreakerSnapshot",
    "BreakerState",
    "BreakerStateChanged",
    "BreakerStore",
    "Call",
    "CallEnded",
    "CallReport",
    "CircuitOpen",
    "ContentPolicyViolation",
    "ContextLengthExceeded",
    "Deadline",
    "DeadlineExceeded",
    "DeadlineExpired",
    "DeadlineScope",
    "Degrade",
    "ErrorFilter",
    "ErrorKind",
    "Event",
    "EventHandler",
    "FailedOver",
    "Failover",
    "Fallback",
    "FallbackFailed",
    "FallbackReason",
    "FallbackUsed",
    "FirstToken",
    "FirstTokenTimeout",
    "Hedge",
    "HedgeFired",
    "HedgeSkipped",
    "HedgeWon",
    "InMemoryBreakerStore",
    "LatencyWindow",
    "LatencykitError",
    "ModelNotFound",
    "Next",
    "Outcome",
    "Pipeline",
    "Policy",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderUnavailable",
    "Quantile",
    "RateLimited",
    "Retry",
    "RetryBudget",
    "RetryGaveUp",
    "RetryScheduled",
    "Route",
    "Stage",
    "StallDetected",
    "StreamResumed",
    "Stream",
    "StreamBroken",
    "StreamGuard",
    "StreamStalled",
    "Subscription",
    "Target",
    "TargetSkipped",
    "Trace",
    "TransientError",
    "breaker",
    "breakers",
    "classify",
    "compose",
    "current_attempt",
    "deadline",
    "failover",
    "fallback",
    "guard_stream",
    "hedge",
    "is_transient",
    "quantile",
    "remaining",
    "report",
    "reset_breakers",
    "retry",
    "retry_after",
    "stream_guard",
    "subscribe",
]
