"""An FL run's pictures in the report: accuracy and loss per round, and accuracy against simulated time.

Drawn off-screen (Agg) without pyplot, as the core's pictures (`fedqueue.report.plots`), from the report's
numbers of each round.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fedqueue.report.plots import DPI

MARKED_POINTS = 100  # more points than this are drawn as a line without markers


def accuracy(path: Path, rounds: Sequence[dict[str, Any]], title: str = "", word: str = "round") -> None:
    """Held-out accuracy, held-out loss and mean training loss per round (`word`: per version)."""
    figure = Figure(figsize=(12, 3.6), dpi=DPI, layout="constrained")
    left, right = figure.subplots(1, 2)
    evaluated = [row for row in rounds if row["accuracy"] is not None]
    trained = [row for row in rounds if row["train_loss"] is not None]
    # A marker per point while they can be told apart; a line alone for thousands.
    dot = "o" if len(evaluated) <= MARKED_POINTS else None
    if evaluated:
        left.plot(
            [row["round"] for row in evaluated], [row["accuracy"] for row in evaluated], marker=dot, color="#2ca02c"
        )
        right.plot(
            [row["round"] for row in evaluated],
            [row["loss"] for row in evaluated],
            marker=dot,
            color="#d62728",
            label="held-out loss",
        )
    else:
        left.text(0.5, 0.5, f"no {word} evaluated yet", ha="center", va="center", transform=left.transAxes)
    if trained:
        right.plot(
            [row["round"] for row in trained],
            [row["train_loss"] for row in trained],
            marker="." if len(trained) <= MARKED_POINTS else None,
            linestyle="--",
            color="#ff7f0e",
            label="mean training loss",
        )
    if evaluated or trained:
        right.legend(fontsize=8, frameon=False)
    for ax, label in ((left, "accuracy (held out)"), (right, "loss")):
        ax.set_xlabel(word)
        ax.set_ylabel(label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(color="0.9")
    left.set_title(title or f"accuracy and loss per {word}", loc="left", fontsize=10)
    figure.savefig(path)


def simulated(path: Path, rounds: Sequence[dict[str, Any]], staleness: dict[str, int] | None, title: str = "") -> None:
    """Accuracy against simulated time; beside it, a buffered-async run's staleness histogram, or how long
    each synchronous round lasted in simulated time (its slowest selected device)."""
    figure = Figure(figsize=(12, 3.6), dpi=DPI, layout="constrained")
    left, right = figure.subplots(1, 2)
    timed = [row for row in rounds if row["sim_time"] is not None and row["accuracy"] is not None]
    if timed:
        dot = "o" if len(timed) <= MARKED_POINTS else None
        left.plot([row["sim_time"] for row in timed], [row["accuracy"] for row in timed], marker=dot, color="#2ca02c")
    else:
        left.text(0.5, 0.5, "no version evaluated yet", ha="center", va="center", transform=left.transAxes)
    left.set_xlabel("simulated time (s)")
    left.set_ylabel("accuracy (held out)")
    if staleness is not None:
        ages = [int(age) for age in staleness]
        right.bar(ages, [staleness[str(age)] for age in ages], color="#1f77b4")
        right.set_xlabel("staleness (versions made while the update trained)")
        right.set_ylabel("updates")
    else:
        ends = [(row["round"], row["sim_time"]) for row in rounds if row["sim_time"] is not None]
        lengths = [end - (ends[i - 1][1] if i else 0.0) for i, (_, end) in enumerate(ends)]
        right.bar([index for index, _ in ends], lengths, color="#9467bd")
        right.set_xlabel("round")
        right.set_ylabel("simulated seconds (slowest device)")
    for ax in (left, right):
        ax.set_axisbelow(True)
        ax.grid(color="0.9")
    right.xaxis.get_major_locator().set_params(integer=True)
    left.set_title(title or "simulated time", loc="left", fontsize=10)
    figure.savefig(path)
