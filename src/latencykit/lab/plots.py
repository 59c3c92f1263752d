"""The lab's pictures: latency CDFs and the outage timeline, as PNG files or as text.

:func:`write_plots` draws PNG files with matplotlib (the ``plots`` extra), on its non-interactive
Agg canvas: no display, no global backend switch. :func:`format_text_plots` renders the same
distributions as plain text for a terminal (no dependency).

The CDFs are drawn as ``1 - CDF`` (the fraction of requests slower than x) on log-log axes: the
body of the distribution takes the top of the plot and each decade down is ten times rarer, so
the tail, where the policies differ, gets as much room as the median.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .report import percentile

if TYPE_CHECKING:
    from .outage import OutageResult
    from .runner import LabResult

Series = tuple[str, Sequence[float]]
"""A label and its latencies in seconds (any order)."""

MARKS = (0.50, 0.95, 0.99)
"""The quantiles marked on every CDF: p50, p95, p99."""

_BARS = " ▁▂▃▄▅▆▇█"
_ASCII_BARS = " .:-=+*#@"
_STATES = {"closed": "C", "half_open": "H", "open": "O"}
_ANSWERS = {"primary": "p", "secondary": "s", "error": "x"}


def _ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f}s"
    if seconds >= 0.001:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds * 1000:.2g}ms"


def latency_series(result: LabResult) -> list[Series]:
    """The rows' latencies, one series per row (the table's order)."""
    return [(row.label, row.latencies) for row in result.rows if row.latencies]


def ttft_series(result: LabResult) -> list[Series]:
    """The streaming scenario's times to first token, one series per row (none if not run)."""
    if result.streaming is None:
        return []
    return [(row.label, row.latencies) for row in result.streaming.ttft if row.latencies]


# --- text ---------------------------------------------------------------------------------


def format_text_cdf(
    title: str, series: Sequence[Series], *, width: int = 48, ascii_only: bool = False
) -> str:
    """``series`` as one text histogram per line on a shared log-scale axis, with each one's
    p50/p95/p99 in milliseconds.

    Each of the ``width`` columns (default ``48``) is a bin of latency; a bar's height grows
    with the log of the requests in its bin, so a bin holding one request in a thousand still
    shows. ``ascii_only`` (default ``False``) draws with ASCII characters instead of Unicode
    blocks (for terminals that cannot print them).
    """
    values = [v for _, latencies in series for v in latencies if v > 0]
    if not values:
        return f"{title}: no latencies"
    bars = _ASCII_BARS if ascii_only else _BARS
    low, high = min(values), max(values)
    span = math.log(high / low) if high > low else 1.0
    label_width = max(len(label) for label, _ in series)
    label_width = min(max(label_width, 10), 44)

    def column(value: float) -> int:
        return min(width - 1, max(0, int(math.log(value / low) / span * width)))

    lines = [
        f"{title} (log scale, bar height ~ log of the requests in each bin)",
        f"{'':<{label_width}}  {_axis(low, high, width, column)}  {'p50':>7} {'p95':>7} {'p99':>7}",
    ]
    for label, latencies in series:
        counts = [0] * width
        for value in latencies:
            if value > 0:
                counts[column(value)] += 1
        top = math.log1p(max(counts)) if any(counts) else 1.0
        chart = "".join(
            bars[0] if n == 0 else bars[max(1, round(math.log1p(n) / top * (len(bars) - 1)))]
            for n in counts
        )
        ordered = sorted(latencies)
        marks = " ".join(f"{_ms(percentile(ordered, q)):>7}" for q in MARKS)
        lines.append(f"{label[:label_width]:<{label_width}}  {chart}  {marks}")
    return "\n".join(lines)


def _axis(low: float, high: float, width: int, column: Any) -> str:
    """An axis line: the low and high ends and the decades between them, at their columns."""
    axis = [" "] * width
    ticks = [low]
    decade = 10 ** math.ceil(math.log10(low))
    while decade < high:
        ticks.append(decade)
        decade *= 10
    ticks.append(high)
    last_end = -1
    for i, tick in enumerate(ticks):
        text = _ms(tick)
        at = column(tick) if i < len(ticks) - 1 else width - len(text)
        at = min(max(at, 0), width - len(text))
        if at <= last_end:  # would overlap the previous label
            continue
        axis[at : at + len(text)] = text
        last_end = at + len(text)
    return "".join(axis)


def format_outage_strip(result: OutageResult, *, step: float = 0.1) -> str:
    """The outage scenario as two text strips, one character per ``step`` seconds (default
    ``0.1``): the primary's breaker state (``C`` closed, ``O`` open, ``H`` half-open) and which
    target answered the calls started then (``p`` primary, ``s`` secondary, ``x`` an error,
    ``.`` no call; the most frequent)."""
    columns = max(1, math.ceil(result.duration / step))
    states = []
    for i in range(columns):
        state = "closed"
        for at, _, after in result.transitions:
            if at <= i * step:
                state = after
        states.append(_STATES.get(state, "?"))
    calls: list[list[str]] = [[] for _ in range(columns)]
    for at, _, who in result.log:
        # The epsilon keeps a call at exactly 0.3 s in the 0.3 s column (0.3 / 0.1 < 3).
        calls[min(columns - 1, int(at / step + 1e-9))].append(who)
    answers = [_ANSWERS[max(_ANSWERS, key=who.count)] if who else "." for who in calls]
    outage_end = min(columns, round(result.outage / step))
    ruler = "^" * outage_end + " " * (columns - outage_end)
    return "\n".join(
        [
            f"outage timeline, one character per {step:g}s (^: the primary answers 503)",
            f"  breaker  {''.join(states)}   C closed, O open, H half-open",
            f"  answers  {''.join(answers)}   p primary, s secondary, x error",
            f"           {ruler}",
        ]
    )


def format_text_plots(result: LabResult, *, ascii_only: bool = False) -> str:
    """The lab's pictures as text: the rows' latency and the streaming TTFT distributions
    (:func:`format_text_cdf`), and the outage timeline (:func:`format_outage_strip`)."""
    parts = [
        format_text_cdf(
            "latency distribution per row", latency_series(result), ascii_only=ascii_only
        )
    ]
    ttft = ttft_series(result)
    if ttft:
        parts.append(format_text_cdf("streaming: time to first token", ttft, ascii_only=ascii_only))
    if result.outage is not None:
        parts.append(format_outage_strip(result.outage))
    return "\n\n".join(parts)


# --- PNG ----------------------------------------------------------------------------------


def _new_figure(rows: int = 1, height: float = 5.5) -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError(
            "the lab's PNG plots need matplotlib: pip install 'latencykit[plots]'"
        ) from exc
    # A Figure on its own Agg canvas: no pyplot, no global backend, no display needed.
    figure = Figure(figsize=(10, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 1, sharex=True) if rows > 1 else figure.subplots()
    return figure, axes


# Each line its own dash pattern, so a line drawn over an identical one still shows.
_DASHES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (2, 3)))
_LABEL_STEP = 9  # points between the value labels of lines on the same side of a mark


def plot_cdf(
    title: str,
    series: Sequence[Series],
    path: Path,
    *,
    panels: Sequence[tuple[str, Sequence[Series]]] = (),
) -> Path:
    """Draw ``series`` as ``1 - CDF`` on log-log axes, p50/p95/p99 marked on each line with
    their values, to the PNG file ``path``; returns ``path``.

    Each line has its own colour and dash pattern (one hidden under another still shows) and
    its labels their own height. ``panels`` (default none) are more ``(title, series)`` plots
    below the first, on the same latency axis (a streamed replay's times to first chunk).
    """
    everything = [(title, series), *panels]
    figure, axes = _new_figure(rows=len(everything), height=5.5 * len(everything) ** 0.8)
    for ax, (panel_title, panel) in zip(
        axes if len(everything) > 1 else [axes], everything, strict=True
    ):
        _draw_cdf(ax, panel)
        ax.set_title(panel_title)
    figure.savefig(path)
    return path


def _draw_cdf(ax: Any, series: Sequence[Series]) -> None:
    smallest = 1.0
    for index, (label, latencies) in enumerate(series):
        ordered = sorted(v for v in latencies if v > 0)
        if not ordered:
            continue
        n = len(ordered)
        slower = [(n - i) / n for i in range(n)]  # fraction of requests at least this slow
        smallest = min(smallest, 1 / n)
        (line,) = ax.step(
            ordered,
            slower,
            where="post",
            label=label,
            linewidth=1.6,
            linestyle=_DASHES[index % len(_DASHES)],
        )
        for q in MARKS:
            value = percentile(ordered, q)
            ax.plot([value], [1 - q], marker="o", color=line.get_color(), markersize=5)
            # Labels alternate sides of the mark and stack down: lines with close values
            # keep theirs apart.
            right = index % 2 == 0
            ax.annotate(
                _ms(value),
                (value, 1 - q),
                textcoords="offset points",
                xytext=(4 if right else -4, 3 - _LABEL_STEP * (index // 2)),
                horizontalalignment="left" if right else "right",
                fontsize=7,
                color=line.get_color(),
            )
    for q in MARKS:
        ax.axhline(1 - q, color="0.6", linestyle=":", linewidth=0.8)
        ax.annotate(
            f"p{q * 100:g}",
            (1.0, 1 - q),
            xycoords=("axes fraction", "data"),
            xytext=(3, -3),
            textcoords="offset points",
            fontsize=8,
            color="0.4",
        )
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _ms(value)))
    ax.set_yscale("log")
    ax.set_ylim(smallest / 2, 1.3)
    ax.set_xlabel("latency (seconds, log scale)")
    ax.set_ylabel("fraction of requests slower (1 - CDF, log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)


def plot_outage(result: OutageResult, path: Path) -> Path:
    """Draw the outage scenario's timeline (the primary's breaker state above, each call's
    latency coloured by the target that answered below) to the PNG file ``path``; returns
    ``path``."""
    figure, (state_ax, calls_ax) = _new_figure(rows=2, height=6.0)
    levels = {"closed": 0, "half_open": 1, "open": 2}
    times, states = [0.0], [0]
    for at, _, after in result.transitions:
        times.append(at)
        states.append(levels.get(after, 0))
    times.append(result.duration)
    states.append(states[-1])
    for ax in (state_ax, calls_ax):
        ax.axvspan(0, result.outage, color="tab:red", alpha=0.08)
    state_ax.step(times, states, where="post", color="tab:purple", linewidth=2)
    state_ax.set_yticks([0, 1, 2], ["closed", "half-open", "open"])
    state_ax.set_ylim(-0.4, 2.4)
    state_ax.set_ylabel("primary's breaker")
    state_ax.set_title(
        f"outage: the primary answers 503 for {result.outage:g}s (shaded), then recovers"
    )
    styles = {
        "primary": ("tab:blue", "o", "answered by the primary"),
        "secondary": ("tab:orange", "o", "answered by the secondary (failover)"),
        "error": ("tab:red", "x", "error"),
    }
    for who, (colour, marker, label) in styles.items():
        calls = [(at, latency * 1000) for at, latency, w in result.log if w == who]
        if calls:
            calls_ax.scatter(
                [c[0] for c in calls],
                [c[1] for c in calls],
                s=10,
                color=colour,
                marker=marker,
                label=f"{label} ({len(calls)})",
            )
    calls_ax.set_ylabel("call latency (ms)")
    calls_ax.set_xlabel("seconds since the scenario started")
    calls_ax.set_xlim(0, result.duration)
    calls_ax.legend(loc="upper right", fontsize=8)
    for ax in (state_ax, calls_ax):
        ax.grid(True, alpha=0.3)
    figure.savefig(path)
    return path


def write_plots(result: LabResult, directory: Path) -> list[Path]:
    """Write the lab's pictures as PNG files into ``directory`` (created if missing) and return
    their paths: ``latency-cdf.png`` (the rows), ``ttft-cdf.png`` (the streaming scenario, if
    run) and ``outage-timeline.png`` (the outage scenario, if run).

    Raises ``RuntimeError`` when matplotlib (the ``plots`` extra) is not installed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = result.config
    if config.arrival == "closed":
        load = f"closed loop, concurrency {config.concurrency}"
    else:
        load = f"{config.arrival} arrivals at {config.rate:g}/s, from scheduled arrival"
    written = [
        plot_cdf(
            f"latency per policy: llmperf {config.run} x{config.scale:g}, {load}",
            latency_series(result),
            directory / "latency-cdf.png",
        )
    ]
    ttft = ttft_series(result)
    if ttft:
        written.append(
            plot_cdf(
                f"streaming: time to first token, llmperf {config.run} x{config.scale:g}",
                ttft,
                directory / "ttft-cdf.png",
            )
        )
    if result.outage is not None:
        written.append(plot_outage(result.outage, directory / "outage-timeline.png"))
    return written
