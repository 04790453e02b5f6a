"""How a run of any kind is launched: where its tasks go, its checks, its submit, its scheduling.

`launched` and `scheduled` are the one sequence that `fedqueue.run()` (and each kind's `run`) and
`fedqueue run` (each kind's command) go through; each adds only how it shows the run (a handle and
exceptions, or bars and exit codes). The steps below it serve callers that place, submit or schedule
by themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_PROCS_PER_GPU, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.handle import RunHandle

# `import fedqueue` stays light: the store (sqlalchemy), Redis and the queue load when a run is placed, submitted
# or scheduled, in the functions below.
if TYPE_CHECKING:
    from fedqueue.core.runs.supervisor import RunSupervisor
    from fedqueue.core.services import Services, WorkerSlots
    from fedqueue.queue.cluster_file import ClusterInfo
    from fedqueue.queue.local import LocalCluster


class Submission(Protocol):
    """A job of some kind, ready to be checked and enqueued (an FL run config, an LLM batch job).

    A submission may also have `check_before_start(settings)`: what it can refuse in an instant (a plugin that
    does not import), run before any broker or worker is started for it (`check_before_start` below).
    """

    def check(self, settings: Settings) -> None:
        """Refuse what would fail, before anything is written (workers may be starting meanwhile)."""

    def submit(self, services: Services) -> str:
        """Enqueue the job's first tasks (checking what is costly first); its run id."""


@dataclass
class Placement:
    """Where a run's tasks go: the configured broker, the cluster `fedqueue up` left, or workers started here."""

    settings: Settings  # with the broker the tasks go to
    # The workers' slots by hostname, where known without asking them (a cluster started or announced here).
    worker_slots: WorkerSlots | None = None
    cluster: LocalCluster | None = None  # local workers this process started and stops
    standing: ClusterInfo | None = None  # the cluster of `fedqueue up` running the workers

    @property
    def workers_known(self) -> bool:
        """Whether workers are known to be there (started or announced) rather than hoped for on a broker."""
        return self.cluster is not None or self.standing is not None


def _quiet(_line: str) -> None:
    pass


@dataclass
class Launch:
    """A run submitted where its tasks go, with the services that submitted it (open for the block)."""

    handle: RunHandle
    place: Placement
    services: Services

    @property
    def workers_unsure(self) -> bool:
        """Whether no worker may be there for its tasks: none started or announced here, and the broker answered
        its submit (so the workers can be asked)."""
        return not self.place.workers_known and self.handle.submit_cut is None


@dataclass(frozen=True)
class LocalWorkers:
    """The workers a launch starts here where no broker is configured and no `fedqueue up` cluster runs;
    `wait`: before the submit, else beside it."""

    procs: int | None = None
    slots: int = DEFAULT_WORKER_SLOTS
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER
    wait: bool = False


@contextlib.contextmanager
def launched(
    submission: Submission,
    settings: Settings,
    workers: LocalWorkers,
    say: Callable[[str], object] = _quiet,
    say_outage: Callable[[str], object] | None = None,
) -> Iterator[Launch]:
    """Check, place and submit a run, for a block that follows it.

    Its quick checks run before anything starts; then it is placed (`placement`: the configured broker, the
    cluster `fedqueue up` left, else an embedded Redis and `workers`; `say` hears which), fully checked, the store
    migrated, and submitted through a broker outage (`submit_through_outage`; `say_outage` hears of it, else the
    log). Local workers stop after the block.
    """
    from fedqueue.core.database import open_store
    from fedqueue.queue.client import open_client_services

    check_before_start(submission, settings)  # a plugin that does not import: before anything starts
    # Local workers are started first, not waited for (unless asked): they boot (imports, warm-up)
    # while this process checks plugins, migrates the store and plans the job; its tasks wait on the queue.
    with placement(
        settings, workers.procs, workers.slots, gpus_per_worker=workers.gpus_per_worker, wait=workers.wait, say=say
    ) as place:
        check(submission, place.settings)
        open_store(place.settings.database_url, migrate=True).close()  # a bad database before a bad broker
        services = open_client_services(place.settings, place.worker_slots, ask_within_s(place))
        try:
            # Through a broker outage, as its follower waits through one: from the launch's first step to its last.
            handle = submit_through_outage(submission, place, services, say=say_outage)
            yield Launch(handle, place, services)
        finally:
            services.close()


@dataclass
class Scheduled:
    """A run whose lease this process holds: its supervisor, and the tick its follower calls on each poll."""

    supervisor: RunSupervisor
    tick: Callable[[], list[str]]


@contextlib.contextmanager
def scheduled(
    handle: RunHandle,
    place: Placement,
    services: Services | None = None,
    say: Callable[[str], object] | None = None,
) -> Iterator[Scheduled]:
    """`scheduling` for the block, with its tick (`keep_running`); where the cluster of `fedqueue up` runs the
    workers, the tick fails once that cluster stopped: nothing would run the tasks."""
    with scheduling(handle, services, say=say) as supervisor:
        tick = keep_running(supervisor, place.cluster)
        if place.standing is not None:
            tick = _while_up(tick, place.standing.pid, handle.id)
        yield Scheduled(supervisor, tick)


def _while_up(tick: Callable[[], list[str]], pid: int, run_id: str) -> Callable[[], list[str]]:
    """A tick that fails once the `fedqueue up` running the workers is gone."""
    from fedqueue.queue.cluster_file import pid_alive

    def checked() -> list[str]:
        if not pid_alive(pid):
            raise FedqueueError(f"the local cluster (fedqueue up, pid {pid}) stopped; fedqueue resume {run_id} goes on")
        return tick()

    return checked


@contextlib.contextmanager
def placement(
    settings: Settings,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    *,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    procs_per_gpu: int = DEFAULT_PROCS_PER_GPU,
    wait: bool = False,
    say: Callable[[str], object] = _quiet,
) -> Iterator[Placement]:
    """The broker configured; else the cluster `fedqueue up` left for these settings; else an embedded
    Redis and local workers for the block (waited for with `wait`, else started beside it)."""
    from fedqueue.queue import cluster_file

    settings.check_lasting_store()  # a store the workers cannot share: refused before anything starts
    if settings.broker_url:
        yield Placement(settings)
        return
    standing = cluster_file.find(settings)
    if standing is not None:
        say(f"using the local cluster of fedqueue up (pid {standing.pid}, {len(standing.slots)} workers)")
        yield Placement(settings.with_broker(standing.broker_url), standing.slots.copy, standing=standing)
        return
    say("starting embedded Redis and local workers")
    with local_cluster(
        procs, slots, settings=settings, gpus_per_worker=gpus_per_worker, procs_per_gpu=procs_per_gpu, wait=wait
    ) as cluster:
        say(f"embedded Redis at {cluster.settings.broker_url}, {len(cluster.workers.specs)} workers")
        yield Placement(cluster.settings, cluster.workers.slots, cluster=cluster)


def ask_within_s(place: Placement) -> float:
    """How long a question to the workers waits for one to take it. Workers started here are still booting (their
    imports cost what the asker would spend doing the work itself): none is asked."""
    from fedqueue.queue.client import ASK_STANDING_S, ASK_UNSURE_S

    if place.cluster is not None:
        return 0.0
    return ASK_STANDING_S if place.standing is not None else ASK_UNSURE_S


@contextlib.contextmanager
def _client(place: Placement, services: Services | None) -> Iterator[Services]:
    """The caller's services, or ones opened (and closed) for the block."""
    if services is not None:
        yield services
        return
    from fedqueue.queue.client import open_client_services

    opened = open_client_services(place.settings, place.worker_slots, ask_within_s(place))
    try:
        yield opened
    finally:
        opened.close()


def check_before_start(submission: Submission, settings: Settings) -> None:
    """The submission's quick checks, if it has any, before anything starts (plugin folders importable)."""
    settings.activate_plugin_path()
    early = getattr(submission, "check_before_start", None)
    if early is not None:
        early(settings)


def check(submission: Submission, settings: Settings) -> None:
    """The submission's checks, with the plugin folders of these settings importable."""
    settings.activate_plugin_path()
    submission.check(settings)


def submit(submission: Submission, place: Placement, services: Services | None = None) -> RunHandle:
    """Enqueue a checked job where `place` says and return at once (`services`: reuse the caller's)."""
    if not place.settings.broker_url:
        raise ConfigError(
            "FEDQUEUE_BROKER_URL: not set (use fedqueue.run(), or submit inside fedqueue.local_cluster())"
        )
    place.settings.check_lasting_store()
    with _client(place, services) as client:
        return RunHandle(submission.submit(client), place.settings)


def submit_through_outage(
    submission: Submission,
    place: Placement,
    services: Services | None = None,
    say: Callable[[str], object] | None = None,
) -> RunHandle:
    """`submit`, for a caller that follows the run: through a broker outage, as the follower waits through one.

    Cut short before anything of the run was stored, the submit waits for the broker (starting this process's
    embedded Redis again if it exited), then starts again; BrokerGone past FEDQUEUE_BROKER_WAIT_S, with nothing
    stored. Cut short after its row was stored, the run is returned with `submit_cut` set: its follower starts out
    waiting for the broker, and its repair pass sends what the submit did not. Lines go to `say`, else the log.
    """
    from fedqueue.core.waits.outage import SubmitCutShort, SubmitWatch, is_broker_error

    revive = None if place.cluster is None else place.cluster.restart_exited_broker
    with _client(place, services) as client:
        while True:
            try:
                return submit(submission, place, client)
            except SubmitCutShort as cut:
                handle = RunHandle(cut.run_id, place.settings)
                handle.submit_cut = cut.cause
                return handle
            except Exception as err:
                if not is_broker_error(err):
                    raise
                watch = SubmitWatch.of(place.settings, say=say)
                watch.went(err)
                watch.wait_back(revive)


@contextlib.contextmanager
def scheduling(
    handle: RunHandle, services: Services | None = None, say: Callable[[str], object] | None = None
) -> Iterator[RunSupervisor]:
    """Hold the run's lease for the block; the supervisor's `tick()` renews it and repairs the run.

    Raises LeaseHeld when another live scheduler has the run. While the broker is unreachable, `tick()`
    waits for it (its `watch` says when the broker goes and comes back, to `say`, else to the log) and
    raises BrokerGone after the broker wait (FEDQUEUE_BROKER_WAIT_S); see fedqueue.core.waits.outage. Its
    `store_watch` does the same for the store (fedqueue.core.waits.store_watch): the caller's polls go through it.
    Its ticks also say when the run's queues have tasks waiting and no worker reads them (fedqueue.core.waits.unread),
    and when the broker is at its maxmemory (fedqueue.core.waits.room).
    """
    from fedqueue.core.runs.supervisor import RunSupervisor
    from fedqueue.core.waits.outage import BrokerWatch, reason
    from fedqueue.core.waits.room import BrokerRoom
    from fedqueue.core.waits.store_watch import StoreWatch
    from fedqueue.core.waits.unread import UnreadQueues

    with _client(Placement(handle.settings), services) as client:
        watch = BrokerWatch.of(client.settings, handle.id, say)
        if handle.submit_cut is not None:  # the follower starts out waiting for the broker its submit lost
            watch.went(
                handle.submit_cut,
                f"broker unreachable ({reason(handle.submit_cut)}) while run {handle.id} was submitted: waiting for"
                " it; the run is stored, and what its submit did not send is sent when the broker is back",
            )
        store_watch = StoreWatch.of(client.settings, handle.id, say)
        room = BrokerRoom.of(client.settings, handle.id, say)
        # Workers waiting for room in a full broker cannot renew their reader marks: not called gone meanwhile.
        unread = UnreadQueues.of(client, handle.id, say, full=lambda: room is not None and room.full)
        supervisor = RunSupervisor(
            client, handle.id, watch=watch, store_watch=store_watch, unread=unread, room=room
        ).acquire()
        try:
            yield supervisor
        finally:
            supervisor.release()


def keep_running(supervisor: RunSupervisor, cluster: LocalCluster | None = None) -> Callable[[], list[str]]:
    """One scheduler tick: restart local workers (and the embedded Redis) that exited, renew the lease, repair
    the run."""

    def tick() -> list[str]:
        restarted: list[str] = []
        if cluster is not None:
            restarted += [f"local worker {name} restarted" for name in cluster.workers.restart_exited()]
            if cluster.restart_exited_broker():
                restarted.append("embedded Redis exited: started again (empty) on its port")
        return restarted + supervisor.tick()

    return tick


@contextlib.contextmanager
def local_cluster(
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    *,
    settings: Settings | None = None,
    plugin_path: list[str] | None = None,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    procs_per_gpu: int = DEFAULT_PROCS_PER_GPU,
    wait: bool = True,
) -> Iterator[LocalCluster]:
    """An embedded Redis (unless a broker is configured) and local workers, for the `with` block.

    With `wait`, the block starts once every worker is up and warm; without, at once (Redis
    answers, the workers start beside the block and take what it queued when they are up).
    """
    from fedqueue.queue.local import LocalCluster
    from fedqueue.queue.workers import detect_gpus, plan_workers

    settings = with_plugins(settings, plugin_path)
    settings.check_lasting_store()
    specs = plan_workers(detect_gpus(), procs, slots, gpus_per_worker, procs_per_gpu)
    cluster = LocalCluster.start(settings, specs) if wait else LocalCluster.launch(settings, specs)
    try:
        yield cluster
    finally:
        cluster.stop()


def with_plugins(settings: Settings | None, plugin_path: list[str] | None) -> Settings:
    """The given settings (else the environment's) with more plugin folders."""
    return (settings or Settings.from_env()).with_plugin_path(plugin_path)
