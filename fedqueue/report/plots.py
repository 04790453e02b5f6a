"""The report's pictures. Figures are drawn off-screen (Agg) without pyplot: no global backend is changed."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from fedqueue.core.process.utilization import INTERVAL_S as SAMPLE_INTERVAL_S
from fedqueue.report.long_table import nice_step
from fedqueue.report.timeline import Lane, RoundMark, RoundWords, Span
from fedqueue.store.utilization import Sample

DPI = 110
LANE_HEIGHT_IN = 0.42
MAX_HEIGHT_IN = 60.0
MAX_ROUND_LABELS = 12
MAX_ROUND_LINES = 40
# The plot's width in pixels, about (12 in at DPI, less the labels and colour bar): what is closer together than
# its share of the run's time lands on one pixel, so it is drawn as one.
PLOT_PIXELS = 1000
CROWDED = 300  # tasks in a lane above which its tasks less than a pixel apart are drawn as one bar
ROUNDS = RoundWords()  # a kind's rounds, called rounds
MAX_DISTINCT_ROUNDS = 10  # more rounds (or versions) than this are coloured on a continuous scale
AGGREGATION_COLOUR = "#222222"
UTILIZATION_COLOUR = "#8c8c8c"
FAILED_COLOUR = "#d62728"
PACK_COLOUR = "0.15"
UNROUNDED_COLOUR = "#1f77b4"  # tasks of kinds that do not run in rounds


class RoundColours:
    """A colour per round (or version), told by a colour bar beside the plot, never by a legend entry per round:
    distinct colours for a few, a continuous scale for many (20 or 2,000 alike)."""

    def __init__(self, rounds: Sequence[int]) -> None:
        from matplotlib import colormaps
        from matplotlib.colors import BoundaryNorm, ListedColormap

        self.rounds = sorted(set(rounds))
        low, high = min(self.rounds, default=0), max(self.rounds, default=0)
        self.continuous = len(self.rounds) > MAX_DISTINCT_ROUNDS or high - low >= MAX_DISTINCT_ROUNDS
        self.norm: Normalize
        if self.continuous:
            self.cmap: Colormap = colormaps["viridis"]
            self.norm = Normalize(vmin=low, vmax=max(high, low + 1))
        else:  # one band of the bar per number from the lowest to the highest
            count = high - low + 1
            self.cmap = ListedColormap([colormaps["tab10"](index) for index in range(count)])
            self.norm = BoundaryNorm([low - 0.5 + step for step in range(count + 1)], count)

    def __call__(self, round_index: int) -> tuple[float, float, float, float]:
        return self.cmap(self.norm(round_index))

    def many(self, round_indices: Sequence[int]) -> list[tuple[float, float, float, float]]:
        """The colours of many rounds in one call (one call per task costs a millisecond each)."""
        if not round_indices:
            return []
        import numpy as np

        return [tuple(rgba) for rgba in self.cmap(self.norm(np.asarray(round_indices)))]

    def colour_bar(self, figure: Figure, ax: Axes, label: str) -> None:
        from matplotlib.cm import ScalarMappable

        bar = figure.colorbar(ScalarMappable(norm=self.norm, cmap=self.cmap), ax=ax, label=label, pad=0.01)
        if self.continuous:
            bar.ax.yaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]  # a MaxNLocator
        else:
            bar.set_ticks(list(range(self.rounds[0], self.rounds[-1] + 1)) if self.rounds else [])


@dataclass
class _Row:
    label: str
    lane: Lane | None = None
    samples: list[Sample] = field(default_factory=list)
    failed: list[Span] = field(default_factory=list)


def _rows(lanes: Sequence[Lane], spans: Sequence[Span], samples: Sequence[Sample]) -> list[_Row]:
    """Top to bottom, per worker: its slot lanes and its utilization row."""
    failed: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for span in spans:
        if span.state != "done":
            failed[span.worker_key].append(span)
    sampled: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        sampled[(sample.worker, sample.pid)].append(sample)
    by_worker: dict[tuple[str, int], list[Lane]] = defaultdict(list)
    for lane in lanes:
        by_worker[(lane.worker, lane.pid)].append(lane)
    rows: list[_Row] = []
    for key in sorted(set(by_worker) | set(failed)):
        worker_lanes = by_worker.get(key, [])
        if not worker_lanes:
            rows.append(_Row(f"{key[0]} pid {key[1]} (nothing ran)", failed=failed[key]))
        for index, lane in enumerate(worker_lanes):
            rows.append(_Row(lane.label, lane=lane, failed=failed.get(key, []) if index == 0 else []))
        if sampled.get(key):
            kind = "GPU" if sampled[key][0].device_used.startswith("cuda") else "CPU"
            rows.append(_Row(f"{key[0]} {kind} % (0-100)", samples=sampled[key]))
    return rows


def _round_marks(ax: Axes, rounds: Sequence[RoundMark], origin: float, words: RoundWords) -> None:
    """Dashed line where a round was enqueued (labelled), dotted where it was aggregated; thinned out for many, to
    the rounds whose number is a multiple of a round step (every 1,000th of 10,000 versions labelled)."""
    every_line = nice_step(len(rounds) / MAX_ROUND_LINES)
    every_label = nice_step(len(rounds) / MAX_ROUND_LABELS)
    for position, row in enumerate(rounds):
        x = row.enqueued_at - origin
        shown = row.round_index + words.shift
        labelled = position == 0 or shown % every_label == 0
        if labelled or shown % every_line == 0:
            ax.axvline(x, color="0.45", linestyle="--", linewidth=0.8, zorder=1)
            if row.aggregated_at is not None and every_line == 1:
                ax.axvline(row.aggregated_at - origin, color=AGGREGATION_COLOUR, linestyle=":", linewidth=0.8, zorder=1)
        if labelled:
            ax.text(
                x,
                1.005,
                f"{words.mark}{shown}",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                ha="left",
                va="bottom",
                color="0.3",
            )


def timeline(
    path: Path,
    lanes: Sequence[Lane],
    spans: Sequence[Span],
    rounds: Sequence[RoundMark],
    samples: Sequence[Sample],
    origin: float,
    end: float,
    title: str = "",
    words: RoundWords = ROUNDS,
) -> None:
    """One lane per worker slot, one bar per task coloured by round (aggregations dark), utilization under each worker."""
    timeline_figure(lanes, spans, rounds, samples, origin, end, title, words).savefig(path)


def timeline_figure(
    lanes: Sequence[Lane],
    spans: Sequence[Span],
    rounds: Sequence[RoundMark],
    samples: Sequence[Sample],
    origin: float,
    end: float,
    title: str = "",
    words: RoundWords = ROUNDS,
) -> Figure:
    """The timeline's figure, drawn and not yet saved."""
    rows = _rows(lanes, spans, samples)
    pixel_s = max(end - origin, 1e-3) * 1.01 / PLOT_PIXELS
    # Colours by the number shown: a buffered run's tasks by the version they trained on.
    spans_rounds = [span.round_index for span in spans if span.round_index is not None]
    colours = RoundColours([index + words.shift for index in [row.round_index for row in rounds] + spans_rounds])
    height = min(MAX_HEIGHT_IN, 1.9 + LANE_HEIGHT_IN * len(rows))
    figure = Figure(figsize=(12, height), dpi=DPI, layout="constrained")
    ax = figure.add_subplot()
    drawn = 0
    for y, row in enumerate(rows):
        if row.lane is not None:
            drawn += _task_bars(ax, row.lane, colours, origin, y, words.shift, pixel_s)
        if row.samples:
            _utilization(ax, row.samples, origin, y, pixel_s)
        if row.failed:
            ax.plot(
                [span.finished_at - origin for span in row.failed],
                [y] * len(row.failed),
                linestyle="none",
                marker="x",
                color=FAILED_COLOUR,
                markersize=6,
                zorder=4,
            )
    _round_marks(ax, rounds, origin, words)
    ax.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top
    ax.set_xlim(0, max(end - origin, 1e-3) * 1.01)
    tasks = sum(len(lane.spans) for lane in lanes)
    # Said on the picture when a bar may be several tasks.
    joined = (
        f"\n{tasks:,} tasks drawn as {drawn:,} bars: a slot's tasks within a pixel ({pixel_s:.3g} s) of each other"
        " are one bar, coloured by the first"
        if drawn < tasks
        else ""
    )
    ax.set_xlabel("seconds since the run was submitted" + joined)
    ax.grid(axis="x", color="0.9", zorder=0)
    ax.set_title(title or "tasks per worker slot", loc="left", fontsize=10, pad=14)
    failed = any(span.state != "done" for span in spans)
    if spans_rounds:
        colours.colour_bar(figure, ax, words.colour)
    packed = any(span.pack is not None for span in spans)
    _timeline_legend(
        figure,
        bool(samples),
        failed,
        packed,
        words,
        unrounded=len(spans_rounds) < len(spans),
        aggregated=any(span.task_type == "aggregate" for span in spans),
        marked=bool(rounds),
    )
    return figure


def _task_bars(ax: Axes, lane: Lane, colours: RoundColours, origin: float, y: int, shift: int, pixel_s: float) -> int:
    """A lane's tasks as bars; how many bars. A crowded lane's tasks less than a pixel apart are one bar: drawn
    apart they would be the same pixels, and a run of 100,000 tasks would take minutes to draw."""
    join_s = pixel_s if len(lane.spans) > CROWDED else -1.0
    trained = [span for span in lane.spans if span.task_type != "aggregate"]
    folds = [span for span in lane.spans if span.task_type == "aggregate"]
    drawn = 0
    for group, zorder in ((trained, 3), (folds, 3.5)):  # aggregations over the tasks they sit between
        bars, firsts = _joined([(span.started_at - origin, span.finished_at - origin) for span in group], join_s)
        if not bars:
            continue
        faces = _faces([group[index] for index in firsts], colours, shift)
        # A thin white edge keeps back-to-back tasks apart, so each bar is one task. With hundreds of tasks
        # per lane bars get narrower than a pixel: an edge in their own colour keeps them from vanishing.
        # One collection per lane, whatever the number of rounds.
        crowded = len(lane.spans) > CROWDED
        ax.broken_barh(
            [(start, finish - start) for start, finish in bars],
            (y - 0.38, 0.76),
            facecolors=faces,
            edgecolors=faces if crowded else "white",
            linewidth=0.6 if crowded else 0.4,
            zorder=zorder,
        )
        drawn += len(bars)
    # A pack's devices (trained back to back, or vmapped as one bar) are underlined together: one line per lane.
    packs: dict[tuple[int | None, str], list[Span]] = defaultdict(list)
    for span in lane.spans:
        if span.pack is not None:
            packs[(span.round_index, span.pack)].append(span)
    extents = sorted(
        (min(s.started_at for s in members) - origin, max(s.finished_at for s in members) - origin)
        for members in packs.values()
    )
    lines, _ = _joined(extents, join_s)
    if lines:
        ax.hlines(
            [y + 0.45] * len(lines),
            [start for start, _ in lines],
            [finish for _, finish in lines],
            color=PACK_COLOUR,
            linewidth=1.4,
            zorder=4,
        )
    return drawn


def _faces(spans: Sequence[Span], colours: RoundColours, shift: int) -> list[tuple[float, float, float, float] | str]:
    """Each bar's colour: aggregations dark, tasks of kinds without rounds blue, the others by their round."""
    by_round = iter(colours.many([span.round_index + shift for span in spans if span.round_index is not None]))
    faces: list[tuple[float, float, float, float] | str] = []
    for span in spans:
        colour = next(by_round) if span.round_index is not None else UNROUNDED_COLOUR
        faces.append(AGGREGATION_COLOUR if span.task_type == "aggregate" else colour)
    return faces


def _joined(intervals: Sequence[tuple[float, float]], join_s: float) -> tuple[list[tuple[float, float]], list[int]]:
    """Intervals in start order, each joined to the one before while less than `join_s` (a pixel) from its end
    and from its start (so a bar spans a pixel or two, and a long busy stretch keeps its colours along it); the
    joined intervals and the position of each one's first. A negative `join_s` joins none."""
    joined: list[tuple[float, float]] = []
    firsts: list[int] = []
    for index, (start, finish) in enumerate(intervals):
        if joined and start - joined[-1][1] < join_s and start - joined[-1][0] < join_s:
            joined[-1] = (joined[-1][0], max(joined[-1][1], finish))
        else:
            joined.append((start, finish))
            firsts.append(index)
    return joined, firsts


def _utilization(ax: Axes, samples: Sequence[Sample], origin: float, y: int, pixel_s: float) -> None:
    """One bar per sample over the interval it measured; row bottom 0 %, row top 100 % (of a GPU or a core).
    Samples closer together than a pixel are drawn as their mean, one bar per pixel."""
    reading_s = SAMPLE_INTERVAL_S
    if len(samples) > PLOT_PIXELS:
        samples, reading_s = _binned(samples, origin, pixel_s), max(SAMPLE_INTERVAL_S, pixel_s)
    bottom = y + 0.4
    previous: float | None = None
    lefts, widths, heights = [], [], []
    for sample in samples:
        # A reading covers the time since the previous one (the sampling interval for the first).
        began = sample.sampled_at - SAMPLE_INTERVAL_S if previous is None else previous
        began = max(began, sample.sampled_at - 2 * reading_s)  # a gap in sampling stays a gap
        lefts.append(began - origin)
        widths.append(sample.sampled_at - began)
        heights.append(-0.8 * min(max(sample.utilization, 0.0), 100.0) / 100.0)  # rows grow downwards
        previous = sample.sampled_at
    ax.bar(
        lefts,
        heights,
        width=widths,
        bottom=bottom,
        align="edge",
        color=UTILIZATION_COLOUR,
        alpha=0.7,
        linewidth=0,
        zorder=2,
    )
    ax.axhline(bottom - 0.8, color="0.85", linewidth=0.5, zorder=1)


def _binned(samples: Sequence[Sample], origin: float, pixel_s: float) -> list[Sample]:
    """The mean of the samples in each pixel's time, as one sample at the last of them."""
    bins: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        bins[int((sample.sampled_at - origin) / pixel_s)].append(sample)
    return [
        replace(members[-1], utilization=sum(sample.utilization for sample in members) / len(members))
        for _, members in sorted(bins.items())
    ]


def _timeline_legend(
    figure: Figure,
    sampled: bool,
    failed: bool,
    packed: bool,
    words: RoundWords,
    *,
    unrounded: bool,
    aggregated: bool,
    marked: bool,
) -> None:
    """What the bars, lines and marks are, in one row under the plot: a handful of entries, however many rounds
    (their colours are told by the colour bar), and only those drawn (a job without rounds names none)."""
    handles: list[Patch | Line2D] = []
    if aggregated or marked:
        handles.append(Patch(color=AGGREGATION_COLOUR, label=words.aggregation))
    if unrounded:
        handles.append(Patch(color=UNROUNDED_COLOUR, label="task"))
    if marked:
        handles.append(Line2D([], [], color="0.45", linestyle="--", label=words.marked))
    if sampled:
        handles.append(Patch(color=UTILIZATION_COLOUR, alpha=0.7, label="utilization (row = 0-100 %)"))
    if failed:
        handles.append(Line2D([], [], color=FAILED_COLOUR, marker="x", linestyle="none", label="failed task"))
    if packed:
        handles.append(Line2D([], [], color=PACK_COLOUR, linewidth=1.4, label="one pack of devices"))
    if handles:
        figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)


def concurrency(
    path: Path,
    steps: Sequence[tuple[float, int]],
    slots: int,
    rounds: Sequence[RoundMark],
    origin: float,
    end: float,
    title: str = "",
    words: RoundWords = ROUNDS,
) -> None:
    """Tasks running at each instant against the slots that could run them."""
    figure = Figure(figsize=(12, 3.6), dpi=DPI, layout="constrained")
    ax = figure.add_subplot()
    xs: Sequence[float] = [0.0] + [instant - origin for instant, _ in steps] + [max(end - origin, 1e-3)]
    ys: Sequence[float] = [0] + [running for _, running in steps] + [steps[-1][1] if steps else 0]
    if len(steps) <= 2 * PLOT_PIXELS:
        ax.fill_between(xs, ys, step="post", color="#1f77b4", alpha=0.35, linewidth=0)
        ax.step(xs, ys, where="post", color="#1f77b4", linewidth=1.0, label="tasks running")
    else:  # more changes than pixels: each pixel's mean and peak, said in the legend
        pixel_s = max(end - origin, 1e-3) * 1.01 / PLOT_PIXELS
        xs, means, ys = _per_pixel(steps, origin, end, pixel_s)
        ax.fill_between(
            xs, means, step="post", color="#1f77b4", alpha=0.35, linewidth=0, label=f"mean per {pixel_s:.3g} s"
        )
        ax.step(xs, ys, where="post", color="#1f77b4", linewidth=0.8, label=f"most running per {pixel_s:.3g} s")
    ax.axhline(slots, color=FAILED_COLOUR, linestyle="--", linewidth=1.2, label=f"slots ({slots})")
    _round_marks(ax, rounds, origin, words)
    ax.set_xlim(0, max(end - origin, 1e-3) * 1.01)
    ax.set_ylim(0, max([slots, *ys]) + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]  # a MaxNLocator
    ax.set_xlabel("seconds since the run was submitted")
    ax.set_ylabel("tasks running")
    ax.set_title(title or "tasks running at once", loc="left", fontsize=10, pad=14)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    figure.savefig(path)


def _per_pixel(
    steps: Sequence[tuple[float, int]], origin: float, end: float, pixel_s: float
) -> tuple[list[float], list[float], list[float]]:
    """Tasks running over each pixel's time: where each pixel begins, the mean over it and the most at once."""
    count = max(1, math.ceil((end - origin) / pixel_s))
    area = [0.0] * count
    peak = [0.0] * count
    changes = [(0.0, 0), *((instant - origin, running) for instant, running in steps), (end - origin, 0)]
    for (start, running), (finish, _) in itertools.pairwise(changes):
        at = max(0.0, start)
        while at < finish:
            bucket = min(count - 1, int(at / pixel_s))
            until = min(finish, (bucket + 1) * pixel_s)
            area[bucket] += running * (until - at)
            peak[bucket] = max(peak[bucket], running)
            if until <= at:  # the last bucket holds what rounding leaves past its end
                break
            at = until
    return [bucket * pixel_s for bucket in range(count)], [total / pixel_s for total in area], peak
