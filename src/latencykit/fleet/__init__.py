"""Fleet-wide state: breakers, budgets and quotas shared by every process of an app.

By default each process keeps its own state, in memory. ``lk.use_store(lk.RedisStore(url))``
moves it to a shared server, so that a provider outage seen by one process protects all of
them, a hedge budget caps the fleet's extra load, a tenant's quota is the tenant's, not each
process's, adaptive hedging learns from the fleet's latencies, and the governor paces the
fleet by one rate-limit room per provider key. A store can also be given to one policy or
``LLM`` (``shared=``).

The policies never wait for the store on the hot path. They read a local view that the store
refreshes in the background, and queue their outcomes, which it writes in batches. Only the
rare transitions that must be agreed by the fleet are round trips: taking a half-open probe
permit and taking from a quota. When the store is down, slow or answers garbage, every
policy goes on with its process-local state, and the store resynchronises on its own.

This module holds the process default; :class:`~latencykit.fleet.redis.RedisStore` is the
store, on Redis or Valkey (``SharedStore`` is its name in the policies' signatures).
"""

from __future__ import annotations

from .. import _validation
from ..events import StoreRecovered, StoreUnavailable
from .redis import RedisStore as SharedStore  # the one store there is
from .redis import SharedLatency as SharedLatency

__all__ = [
    "SharedLatency",
    "SharedStore",
    "StoreRecovered",
    "StoreUnavailable",
    "current_store",
    "use_store",
]

_current: SharedStore | None = None


def use_store(store: SharedStore | None) -> SharedStore | None:
    """Make ``store`` the process's default for every policy built without ``shared=``, and
    return the previous default.

    ``None`` (the initial default) keeps each process's state in its own memory. Policies
    look the default up at each use, so this may be called before or after they are built.
    """
    global _current
    _validation.optional("use_store", store, SharedStore, "a RedisStore")
    previous, _current = _current, store
    return previous


def current_store() -> SharedStore | None:
    """The process's default store (:func:`use_store`), ``None`` for process-local state."""
    return _current
