"""The `fedqueue` command: one Typer command per function, errors as one line and an exit code."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from fedqueue import api
from fedqueue.cli.common import (
    AllRowsOpt,
    GpusPerWorkerOpt,
    JsonOpt,
    PluginPathOpt,
    ProcsOpt,
    ProcsPerGpuOpt,
    SlotsOpt,
    console,
    error_console,
    friendly_errors,
    warn_if_insecure,
)
from fedqueue.cli.dead_letters import show_dead_letters
from fedqueue.cli.launch import exit_unless_finished, follow_to_end, say_plain, show_run
from fedqueue.cli.local import cluster_logs, say_ready, start_detached, stop_standing, with_local_broker
from fedqueue.cli.logs import show_logs
from fedqueue.cli.runs_table import runs_table, stalled_note
from fedqueue.cli.tensorboard import write_tensorboard
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_PROCS_PER_GPU, DEFAULT_WORKER_SLOTS, Settings, mask_url
from fedqueue.core import jobs as job_kinds
from fedqueue.core.database import open_store
from fedqueue.core.process.fast_exit import run_then_exit
from fedqueue.core.runs.adopt import RunAdopter
from fedqueue.core.runs.cancel import CANCELLED
from fedqueue.core.runs.retry import retry_failed_run
from fedqueue.core.services import connect_redis, no_workers_known
from fedqueue.core.waits.outage import wait_for_broker
from fedqueue.core.waits.waiting import waiting_for
from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.queue import cluster_file
from fedqueue.queue.client import open_client_services
from fedqueue.queue.flower import check_basic_auth, flower_command, flower_env
from fedqueue.queue.local import LocalCluster
from fedqueue.queue.workers import WorkerGroup, beside, detect_gpus, named, plan_workers
from fedqueue.report import build_report, write_report

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
RunArg = Annotated[str, typer.Argument(help="Run id.")]


def _print_version(asked: bool) -> None:
    if asked:
        print(f"fedqueue {metadata.version('fedqueue')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Federated-learning rounds and LLM batch jobs on a Redis queue with GPU-pinned Celery workers."""


@app.command()
@friendly_errors
def resume(
    run_id: RunArg,
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    plugin_path: PluginPathOpt = None,
    retry: Annotated[
        bool,
        typer.Option(
            "--retry",
            help="Continue a failed run from its last stored state: what failed (a step whose workers kept "
            "being lost, a round stopped by a failed device) is tried again.",
        ),
    ] = False,
    all_rows: AllRowsOpt = False,
) -> None:
    """Take over scheduling a run of any kind (after its scheduler died) and follow it to the end. A broker that
    is down when it starts, or goes while it follows, is waited for as `run` waits: one line when it goes, one when
    it is back, exit 2 past FEDQUEUE_BROKER_WAIT_S."""

    settings = Settings.from_env().with_plugin_path(plugin_path)
    settings.activate_plugin_path()
    handle = api.RunHandle(run_id, settings)
    state = handle.state  # an unknown id fails here, before anything starts
    if state == CANCELLED:
        raise ConfigError(f"run {run_id} was cancelled: a cancelled run is not resumed (submit it again for a new run)")
    if state not in ("running", "failed") or (state == "failed" and not retry):
        hint = f"; `fedqueue resume {run_id} --retry` tries it again" if state == "failed" else ""
        console.print(escape(f"run {run_id} is already {state}{hint}"))
        show_run(handle.store, run_id, as_json=False, all_rows=all_rows)
    else:
        if settings.broker_url:  # a broker still down after the outage that stopped the run: waited for, as `run` does
            wait_for_broker(settings, run_id, say_plain)
        with api.placement(settings, procs, slots, wait=True, say=say_plain) as place:
            if state == "failed":
                _retry_failed(place.settings, run_id)
            handle = api.RunHandle(run_id, place.settings)
            follow_to_end(handle, place, all_rows=all_rows)
    exit_unless_finished(handle)


def _retry_failed(settings: Settings, run_id: str) -> None:
    services = open_client_services(settings, worker_slots=no_workers_known)
    try:
        for line in retry_failed_run(services, run_id):
            console.print(escape(line))
    finally:
        services.close()


@app.command()
@friendly_errors
def status(
    run_id: Annotated[str | None, typer.Argument(help="Run id; none: the deployment's dead letters.")] = None,
    json_: JsonOpt = False,
    all_rows: AllRowsOpt = False,
) -> None:
    """Show one run's progress, workers and overlap of tasks, and what its kind adds (accuracy, tokens); with no
    run, the messages workers refused for good (dead letters): how many, and the latest."""
    settings = Settings.from_env()
    if run_id is None:
        show_dead_letters(with_local_broker(settings), json_)
        return
    store = open_store(settings.database_url)
    try:
        show_run(store, run_id, json_, all_rows)
        if not json_ and store.get_run(run_id).state == "running":
            _show_waiting(with_local_broker(settings), run_id)
    finally:
        store.close()


def _show_waiting(settings: Settings, run_id: str) -> None:
    """The outage a running run's workers wait for, if any (its broker is asked: status works without one)."""
    if not settings.broker_url:
        return
    try:
        client = connect_redis(settings.broker_url)
    except FedqueueError:
        console.print("[yellow]broker unreachable:[/yellow] the run's workers wait for it", highlight=False)
        return
    try:
        waiting = waiting_for(client, settings.key_prefix, run_id)
    finally:
        client.close()
    if waiting:
        console.print(f"[yellow]waiting:[/yellow] {escape(waiting)}", highlight=False)


@app.command()
@friendly_errors
def report(
    run_id: RunArg,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write into (default: fedqueue-report/RUN_ID).")
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="Print the numbers as JSON (pictures only with --out).")
    ] = False,
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            "--tensorboard",
            help="Write the run's scalars as TensorBoard event files under DIR/RUN_ID instead (the report too with"
            " --out); steps already there are left as they are.",
            metavar="DIR",
        ),
    ] = None,
) -> None:
    """Is the run really parallel, and where does the time go? Timeline, concurrency and accuracy pictures, HTML."""

    store = open_store(Settings.from_env().database_url)
    try:
        if tensorboard is not None:
            write_tensorboard(store, run_id, tensorboard)
            if out is None:
                return
        if json_ and out is None:
            print(json.dumps(build_report(store, run_id), indent=2))
            return
        folder = out if out is not None else Path("fedqueue-report") / run_id
        numbers = write_report(store, run_id, folder)
    finally:
        store.close()
    if json_:
        print(json.dumps(numbers, indent=2))
        return
    efficiency = numbers["parallel_efficiency"]
    console.print(
        f"run {escape(numbers['id'])} ({numbers['state']}): wall {numbers['wall_s']:.2f} s · {numbers['slots']} slots"
        f" · parallel efficiency {'–' if efficiency is None else f'{100 * efficiency:.1f} %'}"
        f" · {escape(_tasks_counted(numbers))}",
        highlight=False,
    )
    console.print(escape(numbers["efficiency_note"]), highlight=False)
    console.print(f"report written to {escape(str(folder / 'report.html'))}", highlight=False)


def _tasks_counted(numbers: dict[str, Any]) -> str:
    """Tasks as the run's kind counts them where it does (FL: device tasks, as `status` says, and their packs)."""
    counted = numbers.get("tasks_counted")
    if not counted:
        return f"{numbers['tasks_done']} tasks ({numbers['tasks_failed']} failed)"
    packs = counted.get("packs")
    if not packs:
        return f"{counted['done']} {counted['what']} ({counted['failed']} failed)"
    packed = counted.get("packed", counted["done"])
    some = "" if packed >= counted["done"] else f"{packed} of them "
    return f"{counted['done']} {counted['what']} ({counted['failed']} failed), {some}in {packs} packs"


@app.command()
@friendly_errors
def runs(json_: JsonOpt = False) -> None:
    """List the runs in the store."""
    lines = api.runs()
    if json_:
        print(json.dumps(lines, indent=2))
        return
    console.print(runs_table(lines, console.width))
    note = stalled_note(lines)
    if note is not None:
        console.print(Text(note), highlight=False)


JobsOpt = Annotated[
    str | None,
    typer.Option("--jobs", help="Job kinds these workers serve, e.g. fl,llm (default: every installed kind)."),
]


@app.command()
@friendly_errors
def worker(
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to use, by index or UUID, e.g. 0,1 (default: all found).")
    ] = None,
    plugin_path: PluginPathOpt = None,
    jobs: JobsOpt = None,
    gpus_per_worker: GpusPerWorkerOpt = DEFAULT_GPUS_PER_WORKER,
    procs_per_gpu: ProcsPerGpuOpt = DEFAULT_PROCS_PER_GPU,
    name: Annotated[
        str | None,
        typer.Option(help="Name of the one worker process, before '@' (e.g. gpu1 in a container that sees one GPU)."),
    ] = None,
) -> None:
    """Start one worker process per GPU (or per core) on the configured broker; stop with Ctrl-C.

    The launcher also adopts running runs that nobody follows and repairs them.
    """

    settings = Settings.from_env().with_plugin_path(plugin_path)
    # The configured broker, else that of the cluster `fedqueue up` runs for these settings: more workers for it.
    standing = None if settings.broker_url else cluster_file.find(settings)
    if standing is not None:
        settings = cluster_file.worker_settings(settings).with_broker(standing.broker_url)
    if not settings.broker_url:
        raise ConfigError("FEDQUEUE_BROKER_URL: not set and no local cluster is up (fedqueue up -d starts one)")
    settings = settings.with_jobs(jobs)
    settings.check_lasting_store()
    warn_if_insecure(settings)
    job_kinds.select(settings.jobs)  # an unknown kind is refused before anything starts
    found = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else detect_gpus()
    specs = named(plan_workers(found, procs, slots, gpus_per_worker, procs_per_gpu), name)
    if standing is not None:
        specs = beside(specs, standing.slots)
        console.print(escape(f"joining the local cluster of fedqueue up (pid {standing.pid})"), highlight=False)
    services = open_client_services(settings)  # the broker answers, the store is current
    group = WorkerGroup(settings, specs).start()
    try:
        _supervise(group, f"{len(group.specs)} workers on {mask_url(settings.broker_url)}", services)
    finally:
        services.close()


@app.command()
@friendly_errors
def up(
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    plugin_path: PluginPathOpt = None,
    gpus_per_worker: GpusPerWorkerOpt = DEFAULT_GPUS_PER_WORKER,
    procs_per_gpu: ProcsPerGpuOpt = DEFAULT_PROCS_PER_GPU,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Return once the workers are ready; `fedqueue down` stops them.")
    ] = False,
    log_dir: Annotated[Path | None, typer.Option(hidden=True)] = None,
    ready_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run an embedded Redis and local workers; `fedqueue run` in this directory uses them.

    In the foreground until Ctrl-C, or in the background with --detach until `fedqueue down`.
    """

    settings = Settings.from_env().with_plugin_path(plugin_path)
    settings.check_lasting_store()
    # With a broker configured, `run` goes to it anyway: only an embedded Redis is announced for reuse.
    announce = not settings.broker_url
    if announce and (running := cluster_file.find(settings)) is not None:
        already = f"a local cluster for these settings is already up (pid {running.pid}, {len(running.slots)} workers)"
        if not detach:  # this command cannot be that cluster: refused, as a second scheduler on a run is
            raise ConfigError(f"{already}; fedqueue down stops it")
        # What `up -d` promises holds: a cluster is up and ready, and the other commands find it.
        console.print(escape(f"{already}: fedqueue run uses it, fedqueue down stops it"), highlight=False)
        _say_where(settings, running.broker_url)
        return
    if detach:
        args = [f"--procs={procs}"] if procs is not None else []
        args += [f"--slots={slots}", f"--gpus-per-worker={gpus_per_worker}", f"--procs-per-gpu={procs_per_gpu}"]
        args += [f"--plugin-path={folder}" for folder in settings.plugin_path]
        logs = log_dir or cluster_file.log_dir(settings)
        pid, broker_url = start_detached(args, logs)
        console.print(
            escape(f"local cluster up (pid {pid}); fedqueue run uses it, fedqueue down stops it"), highlight=False
        )
        console.print(escape(f"logs in {logs} (fedqueue logs [--follow] shows them)"), highlight=False)
        _say_where(settings, broker_url)
        return
    specs = plan_workers(detect_gpus(), procs, slots, gpus_per_worker, procs_per_gpu)
    cluster = LocalCluster.start(settings, specs, log_dir=log_dir)
    info = cluster_file.ClusterInfo(
        pid=os.getpid(),
        broker_url=cluster.settings.broker_url or "",
        slots=cluster.workers.slots(),
        log_dir=str(cluster.log_dir),
    )
    _say_where(settings, info.broker_url)
    services = open_client_services(cluster.settings)
    try:
        with cluster_file.announced(settings, info) if announce else contextlib.nullcontext():
            say_ready(ready_fd, info.broker_url)
            _supervise(
                cluster.workers,
                f"{len(specs)} workers, logs in {cluster.log_dir} (fedqueue logs)",
                services,
                restart_broker=cluster.restart_exited_broker,
            )
    finally:
        services.close()
        cluster.stop(timeout_s=0)  # the workers stopped in _supervise already, unless it never ran


def _say_where(settings: Settings, broker_url: str) -> None:
    """The broker and store of `fedqueue up`'s cluster, as lines another shell pastes to use them (`submit`)."""
    exports = {}
    if settings.broker_url:  # the configured broker: that shell has it already (and its password stays unsaid)
        console.print(escape(f"broker: {mask_url(broker_url)}"), highlight=False)
    else:
        exports["FEDQUEUE_BROKER_URL"] = broker_url
    database = cluster_file.worker_settings(settings).database_url
    if database.startswith("sqlite:"):  # made absolute: the same file from any folder
        exports["FEDQUEUE_DATABASE_URL"] = database
    if exports:
        console.print(
            "submit, monitor, status, cancel and logs run here find it by themselves; in another folder, first:",
            highlight=False,
        )
    for name, value in exports.items():
        console.print(escape(f"export {name}={shlex.quote(value)}"), highlight=False, soft_wrap=True)


@app.command()
@friendly_errors
def down(plugin_path: PluginPathOpt = None) -> None:
    """Stop the local cluster `fedqueue up` runs for these settings (running tasks finish first)."""
    pid = stop_standing(Settings.from_env().with_plugin_path(plugin_path))
    console.print("no local cluster is up for these settings" if pid is None else f"local cluster (pid {pid}) stopped")


@app.command()
@friendly_errors
def cancel(run_id: RunArg, plugin_path: PluginPathOpt = None) -> None:
    """Cancel a running run of any kind: its queued tasks are dropped, running ones finish, and it is stored as
    cancelled for good (`resume` refuses it). The broker is the configured one, else `fedqueue up`'s."""
    settings = with_local_broker(Settings.from_env().with_plugin_path(plugin_path))
    done = api.cancel(run_id, settings, reason="cancelled with fedqueue cancel")
    if done.was not in ("running", CANCELLED):
        raise ConfigError(f"run {run_id} already {done.was}: nothing to cancel")
    what = f"run {run_id} cancelled" if done.cancelled_now else f"run {run_id} was already cancelled"
    if done.dropped:
        what += f"; {done.dropped} queued tasks dropped"
    if done.cancelled_now:
        what += "; tasks already running finish and keep their results"
    console.print(escape(what), highlight=False)
    if done.broker_error is not None:
        error_console.print(
            escape(f"warning: {done.broker_error}; workers skip its queued tasks as they take them"), highlight=False
        )


@app.command()
@friendly_errors
def logs(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what the workers write; Ctrl-C stops.")
    ] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="Last lines of each log to print first.")] = 20,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Show the worker logs of the local cluster (`fedqueue up`'s, or the one `fedqueue run` starts here)."""
    show_logs(cluster_logs(Settings.from_env().with_plugin_path(plugin_path)), lines, follow)


@app.command()
@friendly_errors
def monitor(
    address: Annotated[
        str, typer.Option(help="Address to listen on. Basic auth travels in clear over HTTP: keep it local.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 5555,
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions", envvar="FLOWER_ALLOW_ACTIONS", help="Allow shutdown, pool and rate-limit actions."
        ),
    ] = False,
) -> None:
    """Start Celery's monitor, the Flower web UI (not the Flower FL framework), on the configured broker.

    Behind basic auth from FLOWER_BASIC_AUTH; read-only unless --allow-actions; /metrics and /healthcheck
    answer without a login.
    """

    settings = with_local_broker(Settings.from_env())
    command = flower_command(settings, address, port, allow_actions)
    check_basic_auth(os.environ)
    warn_if_insecure(settings)
    console.print(
        escape(f"Flower on http://{address}:{port} watching {mask_url(settings.broker_url)}"), highlight=False
    )
    # Flower becomes this process (signals reach it directly); its app reads the broker found here from its env.
    os.execve(command[0], command, flower_env(settings, os.environ))


# The name it had first: Celery's Flower, kept for scripts and compose files that start it so.
app.command("flower", help="Same as `monitor`: Celery's web UI (Flower), not the Flower FL framework.", hidden=True)(
    monitor
)


def _supervise(group: Any, what: str, services: Any, restart_broker: Callable[[], bool] | None = None) -> None:
    """Wait on workers and adopt unfollowed runs. First Ctrl-C/SIGTERM: warm stop; second: stop at once.

    `restart_broker`: starts this process's embedded Redis again if it exited (True when it did).
    """
    adopter = RunAdopter(services)
    stops = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stops
        stops += 1
        if stops == 1:
            error_console.print("stopping: running tasks finish first (signal again to stop at once)")
            group.signal_all(signal.SIGTERM)
        else:
            group.signal_all(signal.SIGKILL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    console.print(f"{escape(what)}; Ctrl-C to stop", highlight=False)
    try:
        while stops == 0 or group.alive():
            if stops == 0:
                # A worker that crashed or was killed is started again; its lost task is
                # enqueued again by the run's scheduler.
                for name in group.restart_exited():
                    error_console.print(f"worker {escape(name)} exited; started again", highlight=False)
                if restart_broker is not None and restart_broker():
                    error_console.print("embedded Redis exited; started again (empty) on its port")
                for action in adopter.tick():
                    error_console.print(f"repair: {escape(action)}", highlight=False)
            time.sleep(0.2)
    finally:
        adopter.release_all()
        group.stop(timeout_s=0 if stops else 60)


def _add_kind_commands() -> None:
    """Each installed job kind's own commands, as `fedqueue KIND ...`."""
    for kind in job_kinds.kinds().values():
        commands = kind.commands()
        if commands is None:
            continue
        if kind.commands_at_top:  # listed first: what a user of that kind starts with (`fedqueue run`)
            app.registered_commands[:0] = commands.registered_commands
        else:
            app.add_typer(commands, name=kind.name)


_add_kind_commands()


def main() -> None:
    run_then_exit(app)  # no teardown of torch's modules after the command is done (over a second)
