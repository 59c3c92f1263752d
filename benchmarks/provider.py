"""The fake provider in a child process, for benchmarks: in the measured process its Python
would share the GIL with the client being measured."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def provider_process(script: str, *args: str, output: list[str] | None = None) -> Iterator[str]:
    """Run ``script`` (Python that starts a ``FakeProvider``, prints its base URL, and stops
    when its standard input closes) in a child process with ``args``; yield the base URL. On
    exit, what the script printed after the URL is appended to ``output``, if given."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPOSITORY,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        base_url = process.stdout.readline().strip()
        if not base_url.startswith("http://"):
            raise RuntimeError(f"the fake provider did not start: {base_url!r}")
        yield base_url
    finally:
        process.stdin.close()
        try:
            rest = process.stdout.read()
            process.wait(timeout=15)
            if output is not None:
                output.append(rest)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        finally:
            process.stdout.close()
