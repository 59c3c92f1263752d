"""The examples run offline against the fake provider."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.timeout(120)
def test_quickstart_runs() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("answered by openai/small-model after 2 attempt(s), degraded=True")
    assert lines[1].startswith("(cached answer; primary timeout after 0.2")
    assert lines[2].startswith("slow-case log: [('timeout', 0.2")
    assert lines[3] == "DeadlineExceeded: budget 0.3s, attempts: 1"


@pytest.mark.timeout(120)
def test_streaming_example_runs() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "streaming.py")],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "'Queueing at the provider, long outputs, and stalled streams.' from openai/backup-model"
    )
    assert lines[1] == (
        "attempts: [('openai/busy-model', 'FirstTokenTimeout'), ('openai/backup-model', 'ok')]"
    )
    assert lines[2] == "StreamStalled after 3 chunks: 'Queueing at the'"
