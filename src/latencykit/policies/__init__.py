"""The built-in policies, one per module.

The policies themselves are at the top level (``lk.hedge``, ``lk.Hedge``, ...); each module
also holds what only some users need: the breaker's state, metrics and stores
(:mod:`latencykit.policies.breaker`), the retry policy's events, the fallback's reasons, the
adaptive hedging delay, the limiter and its tenant quotas (:mod:`latencykit.policies.limiter`).
"""

from . import breaker as breaker
from . import deadline as deadline
from . import failover as failover
from . import fallback as fallback
from . import guard as guard
from . import hedge as hedge
from . import limiter as limiter
from . import retry as retry
