"""The lab's open-loop load, its pictures (PNG and text) and its progress display."""

from __future__ import annotations

import importlib
import io
import os
import struct
import time
import warnings
from pathlib import Path

import anyio
import pytest

from latencykit.__main__ import main as latencykit_main
from latencykit.lab import LabConfig, LabResult, run_lab
from latencykit.lab.outage import OutageResult
from latencykit.lab.plots import format_outage_strip, format_text_cdf, write_plots
from latencykit.lab.progress import PlainProgress, Progress, RichProgress, make_progress
from latencykit.lab.rows import Sent
from latencykit.lab.runner import (
    UNFINISHED,
    arrival_offsets,
    quiet_litellm,
    run_requests,
    summarise,
)


def _needs(module: str) -> None:
    """Import an optional extra; skip without it, except under CI=true where it must be there."""
    if os.environ.get("CI", "").strip().lower() in {"true", "1"}:
        importlib.import_module(module)
    else:
        pytest.importorskip(module)


# --- open loop ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_open_loop_achieves_the_offered_rate(backend: str) -> None:
    # 60 requests, one every 1/30 s: 2 s of arrivals; replayed latencies x0.01 are mostly tens
    # of ms, so the client keeps up and completes about what is offered.
    config = LabConfig(
        rows=("bare",),
        requests=60,
        scale=0.01,
        arrival="fixed",
        rate=30.0,
        drain=5.0,
        outage=False,
        streaming=False,
        turn=False,
        fast_lane=False,
    )
    started = time.monotonic()
    [row] = run_lab(config, backend=backend, progress=None).rows
    assert row.arrival == "fixed" and row.offered_rate == 30.0
    assert row.requests == 60 and row.errors == 0 and row.unfinished == 0
    assert row.wall_time >= 59 / 30  # the arrivals were spread, not sent at once
    assert 0.6 * 30 <= row.throughput <= 1.1 * 30  # wide margins: a loaded 2-core machine
    assert len(row.latencies) == 60 and list(row.latencies) == sorted(row.latencies)
    assert time.monotonic() - started < 100


@pytest.mark.anyio
async def test_open_loop_counts_from_the_schedule_and_cuts_what_is_left() -> None:
    started: dict[int, float] = {}

    async def send(i: int) -> Sent:
        started[i] = time.monotonic()
        begun = time.monotonic()
        await anyio.sleep(30 if i == 1 else 0.01)  # request 1 hangs
        return Sent(time.monotonic() - begun, ok=True)

    steps = io.StringIO()
    t0 = time.monotonic()
    sent, wall = await run_requests(
        send, 3, 1, "open", PlainProgress(steps), arrivals=[0.0, 0.1, 0.2], drain=0.3
    )
    elapsed = time.monotonic() - t0
    assert elapsed < 5  # bounded: the hung request was cancelled 0.3 s after the last arrival
    assert 0.5 - 0.05 <= wall < 5
    assert started[2] - started[0] >= 0.2 - 0.02  # arrivals on schedule (not a closed loop)
    [cut] = [s for s in sent if not s.ok]
    assert cut.error_type == UNFINISHED and cut.latency >= 0.4 - 0.05  # from its arrival at 0.1
    assert sum(s.ok for s in sent) == 2
    row = summarise("x", "open", sent, 3, wall, arrival="fixed", offered_rate=10.0, window=0.2)
    assert row.unfinished == 1 and row.errors == 1 and row.error_types == {UNFINISHED: 1}
    assert "open" in steps.getvalue() and "2/3" in steps.getvalue()


def test_arrival_offsets() -> None:
    assert arrival_offsets("fixed", 4.0, 3, seed=1) == [0.0, 0.25, 0.5]
    poisson = arrival_offsets("poisson", 50.0, 2000, seed=7)
    assert poisson == arrival_offsets("poisson", 50.0, 2000, seed=7)  # seeded
    assert poisson != arrival_offsets("poisson", 50.0, 2000, seed=8)
    assert poisson[0] == 0.0 and poisson == sorted(poisson)
    assert 0.9 / 50 < poisson[-1] / 1999 < 1.1 / 50  # mean gap 1/rate
    with pytest.raises(ValueError, match="closed"):
        arrival_offsets("closed", 1.0, 3, seed=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"arrival": "burst"}, "arrival"), ({"rate": 0.0}, "rate"), ({"drain": -1.0}, "drain")],
)
def test_config_rejects_bad_load_options(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LabConfig(**options)  # type: ignore[arg-type]


# --- pictures -----------------------------------------------------------------------------


def _result(tmp_rows: int = 3) -> LabResult:
    """A lab result built by hand: heavy-tailed latencies and an outage, no lab run."""
    rows = []
    for k in range(tmp_rows):
        sent = [Sent(0.02 + 0.001 * i + (2.0 if i % 50 == 0 and k == 0 else 0.0), ok=True)
                for i in range(200)]  # fmt: skip
        rows.append(summarise(f"row{k}", f"policy {k}", sent, 200, 2.0))
    log = [(t / 10, 0.04, "secondary" if t < 30 else "primary") for t in range(60)]
    outage = OutageResult(
        outage=3.0,
        duration=6.0,
        calls=60,
        errors=0,
        by_secondary=30,
        primary_requests_during_outage=5,
        transitions=[(0.4, "closed", "open"), (1.4, "open", "half_open"), (3.2, "half_open", "closed")],  # noqa: E501
        timeline=[],
        log=log,
    )  # fmt: skip
    return LabResult(config=LabConfig(), rows=tuple(rows), machine={}, outage=outage)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plots_are_written_as_png(tmp_path: Path) -> None:
    _needs("matplotlib")
    written = write_plots(_result(), tmp_path / "plots")
    assert [p.name for p in written] == ["latency-cdf.png", "outage-timeline.png"]
    for path in written:
        width, height = _png_size(path)
        assert width > 600 and height > 400 and path.stat().st_size > 10_000


def test_text_cdf_and_outage_strip() -> None:
    result = _result()
    series = [(row.label, row.latencies) for row in result.rows]
    text = format_text_cdf("latency", series, width=40)
    header, axis, *lines = text.splitlines()
    assert "log scale" in header and "p99" in axis and "ms" in axis
    assert [line.split()[:2] for line in lines] == [
        ["policy", "0"],
        ["policy", "1"],
        ["policy", "2"],
    ]
    assert lines[0].rstrip().endswith("2.1s") and "2.1s" not in lines[1]  # row 0's tail only
    assert any(ch in "▁▂▃▄▅▆▇█" for ch in lines[0])
    plain = format_text_cdf("latency", series, ascii_only=True)
    assert plain.isascii() and "@" in plain
    assert format_text_cdf("empty", []) == "empty: no latencies"
    assert result.outage is not None
    strip = format_outage_strip(result.outage).splitlines()
    breaker = strip[1].split()[1]
    answers = strip[2].split()[1]
    assert breaker.startswith("CCCCO") and "H" in breaker and breaker[-1] == "C"
    assert answers.startswith("s" * 30) and answers[30:] == "p" * 30
    assert strip[3].strip() == "^" * 30


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_open_loop_with_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _needs("matplotlib")
    argv = ["lab", "--rows", "bare", "--requests", "20", "--scale", "0.01", "--arrival"]
    argv += ["poisson", "--rate", "40", "--plot-dir", str(tmp_path), "--json", "-"]
    argv += ["--no-outage", "--no-streaming", "--no-turn", "--no-fast-lane"]
    assert latencykit_main(argv) == 0
    captured = capsys.readouterr()
    assert "offered/s" in captured.out and "poisson arrivals at 40 requests/s" in captured.out
    assert "plots written" in captured.out and "latency distribution" not in captured.out
    _png_size(tmp_path / "latency-cdf.png")
    # Not a terminal: plain progress lines, no escape codes, nothing else on stderr.
    assert "\x1b[" not in captured.err and "litellm.acompletion (bare)" in captured.err
    assert "Warning" not in captured.err and "Traceback" not in captured.err


# --- progress and noise -------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_falls_back_to_plain_lines_off_a_terminal() -> None:
    assert type(make_progress(None)) is Progress
    stream = io.StringIO()
    with make_progress(stream) as progress:
        assert isinstance(progress, PlainProgress)
        with progress.step("row one", 3) as step:
            for _ in range(3):
                step.advance()
        with progress.step("a scenario"):
            pass
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # one per step, not one per request
    assert lines[0].split()[:3] == ["row", "one", "3/3"] and "done" in lines[1]


def test_progress_is_a_rich_bar_on_a_terminal() -> None:
    _needs("rich")
    stream = _Terminal()
    with make_progress(stream) as progress:
        assert isinstance(progress, RichProgress)
        with progress.step("row one", 4) as step:
            step.advance(4)
    assert "row one" in stream.getvalue() and "4/4" in stream.getvalue()


def test_quiet_litellm_filters_only_litellms_unawaited_coroutine() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_litellm():
            warnings.warn(
                "coroutine 'OpenAIChatCompletion.acompletion' was never awaited",
                RuntimeWarning,
                stacklevel=1,
            )
            warnings.warn("coroutine 'mine' was never awaited", RuntimeWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["coroutine 'mine' was never awaited"]
