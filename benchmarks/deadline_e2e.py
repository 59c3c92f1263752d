"""Deadlines that travel: the 3-service demo under load, and how late each hop lets go.

Run it from the repository root::

    .venv/bin/python benchmarks/deadline_e2e.py                   # 10,000 calls per backend
    .venv/bin/python benchmarks/deadline_e2e.py --calls 2000 --backend trio

Method. Three processes on loopback, each on its own core's worth of Python:

- the **provider**: latencykit's fake provider; model ``slow`` answers after 30 s, model
  ``slowstream`` streams one token every 50 ms for 10 s: both outlive every deadline;
- the **app**: an ASGI app behind ``DeadlineMiddleware``, served by hypercorn on the backend
  measured; per request it makes one ``lk.LLM`` call (the fast lane by default, ``--lane``) to
  the provider, a stream for every second request (read to its end), and answers its text;
- the **gateway** (this process, same backend): opens ``lk.deadline(--budget)`` (default
  0.25 s) and calls the app with ``send_deadline`` as an httpx hook, open loop at ``--rate``
  calls per second (default 25: what this shared 2-core machine sustained) until ``--calls``
  (default 10,000); each call carries an id the app hands on to the provider (``x-call``), so
  the provider's record of the request is matched to the gateway's deadline.

Reported per backend: the lateness of a bare timer set for each call's deadline in the
gateway (``anyio.sleep_until``: what the machine's load alone costs the loop, side by side),
the gateway's overshoot (from its deadline, on its loop's clock, to the
caller getting control back: a ``504`` from the app or its own ``DeadlineExceeded``), and the
provider's (from the gateway's deadline, on ``time.monotonic()``, the clock every process of
the machine shares, to the provider seeing the app's request closed): p50, p99, max in ms,
streams and responses together and apart; and the calls that did not end that way (an answer,
another error, a provider request never closed). The machine is shared and noisy: the load
average is printed; repeat and read ranges.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import httpx
from overhead import _load, percentile
from provider import provider_process

import latencykit as lk
from latencykit.integrations.asgi import DeadlineMiddleware, Receive, Scope, Send
from latencykit.integrations.httpx import send_deadline

PROVIDER = """
import json, logging, sys
from latencykit.testing import Behavior, FakeProvider
logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # each cut request's lost connection
fake = FakeProvider()
fake.script("slow", Behavior(ttft=30.0))
fake.script("slowstream", Behavior(ttft=0.0, itl=0.05, output_tokens=200))
fake.start()
print(fake.base_url, flush=True)
sys.stdin.read()
try:  # the app has exited: its last closes may still be on their way
    fake.wait_for(lambda seen: all(a.disconnected or a.completed for a in seen), timeout=2.0)
except TimeoutError:
    pass
closes = {
    a.request_headers.get("x-call"): (a.arrived_at, a.disconnected_at, a.ended_at)
    for a in fake.attempts
}
print(json.dumps(closes))
fake.stop()
"""
# The app: this file in a child process, run as the provider is (URL on its first line, stops
# when its standard input closes).
APP = """
import runpy, sys
sys.path.insert(0, "benchmarks")
sys.argv = ["deadline_e2e.py", "--app", *sys.argv[1:]]
runpy.run_path("benchmarks/deadline_e2e.py", run_name="__main__")
"""
MESSAGES = [{"role": "user", "content": "hi"}]


# --- the app (a child process: --app BACKEND PROVIDER_URL LANE) ------------------------------


def app_of(llms: dict[bool, lk.LLM]) -> DeadlineMiddleware:
    """One call per request: a stream (``x-stream: 1``) or a response, its text the answer."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = dict(scope["headers"])
        stream = headers.get(b"x-stream") == b"1"
        call = {"x-call": headers.get(b"x-call", b"").decode()}  # the provider's record's id
        answer = await llms[stream].acompletion(
            messages=MESSAGES, stream=stream, extra_headers=call
        )
        if stream:
            async with answer:
                text = "".join([c.choices[0].delta.content or "" async for c in answer])
        else:
            text = answer.choices[0].message.content
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": text.encode()})

    return DeadlineMiddleware(app, maximum=60)


async def serve_app(backend: str, provider_url: str, lane: str) -> None:
    """Serve the app on a free port of 127.0.0.1 until standard input closes; print the URL."""
    from hypercorn.config import Config

    if backend == "trio":
        from hypercorn.trio import serve
    else:
        from hypercorn.asyncio import serve  # type: ignore[assignment]
    import logging

    logging.getLogger("hypercorn.error").setLevel(logging.CRITICAL)  # aborted responses
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]
    config.graceful_timeout = 1.0
    config.backlog = 1024

    def llm(model: str) -> lk.LLM:
        return lk.LLM(f"openai/{model}", api_base=provider_url, api_key="k", transport=lane)

    async with llm("slow") as response, llm("slowstream") as stream:
        llms = {False: response, True: stream}
        for each in llms.values():
            await each.warm(raise_errors=True)
        stop = anyio.Event()

        async def until_stdin_closes() -> None:
            await anyio.to_thread.run_sync(sys.stdin.read)
            stop.set()

        async with anyio.create_task_group() as group:
            group.start_soon(until_stdin_closes)
            print(f"http://127.0.0.1:{port}", flush=True)
            await serve(app_of(llms), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


# --- the gateway (this process) --------------------------------------------------------------


async def gateway(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--calls`` calls open loop at ``--rate`` per second; one record per call."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    records: list[dict[str, Any]] = []
    timers: dict[int, float] = {}
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [send_deadline]}
    async with httpx.AsyncClient(limits=limits, event_hooks=hooks, timeout=60) as client:

        async def timer(i: int, until: float) -> None:
            await anyio.sleep_until(until)
            timers[i] = anyio.current_time() - until

        async def one(i: int) -> None:
            headers = {"x-call": str(i), "x-stream": str(i % 2)}
            started, wall = anyio.current_time(), time.monotonic()
            tasks.start_soon(timer, i, started + args.budget)  # the bare loop's lateness
            outcome = "answered"
            try:
                with lk.deadline(args.budget):
                    response = await client.get(url, headers=headers)
                if response.status_code == 504:
                    outcome = "504"
            except lk.DeadlineExceeded:
                outcome = "deadline"
            except Exception as error:
                outcome = type(error).__name__
            late = anyio.current_time() - (started + args.budget)
            expiry = wall + args.budget
            records.append({"id": str(i), "outcome": outcome, "late": late, "expiry": expiry})

        begin = anyio.current_time()
        async with anyio.create_task_group() as tasks:
            for i in range(args.warmup + args.calls):
                await anyio.sleep(max(0.0, begin + i / args.rate - anyio.current_time()))
                tasks.start_soon(one, i)
    for record in records:
        record["timer"] = timers[int(record["id"])]
    return [r for r in records if int(r["id"]) >= args.warmup]


def report(
    backend: str,
    records: list[dict[str, Any]],
    closes: dict[str, tuple[float, float | None, float | None]],
) -> None:
    print(f"\n{backend}: overshoot past the gateway's deadline, ms ({len(records)} calls)")
    print(f"  {'where':<9} {'calls':<9} {'n':>6} {'p50':>7} {'p99':>7} {'max':>7}")
    kinds = {"all": (0, 1), "responses": (0,), "streams": (1,)}
    for where in ("timer", "gateway", "provider"):
        for kind, parities in kinds.items() if where != "timer" else [("-", (0, 1))]:
            chosen = [r for r in records if int(r["id"]) % 2 in parities]
            if where != "provider":
                ms = [r["late" if where == "gateway" else "timer"] * 1e3 for r in chosen]
            else:
                closed = [(closes.get(r["id"], (0, None, None))[1], r["expiry"]) for r in chosen]
                ms = [(at - expiry) * 1e3 for at, expiry in closed if at is not None]
            print(
                f"  {where:<9} {kind:<9} {len(ms):>6} {percentile(ms, 50):>7.1f}"
                f" {percentile(ms, 99):>7.1f} {max(ms, default=float('nan')):>7.1f}"
            )
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    unsent = sum(1 for r in records if r["id"] not in closes)
    left = [r for r in records if closes.get(r["id"], (0, 0, None))[1] is None]
    ended = [r for r in left if closes[r["id"]][2] is not None]
    print(f"  outcomes: {outcomes}")
    print(
        f"  calls the app never sent on: {unsent}; provider requests never closed: {len(left)}"
        f" ({len(ended)} ran to their end)"
    )
    for r in left[:5]:
        arrived, _, end = closes[r["id"]]
        print(f"    call {r['id']}: arrived {(arrived - r['expiry']) * 1e3:+.0f} ms, ended {end}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=10_000, help="measured calls per backend")
    parser.add_argument("--warmup", type=int, default=200, help="calls first, not measured")
    parser.add_argument("--rate", type=float, default=25, help="calls started per second")
    parser.add_argument("--budget", type=float, default=0.25, help="the gateway's deadline (s)")
    parser.add_argument("--lane", choices=("openai", "litellm"), default="openai")
    parser.add_argument("--backend", choices=("asyncio", "trio"), action="append")
    parser.add_argument("--app", nargs=3, metavar=("BACKEND", "PROVIDER", "LANE"), help="internal")
    args = parser.parse_args()
    if args.app:
        backend, provider_url, lane = args.app
        anyio.run(serve_app, backend, provider_url, lane, backend=backend)
        return
    print(f"load average {_load()}, lk from {os.path.dirname(lk.__file__)}, lane {args.lane}")
    for backend in args.backend or ("asyncio", "trio"):
        output: list[str] = []
        with (
            provider_process(PROVIDER, output=output) as provider_url,
            provider_process(APP, backend, provider_url, args.lane) as url,
        ):
            records = anyio.run(gateway, url, args, backend=backend)
        closes = json.loads(output[0].strip().splitlines()[-1])
        report(backend, records, closes)
        print(f"  load average after: {_load()}")


if __name__ == "__main__":
    main()
