"""The asyncio HTTP server behind :class:`FakeProvider`; runs on the provider's thread.

Each request's response is generated in its own task, raced against the connection's
EOF watch: a client that goes away is recorded at once and the response is abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import sys
import time
import traceback
from typing import TYPE_CHECKING

from . import _anthropic, _gemini, _responses
from . import _openai as oa
from ._behavior import Behavior, Fault, header_pairs
from ._http import (
    LAST_CHUNK,
    BadRequest,
    Connection,
    PeerClosed,
    Request,
    chunked,
    response_head,
)
from ._latency import sample_seconds
from ._wire import ERROR_FAULTS, Meta, Piece, Wire, seconds_header, wait_header, words

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from ._quota import Ledger, Refusal
    from ._records import AttemptState
    from ._server import FakeProvider

_FAULT_POINT = frozenset(
    {Fault.STALL, Fault.CUT, Fault.CUT_WITH_DONE, Fault.ERROR_EVENT, Fault.MALFORMED_CHUNK}
)
_HEADERS_AT_ONCE = frozenset({Fault.KEEPALIVE_THEN_TOKENS, Fault.HEADERS_THEN_SILENCE})
_WIRES: tuple[type[Wire], ...] = (
    oa.OpenAIWire,
    oa.EmbeddingsWire,
    _responses.ResponsesWire,
    _anthropic.AnthropicWire,
    _gemini.GeminiWire,
)
"""The wire formats served, each routing its own URLs."""


def _answer_tokens(text: str | None, output_tokens: int) -> list[str]:
    """The answer's text pieces, one per token/chunk: ``text``'s words, else ``tok0 tok1...``."""
    if text is None:
        return [f" tok{i}" if i else "tok0" for i in range(output_tokens)]
    return words(text)


def _continuation(tokens: list[str], prefill: str | None) -> list[str]:
    """The tokens left to emit once the client prefilled the answer with ``prefill``.

    If the answer starts with the prefill, only the rest is emitted (re-split into words,
    so a prefill ending mid-word is continued mid-word); otherwise the whole answer.
    """
    if not prefill:
        return tokens
    answer = "".join(tokens)
    if not answer.startswith(prefill):
        return tokens
    return words(answer[len(prefill) :])


def _consume(task: asyncio.Task[bool]) -> None:
    """Done-callback retrieving an abandoned task's exception (no 'never retrieved' logs)."""
    if not task.cancelled():
        task.exception()


class _Plan:
    """Everything decided when a chat request arrives (latencies are sampled up front)."""

    __slots__ = (
        "behavior",
        "fault",
        "finish_reason",
        "gaps",
        "pieces",
        "rejects_prefill",
        "reserved",
        "ttft",
    )

    def __init__(
        self,
        behavior: Behavior,
        provider: FakeProvider,
        *,
        prompt_tokens: int,
        prefill: str | None,
        max_tokens: int | None = None,
    ) -> None:
        rng = provider._rng
        self.behavior = behavior
        # A refused request goes no further: no fault applies to it.
        self.rejects_prefill = behavior.rejects_prefill and prefill is not None
        fault = None if self.rejects_prefill else behavior.fault
        window = behavior.context_window
        if not self.rejects_prefill and window is not None and prompt_tokens > window:
            fault = Fault.CONTEXT_LENGTH
        self.fault = fault
        calls = behavior.tool_call is not None
        text = "" if calls and behavior.text is None else behavior.text
        tokens = _continuation(_answer_tokens(text, behavior.output_tokens), prefill)
        self.finish_reason = "tool_calls" if calls else "stop"
        if max_tokens is not None and len(tokens) > max_tokens:
            # As a real server does: the answer stops at the client's cap, "length".
            tokens = tokens[: max(max_tokens, 0)]
            self.finish_reason = "length"
        thinking = words(behavior.reasoning) if behavior.reasoning else []
        self.pieces: list[Piece] = [("reasoning", t) for t in thinking]
        self.pieces += [("text", t) for t in tokens]
        if calls and self.finish_reason != "length":
            self.pieces.append(("tool", behavior.tool_arguments))
        self.ttft = sample_seconds(behavior.ttft, rng)
        self.gaps = [sample_seconds(behavior.itl, rng) for _ in self.pieces]
        # The output tokens a quota reserves on arrival: the client's cap, as OpenAI and
        # Anthropic do, else the answer's length (settled to what is sent at the end).
        self.reserved = len(self.pieces) if max_tokens is None else max(max_tokens, 0)

    def crowd(self, in_flight: int) -> None:
        """Slow the answer down by ``in_flight / knee`` past the behaviour's knee."""
        knee = self.behavior.concurrency_knee
        if knee is not None and in_flight > knee:
            factor = in_flight / knee
            self.ttft *= factor
            self.gaps = [gap * factor for gap in self.gaps]


class _Exchange:
    """One chat request being answered on one connection, in the format of ``wire``."""

    def __init__(
        self,
        provider: FakeProvider,
        conn: Connection,
        attempt: AttemptState,
        request: Request,
        wire: Wire,
        *,
        stream: bool,
    ) -> None:
        self.provider = provider
        self.conn = conn
        self.attempt = attempt
        self.keep_alive = request.keep_alive
        self.arrived_at = request.arrived_at
        self.wire = wire
        self.stream = stream
        self.limit_headers: list[tuple[str, str]] | None = None  # None: no quota
        self.reservation: tuple[Ledger, str, int] | None = None  # (ledger, key, tokens)

    # -- primitives

    async def send(
        self, data: bytes, *, status: int | None = None, tokens: int = 0, final: bool = False
    ) -> None:
        """Write ``data``, recording it first, so a client never sees unrecorded bytes.

        ``tokens`` content tokens are in ``data``; ``final`` marks the end of the response.
        """
        now = time.monotonic()
        changes: dict[str, object] = {}
        if self.attempt.first_byte_at is None:
            changes["first_byte_at"] = now
        if status is not None:
            changes["status"] = status
        if final:
            changes["ended_at"] = now
        if changes or tokens:
            self.provider._update(self.attempt, tokens=tokens, **changes)
        if final:
            self.settle()
        try:
            self.conn.writer.write(data)
            await self.conn.writer.drain()
        except BaseException:
            if final:  # the client did not get it all
                self.provider._update(self.attempt, ended_at=None)
            raise

    def common_headers(self, *, close: bool = False) -> list[tuple[str, str]]:
        return [
            ("Connection", "close" if close or not self.keep_alive else "keep-alive"),
            (self.wire.request_id_header, f"req_fake_{self.attempt.index}"),
            ("x-fake-attempt", str(self.attempt.index)),
            *(self.limit_headers or ()),
        ]

    def admit(self, ledger: Ledger, key: str, prompt_tokens: int, plan: _Plan) -> Refusal | None:
        """Charge the request to ``key``'s quota, or return why it is past it; either way the
        answer's headers tell the room left, as ``plan.behavior.limit_headers`` says."""
        usage, refusal = ledger.admit(key, prompt_tokens + plan.reserved)
        mode, skew = plan.behavior.limit_headers, plan.behavior.reset_skew
        shown = usage.full() if mode == "full" else usage
        self.limit_headers = [] if mode == "missing" else self.wire.limit_headers(shown, skew)
        if refusal is None:
            self.reservation = (ledger, key, plan.reserved)
        return refusal

    def settle(self) -> None:
        """Settle the quota's reservation with the tokens sent, once: before the answer's
        last bytes, so a client that got them sees the quota settled."""
        if self.reservation is not None:
            ledger, key, reserved = self.reservation
            self.reservation = None
            ledger.settle(key, reserved - self.attempt.tokens_sent)

    async def refuse(self, refusal: Refusal) -> bool:
        """Answer at once the 429 of a request past the quota."""
        status, body, extra = self.wire.quota_error(refusal)
        if self.wire.retry_after_header:
            extra.append(("retry-after", wait_header(refusal.wait)))
        return await self.send_json(status, body, extra)

    async def send_json(
        self, status: int, body: bytes, extra: list[tuple[str, str]] | None = None
    ) -> bool:
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        headers += self.common_headers() + (extra or [])
        await self.send(response_head(status, headers) + body, status=status, final=True)
        return self.keep_alive

    # -- responses

    async def respond(self, plan: _Plan) -> bool:
        """Answer according to ``plan``; return whether the connection may be reused."""
        fault = plan.fault
        wire = self.wire
        behavior = plan.behavior
        first_at = self.arrived_at + plan.ttft
        if plan.rejects_prefill:
            await _sleep_until(first_at)
            return await self.send_json(*wire.prefill_rejected())
        if fault is Fault.HANG:
            await asyncio.get_running_loop().create_future()  # until the client goes away
        if fault is Fault.CLOSE_BEFORE_HEADERS:
            await _sleep_until(first_at)
            self.conn.writer.close()  # a FIN: no response byte, no reset
            return False
        if fault is Fault.HTTP_ERROR:
            await _sleep_until(first_at)
            if behavior.body is not None:
                body = behavior.body.encode("utf-8")
            else:
                body = wire.http_error(
                    behavior.status,
                    type_=behavior.error_type,
                    code=behavior.error_code,
                    message=behavior.error_message,
                )
            headers = list(header_pairs(behavior.headers))
            if behavior.retry_after is not None:
                headers.append(("Retry-After", seconds_header(behavior.retry_after)))
            return await self.send_json(behavior.status, body, headers)
        if fault is Fault.RESET_BEFORE_HEADERS:
            await _sleep_until(first_at)
            sock = self.conn.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.conn.writer.transport.abort()
            return False
        if fault in ERROR_FAULTS:
            assert fault is not None
            await _sleep_until(first_at)
            return await self._error_fault(plan, fault)
        if fault is Fault.ERROR_EVENT and not self.stream:
            await _sleep_until(first_at)
            return await self.send_json(*self.error_event(plan))
        if self.stream:
            return await self._respond_stream(plan)
        return await self._respond_json(plan)

    async def _error_fault(self, plan: _Plan, fault: Fault) -> bool:
        """Answer one of :data:`ERROR_FAULTS` (``ttft`` has passed)."""
        behavior = plan.behavior
        wire = self.wire
        status, body, extra = wire.fault_error(
            fault, context_window=behavior.context_window, retry_after=behavior.retry_after
        )
        if self.limit_headers is not None:  # the quota's headers replace the stand-ins
            extra = [h for h in extra if not h[0].startswith("anthropic-ratelimit-")]
        if status == 200 and self.stream:  # a refusal answered in one event
            return await self._respond_stream(plan, only=wire.stream_error(body))
        waits = fault in (Fault.HTTP_429, Fault.HTTP_503) and wire.retry_after_header
        if waits and behavior.retry_after is not None:
            extra.append(("Retry-After", seconds_header(behavior.retry_after)))
        return await self.send_json(status, body, extra)

    def error_event(self, plan: _Plan) -> tuple[int, bytes]:
        return self.wire.error_event(
            plan.behavior.error, context_window=plan.behavior.context_window
        )

    async def _pause(
        self,
        stall_for: float | None,
        beat: Callable[[int], Awaitable[None]] | None = None,
        every: float = 0.0,
    ) -> float:
        """Wait ``stall_for`` seconds (``None``: until the client goes away); return it.

        ``beat(k)`` is awaited every ``every`` seconds meanwhile, ``k`` counting from 0.
        """
        start = time.monotonic()
        end = None if stall_for is None else start + stall_for
        k = 0
        while beat is not None:
            # Ticks are scheduled from the start, so a late wake-up does not shift them.
            tick = start + (k + 1) * every
            if end is not None and tick >= end:
                break
            await _sleep_until(tick)
            await beat(k)
            k += 1
        if end is None:
            await asyncio.get_running_loop().create_future()  # until the client goes away
        else:
            await _sleep_until(end)
        return stall_for or 0.0

    async def _respond_json(self, plan: _Plan) -> bool:
        fault = plan.fault
        pieces = plan.pieces
        finish_reason: str | None = plan.finish_reason
        if fault is Fault.CUT_WITH_DONE:  # the answer stops early, without a reason
            pieces = pieces[: plan.behavior.stall_after]
            finish_reason = None
        n = len(pieces)
        if fault is Fault.MALFORMED_CHUNK:
            body = b"{not json"
        else:
            body = self.wire.completion(pieces, finish_reason)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        head = response_head(200, headers + self.common_headers())
        if fault is Fault.HEADERS_THEN_SILENCE:
            await self.send(head, status=200)
            await self._pause(None)
        await _sleep_until(self.arrived_at + plan.ttft + sum(plan.gaps[:n]))
        half = len(body) // 2
        if fault is Fault.CUT:
            await self.send(head + body[:half], status=200)
            return False
        sent = 0 if fault is Fault.MALFORMED_CHUNK else n
        if fault is Fault.STALL:
            await self.send(head + body[:half], status=200)
            await self._pause(plan.behavior.stall_for)
            await self.send(body[half:], tokens=sent, final=True)
        else:
            await self.send(head + body, status=200, tokens=sent, final=True)
        return self.keep_alive

    async def _respond_stream(self, plan: _Plan, only: bytes | None = None) -> bool:
        """Stream the answer, or the single event ``only`` (already after ``ttft``)."""
        fault = plan.fault
        behavior = plan.behavior
        wire = self.wire
        missing_done = fault is Fault.MISSING_DONE
        head = response_head(
            200,
            [
                ("Content-Type", "text/event-stream; charset=utf-8"),
                ("Cache-Control", "no-cache"),
                ("Transfer-Encoding", "chunked"),
                *self.common_headers(close=missing_done),
            ],
        )
        head_sent = False
        opened = False  # whether the first piece or the opening event was sent

        async def emit(event: bytes, tokens: int = 0) -> None:
            nonlocal head_sent
            if head_sent:
                await self.send(chunked(event), tokens=tokens)
            else:
                head_sent = True
                await self.send(head + chunked(event), status=200, tokens=tokens)

        async def finish(events: list[bytes]) -> bool:
            """Send the last events and end the body, in one write as a real server does."""
            nonlocal head_sent
            tail = b"".join(chunked(e) for e in events if e) + LAST_CHUNK
            if head_sent:
                await self.send(tail, final=True)
            else:
                head_sent = True
                await self.send(head + tail, status=200, final=True)
            return self.keep_alive and not missing_done

        async def beat(k: int) -> None:
            await emit(wire.beat(k))

        keepalive = beat if behavior.stall_keepalive else None
        if only is not None:
            return await finish([only])

        if behavior.role_chunk or fault in _HEADERS_AT_ONCE:
            head_sent = True
            first = head
            if behavior.role_chunk:
                opened = True
                first += chunked(wire.opening())
            await self.send(first, status=200)
        if fault is Fault.HEADERS_THEN_SILENCE:
            await self._pause(None, keepalive, behavior.keepalive_every)

        deadline = self.arrived_at + plan.ttft
        if fault is Fault.KEEPALIVE_THEN_TOKENS:
            tick = time.monotonic() + behavior.keepalive_every
            while tick < deadline:
                await _sleep_until(tick)
                await self.send(chunked(wire.keepalive()))
                tick += behavior.keepalive_every

        n = len(plan.pieces)
        fault_at = min(behavior.stall_after, n) if fault in _FAULT_POINT else -1
        for i in range(n + 1):
            if i == fault_at:
                await _sleep_until(deadline)  # fault before the first token: wait ttft
                if fault is Fault.ERROR_EVENT:  # may be the very first event
                    _, error = self.error_event(plan)
                    return await finish([wire.stream_error(error)])
                if not opened:  # headers + opening first
                    opened = True
                    await emit(wire.opening())
                if fault is Fault.STALL:
                    deadline += await self._pause(
                        behavior.stall_for, keepalive, behavior.keepalive_every
                    )
                elif fault is Fault.CUT:
                    return False  # the connection handler closes the socket
                elif fault is Fault.CUT_WITH_DONE:
                    return await finish(wire.end_without_finish())
                else:
                    await emit(wire.malformed())
            if i > 0:
                deadline += plan.gaps[i - 1]
            await _sleep_until(deadline)
            if i == n:
                break
            opened = True
            await emit(wire.piece(plan.pieces[i]), tokens=1)

        return await finish(wire.end(plan.finish_reason, n, terminator=not missing_done))


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class Engine:
    """Owns the event loop, the listening socket and the connection tasks."""

    def __init__(self, provider: FakeProvider, host: str, port: int) -> None:
        self.provider = provider
        self.host = host
        self.requested_port = port
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._stopping = False
        self._tasks: set[asyncio.Task[object]] = set()
        self._in_flight: dict[str, int] = {}  # model -> requests being answered

    # -- lifecycle (run() on the server thread, request_stop() from any thread)

    def run(self, on_ready: Callable[[], None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(on_ready))
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def request_stop(self) -> None:
        self._stop_requested = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed meanwhile
            loop.call_soon_threadsafe(self._set_stop)

    def _set_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _main(self, on_ready: Callable[[], None]) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._client, self.host, self.requested_port, backlog=2048, reuse_address=True
        )
        self.port = int(server.sockets[0].getsockname()[1])
        on_ready()
        try:
            if not self._stop_requested:
                await self._stop.wait()
        finally:
            self._stopping = True
            server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    # -- connections

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        conn = Connection(self.provider._connection_opened(), reader, writer)
        pump = asyncio.ensure_future(conn.pump())
        try:
            while True:
                try:
                    request = await conn.read_request()
                except PeerClosed:
                    break
                except BadRequest as exc:
                    body = oa.error_body(exc.message, "invalid_request_error", None)
                    headers = [
                        ("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))),
                        ("Connection", "close"),
                    ]
                    writer.write(response_head(exc.status, headers) + body)
                    await writer.drain()
                    break
                if request is None:
                    break
                if not await self._dispatch(conn, request) or conn.eof:
                    break
        except OSError:
            pass  # write to a connection the client already closed
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # Shutting down: end normally, as asyncio's stream callback (3.11) would log
            # the cancellation of a connection task as an error.
        finally:
            pump.cancel()
            if self._stopping:
                writer.transport.abort()
            else:
                writer.close()
            self.provider._connection_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _dispatch(self, conn: Connection, request: Request) -> bool:
        path = request.path.rstrip("/")
        for wire_type in _WIRES:
            url_model = wire_type.route(request.method, path)
            if url_model is not None:
                return await self._chat(conn, request, wire_type(url_model))
        if path in oa.MODELS_PATHS and request.method == "GET":
            status, body = 200, oa.models_list(self.provider._model_names())
        else:
            status = 404
            served = "; ".join(w.endpoints for w in _WIRES)
            body = oa.error_body(
                f"Unknown request URL: {request.method} {request.path}. "
                f"The fake provider serves {served}.",
                "invalid_request_error",
                "unknown_url",
            )
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "keep-alive" if request.keep_alive else "close"),
        ]
        conn.writer.write(response_head(status, headers) + body)
        await conn.writer.drain()
        return request.keep_alive

    async def _chat(self, conn: Connection, request: Request, wire: Wire) -> bool:
        error: tuple[int, bytes] | None = None
        body: dict[str, object] = {}
        try:
            parsed = json.loads(request.body or b"null")
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            body = parsed
        else:
            error = (
                400,
                wire.error(
                    400,
                    "We could not parse the JSON body of your request: expected a JSON object.",
                ),
            )
        parsed_request = wire.parse(body)
        model = parsed_request.model
        stream = parsed_request.stream
        prompt_tokens = parsed_request.prompt_tokens
        prefill = parsed_request.prefill
        provider = self.provider
        attempt, info, resolver = provider._begin(
            model=model,
            stream=stream,
            prompt_tokens=prompt_tokens,
            prefill_chars=len(prefill or ""),
            headers=request.headers,
            connection_id=conn.id,
            arrived_at=request.arrived_at,
            body=body,
            wire=wire.name,
        )
        behavior = Behavior()
        if error is None:
            override = request.headers.get("x-fake-behavior")
            if override is not None:
                try:
                    data = json.loads(override)
                    if not isinstance(data, dict):
                        raise ValueError("expected a JSON object")
                    behavior = Behavior.from_json(data)
                except (ValueError, TypeError) as exc:
                    error = (400, wire.error(400, f"Invalid x-fake-behavior header: {exc}"))
            else:
                try:
                    behavior = resolver.next(info)
                except Exception as exc:
                    print(
                        f"latencykit FakeProvider: the script for model {model!r} raised:",
                        file=sys.stderr,
                    )
                    traceback.print_exc()
                    error = (
                        500,
                        wire.error(
                            500,
                            f"The fake provider's script for model {model!r} raised {exc!r}",
                            "fake_script_error",
                        ),
                    )
        wire.start(
            Meta(
                response_id=f"{wire.id_prefix}{attempt.index:06d}c{conn.id}",
                created=int(time.time()),
                model=model,
                prompt_tokens=prompt_tokens,
                include_usage=parsed_request.include_usage,
                flavor=behavior.flavor,
                tool_name=behavior.tool_call or "",
                dimensions=behavior.dimensions,
            )
        )
        exchange = _Exchange(provider, conn, attempt, request, wire, stream=stream)
        if error is not None:
            return await self._watch(conn, attempt, exchange.send_json(*error))
        plan = _Plan(
            behavior,
            provider,
            prompt_tokens=prompt_tokens,
            prefill=prefill,
            max_tokens=parsed_request.max_tokens,
        )
        ledger = provider._ledger
        if ledger is not None:
            key = wire.api_key(request.headers, request.target.partition("?")[2])
            refusal = exchange.admit(ledger, key, prompt_tokens, plan)
            if refusal is not None:
                return await self._watch(conn, attempt, exchange.refuse(refusal))
        return await self._answer(exchange, plan)

    async def _answer(self, exchange: _Exchange, plan: _Plan) -> bool:
        """Answer an admitted request as planned, slowed past its knee; settle its quota."""
        conn, attempt, model = exchange.conn, exchange.attempt, exchange.attempt.model
        self.provider._update(attempt, fault=plan.fault)
        in_flight = self._in_flight
        in_flight[model] = in_flight.get(model, 0) + 1
        plan.crowd(in_flight[model])
        try:
            return await self._watch(conn, attempt, exchange.respond(plan))
        finally:
            in_flight[model] -= 1
            exchange.settle()  # an answer cut short or abandoned

    async def _watch(
        self, conn: Connection, attempt: AttemptState, coro: Coroutine[object, object, bool]
    ) -> bool:
        """Run a response, abandoning it as soon as the client goes away."""
        work = asyncio.ensure_future(coro)
        gone = asyncio.ensure_future(conn.gone.wait())
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.add_done_callback(_consume)
                work.cancel()
        if not work.cancelled() and work.done():
            exc = work.exception()
            if exc is None:
                return work.result()
            if not isinstance(exc, OSError):
                raise exc
            # writing failed: the client reset the connection
        else:
            await asyncio.wait((work,))  # let it unwind (it may un-mark ended_at)
        if attempt.ended_at is None and attempt.disconnected_at is None:
            when = conn.eof_at if conn.eof_at is not None else time.monotonic()
            self.provider._update(attempt, disconnected_at=when)
        return False
