"""429s and goodput under a tight quota: ``LLM(governor=True)`` against today's behaviour
(retries on 429, honouring Retry-After), side by side.

Run it from the repository root::

    .venv/bin/python benchmarks/governor.py            # 6 rounds of 10 s per variant
    .venv/bin/python benchmarks/governor.py --quick    # smoke run, a few seconds

The fake provider (real HTTP on 127.0.0.1, fast lane) enforces a quota per API key, 120
requests and 3,000 tokens per minute by default (a call costs 26 tokens: the tokens bind),
told in OpenAI's headers, 429 with ``retry-after`` past it. Each round runs both variants one
after the other (order alternating), each with a fresh key whose quota is first drained to
empty, so every run starts at the same point: the provider's steady refill (50 tokens, about 2
calls, per second) is all there is to share. ``N`` workers (tasks in one process; default 16)
each call in a closed loop for ``--seconds``, with ``deadline=`` 30 s and
``lk.Retry(max_attempts=10)`` in both variants:

- ``retry``: today's behaviour: every worker sends, a 429 comes back, the retry waits the
  Retry-After the provider asked for, and tries again;
- ``governor``: the same, with ``governor=True``: attempts wait for the room the headers tell.

Reported per variant (medians over rounds): the requests the provider saw, the share refused
with 429, the 429s after the first answer (before it, nothing is known to pace by), calls
answered per second and tokens served per second as a share of the quota's rate; and the
median over rounds of the per-round ratio governor / retry of the calls answered.
**2. The fleet** (``--fleet``): ``--processes`` OS processes (default 4) x ``--concurrency``
workers each (default 16), one shared redis-server (started here, as the tests do), against
the provider's quota for one API key (``--fleet-rpm`` 600 requests and ``--fleet-tpm`` 60,000
tokens per minute by default; a call costs about 100 tokens: both limits bind). Each process
sends open-loop bursts (``--burst`` calls every ``--period`` seconds, 5 every 1 s: twice the
quota, all four together), each call taking one of its workers (a call waits for a free one),
with ``deadline=`` 10 s and ``lk.Retry(max_attempts=10)``, for ``--seconds``; calls still going
at the end are cancelled. Variants, one after the other, each on a fresh key whose quota is
first drained: ``retry`` (no governor: a 429 is retried after its Retry-After), ``governor``
(``LLM(governor=True, shared=RedisStore(...))``), and with ``--variants ... router``, litellm's
``Router`` with its own ``rpm``/``tpm`` and the same Redis (usage-based routing, 10 retries).
Reported per round, from the provider's records: the requests it saw, the share refused with
429 (and the 429s after the first 2 s: the start, when nobody has told the fleet the room yet,
aside), the requests and tokens it served as a share of the quota's refill over the run; and
the calls answered, shed (``LimitExceeded``: their wait would have passed the deadline) and
failed (by type; each process prints its first 3 failures as they happen: when, the error and
its attempts). ``--kill-redis-at S`` kills the redis-server ``S`` seconds into each run (every
variant, as a crash would: SIGKILL), ``--restart-redis-at S`` starts a fresh, empty one later;
each phase (Redis up, down, back) is then reported apart: requests, 429s and tokens served.

**3. Lanes** (``--lanes``): one process with ``governor=True`` on the same quota, drained;
interactive calls (``priority="interactive"``, 2 a second) alone (``quiet``), under 16 workers
flooding the quota in the batch lane (``flood``), and under the same flood with every call in
the default lane (``no lanes``); reported: the interactive calls' latency p50 and p99 (the
fake provider answers at once: the latency is the wait for room), and p99 over the quiet p99.

**4. Cost per call** (``--overhead``): a pipeline with the governor stage against the same
pipeline without it, around a trivial async function whose answer tells the limits (as a
transport does: :func:`latencykit.ratelimit.heard`), on a room with plenty left; variants
interleaved per round, batches of 2,000 calls with the garbage collector off; reported: the
median per-round difference, and the cost of parsing one answer's OpenAI headers.

The script reports; it always exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio
import httpx

import latencykit as lk
from latencykit.testing import FakeProvider, ProviderQuota

MESSAGES = [{"role": "user", "content": "x" * 40}]  # 10 prompt tokens
MAX_TOKENS = 16


def drain(fake: FakeProvider, key: str) -> None:
    """Spend ``key``'s whole quota (its tokens with 100-token prompts, then its requests with
    1-token ones), so that a run starts with an empty room."""
    with httpx.Client() as client:
        for prompt, left in ((400, lambda u: u.tokens_remaining > 101), (4, lambda u: True)):
            while fake.quota_usage(key).requests_remaining > 0 and left(fake.quota_usage(key)):
                client.post(
                    f"{fake.base_url}/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": "x" * prompt}],
                        "max_tokens": 1,
                    },
                    headers={"authorization": f"Bearer {key}"},
                )


def client(base_url: str, key: str, *, governor: bool, **options: Any) -> lk.LLM:
    """The benchmark's client: the fast lane, retries honouring Retry-After, 30 s deadline."""
    options.setdefault("deadline", 30.0)
    return lk.LLM(
        "openai/m",
        api_base=base_url,
        api_key=key,
        transport="openai",
        governor=governor,
        retry=lk.Retry(max_attempts=10),
        **options,
    )


async def run(
    fake: FakeProvider, key: str, governor: bool, workers: int, seconds: float
) -> dict[str, float]:
    llm = client(fake.base_url, key, governor=governor)
    before = len(fake.attempts)
    answered = tokens = failed = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal answered, tokens, failed
        while time.monotonic() < end:
            try:
                response: Any = await llm.acompletion(messages=MESSAGES, max_tokens=MAX_TOKENS)
            except lk.LatencykitError:
                failed += 1
                continue
            answered += 1
            tokens += response.usage.total_tokens

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        for _ in range(workers):
            group.start_soon(worker)
    elapsed = time.monotonic() - started
    await llm.aclose()
    statuses = [a.status for a in fake.attempts[before:]]
    first = statuses.index(200) if 200 in statuses else len(statuses)
    return {
        "sent": len(statuses),
        "429": statuses.count(429),
        "429 later": statuses[first:].count(429),
        "answered/s": answered / elapsed,
        "tokens/s": tokens / elapsed,
        "failed": failed,
    }


# --- the fleet -----------------------------------------------------------------------------------

FLEET_PROMPT = [{"role": "user", "content": "x" * 336}]  # 84 prompt tokens: 100 with the answer


def fleet_process(options: dict[str, Any], start: Any, results: Any) -> None:
    """One process of the fleet (spawned): its workers' calls, counted, put on ``results``."""
    results.put(anyio.run(_fleet_process, options, start))


async def _fleet_process(options: dict[str, Any], start: Any) -> dict[str, int]:
    if options["variant"] == "router":
        return await _router_process(options, start)
    store = None
    if options["variant"] == "governor":
        store = lk.RedisStore(options["redis"], interval=0.05)
    llm = client(
        options["base_url"], options["key"], governor=store is not None, shared=store, deadline=10.0
    )
    workers = anyio.CapacityLimiter(options["concurrency"])
    counts = {"answered": 0, "shed": 0, "failed": 0}

    async def one() -> None:
        async with workers:
            try:
                await llm.acompletion(messages=FLEET_PROMPT, max_tokens=MAX_TOKENS)
            except lk.LimitExceeded:
                counts["shed"] += 1
            except lk.LatencykitError as exc:
                counts["failed"] += 1
                kind = f"failed: {type(exc).__name__}"
                counts[kind] = counts.get(kind, 0) + 1
                if counts["failed"] <= 3:  # what failed, when, and why: printed by the parent
                    print(
                        f"  {options['variant']} pid {os.getpid()} failed at "
                        f"{time.monotonic() - began:.1f} s: {type(exc).__name__}: {exc}"[:1500],
                        flush=True,
                    )
            else:
                counts["answered"] += 1

    await anyio.to_thread.run_sync(start.wait)  # every process ready: the parent drains
    await anyio.to_thread.run_sync(start.wait)  # the quota is empty: go together
    began = time.monotonic()
    end = began + options["seconds"]
    async with anyio.create_task_group() as group:
        while time.monotonic() < end:
            for _ in range(options["burst"]):
                group.start_soon(one)
            await anyio.sleep(options["period"])
        group.cancel_scope.cancel()  # calls still going at the end are not counted
    await llm.aclose()
    if store is not None:
        store.close()
    return counts


async def _router_process(options: dict[str, Any], start: Any) -> dict[str, int]:
    """The same load through litellm's Router with its own ``rpm``/``tpm`` on the shared Redis
    (usage-based routing), 10 retries, the same 10 s deadline."""
    from urllib.parse import urlsplit

    import litellm
    from litellm.router import Router

    litellm.suppress_debug_info = True
    redis_url = urlsplit(options["redis"])
    router = Router(
        model_list=[
            {
                "model_name": "m",
                "litellm_params": {
                    "model": "openai/m",
                    "api_base": options["base_url"],
                    "api_key": options["key"],
                    "rpm": options["rpm"],
                    "tpm": options["tpm"],
                    "max_retries": 0,
                },
            }
        ],
        redis_host=redis_url.hostname,
        redis_port=redis_url.port,
        routing_strategy="usage-based-routing-v2",
        num_retries=10,
        timeout=10.0,
    )
    workers = anyio.CapacityLimiter(options["concurrency"])
    counts = {"answered": 0, "shed": 0, "failed": 0}

    async def one() -> None:
        async with workers:
            try:
                with anyio.fail_after(10.0):
                    await router.acompletion(
                        model="m", messages=FLEET_PROMPT, max_tokens=MAX_TOKENS
                    )
            except Exception:
                counts["failed"] += 1
            else:
                counts["answered"] += 1

    await anyio.to_thread.run_sync(start.wait)  # ready
    await anyio.to_thread.run_sync(start.wait)  # go
    end = time.monotonic() + options["seconds"]
    async with anyio.create_task_group() as group:
        while time.monotonic() < end:
            for _ in range(options["burst"]):
                group.start_soon(one)
            await anyio.sleep(options["period"])
        group.cancel_scope.cancel()
    return counts


def fleet(args: argparse.Namespace) -> None:
    import multiprocessing

    from latencykit.testing import RedisServer

    spawn = multiprocessing.get_context("spawn")
    quota = ProviderQuota(requests_per_minute=args.fleet_rpm, tokens_per_minute=args.fleet_tpm)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in args.variants}
    rpm = args.fleet_rpm
    # The phases of a run: (name, from, to) seconds; Redis up throughout unless killed.
    cuts = [0.0, args.kill_redis_at, args.restart_redis_at, args.seconds]
    cuts = [c for c in cuts if c is not None and c <= args.seconds]
    phases = list(zip(("up", "down", "back"), cuts, cuts[1:], strict=False))  # 1 to 3
    with RedisServer() as redis_server, FakeProvider(quota=quota) as fake:
        outage: list[tuple[float, Any]] = []
        if args.kill_redis_at is not None:
            outage.append((args.kill_redis_at, redis_server.kill))
        if args.restart_redis_at is not None:
            outage.append((args.restart_redis_at, redis_server.start))
        for index in range(args.rounds):
            order = args.variants if index % 2 == 0 else args.variants[::-1]
            for variant in order:
                key = f"sk-fleet-{index}-{variant}"
                options = {
                    "variant": variant,
                    "redis": redis_server.url,
                    "base_url": fake.base_url,
                    "key": key,
                    "concurrency": args.concurrency,
                    "seconds": args.seconds,
                    "burst": args.burst,
                    "period": args.period,
                    "rpm": args.fleet_rpm,
                    "tpm": args.fleet_tpm,
                }
                start = spawn.Barrier(args.processes + 1)
                results = spawn.Queue()
                processes = [
                    spawn.Process(target=fleet_process, args=(options, start, results))
                    for _ in range(args.processes)
                ]
                for process in processes:
                    process.start()
                start.wait()  # the processes imported everything and built their clients
                drain(fake, key)  # the run starts on an empty quota
                start.wait()
                began = time.monotonic()
                for at, change in outage:  # Redis killed (and restarted, empty) mid-run
                    time.sleep(max(0.0, began + at - time.monotonic()))
                    change()
                counts = [results.get(timeout=args.seconds + 120) for _ in processes]
                if not redis_server.running:
                    redis_server.start()  # the next variant starts with Redis up
                for process in processes:
                    process.join(30.0)
                    if process.is_alive():  # reported, but stuck at exit: not ours to wait for
                        process.terminate()
                # One variant runs at a time: the provider's requests of the run are its own.
                mine = [a for a in fake.attempts if began <= a.arrived_at <= began + args.seconds]
                statuses = [a.status for a in mine]
                served = sum(a.prompt_tokens + a.tokens_sent for a in mine if a.status == 200)
                rows[variant].append(
                    {
                        "sent": len(statuses),
                        "429": statuses.count(429),
                        "429 later": sum(
                            a.status == 429 for a in mine if a.arrived_at > began + 2.0
                        ),
                        "requests %": 100 * statuses.count(200) / (rpm * args.seconds / 60),
                        "tokens %": 100 * served / (args.fleet_tpm * args.seconds / 60),
                        **{
                            name: sum(c.get(name, 0) for c in counts)
                            for name in sorted({name for c in counts for name in c})
                        },
                        **{
                            f"{phase} {column}": value
                            for phase, since, until in phases
                            for column, value in _phase(
                                mine, began + since, began + until, args.fleet_tpm
                            ).items()
                        },
                    }
                )
    for child in multiprocessing.active_children():  # whatever a library left running
        child.terminate()
    print(
        f"fleet: {args.processes} processes x {args.concurrency} workers, bursts of {args.burst}"
        f" every {args.period:g} s per process, {args.rounds} rounds of {args.seconds:g} s per "
        f"variant; quota {args.fleet_rpm} requests and {args.fleet_tpm} tokens per minute; "
        f"python {sys.version.split()[0]}"
    )
    header = ("variant", "sent", "429s", "429 %", "429s after 2 s", "requests % quota",
              "tokens % quota", "answered", "shed", "failed")  # fmt: skip
    print(f"{header[0]:<9} " + " ".join(f"{h:>{max(7, len(h))}}" for h in header[1:]))
    for name, runs in rows.items():
        for run in runs:
            share = 100 * run["429"] / run["sent"] if run["sent"] else 0.0
            print(
                f"{name:<9} {run['sent']:>7.0f} {run['429']:>7.0f} {share:>7.2f} "
                f"{run['429 later']:>14.0f} {run['requests %']:>16.1f} {run['tokens %']:>14.1f} "
                f"{run['answered']:>8.0f} "
                f"{run['shed']:>7.0f} {run['failed']:>7.0f}"
            )
    for name, runs in rows.items():
        kinds = [
            ", ".join(f"{k[8:]} {v:.0f}" for k, v in run.items() if k.startswith("failed: "))
            for run in runs
        ]
        if any(kinds):
            print(f"{name} failed, by type, per round: " + " / ".join(k or "-" for k in kinds))
    if len(phases) > 1:
        print(
            "by phase (Redis " + ", ".join(f"{p} {a:g}-{b:g} s" for p, a, b in phases) + "): "
            "requests sent, 429s, tokens served % of the quota's refill over the phase"
        )
        for name, runs in rows.items():
            for run in runs:
                print(
                    f"{name:<9} "
                    + "   ".join(
                        f"{p}: {run[p + ' sent']:>5.0f} sent {run[p + ' 429']:>4.0f} 429s "
                        f"{run[p + ' tokens %']:>6.1f} %"
                        for p, _, _ in phases
                    )
                )


def _phase(attempts: list[Any], since: float, until: float, tpm: int) -> dict[str, float]:
    """The provider's records of one phase of a run: requests sent, 429s, tokens served as a
    share of the quota's refill over the phase."""
    found = [a for a in attempts if since <= a.arrived_at < until]
    served = sum(a.prompt_tokens + a.tokens_sent for a in found if a.status == 200)
    return {
        "sent": len(found),
        "429": sum(a.status == 429 for a in found),
        "tokens %": 100 * served / (tpm * (until - since) / 60),
    }


# --- lanes ---------------------------------------------------------------------------------------


async def lanes_run(fake: FakeProvider, key: str, variant: str, seconds: float) -> list[float]:
    """Interactive calls' latencies (2 a second) in one process, alone (``quiet``), or with 16
    workers flooding the quota in the batch lane (``flood``), or in the default lane like the
    interactive calls themselves (``no lanes``)."""
    llm = client(fake.base_url, key, governor=True)
    latencies: list[float] = []
    end = time.monotonic() + seconds
    interactive = "default" if variant == "no lanes" else "interactive"

    async def flood() -> None:
        while time.monotonic() < end:
            with contextlib.suppress(lk.LatencykitError):
                await llm.acompletion(
                    messages=FLEET_PROMPT, max_tokens=MAX_TOKENS, priority="batch"
                    if variant == "flood" else "default"
                )  # fmt: skip

    async def person() -> None:
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                await llm.acompletion(
                    messages=FLEET_PROMPT, max_tokens=MAX_TOKENS, priority=interactive
                )
            except lk.LatencykitError:
                latencies.append(math.inf)
            else:
                latencies.append(time.monotonic() - started)
            await anyio.sleep(0.5)

    # The room is learned first (a call that finds out, and its 429's retry, not counted).
    await llm.acompletion(messages=FLEET_PROMPT, max_tokens=MAX_TOKENS, priority="interactive")
    async with anyio.create_task_group() as group:
        if variant != "quiet":
            for _ in range(16):
                group.start_soon(flood)
            await anyio.sleep(2.0)  # the flood fills the line first
            end += 2.0
        group.start_soon(person)
    await llm.aclose()
    return latencies


def lanes(args: argparse.Namespace) -> None:
    quota = ProviderQuota(requests_per_minute=args.fleet_rpm, tokens_per_minute=args.fleet_tpm)
    found: dict[str, list[float]] = {"quiet": [], "flood": [], "no lanes": []}
    with FakeProvider(quota=quota) as fake:
        for index in range(args.rounds):
            for variant in found if index % 2 == 0 else list(found)[::-1]:
                key = f"sk-lanes-{index}-{variant}"
                drain(fake, key)
                found[variant] += anyio.run(lanes_run, fake, key, variant, args.seconds)
    print(
        f"lanes: one process, interactive calls 2 a second, 16 flooding workers; quota "
        f"{args.fleet_rpm} requests and {args.fleet_tpm} tokens per minute; {args.rounds} rounds "
        f"of {args.seconds:g} s per variant"
    )
    quiet = statistics.quantiles(found["quiet"], n=100)[98]
    for variant, latencies in found.items():
        cut = statistics.quantiles(latencies, n=100)
        print(
            f"{variant:<9} interactive calls {len(latencies):>4}  p50 {cut[49] * 1e3:>7.1f} ms"
            f"  p99 {cut[98] * 1e3:>7.1f} ms  p99 / quiet p99 {cut[98] / quiet:>5.2f}"
        )


_HEADERS = {
    "x-ratelimit-limit-requests": "600000",
    "x-ratelimit-limit-tokens": "60000000",
    "x-ratelimit-remaining-requests": "599999",
    "x-ratelimit-remaining-tokens": "59999000",
    "x-ratelimit-reset-requests": "1ms",
    "x-ratelimit-reset-tokens": "6ms",
}


async def overhead(rounds: int = 30, batch: int = 2000) -> None:
    import gc
    import timeit
    from types import SimpleNamespace

    from latencykit import ratelimit
    from latencykit.pipeline import Call, Pipeline
    from latencykit.policies.governor import Governor
    from latencykit.testing import RedisServer

    usage = SimpleNamespace(prompt_tokens=100, completion_tokens=16, total_tokens=116)
    answer = SimpleNamespace(usage=usage, choices=[], model="m", id="x")

    def calling(api_key: str) -> Call:
        """A call of its own target (its own room) whose answer tells the limits."""
        target = lk.Target("openai/m", api_key=api_key, transport="openai")

        async def call_provider(**kwargs: Any) -> Any:
            ratelimit.heard(target.key, target.api_key, _HEADERS)
            return answer

        return Call(
            call_provider, (), {"messages": [{"role": "user", "content": "x" * 400}]}, target
        )

    with RedisServer() as server:
        store = lk.RedisStore(server.url)
        variants = {
            "plain": (Pipeline(()), calling("sk-bench")),
            "governor": (Pipeline((Governor(),)), calling("sk-bench")),
            "governor+store": (Pipeline((Governor(shared=store),)), calling("sk-bench-fleet")),
        }
        for pipeline, call in variants.values():  # the rooms exist, the fleet's is told
            await pipeline.run(call)
        await anyio.sleep(0.5)
        differences: dict[str, list[float]] = {"governor": [], "governor+store": []}
        for index in range(rounds):
            took = {}
            for name in sorted(variants, reverse=index % 2 == 1):
                pipeline, call = variants[name]
                gc.disable()
                started = time.perf_counter()
                for _ in range(batch):
                    await pipeline.run(call)
                took[name] = (time.perf_counter() - started) / batch
                gc.enable()
            for name, found in differences.items():
                found.append(took[name] - took["plain"])
        fleet = variants["governor+store"][1].target
        paced = ratelimit.room_for(fleet.key, fleet.api_key).stats()
        store.close()
    parse = min(timeit.repeat(lambda: ratelimit.read_limits(_HEADERS), number=5000, repeat=5))
    for name, found in differences.items():
        print(
            f"{name} stage: median per-round difference {statistics.median(found) * 1e6:.1f} us"
            f" per call (range {min(found) * 1e6:.1f} to {max(found) * 1e6:.1f})"
        )
    print(
        f"parsing one answer's headers {parse / 5000 * 1e6:.1f} us; the fleet's room: "
        f"{paced.waits} of {rounds * batch} calls waited for a lease (a round trip)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rpm", type=int, default=120)
    parser.add_argument("--tpm", type=int, default=3_000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    parser.add_argument("--overhead", action="store_true", help="only the cost per call")
    parser.add_argument("--fleet", action="store_true", help="processes sharing one Redis")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--burst", type=int, default=5)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--fleet-rpm", type=int, default=600)
    parser.add_argument("--fleet-tpm", type=int, default=60_000)
    parser.add_argument("--variants", nargs="+", default=["retry", "governor"])
    parser.add_argument(
        "--kill-redis-at", type=float, metavar="S", help="fleet: kill redis-server S s into a run"
    )
    parser.add_argument(
        "--restart-redis-at", type=float, metavar="S", help="fleet: a fresh one S s into a run"
    )
    parser.add_argument("--lanes", action="store_true", help="interactive under a batch flood")
    args = parser.parse_args()
    if args.overhead:
        anyio.run(overhead)
        return
    if args.lanes:
        lanes(args)
        return
    if args.restart_redis_at is not None and not (
        args.kill_redis_at is not None and args.restart_redis_at > args.kill_redis_at
    ):
        parser.error("--restart-redis-at needs an earlier --kill-redis-at")
    if args.fleet:
        if args.quick:
            args.rounds, args.seconds = 1, 5.0
        fleet(args)
        return
    if args.quick:
        args.rounds, args.seconds = 2, 3.0
    quota = ProviderQuota(requests_per_minute=args.rpm, tokens_per_minute=args.tpm)
    results: dict[str, list[dict[str, float]]] = {"retry": [], "governor": []}
    ratios: list[float] = []
    with FakeProvider(quota=quota) as fake:
        for index in range(args.rounds):
            order = ["retry", "governor"] if index % 2 == 0 else ["governor", "retry"]
            row: dict[str, dict[str, float]] = {}
            for name in order:
                key = f"sk-bench-{index}-{name}"
                drain(fake, key)
                row[name] = anyio.run(
                    run, fake, key, name == "governor", args.workers, args.seconds
                )
                results[name].append(row[name])
            if row["retry"]["answered/s"]:
                ratios.append(row["governor"]["answered/s"] / row["retry"]["answered/s"])
    print(
        f"quota {args.rpm} requests and {args.tpm} tokens per minute; {args.workers} workers; "
        f"{args.rounds} rounds of {args.seconds:g} s per variant; python {sys.version.split()[0]}"
    )
    header = (
        "variant",
        "sent",
        "429s",
        "429 %",
        "429s after 1st answer",
        "answered/s",
        "tokens % quota",
    )
    print(f"{header[0]:<9} " + " ".join(f"{h:>{max(6, len(h))}}" for h in header[1:]))
    for name, runs in results.items():
        sent = statistics.median(r["sent"] for r in runs)
        refused = statistics.median(r["429"] for r in runs)
        later = statistics.median(r["429 later"] for r in runs)
        share = statistics.median(100 * r["429"] / r["sent"] if r["sent"] else 0 for r in runs)
        rate = statistics.median(r["answered/s"] for r in runs)
        served = statistics.median(100 * r["tokens/s"] / (args.tpm / 60) for r in runs)
        print(
            f"{name:<9} {sent:>6.0f} {refused:>6.0f} {share:>6.1f} {later:>21.0f} {rate:>10.2f} "
            f"{served:>14.1f}"
        )
    if ratios:
        ratio = statistics.median(ratios)
        print(f"answered/s, governor / retry: median of per-round ratios {ratio:.2f}")


if __name__ == "__main__":
    main()
