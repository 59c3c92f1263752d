"""What the lab shows people: its plots' lines and labels, the replay's legend and panels, the
table's columns, and ``--rows`` running exactly what it names."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import random
from pathlib import Path

import pytest

from latencykit.__main__ import main as latencykit_main
from latencykit.lab.cli import build_parser, config_from_args, replay_panels
from latencykit.lab.plots import _draw_cdf, _new_figure
from latencykit.lab.replay import ReplayResult, ReplayRow
from latencykit.lab.report import format_table
from test_lab_load import _needs, _result


def test_lines_on_top_of_each_other_all_show_and_their_labels_do_not_overlap() -> None:
    _needs("matplotlib")
    same = [0.02 + 0.001 * i for i in range(200)]
    figure, ax = _new_figure()
    _draw_cdf(ax, [("bare", same), ("policy", same), ("tuned", same)])
    lines = [line for line in ax.get_lines() if line.get_label() in ("bare", "policy", "tuned")]
    assert len(lines) == 3
    # The same data: only a line's own dash pattern keeps it visible under the next.
    assert len({str(line.get_linestyle()) + str(line._dash_pattern) for line in lines}) == 3
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    values = [text for text in ax.texts if not text.get_text().startswith("p")]
    assert len(values) == 3 * 3  # p50, p95, p99 of each line
    boxes = [text.get_window_extent(renderer) for text in values]
    for one, other in itertools.combinations(boxes, 2):
        assert not one.overlaps(other)


def _row(name: str, policy: str, stream: bool) -> ReplayRow:
    return ReplayRow(
        name=name,
        requests=3,
        errors=0,
        p50=1.0,
        p95=1.0,
        p99=1.0,
        extra=0.0,
        wasted=0.0,
        ttft_p99=0.2 if stream else None,
        policy=policy,
        latencies=(1.0, 1.1, 1.2),
        ttfts=(0.1, 0.15, 0.2) if stream else (),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_replay_plot_says_what_each_line_ran_and_plots_the_first_token_of_streams(
    stream: bool,
) -> None:
    rows = (_row("bare", "no policy", stream), _row("default", "hedge.delay.q=0.9", stream))
    result = ReplayResult(trace="t.csv", target="m", seed=0, rate=None, rows=rows)
    assert result.title == "replay of t.csv: target m, seed 0, arrivals recorded" + (
        ", streamed" if stream else ""
    )
    panels = replay_panels(result)
    assert [title for title, _ in panels] == [
        "latency from arrival to answer" + (" (the stream's end)" if stream else ""),
        *(["time to first chunk, from arrival"] if stream else []),
    ]
    for _, series in panels:
        assert [label for label, _ in series] == ["bare: no policy", "default: hedge.delay.q=0.9"]
    if stream:
        assert [values for _, values in panels[1][1]] == [(0.1, 0.15, 0.2)] * 2
    assert result.report().splitlines()[-2:] == [
        "  bare: no policy",
        "  default: hedge.delay.q=0.9",
    ]


def test_a_streamed_replay_prints_and_plots_its_times_to_first_chunk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs("matplotlib")
    rng = random.Random(3)
    trace = tmp_path / "s.csv"
    with trace.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["target", "ttft_s", "e2e_s", "at_s"])
        for i in range(200):
            ttft = 5.0 if rng.random() < 0.05 else rng.uniform(0.05, 0.15)
            writer.writerow(["m", ttft, ttft + 1.0, i])
    assert latencykit_main(["lab", "replay", str(trace), "--stream"]) == 0
    out = capsys.readouterr().out
    assert "time to first chunk, from arrival" in out and "default: hedge.delay.q=0.9" in out
    plot = tmp_path / "s.png"
    assert latencykit_main(["lab", "replay", str(trace), "--stream", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _config(*argv: str) -> tuple[tuple[str, ...], dict[str, bool]]:
    config = config_from_args(build_parser().parse_args(list(argv)))
    scenarios = ("streaming", "turn", "fast_lane", "outage")
    return config.rows, {name: getattr(config, name) for name in scenarios}


def test_rows_runs_what_it_names_and_only_that() -> None:
    everything = {"streaming": True, "turn": True, "fast_lane": True, "outage": True}
    assert _config() == (("bare", "deadline+degrade", "hedge"), everything)
    assert _config("--no-turn") == (
        ("bare", "deadline+degrade", "hedge"),
        {**everything, "turn": False},
    )
    nothing = dict.fromkeys(everything, False)
    assert _config("--rows", "hedge") == (("hedge",), nothing)
    assert _config("--rows", "bare, streaming,fast-lane") == (
        ("bare",),
        {**nothing, "streaming": True, "fast_lane": True},
    )
    assert _config("--rows", "bare,streaming", "--no-streaming") == (("bare",), nothing)
    with pytest.raises(ValueError, match=r"--rows: unknown \[\]; name at least one row"):
        _config("--rows", "streaming")
    with pytest.raises(ValueError, match=r"--rows: unknown \['stream'\]"):
        _config("--rows", "bare,stream")


def test_the_table_shows_an_offered_rate_only_for_an_open_loop() -> None:
    closed = _result()
    header, *_ = format_table(closed).splitlines()
    assert "offered/s" not in header and "achieved/s" in header
    assert "closed" not in format_table(closed).split("\n\n")[0]
    opened = dataclasses.replace(
        closed,
        config=dataclasses.replace(closed.config, arrival="poisson", rate=40.0),
        rows=tuple(
            dataclasses.replace(row, arrival="poisson", offered_rate=40.0) for row in closed.rows
        ),
    )
    header, _, first, *_ = format_table(opened).splitlines()
    assert "offered/s" in header
    assert first.split()[-2] == "40.0"


def test_the_table_says_what_the_hedge_row_changes_and_what_it_does_not() -> None:
    result = _result()
    assert "hedge row" not in format_table(result)
    hedged = dataclasses.replace(result.rows[1], key="hedge")
    table = format_table(dataclasses.replace(result, rows=(result.rows[0], hedged)))
    assert "the hedge row sends a backup only once a call has run past about the recent p90" in (
        table
    )
    assert "p50/p90 differ from the bare row's by run-to-run noise" in table
