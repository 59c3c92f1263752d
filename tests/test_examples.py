"""The examples run offline against the fake provider; ``CHECKS`` says what each must print
(tests/test_wheel.py runs them again from a fresh venv holding only the built wheel)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses: each starts Python and imports litellm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(
    name: str, python: str = sys.executable, env: Mapping[str, str] | None = None
) -> list[str]:
    """Run ``examples/<name>`` offline with ``python`` (in ``env``, default this process's);
    its output lines (it must exit 0)."""
    done = subprocess.run(
        [python, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=110,
        env={**(os.environ if env is None else env), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def check_quickstart(lines: list[str]) -> None:
    assert lines[0].startswith(
        "openai/small-model answered after 2 attempts (degraded: timeout), total "
    )
    assert lines[1].startswith("(cached answer; primary timeout after 0.2")
    assert lines[2].startswith("slow-case log: [('timeout', 0.2")
    assert lines[3] == "DeadlineExceeded: budget 0.3s, attempts: 1"


def check_streaming(lines: list[str]) -> None:
    assert lines[0].startswith(
        "'Queueing at the provider, long outputs, and stalled streams.' from openai/backup-model"
    )
    assert lines[1] == (
        "attempts: [('openai/busy-model', 'FirstTokenTimeout'), ('openai/backup-model', 'ok')]"
    )
    assert lines[2] == "StreamStalled after 3 chunks: 'Queueing at the'"


def check_turn_budget(lines: list[str]) -> None:
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


def check_fanout(lines: list[str]) -> None:
    assert lines[0] == "gathered 2 of 3, missing {2: 'TimedOut'}"
    assert lines[1].startswith("final answer: 'tok0 tok1', ")
    assert lines[2].startswith("GatherIncomplete: [1, 2] missing, caused by ProviderUnavailable(")
    assert lines[3] == "first acceptable: 'Paris.' from openai/careful-model"
    assert lines[4] == "streamed 17 chunks from openai/fast-model"
    assert lines[5] == "NoAcceptableResult: ['Failed', 'TimedOut']"


def check_fast_lane(lines: list[str]) -> None:
    assert lines[0] == "'Queueing, long outputs, stalls.' from openai/backup-model in 4 chunks"
    assert lines[1] == (
        "attempts: [('openai/primary-model', 'ProviderUnavailable'), ('openai/backup-model', 'ok')]"
    )
    assert lines[2] == "Response Queueing, long outputs, stalls."


# What each example must print: a new example gets its check here (test_every_example_is_checked).
def check_deadlines(lines: list[str]) -> None:
    assert lines == [
        "gateway: HTTP 504, control back within 0.2 s of its deadline: True",
        "provider was told the time left: True",
        "provider saw the request closed within 0.2 s of the deadline: True",
        "provider answered: False",
    ]


CHECKS: dict[str, Callable[[list[str]], None]] = {
    "deadlines.py": check_deadlines,
    "quickstart.py": check_quickstart,
    "streaming.py": check_streaming,
    "turn_budget.py": check_turn_budget,
    "fanout.py": check_fanout,
    "fast_lane.py": check_fast_lane,
}


def test_every_example_is_checked() -> None:
    assert set(CHECKS) == {path.name for path in EXAMPLES.glob("*.py")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_runs(name: str) -> None:
    CHECKS[name](run_example(name))
