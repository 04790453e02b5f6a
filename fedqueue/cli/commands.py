"""The `fedqueue` command: one Typer command per function, errors as one line and an exit code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from fedqueue.cli.common import (
    GpusPerWorkerOpt,
    JsonOpt,
    PluginPathOpt,
    ProcsOpt,
    ProcsPerGpuOpt,
    SlotsOpt,
    console,
    errors,
    friendly_errors,
    warn_if_insecure,
    warn_if_no_workers,
)
from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_PROCS_PER_GPU, DEFAULT_WORKER_SLOTS, Settings, mask_url
from fedqueue.errors import FedqueueError
from fedqueue.fl.config import RunConfig, load_run_config, parse_override

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="Federated-learning rounds and LLM batch jobs on a Redis queue with GPU-pinned Celery workers.",
)
ConfigArg = Annotated[Path, typer.Argument(help="Run config (TOML); see examples/.", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a config key: KEY=VALUE (repeatable).")]
RoundsOpt = Annotated[int | None, typer.Option(help="Override `rounds`.")]
SeedOpt = Annotated[int | None, typer.Option(help="Override `seed`.")]


def _config(path: Path, sets: list[str] | None, rounds: int | None, seed: int | None) -> RunConfig:
    overrides: dict[str, Any] = dict(parse_override(item) for item in sets or [])
    if rounds is not None:
        overrides["rounds"] = rounds
    if seed is not None:
        overrides["seed"] = seed
    return load_run_config(path, overrides)


def _follow(handle: Any, cluster: Any = None, standing: Any = None) -> dict[str, Any]:
    """Schedule the run (lease, repairs) and show its progress until it ends.

    `standing`: the cluster of `fedqueue up` that runs it; following stops if that cluster stops.
    """
    from fedqueue import api
    from fedqueue.cli.follow import follow_run, print_summary

    with api.scheduling(handle) as supervisor:
        tick = api.keep_running(supervisor, cluster)
        if standing is not None:
            tick = _while_up(tick, standing.pid, handle.id)
        try:
            summary = follow_run(handle.store, handle.id, console, tick=tick)
        except KeyboardInterrupt:
            if cluster is None:
                errors.print(f"stopped following; run {handle.id} goes on (fedqueue resume {handle.id})")
            raise typer.Exit(130) from None
    print_summary(console, summary)
    return summary


@app.command()
@friendly_errors
def run(
    config: ConfigArg,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    seed: SeedOpt = None,
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Submit a run and follow it to the end. With no broker configured, start Redis and workers here."""
    from fedqueue import api

    run_config = _config(config, set_, rounds, seed)
    settings = Settings.from_env().with_plugin_path(plugin_path)
    warn_if_insecure(settings)
    settings.activate_plugin_path()
    standing = None if settings.broker_url else _standing(settings)
    if settings.broker_url or standing is not None:
        _check(run_config, settings)
        handle = api.submit(
            run_config,
            settings=settings.with_broker(standing.broker_url) if standing else settings,
            worker_slots=standing.slots.copy if standing else None,
        )
        _announce(handle.id, run_config)
        if standing is None:
            warn_if_no_workers(settings)
        summary = _follow(handle, standing=standing)
    else:
        console.print("starting embedded Redis and local workers")
        # Started first, not waited for: the workers boot (imports, warm-up) while this process
        # checks plugins, migrates the store and builds the first model; round 1 waits on the queue.
        with api.local_cluster(procs, slots, settings=settings, wait=False) as cluster:
            console.print(f"embedded Redis at {cluster.settings.broker_url}, {len(cluster.workers.specs)} workers")
            _check(run_config, settings)
            handle = api.submit(run_config, settings=cluster.settings, worker_slots=cluster.workers.slots)
            _announce(handle.id, run_config)
            summary = _follow(handle, cluster)
    if summary["state"] != "finished":
        raise typer.Exit(1)


def _check(run_config: RunConfig, settings: Settings) -> None:
    """A plugin that does not import, or a bad database, fails before anything is written."""
    from fedqueue.fl.experiment import check_plugins  # imports torch: after the workers were started
    from fedqueue.store import open_store

    check_plugins(run_config)
    open_store(settings.database_url, migrate=True).close()


def _standing(settings: Settings) -> Any:
    """The cluster `fedqueue up` left running for these settings, announced; None when there is none."""
    from fedqueue.core import cluster_file

    info = cluster_file.find(settings)
    if info is not None:
        console.print(f"using the local cluster of fedqueue up (pid {info.pid}, {len(info.slots)} workers)")
    return info


def _while_up(tick: Any, pid: int, run_id: str) -> Any:
    """A tick that fails once the `fedqueue up` running the workers is gone: nothing would train the run."""
    from fedqueue.core.cluster_file import pid_alive

    def checked() -> Any:
        if not pid_alive(pid):
            raise FedqueueError(f"the local cluster (fedqueue up, pid {pid}) stopped; fedqueue resume {run_id} goes on")
        return tick()

    return checked


def _announce(run_id: str, run_config: RunConfig) -> None:
    console.print(
        f"run [bold]{run_id}[/bold] submitted ({run_config.rounds} rounds, "
        f"{run_config.devices_per_round} of {run_config.num_devices} devices per round)"
    )


@app.command()
@friendly_errors
def resume(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    procs: ProcsOpt = None,
    slots: SlotsOpt = DEFAULT_WORKER_SLOTS,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Take over scheduling a run (after its scheduler died) and follow it to the end."""
    from fedqueue import api

    settings = Settings.from_env().with_plugin_path(plugin_path)
    settings.activate_plugin_path()
    handle = api.RunHandle(run_id, settings)
    state = handle.store.get_run(run_id).state  # an unknown id fails here, before anything starts
    if state != "running":
        console.print(f"run {run_id} is already {state}")
        summary = handle.status()
    elif settings.broker_url:
        summary = _follow(handle)
    elif (standing := _standing(settings)) is not None:
        summary = _follow(api.RunHandle(run_id, settings.with_broker(standing.broker_url)), standing=standing)
    else:
        console.print("starting embedded Redis and local workers")
        with api.local_cluster(procs, slots, settings=settings) as cluster:
            handle = api.RunHandle(run_id, cluster.settings)
            summary = _follow(handle, cluster)
    if summary["state"] != "finished":
        raise typer.Exit(1)


@app.command()
@friendly_errors
def submit(
    config: ConfigArg,
    set_: SetOpt = None,
    rounds: RoundsOpt = None,
    seed: SeedOpt = None,
    plugin_path: PluginPathOpt = None,
) -> None:
    """Enqueue a run on the configured broker, print its id and return."""
    from fedqueue import api

    run_config = _config(config, set_, rounds, seed)
    settings = Settings.from_env().with_plugin_path(plugin_path)
    if not settings.broker_url:
        raise FedqueueError("FEDQUEUE_BROKER_URL: not set (start `fedqueue up` and export the URL it prints)")
    warn_if_insecure(settings)
    handle = api.submit(run_config, settings=settings)
    warn_if_no_workers(settings)
    print(handle.id)


@app.command()
@friendly_errors
def status(run_id: Annotated[str, typer.Argument(help="Run id.")], json_: JsonOpt = False) -> None:
    """Show one run's progress, accuracy, workers and overlap of tasks."""
    from fedqueue.cli.follow import print_summary
    from fedqueue.core import jobs as job_kinds
    from fedqueue.report.summary import run_summary
    from fedqueue.store import open_store

    store = open_store(Settings.from_env().database_url)
    kind = job_kinds.get(store.get_run(run_id).kind)
    if kind.show_status is not None:
        kind.show_status(store, run_id, json_)
        return
    summary = run_summary(store, run_id)
    if json_:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(console, summary)


@app.command()
@friendly_errors
def report(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder to write into (default: fedqueue-report/RUN_ID).")
    ] = None,
    json_: Annotated[
        bool, typer.Option("--json", help="Print the numbers as JSON (pictures only with --out).")
    ] = False,
) -> None:
    """Is the run really parallel, and where does the time go? Timeline, concurrency and accuracy pictures, HTML."""
    from fedqueue.report import build_report, write_report
    from fedqueue.store import open_store

    store = open_store(Settings.from_env().database_url)
    try:
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
        f"run {numbers['id']} ({numbers['state']}): wall {numbers['wall_s']:.2f} s · {numbers['slots']} slots"
        f" · parallel efficiency {'–' if efficiency is None else f'{100 * efficiency:.1f} %'}"
        f" · {numbers['tasks_done']} tasks ({numbers['tasks_failed']} failed)",
        highlight=False,
    )
    console.print(f"report written to {folder / 'report.html'}", highlight=False)


@app.command()
@friendly_errors
def runs(json_: JsonOpt = False) -> None:
    """List the runs in the store."""
    from fedqueue import api

    lines = api.runs()
    if json_:
        print(json.dumps(lines, indent=2))
        return
    table = Table(box=box.SIMPLE)
    for column in ("id", "name", "state", "rounds", "data", "model", "created"):
        table.add_column(column, no_wrap=True)
    for line in lines:
        created = time.strftime("%m-%d %H:%M", time.localtime(line["created_at"]))
        table.add_row(line["id"], line["name"], line["state"], line["rounds"], line["dataset"], line["model"], created)
    console.print(table)


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
    from fedqueue.core import jobs as job_kinds
    from fedqueue.queue.client import open_client
    from fedqueue.queue.workers import WorkerGroup, detect_gpus, named, plan_workers

    settings = Settings.from_env().with_plugin_path(plugin_path).with_jobs(jobs)
    if not settings.broker_url:
        raise FedqueueError("FEDQUEUE_BROKER_URL: not set (or use `fedqueue up` for a local broker)")
    warn_if_insecure(settings)
    job_kinds.select(settings.jobs)  # an unknown kind is refused before anything starts
    found = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else detect_gpus()
    specs = named(plan_workers(found, procs, slots, gpus_per_worker, procs_per_gpu), name)
    services = open_client(settings)  # the broker answers, the store is current
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
    from fedqueue.cli.local import say_ready, start_detached
    from fedqueue.core import cluster_file
    from fedqueue.queue.client import open_client
    from fedqueue.queue.local import LocalCluster
    from fedqueue.queue.workers import detect_gpus, plan_workers

    settings = Settings.from_env().with_plugin_path(plugin_path)
    # With a broker configured, `run` goes to it anyway: only an embedded Redis is announced for reuse.
    announce = not settings.broker_url
    if announce and (running := cluster_file.find(settings)) is not None:
        raise FedqueueError(f"a local cluster for these settings is already up (pid {running.pid}; fedqueue down)")
    if detach:
        args = [f"--procs={procs}"] if procs is not None else []
        args += [f"--slots={slots}", f"--gpus-per-worker={gpus_per_worker}", f"--procs-per-gpu={procs_per_gpu}"]
        args += [f"--plugin-path={folder}" for folder in settings.plugin_path]
        pid, logs = start_detached(args)
        console.print(f"local cluster up (pid {pid}, logs in {logs}); fedqueue run uses it, fedqueue down stops it")
        return
    specs = plan_workers(detect_gpus(), procs, slots, gpus_per_worker, procs_per_gpu)
    cluster = LocalCluster.start(settings, specs, log_dir=log_dir)
    info = cluster_file.ClusterInfo(
        pid=os.getpid(),
        broker_url=cluster.settings.broker_url or "",
        slots=cluster.workers.slots(),
        log_dir=str(cluster.log_dir),
    )
    console.print(f"broker ready: export FEDQUEUE_BROKER_URL={cluster.settings.broker_url}")
    services = open_client(cluster.settings)
    try:
        with cluster_file.announced(settings, info) if announce else contextlib.nullcontext():
            say_ready(ready_fd)
            _supervise(cluster.workers, f"{len(specs)} workers, logs in {cluster.log_dir}", services)
    finally:
        services.close()
        cluster.stop(timeout_s=0)  # the workers stopped in _supervise already, unless it never ran


@app.command()
@friendly_errors
def down(plugin_path: PluginPathOpt = None) -> None:
    """Stop the local cluster `fedqueue up` runs for these settings (running tasks finish first)."""
    from fedqueue.cli.local import stop_standing

    pid = stop_standing(Settings.from_env().with_plugin_path(plugin_path))
    console.print("no local cluster is up for these settings" if pid is None else f"local cluster (pid {pid}) stopped")


@app.command()
@friendly_errors
def flower(
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
    """Start the Flower UI on the configured broker, behind basic auth from FLOWER_BASIC_AUTH.

    Read-only unless --allow-actions; /metrics and /healthcheck answer without a login.
    """
    import os

    from fedqueue.queue.flower import check_basic_auth, flower_command

    settings = Settings.from_env()
    command = flower_command(settings, address, port, allow_actions)
    check_basic_auth(os.environ)
    warn_if_insecure(settings)
    console.print(f"Flower on http://{address}:{port} watching {mask_url(settings.broker_url)}")
    os.execv(command[0], command)  # Flower becomes this process: signals reach it directly


def _supervise(group: Any, what: str, services: Any) -> None:
    """Wait on workers and adopt unfollowed runs. First Ctrl-C/SIGTERM: warm stop; second: stop at once."""
    from fedqueue.core.adopt import RunAdopter

    adopter = RunAdopter(services)
    stops = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stops
        stops += 1
        if stops == 1:
            errors.print("stopping: running tasks finish first (signal again to stop at once)")
            group.signal_all(signal.SIGTERM)
        else:
            group.signal_all(signal.SIGKILL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    console.print(f"{what}; Ctrl-C to stop")
    try:
        while stops == 0 or group.alive():
            if stops == 0:
                # A worker that crashed or was killed is started again; its lost task is
                # enqueued again by the run's scheduler.
                for name in group.restart_exited():
                    errors.print(f"worker {name} exited; started again")
                for action in adopter.tick():
                    errors.print(f"repair: {action}", highlight=False)
            time.sleep(0.2)
    finally:
        adopter.release_all()
        group.stop(timeout_s=0 if stops else 60)


def _add_kind_commands() -> None:
    """Each installed job kind's own commands, as `fedqueue KIND ...`."""
    from fedqueue.core import jobs as job_kinds

    for kind in job_kinds.kinds().values():
        if kind.commands is not None:
            app.add_typer(kind.commands(), name=kind.name)


_add_kind_commands()


def main() -> None:
    from fedqueue.core.fast_exit import run_then_exit

    run_then_exit(app)  # no teardown of torch's modules after the command is done (over a second)
