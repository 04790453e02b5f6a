"""Following a run of any kind: the bars its kind shows (or its tasks), repairs as they happen."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fedqueue.core import jobs
from fedqueue.core.jobs import ProgressBar, RunProgress, TaskProgress
from fedqueue.core.services import Services
from fedqueue.core.waits.outage import BrokerWatch
from fedqueue.core.waits.store_watch import StoreWatch


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def progress_of(services: Services, run_id: str) -> RunProgress:
    """The bars its kind shows; one bar of its tasks for a kind not installed here."""
    kind = jobs.kinds().get(services.store.get_run(run_id).kind)
    return TaskProgress(services.store, run_id) if kind is None else kind.progress(services, run_id)


def follow(
    services: Services,
    run_id: str,
    console: Console,
    poll_s: float = 0.2,
    tick: Callable[[], Iterable[str]] | None = None,
    watch: BrokerWatch | None = None,
    store_watch: StoreWatch | None = None,
) -> str:
    """Show the run's bars until it finishes or fails; its final state.

    `tick` (the scheduler's lease and repairs) runs at most once per `poll_s`; what it reports is printed.
    The kind's wait between polls goes through `watch` (the one `tick` reports to): while the broker is
    unreachable it is a plain sleep. Each poll (reading the run, the tick) goes through `store_watch`:
    while the store refuses it, the bars stand still.
    """
    progress = progress_of(services, run_id)
    wait = progress.wait if watch is None else watch.guard(progress.wait, _sleep)
    shown: dict[str, TaskID] = {}
    display = Progress(
        # A kind's labels and notes are shown as they are: no markup in them.
        TextColumn("{task.fields[label]}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", markup=False),
        console=console,
    )
    ticked = [0.0]

    def poll() -> str | None:
        """One look at the run: its final state once it ended, else None."""
        state = services.store.get_run(run_id).state
        show_bars(display, shown, progress.bars())
        if state != "running":
            return state
        # While the store is down every try ticks: only the lease and the repairs tell that it takes writes again.
        due = time.monotonic() - ticked[0] >= poll_s or (store_watch is not None and store_watch.down)
        if tick is not None and due:
            ticked[0] = time.monotonic()
            for action in tick():
                display.console.print(f"[yellow]repair:[/yellow] {escape(action)}", highlight=False)
        return None

    # Not `with display`: a Ctrl-C inside its start would skip its stop, and leave stderr going to the bars.
    try:
        display.start()
        while True:
            ended = poll() if store_watch is None else store_watch.call(poll, _still_running)
            if ended is not None:
                return ended
            wait(poll_s)
    finally:
        display.stop()


def show_bars(display: Progress, shown: dict[str, TaskID], bars: Iterable[ProgressBar]) -> None:
    """Each bar the kind gives, added or brought up to date; a bar it no longer gives (a long run's older
    rounds) is taken off, so the display keeps the kind's few."""
    given = set()
    for bar in bars:
        given.add(bar.key)
        if bar.key not in shown:
            shown[bar.key] = display.add_task("", total=bar.total, label=bar.label, unit=bar.unit, note="")
        display.update(shown[bar.key], total=bar.total, completed=bar.completed, note=bar.note)
        if bar.finished:
            display.stop_task(shown[bar.key])
    for key in [key for key in shown if key not in given]:
        display.remove_task(shown.pop(key))


def _still_running() -> str | None:
    """What a poll tells while the store refuses it."""
    return None
