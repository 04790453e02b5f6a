"""The Python API's kind-neutral part: where a run's workers are, submitting, scheduling and waiting.

Every job kind builds its own front door on this; FL's is `fedqueue.run(config)` (fedqueue.fl.api),
LLM batch jobs' `fedqueue.llm.run(prompts, model)` (fedqueue.llm.api):

import fedqueue
handle = fedqueue.run("examples/digits_fedavg.toml", rounds=3)
print(handle.status()["final_accuracy"])
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self

from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_PROCS_PER_GPU, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.errors import ConfigError, FedqueueError

# `import fedqueue` stays light: the store (sqlalchemy), Redis and the queue load when a run is placed, submitted
# or read, in the functions below.
if TYPE_CHECKING:
    from fedqueue.core.cluster_file import ClusterInfo
    from fedqueue.core.services import Services, WorkerSlots
    from fedqueue.core.store_watch import StoreWatch
    from fedqueue.core.supervisor import RunSupervisor
    from fedqueue.queue.local import LocalCluster
    from fedqueue.store import Store


class Submission(Protocol):
    """A job of some kind, ready to be checked and enqueued (an FL run config, an LLM batch job).

    A submission may also have `check_before_start(settings)`: what it can refuse in an instant (a plugin that
    does not import), run before any broker or worker is started for it (`check_before_start` below).
    """

    def check(self, settings: Settings) -> None:
        """Refuse what would fail, before anything is written (workers may be starting meanwhile)."""

    def submit(self, services: Services) -> str:
        """Enqueue the job's first tasks (checking what is costly first); its run id."""


class RunHandle:
    """One submitted run of any kind, read back from the store."""

    def __init__(self, run_id: str, settings: Settings) -> None:
        self.id = run_id
        self.settings = settings
        self._store: Store | None = None
        # The broker error that cut its submit short after the run was stored: its follower starts out waiting.
        self.submit_cut: BaseException | None = None

    @classmethod
    def of(cls, handle: RunHandle) -> Self:
        """The same run behind a kind's own handle."""
        same = cls(handle.id, handle.settings)
        same.submit_cut = handle.submit_cut
        return same

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    @property
    def store(self) -> Store:
        if self._store is None:
            from fedqueue.core.database import open_store

            self._store = open_store(self.settings.database_url)
        return self._store

    @property
    def state(self) -> str:
        return self.store.get_run(self.id).state

    def cancel(self, reason: str = "cancelled by the user") -> Cancellation:
        """Cancel the run (see `cancel`)."""
        return cancel(self.id, self.settings, reason)

    def status(self) -> dict[str, Any]:
        """State, tasks, workers, max_concurrency, failures, and what the run's kind adds."""
        from fedqueue.report.summary import run_summary

        return run_summary(self.store, self.id)

    def wait(
        self,
        timeout_s: float | None = None,
        poll_s: float = 0.2,
        tick: Callable[[], object] | None = None,
        store_watch: StoreWatch | None = None,
    ) -> dict[str, Any]:
        """Block until the run finishes or fails; return its status. `tick` runs on every poll.

        The tick of `scheduling()` (or `keep_running`) waits through a broker outage; it raises
        BrokerGone once the broker stayed away longer than FEDQUEUE_BROKER_WAIT_S. Each poll goes through
        `store_watch` (the supervisor's): while the store refuses it, the poll waits; past
        FEDQUEUE_STORE_WAIT_S, StoreGone.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def poll() -> bool:
            """Whether the run is still running; a tick if so."""
            if self.state != "running":
                return False
            if tick is not None:
                tick()
            return True

        while poll() if store_watch is None else store_watch.call(poll, _still_running):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still running after {timeout_s} s")
            time.sleep(poll_s)
        return self.status()


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


def _still_running() -> bool:
    """What a poll tells while the store refuses it."""
    return True


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
    from fedqueue.core import cluster_file

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


@contextlib.contextmanager
def _client(place: Placement, services: Services | None) -> Iterator[Services]:
    """The caller's services, or ones opened (and closed) for the block."""
    if services is not None:
        yield services
        return
    from fedqueue.queue.client import open_client_services

    opened = open_client_services(place.settings, place.worker_slots)
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
    from fedqueue.core.outage import SubmitCutShort, SubmitWatch, is_broker_error

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
    raises BrokerGone after the broker wait (FEDQUEUE_BROKER_WAIT_S); see fedqueue.core.outage. Its
    `store_watch` does the same for the store (fedqueue.core.store_watch): the caller's polls go through it.
    Its ticks also say when the run's queues have tasks waiting and no worker reads them (fedqueue.core.unread),
    and when the broker is at its maxmemory (fedqueue.core.room).
    """
    from fedqueue.core.outage import BrokerWatch, reason
    from fedqueue.core.room import BrokerRoom
    from fedqueue.core.store_watch import StoreWatch
    from fedqueue.core.supervisor import RunSupervisor
    from fedqueue.core.unread import UnreadQueues

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


def run(
    submission: Submission,
    settings: Settings,
    *,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    wait_for_workers: bool = False,
    timeout_s: float | None = None,
) -> RunHandle:
    """Check, submit and wait, scheduling the run meanwhile: on the configured broker, the cluster
    `fedqueue up` left running for these settings, else local workers started here (beside the submit,
    or before it with `wait_for_workers`)."""
    check_before_start(submission, settings)
    with placement(settings, procs, slots, gpus_per_worker=gpus_per_worker, wait=wait_for_workers) as place:
        check(submission, place.settings)
        handle = submit_through_outage(submission, place)
        with scheduling(handle) as supervisor:
            handle.wait(timeout_s, tick=keep_running(supervisor, place.cluster), store_watch=supervisor.store_watch)
    return handle


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


@dataclass(frozen=True)
class Cancellation:
    """What `cancel` did."""

    run_id: str
    was: str  # "running" when this call cancelled it; else the state the run had already ended in
    dropped: int | None = None  # queued tasks removed from the broker; None when it was not reached
    broker_error: str | None = None  # why the broker was not reached (its workers skip the run's tasks instead)

    @property
    def cancelled_now(self) -> bool:
        return self.was == "running"


def cancel(run_id: str, settings: Settings | None = None, reason: str = "cancelled by the user") -> Cancellation:
    """Cancel a running run of any kind: state `cancelled` in the store (final: nothing resumes it), its
    queued tasks removed from the broker of `settings` (where one is configured and answers); tasks that
    workers hold are skipped, and running ones finish. An ended run is left as it is (`was` tells its state)."""
    from fedqueue.core.cancel import CANCELLED, cancel_run
    from fedqueue.core.database import open_store

    settings = settings or Settings.from_env()
    store = open_store(settings.database_url)
    try:
        was = cancel_run(store, run_id, reason)
    finally:
        store.close()
    if was not in ("running", CANCELLED) or not settings.broker_url:
        return Cancellation(run_id, was)
    try:
        dropped = drop_queued_tasks(settings, run_id)
    except FedqueueError as err:
        return Cancellation(run_id, was, broker_error=str(err))
    return Cancellation(run_id, was, dropped)


def drop_queued_tasks(settings: Settings, run_id: str) -> int:
    """Remove a run's queued tasks from the broker of `settings`; how many (ServiceUnavailable when it is down)."""
    import redis

    from fedqueue.core.services import connect_redis
    from fedqueue.errors import ServiceUnavailable
    from fedqueue.queue.purge import drop_queued

    client = connect_redis(settings.broker_url or "")
    try:
        return drop_queued(client, settings, run_id)
    except redis.RedisError as err:
        raise ServiceUnavailable(f"broker: {err}") from None
    finally:
        client.close()


def runs(settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every run in the store, oldest first: what `fedqueue runs` shows (`stalled`: running, but nothing
    schedules it)."""
    from fedqueue.core.database import open_store
    from fedqueue.report.summary import run_lines

    settings = settings or Settings.from_env()
    store = open_store(settings.database_url)
    try:
        return run_lines(store, store.list_runs(), lease_ttl_s=settings.lease_ttl_s)
    finally:
        store.close()
