"""Adaptive concurrency (``LLM(governor=True)``): the limit learned from latency and overload
signals, and the stage that holds attempts to it, with a wait queue served by lane.

The limit's rule is pure logic, tested on a fake clock against a model of a server with a knee
(latency ``max(1, k / N)`` times its own with ``k`` in flight: the fake provider's
``concurrency_knee``). The stage's queue is tested with gated coroutines (the order of service,
the refusal of a wait that cannot fit); what it reads from real answers (time to first chunk,
overloads, a stream's slot held until it ends, the stats columns) over real HTTP to the fake
provider, on both lanes.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import latencykit as lk
from helpers import KEY, MESSAGES, read_all, until
from latencykit import events
from latencykit._context import Priority, priority_var
from latencykit.errors import LimitExceeded, overloaded
from latencykit.pipeline import Call, compose
from latencykit.policies.concurrency import AdaptiveConcurrency, ConcurrencyLimit
from latencykit.policies.deadline import Deadline
from latencykit.ratelimit import RESERVES
from latencykit.stats import ConcurrencyStats
from latencykit.testing import Behavior, FakeProvider, Fault

pytestmark = pytest.mark.anyio

T = lk.Target(name="t")


class Clock:
    """A fake clock the tests move."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def serve(
    limit: ConcurrencyLimit,
    clock: Clock,
    *,
    knee: int,
    samples: int,
    base: float = 0.5,
    noise: float = 0.0,
    rng: random.Random | None = None,
) -> list[int]:
    """Feed ``limit`` ``samples`` answers of a server with ``knee`` kept busy at the limit (an
    open load above its capacity); the limit after each."""
    rng = rng or random.Random(1)
    seen = []
    for _ in range(samples):
        k = limit.limit
        latency = base * max(1.0, k / knee) * (1 + noise * rng.uniform(-1, 1))
        clock.t += latency / k  # k in flight: one answer every latency / k seconds
        limit.sample(latency, epoch=limit.epoch, in_flight=k)
        seen.append(limit.limit)
    return seen


def learned(**options: Any) -> tuple[ConcurrencyLimit, Clock]:
    clock = Clock()
    return ConcurrencyLimit(clock=clock, **options), clock


# --- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("knee", [2, 8, 16, 32, 100])
def test_converges_to_the_knee(knee: int) -> None:
    limit, clock = learned()
    seen = serve(limit, clock, knee=knee, samples=400 * knee)
    # It settles at tolerance (1.1) times the knee, within one (outside a probe round).
    assert knee <= limit.settled <= math.ceil(1.1 * knee) + 1, seen[-50:]


@pytest.mark.parametrize("knee", [8, 32])
def test_converges_with_noisy_latency_and_stays_in_its_band(knee: int) -> None:
    limit, clock = learned(probe_interval=None)
    rng = random.Random(3)
    serve(limit, clock, knee=knee, samples=200 * knee, noise=0.05, rng=rng)
    later = serve(limit, clock, knee=knee, samples=200 * knee, noise=0.05, rng=rng)
    # With +-5 % noise on each answer: within 20 % of the knee, never oscillating wider.
    assert 0.8 * knee <= min(later) and max(later) <= 1.2 * knee + 1, (min(later), max(later))


def test_probe_rounds_measure_the_baseline_at_half_the_limit() -> None:
    limit, clock = learned(probe_interval=30.0)
    serve(limit, clock, knee=16, samples=2000)
    assert clock.t > 30.0  # a probe round has run
    seen = serve(limit, clock, knee=16, samples=4000)
    steady = [k for k in seen if k > 12]
    assert min(seen) >= 8  # a probe halves the limit for a round
    assert min(steady) >= 16 and max(steady) <= 19
    assert limit.baselines[0] == pytest.approx(0.5)


def test_a_provider_slower_for_good_is_measured_again() -> None:
    limit, clock = learned(probe_interval=10.0)
    serve(limit, clock, knee=16, samples=2000)
    # Its own latency doubles: until a probe round, that reads as overload and the limit
    # falls; the probe round's baseline brings it back to the knee.
    serve(limit, clock, knee=16, samples=3000, base=1.0)
    seen = serve(limit, clock, knee=16, samples=1000, base=1.0)
    assert limit.baselines[0] == pytest.approx(1.0)
    assert 16 <= seen[-1] <= 19


def test_overload_backs_off_once_per_limit_and_recovers() -> None:
    limit, clock = learned(probe_interval=None)
    serve(limit, clock, knee=16, samples=3000)
    before, epoch = limit.limit, limit.epoch
    assert limit.overload(epoch=epoch)
    assert limit.limit == before // 2
    # Others that started under the same limit and fail the same way: no second cut.
    assert not limit.overload(epoch=epoch)
    assert limit.limit == before // 2
    # ... and their samples say nothing of the new limit.
    assert not limit.sample(5.0, epoch=epoch, in_flight=before)
    seen = serve(limit, clock, knee=16, samples=1500)
    assert 16 <= seen[-1] <= 19


def test_back_off_stops_at_min_limit() -> None:
    limit, _ = learned(initial=4, min_limit=2)
    for _ in range(5):
        limit.overload(epoch=limit.epoch)
    assert limit.limit == 2


def test_does_not_grow_when_the_load_does_not_reach_it() -> None:
    limit, _ = learned(initial=20)
    for _ in range(500):  # fast answers, but never more than 3 in flight
        limit.sample(0.1, epoch=limit.epoch, in_flight=3)
    assert limit.limit == 20


def test_streams_and_responses_keep_their_own_baselines() -> None:
    limit, _ = learned(initial=4, probe_interval=None)
    for _ in range(2000):  # time to first chunk 0.1 s, whole answers 2 s: no queueing
        limit.sample(2.0, epoch=limit.epoch, in_flight=limit.limit)
        limit.sample(0.1, epoch=limit.epoch, in_flight=limit.limit, stream=True)
    assert limit.baselines == (2.0, 0.1)
    assert limit.limit == 500  # neither kind ever looked slow: it grew to max_limit


def test_a_reserve_kept_free_does_not_push_the_load_past_the_knee() -> None:
    # Only the batch lane is busy: it leaves 20 % of the limit free for the lanes above. The
    # limit learns from what was in flight, so the batch lane settles near the knee (not at
    # the tolerance past it, with the limit 1 / 0.8 higher still).
    limit, clock = learned(probe_interval=None)
    knee = 32
    seen = []
    for _ in range(20_000):
        k = limit.limit - math.ceil(RESERVES[-1] * limit.limit)
        latency = 0.5 * max(1.0, k / knee)
        clock.t += latency / k
        limit.sample(latency, epoch=limit.epoch, in_flight=k)
        seen.append(k)
    later = seen[-5000:]
    assert 0.85 * knee <= min(later) and max(later) <= 1.1 * knee, (min(later), max(later))
    assert statistics.median(later) <= knee + 1


def past_slow_start(limit: ConcurrencyLimit, value: int) -> None:
    """A round at the baseline (0.5 s), then the limit set to ``value``, past slow start."""
    for _ in range(max(limit.round_samples, limit.limit)):
        limit.sample(0.5, epoch=limit.epoch, in_flight=limit.limit)
    limit.adopt(value)


@pytest.mark.parametrize("knee", [8, 16, 32])
def test_a_batch_flood_leaves_the_interactive_lane_below_the_knee(knee: int) -> None:
    # The batch lane fills its slots (the limit less its reserve) and the interactive lane's
    # calls come on top, 0 to 3 at a time. Once learned, what an interactive call finds in
    # flight (itself included) stays within 1.2 times the knee: the lower lanes, held below
    # the knee, do not push the limit up, and Little's law reads the round's typical load.
    limit, clock = learned(probe_interval=None)
    upper = [0, 1, 1, 2, 0, 1, 3, 1]
    found = []
    for n in range(20_000):
        batch = limit.limit - math.ceil(RESERVES[-1] * limit.limit)
        k = batch + upper[n % len(upper)]
        latency = 0.5 * max(1.0, k / knee)
        clock.t += latency / k
        limit.sample(latency, epoch=limit.epoch, in_flight=min(k, limit.limit))
        found.append(batch + 3)  # an interactive call arriving with two others in flight
    later = found[-5000:]
    assert max(later) <= 1.2 * knee, (min(later), max(later))
    assert knee <= limit.limit <= 1.2 * knee  # still converged: within 20 % of the knee


def test_little_s_law_reads_the_round_s_typical_load_not_its_peak() -> None:
    # Past the knee of 16: most samples started with 20 in flight, one in ten with 30 (a
    # burst). The knee is 20 / the latency ratio, not 30 / it.
    limit, _ = learned(initial=16, probe_interval=None)
    past_slow_start(limit, 30)
    for n in range(30):
        limit.sample(0.5 * 20 / 16, epoch=limit.epoch, in_flight=30 if n % 10 == 0 else 20)
    assert limit.limit == 17  # 1.1 * 20 / (20 / 16) = 17.6 (from the peak, 30: 26)


def test_past_the_knee_the_limit_goes_straight_to_little_s_estimate() -> None:
    limit, _ = learned(initial=16, probe_interval=None)
    past_slow_start(limit, 32)
    for _ in range(32):  # a knee of 16: twice as slow as alone
        limit.sample(1.0, epoch=limit.epoch, in_flight=32)
    assert limit.limit == 17  # 1.1 * 32 / 2 = 17.6 at once (half-way, as other rounds: 24)


def test_lower_lanes_below_the_knee_do_not_push_the_limit_up() -> None:
    limit, _ = learned(initial=16, probe_interval=None)
    past_slow_start(limit, 20)
    for _ in range(2000):  # 17 in flight at most (of 20), all at the baseline
        limit.sample(0.5, epoch=limit.epoch, in_flight=17)
    assert limit.limit == 20
    for _ in range(100):  # the load reaches the knee the limit estimates (20 / 1.1): grow
        limit.sample(0.5, epoch=limit.epoch, in_flight=limit.limit)
    assert limit.limit > 20


def test_noisy_rounds_below_the_knee_do_not_ratchet_the_limit_down() -> None:
    # A batch flood holds the load at 80 % of the limit plus one, below the knee of 32; one
    # round in four reads 7 % slow (a loaded machine). Each such round cuts the limit (Little's
    # law), and the rounds at the baseline bring it back to where the knee was found.
    limit, clock = learned(probe_interval=None)
    serve(limit, clock, knee=32, samples=20_000)
    found = limit.limit
    for n in range(400):
        latency = 0.5 * (1.07 if n % 4 == 0 else 1.0)
        for _ in range(max(limit.round_samples, limit.limit)):
            load = limit.limit - math.ceil(RESERVES[-1] * limit.limit) + 1
            limit.sample(latency, epoch=limit.epoch, in_flight=load)
    assert limit.limit >= 0.9 * found, (found, limit.limit)


async def test_the_interactive_lane_keeps_the_settled_limit_during_a_probe_round() -> None:
    limit, clock = learned(initial=20, probe_interval=10.0)
    past_slow_start(limit, 20)
    stage = AdaptiveConcurrency(lambda: limit)
    pipeline = compose(stage)
    gate = anyio.Event()

    async def work() -> None:
        await gate.wait()

    async def call(lane: Priority) -> None:
        token = priority_var.set(lane)
        try:
            await pipeline.run(Call(work, target=T))
        finally:
            priority_var.reset(token)

    def stats() -> ConcurrencyStats:
        return stage.stats("t") or ConcurrencyStats(0, 0, 0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "default")
        await until(lambda: stats().in_flight == 1)
        clock.t = 11.0  # a probe is due: the next round to end starts one, at half the limit
        state = stage._targets["t"]
        for _ in range(20):  # (17 in flight: no growth)
            stage._learn(state, "t", 0.5, limit.epoch, 17, stream=False)
        assert limit.settled == 20 and limit.limit == 10
        for _ in range(12):
            tg.start_soon(call, "batch")
        await until(lambda: stats().in_flight == 8 and stats().waiting == 5)  # 10 less 20 %
        for _ in range(3):
            tg.start_soon(call, "default")
        await until(lambda: stats().in_flight == 10 and stats().waiting == 6)  # the probe's
        for _ in range(10):
            tg.start_soon(call, "interactive")
        # The interactive lane: the limit the probe goes back to, 20.
        await until(lambda: stats().in_flight == 20 and stats().waiting == 6)
        gate.set()


@pytest.mark.parametrize(
    ("options", "error", "field"),
    [
        ({"initial": 0}, ValueError, "ConcurrencyLimit.initial"),
        ({"initial": 600}, ValueError, "ConcurrencyLimit.initial"),
        ({"min_limit": 0}, ValueError, "ConcurrencyLimit.min_limit"),
        ({"max_limit": 0}, ValueError, "ConcurrencyLimit.max_limit"),
        ({"tolerance": 1.0}, ValueError, "ConcurrencyLimit.tolerance"),
        ({"smoothing": 0}, ValueError, "ConcurrencyLimit.smoothing"),
        ({"backoff": 1.5}, ValueError, "ConcurrencyLimit.backoff"),
        ({"round_samples": 0}, ValueError, "ConcurrencyLimit.round_samples"),
        ({"probe_interval": -1.0}, ValueError, "ConcurrencyLimit.probe_interval"),
        ({"tolerance": "1.2"}, TypeError, "ConcurrencyLimit.tolerance"),
        ({"initial": True}, TypeError, "ConcurrencyLimit.initial"),
    ],
)
def test_invalid_options_fail_naming_the_field(
    options: dict[str, Any], error: type[Exception], field: str
) -> None:
    with pytest.raises(error, match=field):
        ConcurrencyLimit(**options)


# --- the queue ---------------------------------------------------------------------------------


def fixed(n: int) -> Callable[[], ConcurrencyLimit]:
    return lambda: ConcurrencyLimit(initial=n, min_limit=n, max_limit=n)


async def test_waiters_are_served_by_lane_fifo_within_a_lane() -> None:
    stage = AdaptiveConcurrency(fixed(1))
    pipeline = compose(stage)
    gate = anyio.Event()
    served: list[str] = []

    async def work(name: str) -> str:
        served.append(name)
        if name == "holder":
            await gate.wait()
        return name

    async def call(name: str, lane: Priority) -> None:
        token = priority_var.set(lane)
        try:
            await pipeline.run(Call(work, (name,), target=T))
        finally:
            priority_var.reset(token)

    def waiting() -> int:
        found = stage.stats("t")
        return 0 if found is None else found.waiting

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "holder", "batch")
        await until(lambda: served == ["holder"])
        order: list[tuple[str, Priority]] = [("b1", "batch"), ("d1", "default"), ("b2", "batch")]
        order += [("i1", "interactive")]
        order += [("d2", "default"), ("i2", "interactive")]
        for n, (name, lane) in enumerate(order, 1):
            tg.start_soon(call, name, lane)
            await until(lambda n=n: waiting() == n)  # type: ignore[misc]
        gate.set()
    assert served == ["holder", "i1", "i2", "d1", "d2", "b1", "b2"]


async def test_no_lane_starves_while_higher_ones_wait() -> None:
    stage = AdaptiveConcurrency(fixed(1))
    pipeline = compose(stage)
    served: list[str] = []

    async def work(lane: str) -> None:
        served.append(lane)
        await anyio.lowlevel.checkpoint()

    async def call(lane: Priority) -> None:
        token = priority_var.set(lane)
        try:
            await pipeline.run(Call(work, (lane,), target=T))
        finally:
            priority_var.reset(token)

    async with anyio.create_task_group() as tg:
        for _ in range(40):
            for lane in ("interactive", "batch"):
                tg.start_soon(call, lane)
    # The batch lane is served too while the interactive one waits: about 1 in 17.
    first = served[:34]
    assert 1 <= first.count("batch") <= 4, first
    assert served.count("batch") == 40


async def test_batch_leaves_the_reserve_free_for_the_lanes_above() -> None:
    stage = AdaptiveConcurrency(fixed(10))
    pipeline = compose(stage)
    gate = anyio.Event()
    started: list[Priority] = []

    async def work(lane: Priority) -> None:
        started.append(lane)
        await gate.wait()

    async def call(lane: Priority) -> None:
        token = priority_var.set(lane)
        try:
            await pipeline.run(Call(work, (lane,), target=T))
        finally:
            priority_var.reset(token)

    def stats() -> ConcurrencyStats:
        return stage.stats("t") or ConcurrencyStats(0, 0, 0)

    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(call, "batch")
        # 10 slots, 20 % kept for the lanes above: 8 batch calls run, 4 wait.
        await until(lambda: stats().waiting == 4 and stats().in_flight == 8)
        for lane in ("interactive", "default"):
            tg.start_soon(call, lane)
        await until(lambda: stats().in_flight == 10)  # at once, without a slot freed
        assert started.count("batch") == 8 and stats().waiting == 4
        gate.set()
    assert started.count("batch") == 12  # and the batch lane went on


async def test_a_wait_that_cannot_fit_the_deadline_is_refused_at_once() -> None:
    stage = AdaptiveConcurrency(fixed(1))
    gate = anyio.Event()
    started: list[str] = []

    async def work(name: str) -> None:
        started.append(name)
        await gate.wait()

    async def one(seconds: float) -> None:
        started.append("quick")
        await anyio.sleep(seconds)

    # A slot is held about 0.5 s: one call teaches it.
    await compose(stage).run(Call(one, (0.5,), target=T))
    seen: list[events.Event] = []
    plain = compose(stage)
    with events.subscribe(seen.append):
        async with anyio.create_task_group() as tg:
            tg.start_soon(plain.run, Call(work, ("holder",), target=T))
            await until(lambda: "holder" in started)
            tg.start_soon(plain.run, Call(work, ("waiter",), target=T))
            await until(lambda: stage.stats("t") is not None and stage.stats("t").waiting == 1)  # type: ignore[union-attr]
            # Two ahead of it (the holder's slot, the waiter), 0.5 s each: 1 s > 0.3 s.
            with anyio.fail_after(0.25), pytest.raises(LimitExceeded) as caught:
                await compose(Deadline(0.3), stage).run(Call(work, ("late",), target=T))
            gate.set()
    assert "late" not in started
    assert caught.value.limit == "concurrency" and caught.value.target == "t"
    assert caught.value.wait == pytest.approx(1.0, rel=0.5)
    assert [e.limit for e in seen if isinstance(e, events.LimitRefused)] == ["concurrency"]
    assert started == ["quick", "holder", "waiter"]


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    stage = AdaptiveConcurrency(fixed(1))
    gate = anyio.Event()

    async def work() -> None:
        await gate.wait()

    pipeline = compose(stage)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run, Call(work, target=T))
        await until(lambda: stage.stats("t") is not None)
        with anyio.move_on_after(0.05):
            await pipeline.run(Call(work, target=T))
        assert stage.stats("t") == ConcurrencyStats(1, 1, 0)
        gate.set()
    assert stage.stats("t") == ConcurrencyStats(1, 0, 0)


# --- over real HTTP ----------------------------------------------------------------------------


def governed(fake: FakeProvider, model: str, lane: str, **options: Any) -> lk.LLM:
    return lk.LLM(
        f"openai/{model}",
        api_base=fake.base_url,
        api_key=KEY,
        transport=lane,
        governor=True,
        **options,
    )


def stage_of(llm: lk.LLM) -> AdaptiveConcurrency:
    [stage] = [p for p in llm.pipeline.policies if isinstance(p, AdaptiveConcurrency)]
    return stage


def test_off_by_default_no_stage() -> None:
    llm = lk.LLM("openai/m", api_key=KEY)
    assert not [p for p in llm.pipeline.policies if isinstance(p, AdaptiveConcurrency)]
    governed_llm = lk.LLM("openai/m", api_key=KEY, governor=True)
    stages = [int(p.stage) for p in governed_llm.pipeline.policies]
    assert stages == sorted(stages)


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_a_stream_holds_its_slot_until_it_ends(fake: FakeProvider, lane: str) -> None:
    fake.script("m", Behavior(ttft=0.05, output_tokens=3))
    llm = governed(fake, "m", lane)
    key = llm.targets[0].key
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    row = llm.stats()[key]
    assert row.concurrency == ConcurrencyStats(8, 1, 0)
    assert "limit" in str(llm.stats()) and "inflight" in str(llm.stats())
    await read_all(stream)
    assert llm.stats()[key].concurrency == ConcurrencyStats(8, 0, 0)
    # It learned from the time to first chunk (0.05 s), not from the whole stream.
    await llm.acompletion(messages=MESSAGES)
    limit = stage_of(llm).limit_of(key)
    assert limit is not None
    await llm.aclose()


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_samples_are_time_to_first_chunk_and_durations(fake: FakeProvider, lane: str) -> None:
    fake.script("m", Behavior(ttft=0.05, itl=0.05, output_tokens=4))
    llm = governed(fake, "m", lane)
    stage = stage_of(llm)
    for _ in range(10):
        await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
        await llm.acompletion(messages=MESSAGES)
    limit = stage.limit_of(llm.targets[0].key)
    assert limit is not None
    response, stream = limit.baselines
    assert stream is not None and 0.05 <= stream < 0.2  # the first chunk
    assert response is not None and 0.25 <= response < 0.6  # the whole answer: 0.05 + 4 * 0.05
    await llm.aclose()


@pytest.mark.parametrize(
    ("behavior", "expected"),
    [
        (Behavior(fault=Fault.HTTP_429), True),
        (Behavior(fault=Fault.HTTP_503), True),
        (Behavior(fault=Fault.ERROR_EVENT, error="overloaded"), True),  # 529
        (Behavior(fault=Fault.HTTP_500), False),
        (Behavior(fault=Fault.CONTEXT_LENGTH), False),
    ],
    ids=["429", "503", "529", "500", "400"],
)
@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_overload_signals_back_off(
    fake: FakeProvider, lane: str, behavior: Behavior, expected: bool
) -> None:
    fake.script("m", behavior)
    llm = governed(fake, "m", lane)
    seen: list[events.Event] = []
    with events.subscribe(seen.append), pytest.raises(lk.errors.ProviderError) as caught:
        await llm.acompletion(messages=MESSAGES)
    assert overloaded(caught.value) is expected
    row = llm.stats()[llm.targets[0].key]
    assert row.concurrency is not None
    assert row.concurrency.limit == (4 if expected else 8)
    told = [(e.limit, e.value, e.previous) for e in seen if isinstance(e, events.LimitLearned)]
    assert told == ([("concurrency", 4, 8)] if expected else [])
    await llm.aclose()


async def test_an_overloaded_stream_event_is_an_overload(fake: FakeProvider) -> None:
    fake.script("m", Behavior(fault=Fault.ERROR_EVENT, error="overloaded", stall_after=0))
    llm = governed(fake, "m", "openai")
    with pytest.raises(lk.errors.ProviderError) as caught:
        await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    assert overloaded(caught.value)
    await llm.aclose()


@pytest.mark.slow
async def test_learns_the_knee_of_the_fake_provider(fake: FakeProvider) -> None:
    # A server of 4 at a time, 0.2 s alone, under 12 closed-loop workers: the limit comes
    # down from its start of 8 to the knee's band; nothing is refused (no deadline).
    fake.script("m", Behavior(ttft=0.2, concurrency_knee=4))
    llm = governed(fake, "m", "openai")
    key = llm.targets[0].key
    stop = anyio.Event()

    async def worker() -> None:
        while not stop.is_set():
            await llm.acompletion(messages=MESSAGES, max_tokens=2)

    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(worker)
        await until(lambda: stage_of(llm).limit_of(key) is not None)
        found = stage_of(llm).limit_of(key)
        assert found is not None
        limit: ConcurrencyLimit = found
        await until(lambda: limit.epoch >= 12, within=60)
        stop.set()
    assert 3 <= limit.limit <= 6, limit
    await llm.aclose()


async def test_an_overload_that_breaks_a_committed_stream_backs_off(fake: FakeProvider) -> None:
    fake.script("m", Behavior(fault=Fault.ERROR_EVENT, error="overloaded", stall_after=2))
    llm = governed(fake, "m", "openai")
    with pytest.raises(lk.errors.StreamBroken):
        await read_all(await llm.acompletion(messages=MESSAGES, stream=True))
    assert llm.stats()[llm.targets[0].key].concurrency == ConcurrencyStats(4, 0, 0)
    await llm.aclose()


async def test_an_attempt_that_times_out_is_a_sample_of_at_least_that_long(
    fake: FakeProvider,
) -> None:
    fake.script("m", Behavior(ttft=5.0))
    llm = governed(fake, "m", "openai", timeout=0.1)
    for _ in range(10):
        with pytest.raises(lk.errors.AttemptTimeout):
            await llm.acompletion(messages=MESSAGES)
    limit = stage_of(llm).limit_of(llm.targets[0].key)
    assert limit is not None
    response, _ = limit.baselines
    assert response is not None and 0.1 <= response < 1.0  # a round of 10 timed-out samples
    await llm.aclose()


@pytest.mark.slow
async def test_an_interactive_call_goes_ahead_of_a_batch_backlog(fake: FakeProvider) -> None:
    fake.script("m", Behavior(ttft=0.1, concurrency_knee=2))
    llm = governed(fake, "m", "openai")
    done: list[str] = []

    async def one(name: str, priority: str) -> None:
        await llm.acompletion(messages=MESSAGES, priority=priority)
        done.append(name)

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(one, f"batch{n}", "batch")
        stage = stage_of(llm)
        await until(
            lambda: (stage.stats(llm.targets[0].key) or ConcurrencyStats(0, 0, 0)).waiting > 20
        )
        tg.start_soon(one, "interactive", "interactive")
    # It waited for one freed slot, not for the backlog: at most the batch calls in flight
    # ended before it (the limit: 8 at first, 12 after a round of slow start), not 40.
    assert done.index("interactive") <= 13, done
    await llm.aclose()


@pytest.mark.parametrize("lane", ["openai", "litellm"])
async def test_a_stream_collected_unclosed_gives_its_slot_back(
    fake: FakeProvider, lane: str
) -> None:
    fake.script("m", Behavior(itl=0.05, output_tokens=400))
    llm = governed(fake, "m", lane)
    key = llm.targets[0].key
    stream = await llm.acompletion(messages=MESSAGES, stream=True)
    assert llm.stats()[key].concurrency == ConcurrencyStats(8, 1, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del stream
        gc.collect()  # the finaliser gives the slot back through the event loop
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    await until(lambda: llm.stats()[key].concurrency == ConcurrencyStats(8, 0, 0))
    await llm.aclose()
