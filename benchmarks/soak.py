"""A soak of mixed streams under load: what must never happen, counted over many calls.

Run it from the repository root::

    .venv/bin/python benchmarks/soak.py                   # 20,000 streams per lane and backend
    .venv/bin/python benchmarks/soak.py --calls 2000      # a quicker look
    .venv/bin/python benchmarks/soak.py --lanes openai --backends asyncio

The fake provider runs in a process of its own (as a provider would), on 127.0.0.1; the client
runs ``--concurrency`` workers (default 40) on one event loop, each making streamed calls
through ``lk.LLM`` one after the other, for each lane (litellm, the fast lane) and backend
(asyncio, trio). The calls cycle through scenarios, each with what it must end as:

- ``ok``: a normal stream; complete, with the whole text;
- ``cut``: the primary cuts every stream after 5 chunks; ``on_break="continue"`` completes it
  on the failover target, with the whole text;
- ``stall``: the provider stalls after 5 chunks: ``StreamStalled`` after the 0.2 s limit;
- ``deadline``: a slow stream inside ``lk.deadline(0.15)``: ``DeadlineExceeded``, whose
  lateness (the time from the budget's end to the error) is measured;
- ``cancel``: the consumer gives up mid-stream (``anyio.move_on_after(0.05)``);
- ``early``: the consumer reads 3 chunks, then closes the stream;
- ``hang``: no first token: ``FirstTokenTimeout`` after 0.2 s;
- ``error``: an error event after 3 chunks: ``StreamBroken``.

Counted, per lane and backend (each must be 0):

- **stray cancellations**: a cancellation that reached a worker which had not cancelled;
- **open at the end**: requests the server still serves (neither finished nor disconnected)
  once every call returned and a drain of up to 5 s passed (a stream never closed);
- **truncated successes**: a call that ended as a success without the whole text;
- **wrong outcomes**: any other outcome than the scenario's (listed by type).

And the deadline lateness p50/p99/max over the ``deadline`` calls.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TOKENS = 20
TEXT = " ".join(f"tok{i}" for i in range(TOKENS))
SCENARIOS = ("ok", "cut", "stall", "deadline", "cancel", "early", "hang", "error")
MESSAGES = [{"role": "user", "content": "soak"}]
KEY = "sk-soak-0000000000"


# --- the server, in a process of its own -------------------------------------------------------


def _serve(conn: Any) -> None:
    from latencykit.testing import Behavior, FakeProvider, Fault

    fake = FakeProvider().start()

    def script() -> None:
        itl = 0.002
        fake.script("ok", Behavior(output_tokens=TOKENS, itl=itl))
        fake.script("cut", Behavior(fault=Fault.CUT, stall_after=5, output_tokens=TOKENS, itl=itl))
        fake.script("stall", Behavior(fault=Fault.STALL, stall_after=5, output_tokens=TOKENS))
        fake.script("slow", Behavior(output_tokens=TOKENS, itl=0.05))
        fake.script("hang", Behavior(fault=Fault.HANG))
        fake.script(
            "error",
            Behavior(fault=Fault.ERROR_EVENT, stall_after=3, output_tokens=TOKENS, itl=itl),
        )

    script()
    conn.send(fake.base_url)
    while True:
        command = conn.recv()
        if command == "stop":
            fake.stop()
            return
        if command == "reset":
            fake.reset()
            script()
            conn.send(None)
        elif command == "open":  # requests neither finished nor disconnected (nor aborted)
            seen = fake.attempts
            conn.send(
                sum(
                    1
                    for a in seen
                    if a.ended_at is None and a.disconnected_at is None and a.fault is not Fault.CUT
                )
            )


# --- the client --------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.wrong: Counter[str] = Counter()
        self.stray = 0
        self.truncated = 0
        self.lateness: list[float] = []


EXPECTED = {
    "ok": "ok",
    "cut": "ok",
    "stall": "StreamStalled",
    "deadline": "DeadlineExceeded",
    "cancel": "cancelled",
    "early": "closed",
    "hang": "FirstTokenTimeout",
    "error": "StreamBroken",
}


async def _one(llms: dict[str, Any], scenario: str, tally: Tally) -> None:
    import anyio

    import latencykit as lk

    outcome = "?"
    text = ""
    cancelled_by_us = False
    started = 0.0
    try:
        with anyio.CancelScope() as scope:
            if scenario == "deadline":
                started = anyio.current_time()
                with lk.deadline(0.15):
                    stream = await llms["slow"].acompletion(messages=MESSAGES, stream=True)
                    async with stream:
                        async for _ in stream:
                            pass
            else:
                model = {"cancel": "slow", "early": "ok"}.get(scenario, scenario)
                stream = await llms[model].acompletion(messages=MESSAGES, stream=True)
                async with stream:
                    if scenario == "cancel":
                        scope.deadline = anyio.current_time() + 0.05
                    count = 0
                    async for _ in stream:
                        count += 1
                        if scenario == "early" and count == 3:
                            break
                    text = stream.partial_text
            outcome = "closed" if scenario == "early" else "ok"
        if scope.cancelled_caught:
            cancelled_by_us = True
            outcome = "cancelled"
    except lk.DeadlineExceeded as exc:
        outcome = "DeadlineExceeded"
        tally.lateness.append(anyio.current_time() - started - exc.budget)
    except Exception as exc:
        outcome = type(exc).__name__
    except BaseException as exc:
        if isinstance(exc, anyio.get_cancelled_exc_class()) and not cancelled_by_us:
            tally.stray += 1  # a cancellation this worker never asked for
            outcome = "stray-cancel"
            return
        raise
    tally.outcomes[outcome] += 1
    if outcome == "ok" and text != TEXT:
        tally.truncated += 1
    if outcome != EXPECTED[scenario]:
        tally.wrong[f"{scenario}->{outcome}"] += 1


async def _run(base: str, lane: str, calls: int, concurrency: int) -> Tally:
    import anyio

    import latencykit as lk

    def target(model: str) -> dict[str, Any]:
        return {"model": f"openai/{model}", "api_base": base, "api_key": KEY, "transport": lane}

    def llm(model: str, **options: Any) -> lk.LLM:
        return lk.LLM(
            f"openai/{model}", api_base=base, api_key=KEY, transport=lane, retry=None, **options
        )

    # Limits generous enough for a CPU-bound client (40 calls queue for the CPU), except where
    # the scenario is the silence they catch.
    roomy = lk.StreamGuard(first_token=5.0, stall=5.0)
    llms = {name: llm(name, stream_guard=roomy) for name in ("ok", "slow", "error")}
    llms["stall"] = llm("stall", stream_guard=lk.StreamGuard(first_token=5.0, stall=0.2))
    llms["hang"] = llm("hang", stream_guard=lk.StreamGuard(first_token=0.2))
    llms["cut"] = llm(
        "cut",
        failover=[target("ok")],
        stream_guard=lk.StreamGuard(first_token=5.0, stall=5.0, on_break="continue"),
    )
    tally = Tally()
    next_call = iter(range(calls))

    async def worker() -> None:
        for i in next_call:
            try:
                await _one(llms, SCENARIOS[i % len(SCENARIOS)], tally)
            except BaseException as exc:  # a stray cancellation would end the worker
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    tally.stray += 1
                    continue
                raise

    # Warm each lane's clients first (litellm's first call sets itself up for seconds).
    for name in ("ok",):
        warm = await llms[name].acompletion(messages=MESSAGES, stream=True)
        async with warm:
            async for _ in warm:
                pass
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker)
    return tally


def _client(base: str, lane: str, backend: str, calls: int, concurrency: int) -> Tally:
    import anyio

    return anyio.run(_run, base, lane, calls, concurrency, backend=backend)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=20_000, help="per lane and backend")
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--lanes", default="litellm,openai")
    parser.add_argument("--backends", default="asyncio,trio")
    args = parser.parse_args(argv)

    import litellm

    litellm.suppress_debug_info = True
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(child,))
    server.start()
    base = parent.recv()
    failures = 0
    print(
        f"{'lane':8} {'backend':8} {'calls':>6} {'s':>6} {'stray':>5} {'open':>4} "
        f"{'trunc':>5} {'wrong':>5}  deadline lateness p50/p99/max ms"
    )
    try:
        for lane in args.lanes.split(","):
            for backend in args.backends.split(","):
                parent.send("reset")
                parent.recv()
                began = time.monotonic()
                tally = _client(base, lane, backend, args.calls, args.concurrency)
                took = time.monotonic() - began
                deadline = time.monotonic() + 5.0
                while True:  # the server's view: every request ended or disconnected
                    parent.send("open")
                    still_open = parent.recv()
                    if still_open == 0 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                late = [x * 1000 for x in tally.lateness]
                wrong = sum(tally.wrong.values())
                print(
                    f"{lane:8} {backend:8} {sum(tally.outcomes.values()) + tally.stray:>6} "
                    f"{took:6.1f} {tally.stray:>5} {still_open:>4} {tally.truncated:>5} "
                    f"{wrong:>5}  {statistics.median(late) if late else float('nan'):.1f} / "
                    f"{_quantile(late, 0.99):.1f} / {max(late, default=float('nan')):.1f}"
                )
                if tally.wrong:
                    print("    wrong outcomes:", dict(tally.wrong.most_common(8)))
                failures += tally.stray + still_open + tally.truncated
                sys.stdout.flush()
    finally:
        parent.send("stop")
        server.join(10)
    print("PASS" if failures == 0 else f"FAIL: {failures} stray/open/truncated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
