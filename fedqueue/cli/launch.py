"""Submit a job of any kind and follow it to the end, or submit it and return: what the kinds' commands share."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.markup import escape
from rich.text import Text

from fedqueue import api
from fedqueue.cli.common import console, error_console, warn_if_insecure, warn_if_no_workers
from fedqueue.cli.follow import follow
from fedqueue.cli.local import with_local_broker
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings, mask_url
from fedqueue.core import jobs
from fedqueue.core.runs.cancel import CANCELLED, cancel_run
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.launch import LocalWorkers, launched, scheduled
from fedqueue.report.summary import run_summary
from fedqueue.store import Store


def submit_and_follow(
    submission: api.Submission,
    settings: Settings,
    *,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    wait_for_workers: bool = False,
    all_rows: bool = False,
) -> api.RunHandle:
    """Submit where the tasks can run (the broker, `fedqueue up`'s cluster, or workers started here) and
    follow the run (its lease, repairs, bars) to the end; then print what its kind shows of it."""
    warn_if_insecure(settings)
    workers = LocalWorkers(procs, slots, gpus_per_worker, wait_for_workers)
    with launched(submission, settings, workers, say=say_plain, say_outage=_say) as launch:
        if launch.workers_unsure:
            try:
                warn_if_no_workers(launch.place.settings)
            except KeyboardInterrupt:  # the run is submitted: the same question as while following
                interrupted(launch.handle.id, launch.handle.store, launch.place)
        follow_to_end(launch.handle, launch.place, launch.services, all_rows=all_rows)
    return launch.handle


def submit_detached(submission: api.Submission, settings: Settings) -> str:
    """Enqueue on the configured broker (else that of the cluster `fedqueue up` runs for these settings) and
    return the run id; the workers and their launcher see it through."""
    settings = with_local_broker(settings)
    if not settings.broker_url:
        raise ConfigError("FEDQUEUE_BROKER_URL: not set and no local cluster is up (start one: fedqueue up -d)")
    warn_if_insecure(settings)
    api.check(submission, settings)
    handle = api.submit(submission, api.Placement(settings))
    warn_if_no_workers(settings)
    return handle.id


INTERRUPTED = "interrupted"  # what following gave when Ctrl-C cut it short


def follow_to_end(
    handle: api.RunHandle, place: api.Placement, services: Services | None = None, all_rows: bool = False
) -> None:
    """Schedule the run (lease, repairs) and show its progress until it ends; then its summary (a long table of it
    folded, unless `all_rows`).

    With the cluster of `fedqueue up` running the workers, following stops if that cluster stops. Through
    a broker outage it waits, saying when the broker goes and comes back, up to FEDQUEUE_BROKER_WAIT_S; through
    a store outage (a full disk), the same up to FEDQUEUE_STORE_WAIT_S.
    """

    with contextlib.ExitStack() as stack:
        try:
            lease = stack.enter_context(scheduled(handle, place, services, say=_say))
        except KeyboardInterrupt:  # while the lease was being taken: asked the same as while following
            interrupted(handle.id, handle.store, place)
        supervisor = lease.supervisor
        try:
            ended = follow(
                supervisor.services,
                handle.id,
                console,
                tick=lease.tick,
                watch=supervisor.watch,
                store_watch=supervisor.store_watch,
            )
        except KeyboardInterrupt:
            # Asked once out of this block: the interrupted calls' frames (a store read cut short among them)
            # go with it, not kept alive by the traceback through the question and the writes that follow.
            ended = INTERRUPTED
        if ended == INTERRUPTED:
            interrupted(handle.id, handle.store, place)
        if ended == CANCELLED:  # from another shell: its tasks leave this broker too (that shell may not reach it)
            _drop_queued(place.settings, handle.id)
    show_run(handle.store, handle.id, as_json=False, all_rows=all_rows)


def interrupted(run_id: str, store: Store, place: api.Placement) -> NoReturn:
    """Ctrl-C while following: ask once whether to cancel the run or leave it; exit 130 either way.

    Not asked (and left) when stdin is no terminal, or on a second Ctrl-C or an end of input at the question.
    Workers started by this command stop with it: "leave" then means kept stored, for `fedqueue resume`.
    """
    embedded = place.cluster is not None
    error_console.print()
    if embedded:
        error_console.print(
            escape(f"run {run_id}: its workers were started by this command and stop with it"), highlight=False
        )
    leave = "keep it for `fedqueue resume`" if embedded else "leave it running"
    answer = _ask(f"cancel run {run_id}? [y/N] (N: {leave}) ")
    if answer:
        was = cancel_run(store, run_id, "cancelled with Ctrl-C")
        if was not in ("running", CANCELLED):  # it ended while the question waited
            error_console.print(escape(f"run {run_id} already {was}: not cancelled"), highlight=False)
            raise typer.Exit(130)
        dropped = _drop_queued(place.settings, run_id)
        note = f"; {dropped} queued tasks dropped" if dropped else ""
        error_console.print(escape(f"run {run_id} cancelled{note}"), highlight=False)
        raise typer.Exit(130)
    if answer is None:
        why = "no answer" if _interactive() else "stdin is no terminal to ask on"
        error_console.print(escape(f"{why}: run {run_id} is not cancelled"), highlight=False)
    if embedded:
        what = f"run {run_id} kept: fedqueue resume {run_id} goes on with it (on workers it starts)"
    else:
        what = f"run {run_id} goes on: fedqueue status {run_id} shows it, fedqueue resume {run_id} follows it"
    error_console.print(escape(f"{what}, fedqueue cancel {run_id} cancels it"), highlight=False)
    raise typer.Exit(130)


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # closed
        return False


def _ask(question: str) -> bool | None:
    """Yes or no to a question on the terminal; None when there is none, or for a Ctrl-C or end of input."""
    if not _interactive():
        return None
    try:  # a Ctrl-C typed as soon as the question shows may land before the read begins
        error_console.print(escape(question), end="", highlight=False)
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        error_console.print()
        return None
    if not answer:
        error_console.print()
        return None
    return answer.strip().lower() in ("y", "yes")


def _drop_queued(settings: Settings, run_id: str) -> int:
    """The run's queued tasks dropped from this broker, as far as it answers (workers skip the others)."""
    if not settings.broker_url:
        return 0
    try:
        return api.drop_queued_tasks(settings, run_id)
    except FedqueueError:
        return 0


def say_plain(line: str) -> None:
    """A line as it is: no markup in it (paths, names and URLs keep their brackets)."""
    console.print(Text(line), highlight=False)


def _say(line: str) -> None:
    """A line of the broker's or the store's watch, above the bars."""
    console.print(Text(line, style="yellow"), soft_wrap=True)


def show_run(store: Store, run_id: str, as_json: bool, all_rows: bool = False) -> None:
    """What `fedqueue status` prints: the kind's own view of the run, else the tasks' summary."""
    kind = jobs.kinds().get(store.get_run(run_id).kind)
    if kind is not None and kind.show_status(store, run_id, as_json, all_rows):
        return
    summary = run_summary(store, run_id)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    console.print(
        f"run {escape(summary['id'])} ({summary['state']}): wall {summary['wall_s']:.2f} s · {summary['tasks_done']} tasks"
        f" ({summary['tasks_failed']} failed) · max_concurrency {summary['max_concurrency']}"
        f" · {len(summary['workers'])} workers",
        highlight=False,
    )
    if summary["error"]:
        console.print(f"[red]run {summary['state']}:[/red] {escape(summary['error'])}", highlight=False)


def say_where_results_are(handle: api.RunHandle) -> None:
    """After a run: the store that holds it, and the commands that show it, as this shell can type them."""
    command = fedqueue_command()
    console.print(
        Text(f"results: in the store {store_name(handle.settings.database_url)} (FEDQUEUE_DATABASE_URL sets it)"),
        highlight=False,
    )
    console.print(
        Text(f"next: {command} report {handle.id} · {command} status {handle.id} · {command} runs"),
        highlight=False,
        soft_wrap=True,
    )


def store_name(database_url: str) -> str:
    """A SQLite store by its file (as given: relative to the working folder, or absolute), another by its URL."""
    if database_url.startswith("sqlite:///"):
        return database_url.removeprefix("sqlite:///")
    return mask_url(database_url)


def fedqueue_command() -> str:
    """`fedqueue` where PATH finds this one; else the path of this one's script (`.venv/bin/fedqueue` from the
    folder it is installed in), else this Python running the module."""
    script = Path(sys.executable).with_name("fedqueue")
    found = shutil.which("fedqueue")
    if found is not None and (not script.is_file() or os.path.samefile(found, script)):
        return "fedqueue"
    if not script.is_file():
        return f"{sys.executable} -m fedqueue.cli"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def exit_unless_finished(handle: api.RunHandle) -> None:
    if handle.state != "finished":
        raise typer.Exit(1)
