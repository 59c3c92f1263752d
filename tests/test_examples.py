"""The examples run offline against the fake provider."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses: each starts Python and imports litellm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str) -> list[str]:
    """Run ``examples/<name>`` offline; its output lines (it must exit 0)."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.timeout(120)
def test_quickstart_runs() -> None:
    lines = run_example("quickstart.py")
    assert lines[0].startswith("answered by openai/small-model after 2 attempt(s), degraded=True")
    assert lines[1].startswith("(cached answer; primary timeout after 0.2")
    assert lines[2].startswith("slow-case log: [('timeout', 0.2")
    assert lines[3] == "DeadlineExceeded: budget 0.3s, attempts: 1"


@pytest.mark.timeout(120)
def test_streaming_example_runs() -> None:
    lines = run_example("streaming.py")
    assert lines[0].startswith(
        "'Queueing at the provider, long outputs, and stalled streams.' from openai/backup-model"
    )
    assert lines[1] == (
        "attempts: [('openai/busy-model', 'FirstTokenTimeout'), ('openai/backup-model', 'ok')]"
    )
    assert lines[2] == "StreamStalled after 3 chunks: 'Queueing at the'"


@pytest.mark.timeout(120)
def test_turn_budget_example_runs() -> None:
    lines = run_example("turn_budget.py")
    assert lines[0] == "turn budget 2.300s"
    assert [line.split(":")[0].strip() for line in lines[1:5]] == [
        "retrieval",
        "prompt",
        "model",
        "tools",
    ]
    assert all(line.endswith(", ok") for line in lines[1:5])
    assert lines[5] == "answer: Queues at the provider. (latency: see the runbook)"
    assert lines[6] == (
        "DeadlineExceeded in stage 'model': {'retrieval': 'ok', 'prompt': 'ok', 'model': 'overran'}"
    )


@pytest.mark.timeout(120)
def test_fanout_example_runs() -> None:
    lines = run_example("fanout.py")
    assert lines[0] == "gathered 2 of 3, missing {2: 'TimedOut'}"
    assert lines[1].startswith("final answer: 'tok0 tok1', ")
    assert lines[2].startswith("GatherIncomplete: [1, 2] missing, caused by ProviderUnavailable(")
    assert lines[3] == "first acceptable: 'Paris.' from openai/careful-model"
    assert lines[4] == "streamed 17 chunks from openai/fast-model"
    assert lines[5] == "NoAcceptableResult: ['Failed', 'TimedOut']"


@pytest.mark.timeout(120)
def test_fast_lane_example_runs() -> None:
    lines = run_example("fast_lane.py")
    assert lines[0] == "'Queueing, long outputs, stalls.' from openai/backup-model in 4 chunks"
    assert lines[1] == (
        "attempts: [('openai/primary-model', 'ProviderUnavailable'), ('openai/backup-model', 'ok')]"
    )
    assert lines[2] == "Response Queueing, long outputs, stalls."
