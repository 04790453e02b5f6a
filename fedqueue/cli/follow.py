"""Following a run from the store: a Rich progress bar per round, then a summary."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedqueue.fl.results import count_done, list_rounds
from fedqueue.fl.summary import is_buffered
from fedqueue.report.summary import run_summary
from fedqueue.store import Store


def follow_run(
    store: Store,
    run_id: str,
    console: Console,
    poll_s: float = 0.2,
    tick: Callable[[], Iterable[str]] | None = None,
) -> dict[str, Any]:
    """Show progress until the run finishes or fails; return its summary.

    `tick` runs on every poll (the scheduler's lease and repairs); what it reports is printed.
    """
    bars: dict[int, TaskID] = {}
    # A buffered-async run shows a bar per version: the devices sent off with the version before it.
    buffered = is_buffered(store.get_run(run_id))
    progress = Progress(
        TextColumn("[bold]{task.fields[label]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )
    with progress:
        while True:
            run = store.get_run(run_id)
            for row in list_rounds(store, run_id):
                if row.round_index not in bars:
                    label = f"version {row.round_index:>3}" if buffered else f"round {row.round_index:>3}"
                    unit = f"trained on v{row.round_index - 1}" if buffered else "devices"
                    bars[row.round_index] = progress.add_task(
                        "", total=len(row.selected), label=label, unit=unit, note=""
                    )
                bar = bars[row.round_index]
                if row.state == "done":
                    took = (row.aggregated_at or 0) - row.enqueued_at
                    note = f"{took:5.2f} s"
                    if row.sim_time is not None and buffered:
                        note += f"  sim {row.sim_time:8.1f} s"
                    if row.accuracy is not None:
                        note += f"  accuracy {row.accuracy:.3f}"
                    # A version is made while some devices sent off with the one before still train.
                    completed = count_done(store, run_id, row.round_index) if buffered else len(row.selected)
                    progress.update(bar, total=len(row.selected), completed=completed, note=note)
                    progress.stop_task(bar)
                else:
                    # A buffered-async version's devices keep being sent off until it is made.
                    done = count_done(store, run_id, row.round_index)
                    progress.update(bar, total=len(row.selected), completed=done)
            if run.state != "running":
                break
            for action in tick() if tick is not None else ():
                progress.console.print(f"[yellow]repair:[/yellow] {action}", highlight=False)
            time.sleep(poll_s)
    return run_summary(store, run_id)


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    buffered = summary.get("buffered")
    # Simulated time is shown where the run models it: async runs, and sync runs given device speeds.
    simulated = buffered is not None or summary.get("simulated_speeds", False)
    table = Table(title=f"run {summary['id']} ({summary['state']})")
    table.add_column("version" if buffered else "round", justify="right")
    table.add_column("seconds", justify="right")
    if simulated:
        table.add_column("sim s", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("loss", justify="right")
    for index, seconds in summary["round_seconds"].items():
        accuracy = summary["accuracy"].get(index)
        loss = summary["loss"].get(index)
        sim = summary["sim_time"].get(index)
        cells = [index, f"{seconds:.2f}"]
        if simulated:
            cells.append("" if sim is None else f"{sim:.1f}")
        cells += ["" if accuracy is None else f"{accuracy:.4f}", "" if loss is None else f"{loss:.4f}"]
        table.add_row(*cells)
    console.print(table)
    if buffered:
        histogram = ", ".join(f"{s}: {n}" for s, n in buffered["staleness"].items()) or "none"
        console.print(
            f"updates: {buffered['folded']} folded, {buffered['stale']} dropped as stale,"
            f" {buffered['failed']} failed (buffer_size {buffered['buffer_size']}) · staleness {histogram}",
            highlight=False,
        )
    sim_end = max(summary["sim_time"].values(), default=None) if simulated else None
    console.print(
        ("" if sim_end is None else f"simulated {sim_end:.1f} s · ")
        + f"wall {summary['wall_s']:.2f} s · {summary['tasks_done']} device tasks"
        f" ({summary['tasks_failed']} failed) · mean train {summary['mean_train_ms']} ms"
        f" · max_concurrency {summary['max_concurrency']} · {len(summary['workers'])} workers"
    )
    if summary["error"]:
        console.print(f"[red]run {summary['state']}:[/red] {summary['error']}", highlight=False)
    for failure in summary["failures"][:5]:
        last_line = (failure["error"] or "").strip().splitlines()[-1:] or ["?"]
        console.print(
            f"[yellow]device {failure['device']} failed[/yellow] in round {failure['round']} on {failure['worker']}"
            f" after {failure['attempts']} attempts: {last_line[0]}",
            highlight=False,
        )
    if len(summary["failures"]) > 5:
        console.print(f"... {len(summary['failures']) - 5} more failed devices (fedqueue status RUN --json)")
    if summary["final_accuracy"] is not None:
        console.print(f"final accuracy {summary['final_accuracy']:.4f}")
