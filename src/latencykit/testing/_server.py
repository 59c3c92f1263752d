"""The public face of the fake provider: :class:`FakeProvider`.

The asyncio server itself lives in ``_engine`` and is imported on :meth:`FakeProvider.start`,
so that importing ``latencykit.testing`` stays cheap.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable

from ._behavior import Behavior
from ._quota import Ledger, ProviderQuota, QuotaUsage
from ._records import AttemptState, RecordedAttempt
from ._request import RequestInfo
from ._script import Resolver, Script

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

    from ._engine import Engine

Predicate = Callable[[list[RecordedAttempt]], bool]
"""A condition on the attempts recorded so far, for :meth:`FakeProvider.wait_for`."""

_REDACTED = frozenset({"authorization", "api-key", "x-api-key", "x-goog-api-key"})


def _describe(a: RecordedAttempt) -> str:
    if a.disconnected:
        outcome = "client disconnected"
    elif a.completed:
        outcome = "completed"
    elif a.first_byte_at is not None or a.status is not None:
        outcome = "in progress or cut by the server"
    else:
        outcome = "no response yet"
    fault = f" fault={a.fault.value}" if a.fault is not None else ""
    return (
        f"#{a.index} model={a.model!r} stream={a.stream}{fault} status={a.status} "
        f"tokens_sent={a.tokens_sent} conn={a.connection_id}: {outcome}"
    )


def _running_event_loop() -> str | None:
    """Name of the async framework running in this thread, if any."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return "trio"
    return None


class FakeProvider:
    """A fake LLM server on a real local socket, for tests and demos.

    It serves, over HTTP/1.1 with keep-alive, from an asyncio loop on a background daemon
    thread, three wire formats: OpenAI's ``POST /v1/chat/completions`` (JSON, or SSE with
    ``"stream": true``) and ``GET /v1/models`` (:attr:`base_url`); Anthropic's
    ``POST /v1/messages`` (:attr:`anthropic_base_url`); Gemini's
    ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``
    (:attr:`gemini_base_url`). Every behaviour and fault applies to each format. What each
    request gets is chosen per model with :meth:`script` (default: :attr:`default`, a fast
    16-token answer), or per request with an ``x-fake-behavior: {json}`` header. Every chat
    request is recorded as a :class:`RecordedAttempt`, including when the client disconnected.

    Args:
        port: TCP port to listen on; ``0`` (default) picks a free one.
        host: Address to bind; default ``"127.0.0.1"``.
        seed: Seed of the RNG used to sample latencies and passed to callable scripts;
            default ``0``, so runs are reproducible.
        quota: Rate limits per API key (:class:`ProviderQuota`), told in every answer's headers
            and enforced with 429s; default ``None``: no limit, no header.

    Use as a context manager (``with FakeProvider() as fake:``), which starts it and stops
    it on exit, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        seed: int = 0,
        quota: ProviderQuota | None = None,
    ) -> None:
        self._requested_port = port
        self._host = host
        self._seed = seed
        self._rng = random.Random(seed)
        self._cond = threading.Condition(threading.Lock())
        self._version = 0
        self._records: list[AttemptState] = []
        self._scripts: dict[str, Resolver] = {}
        self._default = Resolver(Behavior())
        self._per_model: dict[str, int] = {}
        self._connections_open = 0
        self._connections_opened = 0
        self._thread: threading.Thread | None = None
        self._engine: Engine | None = None
        self._port: int | None = None
        self._start_lock = threading.Lock()
        self._ledger: Ledger | None = None
        self.quota = quota

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeProvider:
        """Start the server thread and wait until it listens. Returns ``self``.

        Raises ``RuntimeError`` if already running, ``OSError`` if the port can't be bound.
        """
        from ._engine import Engine  # asyncio etc. are imported only here

        with self._start_lock:
            if self._thread is not None:
                raise RuntimeError("FakeProvider is already running")
            engine = Engine(self, self._host, self._requested_port)
            ready = threading.Event()
            failure: list[BaseException] = []

            def run() -> None:
                try:
                    engine.run(ready.set)
                except BaseException as exc:  # reported to start() below
                    failure.append(exc)
                finally:
                    ready.set()

            thread = threading.Thread(target=run, name="latencykit-fake-provider", daemon=True)
            thread.start()
            if not ready.wait(30.0):
                engine.request_stop()
                raise RuntimeError("FakeProvider did not start listening within 30 s")
            if failure:
                thread.join(5.0)
                raise failure[0]
            self._engine = engine
            self._thread = thread
            self._port = engine.port
        return self

    def stop(self) -> None:
        """Close the listener and all connections and join the thread. Safe to call twice."""
        with self._start_lock:
            thread, engine = self._thread, self._engine
            if thread is None or engine is None:
                return
            if threading.current_thread() is thread:
                raise RuntimeError("FakeProvider.stop() cannot be called from a script callable")
            engine.request_stop()
            thread.join(30.0)
            if thread.is_alive():
                raise RuntimeError("FakeProvider server thread did not stop within 30 s")
            self._thread = None
            self._engine = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server thread is running."""
        return self._thread is not None

    @property
    def host(self) -> str:
        """The bound address, default ``"127.0.0.1"``."""
        return self._host

    @property
    def port(self) -> int:
        """The listening TCP port (known once started)."""
        if self._port is None:
            if self._requested_port:
                return self._requested_port
            raise RuntimeError("FakeProvider has not been started: its port is not known yet")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to give clients, e.g. ``"http://127.0.0.1:54321/v1"``."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic base URL, the server's root, e.g. ``"http://127.0.0.1:54321"``:
        litellm's ``anthropic/<model>`` posts to ``{api_base}/v1/messages``."""
        return self.base_url.removesuffix("/v1")

    @property
    def gemini_base_url(self) -> str:
        """The Gemini base URL, e.g. ``"http://127.0.0.1:54321/v1beta"``: litellm's
        ``gemini/<model>`` posts to ``{api_base}/models/<model>:generateContent``."""
        return self.base_url.removesuffix("/v1") + "/v1beta"

    def __repr__(self) -> str:
        where = self.base_url if self._port is not None else "not started"
        return f"<FakeProvider {where}>"

    # ------------------------------------------------------------------ scripting

    def script(self, model: str, script: Script) -> None:
        """Choose what requests for ``model`` get, replacing any previous script.

        ``model`` is the name the server receives (litellm's ``"openai/slow"`` sends
        ``"slow"``; for Gemini it is the model named in the URL). ``script`` is one of:

        - a :class:`Behavior`: used for every request;
        - a sequence of Behavior: one per request, in order; the last one repeats forever;
        - a callable ``RequestInfo -> Behavior`` (such as an :class:`LlmperfProfile`),
          called on the server thread for each request.

        The ``x-fake-behavior`` request header, if present, overrides the script.
        """
        if not isinstance(model, str):
            raise TypeError(f"model must be a str, got {model!r}")
        resolver = Resolver(script)
        with self._cond:
            self._scripts[model] = resolver

    @property
    def default(self) -> Script:
        """The script for unscripted models. Default ``Behavior()``: no delay, 16 tokens.

        Accepts the same forms as :meth:`script`; :meth:`reset` leaves it unchanged.
        """
        return self._default.script

    @default.setter
    def default(self, script: Script) -> None:
        resolver = Resolver(script)
        with self._cond:
            self._default = resolver

    def reset(self) -> None:
        """Clear all scripts and recorded attempts, restart per-model counts, re-seed and
        refill every key's quota (:meth:`reset_quota`).

        :attr:`default`, :attr:`quota` and the connection counters are kept.
        """
        self.reset_quota()
        with self._cond:
            self._scripts.clear()
            self._records.clear()
            self._per_model.clear()
            self._rng.seed(self._seed)
            self._version += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ quota

    @property
    def quota(self) -> ProviderQuota | None:
        """The rate limits per API key, or ``None`` (default): no limit, no header.

        Setting it (also to another :class:`ProviderQuota`) starts every key with full buckets.
        """
        ledger = self._ledger
        return ledger.quota if ledger is not None else None

    @quota.setter
    def quota(self, quota: ProviderQuota | None) -> None:
        if quota is not None and not isinstance(quota, ProviderQuota):
            raise TypeError(f"quota must be a ProviderQuota or None, got {quota!r}")
        self._ledger = Ledger(quota) if quota is not None else None

    def _quota_ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError(
                "this FakeProvider has no quota: FakeProvider(quota=ProviderQuota(...))"
            )
        return self._ledger

    def quota_usage(self, api_key: str = "") -> QuotaUsage:
        """The room ``api_key`` has left now (default ``""``: requests without a key).

        A key never seen has full buckets. Raises ``RuntimeError`` without a quota.
        """
        return self._quota_ledger().usage(api_key)

    def advance_quota(self, seconds: float) -> None:
        """Move the quota's clock ``seconds`` forward (>= 0): every bucket refills as if
        that time had passed. Latencies are not affected. Raises ``RuntimeError`` without
        a quota."""
        if not (isinstance(seconds, (int, float)) and seconds >= 0):
            raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
        self._quota_ledger().advance(seconds)

    def freeze_quota(self, frozen: bool = True) -> None:
        """Stop the quota's clock (default), or restart it with ``frozen=False``: while it
        is stopped, buckets refill only through :meth:`advance_quota`, so the room and the
        resets each answer tells are exact. Raises ``RuntimeError`` without a quota."""
        self._quota_ledger().freeze(frozen)

    def reset_quota(self) -> None:
        """Refill every key's buckets (forget all usage). Does nothing without a quota."""
        if self._ledger is not None:
            self._ledger.clear()

    # ------------------------------------------------------------------ observation

    @property
    def attempts(self) -> list[RecordedAttempt]:
        """A snapshot of all recorded chat requests (any format), in arrival order."""
        with self._cond:
            return [a.snapshot() for a in self._records]

    @property
    def open_connections(self) -> int:
        """Number of client TCP connections open right now."""
        with self._cond:
            return self._connections_open

    @property
    def connections_opened(self) -> int:
        """Total number of client TCP connections accepted since start."""
        with self._cond:
            return self._connections_opened

    def _snapshot(self) -> tuple[int, list[RecordedAttempt]]:
        with self._cond:
            return self._version, [a.snapshot() for a in self._records]

    def _timeout_error(self, predicate: Predicate, timeout: float) -> TimeoutError:
        attempts = self.attempts
        lines = "\n".join(f"  {_describe(a)}" for a in attempts[-20:]) or "  (none)"
        more = f" (last 20 of {len(attempts)})" if len(attempts) > 20 else ""
        name = getattr(predicate, "__qualname__", repr(predicate))
        return TimeoutError(
            f"FakeProvider.wait_for: {name} still false after {timeout} s; "
            f"attempts recorded{more}:\n{lines}"
        )

    def wait_for(self, predicate: Predicate, timeout: float = 5.0) -> list[RecordedAttempt]:
        """Block until ``predicate(attempts)`` is true; return those attempts.

        The predicate is re-checked whenever a record changes. Raises ``TimeoutError``
        listing the recorded attempts if it is still false after ``timeout`` seconds
        (default ``5.0``).

        Raises ``RuntimeError`` when called from a running asyncio or trio event loop:
        blocking the loop would also block the client under test (an HTTP client closes a
        cancelled request's socket from the loop), use :meth:`wait_for_async` there.
        """
        framework = _running_event_loop()
        if framework is not None:
            raise RuntimeError(
                f"FakeProvider.wait_for() would block the running {framework} event loop; "
                "use 'await fake.wait_for_async(...)' in async code"
            )
        deadline = time.monotonic() + timeout
        while True:
            version, attempts = self._snapshot()
            if predicate(attempts):
                return attempts
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_error(predicate, timeout)
            with self._cond:
                if self._version == version:
                    self._cond.wait(remaining)

    async def wait_for_async(
        self, predicate: Predicate, timeout: float = 5.0
    ) -> list[RecordedAttempt]:
        """Like :meth:`wait_for`, for async tests on asyncio or trio (polls every 2 ms).

        Default ``timeout`` is ``5.0`` seconds.
        """
        import anyio

        deadline = time.monotonic() + timeout
        seen = -1
        while True:
            if self._version != seen:
                seen, attempts = self._snapshot()
                if predicate(attempts):
                    return attempts
            if time.monotonic() >= deadline:
                raise self._timeout_error(predicate, timeout)
            await anyio.sleep(0.002)

    # ------------------------------------------------------------------ server-thread hooks

    def _update(self, attempt: AttemptState, *, tokens: int = 0, **changes: object) -> None:
        with self._cond:
            for name, value in changes.items():
                setattr(attempt, name, value)
            attempt.tokens_sent += tokens
            self._version += 1
            self._cond.notify_all()

    def _connection_opened(self) -> int:
        with self._cond:
            self._connections_open += 1
            self._connections_opened += 1
            return self._connections_opened

    def _connection_closed(self) -> None:
        with self._cond:
            self._connections_open -= 1
            self._version += 1
            self._cond.notify_all()

    def _begin(
        self,
        *,
        model: str,
        stream: bool,
        prompt_tokens: int,
        prefill_chars: int,
        headers: Mapping[str, str],
        connection_id: int,
        arrived_at: float,
        body: Mapping[str, object],
        wire: str = "openai",
    ) -> tuple[AttemptState, RequestInfo, Resolver]:
        """Record a new attempt; return it, its RequestInfo and the resolver to use."""
        redacted = {k: ("***" if k in _REDACTED else v) for k, v in headers.items()}
        with self._cond:
            nth = self._per_model.get(model, 0)
            self._per_model[model] = nth + 1
            attempt = AttemptState(
                index=len(self._records),
                model=model,
                stream=stream,
                arrived_at=arrived_at,
                connection_id=connection_id,
                request_headers=redacted,
                prompt_tokens=prompt_tokens,
                prefill_chars=prefill_chars,
                wire=wire,
            )
            self._records.append(attempt)
            resolver = self._scripts.get(model, self._default)
            self._version += 1
            self._cond.notify_all()
        info = RequestInfo(
            model=model,
            stream=stream,
            prompt_tokens=prompt_tokens,
            arrived_at=arrived_at,
            nth=nth,
            headers=redacted,
            body=body,
            rng=self._rng,
            wire=wire,
        )
        return attempt, info, resolver

    def _model_names(self) -> list[str]:
        with self._cond:
            return sorted(self._scripts)

    @property
    def _rng_for_server(self) -> random.Random:
        return self._rng
