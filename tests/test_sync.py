"""LLM.completion / LLM.embedding: the async pipeline run from sync code on the LLM's own event
loop thread (one, long-lived, shared by every thread). The fault matrix runs through both in
test_faults.py."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import latencykit as lk
from helpers import MESSAGES, make_llm, target
from latencykit._sync import SyncStream
from latencykit.testing import Behavior, FakeProvider, Fault
from latencykit.testing._openai import embedding_of


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "latencykit-sync"]


def wait_for(predicate: Any, within: float = 10.0) -> None:
    """Poll ``predicate()`` until it holds (state the provider's thread changes)."""
    ends = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.005)


def forget(held: list[Any]) -> None:
    """Drop the last references to ``held``'s objects and collect them."""
    held.clear()
    gc.collect()


@pytest.fixture(params=["litellm", "openai"])
def lane(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_sync_calls_share_one_loop_and_its_connections(fake: FakeProvider, lane: str) -> None:
    before = len(loop_threads())
    llm = make_llm(fake, transport=lane, dimensions=8)
    try:
        answers = [llm.completion(messages=MESSAGES) for _ in range(3)]
        vectors = llm.embedding(input=["one", "two"])
        assert len(loop_threads()) == before + 1
    finally:
        llm.close()
    assert all(a.choices[0].message.content.startswith("tok0") for a in answers)
    assert [v["embedding"] for v in vectors.data] == [
        embedding_of("one", 8),
        embedding_of("two", 8),
    ]
    assert [lk.report(a).target for a in [*answers, vectors]] == ["openai/primary"] * 4
    assert len({a.connection_id for a in fake.attempts}) == 1  # kept alive across sync calls
    wait_for(lambda: len(loop_threads()) == before)


def test_a_sync_stream_is_an_iterator_that_closes(fake: FakeProvider, lane: str) -> None:
    fake.script("primary", Behavior(output_tokens=5))
    llm = make_llm(fake, transport=lane)
    try:
        with llm.completion(messages=MESSAGES, stream=True) as stream:
            assert isinstance(stream, SyncStream)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "tok0 tok1 tok2 tok3 tok4"
        assert lk.report(stream).chunks == 5
        fake.script("primary", Behavior(output_tokens=50, itl=0.05))
        broken_out = llm.completion(messages=MESSAGES, stream=True)
        next(iter(broken_out))
        broken_out.close()
        wait_for(lambda: fake.attempts[-1].disconnected_at is not None)
        assert fake.attempts[-1].tokens_sent < 50
    finally:
        llm.close()


def test_a_sync_stream_outlived_by_its_loop_says_so(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(output_tokens=50, itl=0.05))
    llm = make_llm(fake, transport="openai")
    stream = llm.completion(messages=MESSAGES, stream=True)
    next(stream)
    llm.close()
    with pytest.raises(RuntimeError, match=r"sync loop was closed \(LLM\.close\(\)\)"):
        next(stream)
    stream.close()  # nothing left to close
    wait_for(lambda: fake.attempts[0].disconnected_at is not None)
    held = [stream]
    del stream
    with pytest.warns(ResourceWarning, match="never closed"):  # as any stream left open
        forget(held)


def test_the_deadline_closes_a_sync_call_s_request(fake: FakeProvider, lane: str) -> None:
    fake.script("primary", Behavior(fault=Fault.HANG))
    llm = make_llm(fake, transport=lane, deadline=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(lk.DeadlineExceeded) as info:
            llm.embedding(input="x")
        assert time.monotonic() - started < 3.0
        assert [a.target for a in info.value.attempts] == ["openai/primary"]
        wait_for(lambda: fake.attempts[0].disconnected_at is not None)
        with pytest.raises(lk.DeadlineExceeded):
            llm.completion(messages=MESSAGES)
        wait_for(lambda: fake.attempts[1].disconnected_at is not None)
    finally:
        llm.close()


def test_many_threads_call_one_llm_at_once(fake: FakeProvider) -> None:
    fake.script("primary", Behavior(ttft=0.05))
    llm = make_llm(fake, transport="openai", retry=lk.Retry(max_attempts=2))
    found: dict[int, Any] = {}
    failed: list[BaseException] = []

    def work(i: int) -> None:
        try:
            if i % 2:
                found[i] = llm.embedding(input=f"text {i}").data[0].embedding
            else:
                found[i] = llm.completion(messages=MESSAGES).choices[0].message.content
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    llm.close()
    assert failed == []
    assert {i: v for i, v in found.items() if i % 2} == {
        i: embedding_of(f"text {i}", 8) for i in range(1, 16, 2)
    }
    assert all(found[i].startswith("tok0") for i in range(0, 16, 2))


def test_close_is_idempotent_and_a_later_call_starts_a_new_loop(fake: FakeProvider) -> None:
    llm = make_llm(fake, transport="openai")
    llm.close()  # never started: nothing to do
    llm.completion(messages=MESSAGES)
    llm.close()
    llm.close()
    llm.completion(messages=MESSAGES)
    llm.close()
    first, second = fake.attempts
    assert first.connection_id != second.connection_id  # the first loop's pool was closed


def test_a_collected_llm_stops_its_loop_thread(fake: FakeProvider) -> None:
    make_llm(fake)  # the process's first litellm LLM freezes the heap (gc.freeze): not this one
    before = len(loop_threads())
    held = [make_llm(fake, transport="openai")]
    held[0].completion(messages=MESSAGES)
    assert len(loop_threads()) == before + 1
    forget(held)
    wait_for(lambda: len(loop_threads()) == before)
    wait_for(lambda: fake.open_connections == 0)  # its pool closed with its loop


def test_errors_are_latencykit_s_with_the_attempts(fake: FakeProvider, lane: str) -> None:
    fake.script("primary", Behavior(fault=Fault.HTTP_503))
    fake.script("secondary", Behavior(fault=Fault.HTTP_500))
    llm = make_llm(
        fake, transport=lane, dimensions=8, failover=[target(fake, "secondary", dimensions=8)]
    )
    try:
        with pytest.raises(lk.ProviderUnavailable) as info:
            llm.embedding(input="x")
    finally:
        llm.close()
    assert [a.target for a in info.value.attempts] == ["openai/primary", "openai/secondary"]


@pytest.mark.anyio
async def test_a_sync_call_from_an_event_loop_says_to_await_instead(fake: FakeProvider) -> None:
    llm = make_llm(fake, transport="openai")
    with pytest.raises(RuntimeError, match=r"await llm\.acompletion\(\.\.\.\)"):
        llm.completion(messages=MESSAGES)
    with pytest.raises(RuntimeError, match=r"await llm\.aembedding\(\.\.\.\)"):
        llm.embedding(input="x")
    assert fake.attempts == [] and not llm._loop_thread().running


@pytest.mark.anyio
async def test_aclose_closes_the_sync_loop_too(fake: FakeProvider) -> None:
    import anyio

    llm = make_llm(fake, transport="openai")
    await anyio.to_thread.run_sync(lambda: llm.completion(messages=MESSAGES))
    assert llm._loop_thread().running
    await llm.aclose()
    assert not llm._loop_thread().running


@pytest.mark.slow
def test_a_process_exits_with_its_sync_loop_still_open(fake: FakeProvider) -> None:
    script = textwrap.dedent(
        f"""
        import latencykit as lk
        llm = lk.LLM("openai/primary", api_base={fake.base_url!r}, api_key="k",
                     transport="openai")
        print(llm.completion(messages=[{{"role": "user", "content": "hi"}}]).choices[0]
              .message.content.split()[0])
        # no close(): the loop thread is stopped at exit, its connection closed
        """
    )
    source = os.path.dirname(os.path.dirname(lk.__file__))  # this checkout's latencykit
    env = {**os.environ, "PYTHONPATH": source}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tok0"
    assert time.monotonic() - started < 30
    wait_for(lambda: fake.open_connections == 0)  # the process's connection went with it
