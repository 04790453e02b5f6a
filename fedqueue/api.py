"""The Python API: what the CLI does, for scripts and sweeps.

import fedqueue
handle = fedqueue.run("examples/digits_fedavg.toml", rounds=3)
print(handle.status()["final_accuracy"])
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedqueue.config import Settings
from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig, load_run_config

if TYPE_CHECKING:
    import torch

    from fedqueue.core.services import WorkerSlots
    from fedqueue.core.supervisor import RunSupervisor
    from fedqueue.queue.local import LocalCluster
    from fedqueue.store import Store

ConfigLike = RunConfig | Mapping[str, Any] | str | os.PathLike[str]


def load_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """A validated RunConfig from a RunConfig, a dict or a TOML path, with overrides applied."""
    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif isinstance(config, Mapping):
        raw = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        return load_run_config(Path(config), dict(overrides or {}))
    else:
        raise ConfigError(f"config: expected a dict, a path or a RunConfig, got {type(config).__name__}")
    raw.update(overrides or {})
    return RunConfig.from_dict(raw)


class RunHandle:
    """One submitted run, read back from the store."""

    def __init__(self, run_id: str, settings: Settings) -> None:
        self.id = run_id
        self.settings = settings
        self._store: Store | None = None

    def __repr__(self) -> str:
        return f"RunHandle({self.id!r})"

    @property
    def store(self) -> Store:
        if self._store is None:
            from fedqueue.store import open_store

            self._store = open_store(self.settings.database_url)
        return self._store

    def status(self) -> dict[str, Any]:
        """State, rounds done, accuracy per evaluated round, workers, max_concurrency, failures."""
        from fedqueue.report.summary import run_summary

        return run_summary(self.store, self.id)

    def wait(
        self, timeout_s: float | None = None, poll_s: float = 0.2, tick: Callable[[], object] | None = None
    ) -> dict[str, Any]:
        """Block until the run finishes or fails; return its status. `tick` runs on every poll."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.store.get_run(self.id).state == "running":
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still running after {timeout_s} s")
            if tick is not None:
                tick()
            time.sleep(poll_s)
        return self.status()

    def report(self) -> dict[str, Any]:
        """The status plus one row per round."""
        from fedqueue.fl.results import list_rounds

        rounds = [
            {
                "round": row.round_index,
                "state": row.state,
                "selected": len(row.selected),
                "seconds": None if row.aggregated_at is None else row.aggregated_at - row.enqueued_at,
                "accuracy": row.accuracy,
                "loss": row.loss,
                "train_loss": row.train_loss,
            }
            for row in list_rounds(self.store, self.id)
        ]
        return {**self.status(), "rounds": rounds}

    def final_weights(self) -> dict[str, torch.Tensor]:
        """The latest checkpointed global model."""
        from fedqueue.fl.rounds import final_state

        return final_state(self.store, self.id)


@contextlib.contextmanager
def scheduling(handle: RunHandle) -> Iterator[RunSupervisor]:
    """Hold the run's lease for the block; the supervisor's `tick()` renews it and repairs the run.

    Raises LeaseHeld when another live scheduler has the run.
    """
    from fedqueue.core.supervisor import RunSupervisor
    from fedqueue.queue.client import open_client

    services = open_client(handle.settings)
    try:
        supervisor = RunSupervisor(services, handle.id).acquire()
        try:
            yield supervisor
        finally:
            supervisor.release()
    finally:
        services.close()


def keep_running(supervisor: RunSupervisor, cluster: LocalCluster | None = None) -> Callable[[], list[str]]:
    """One scheduler tick: restart local workers that exited, renew the lease, repair the run."""

    def tick() -> list[str]:
        restarted = [f"local worker {name} restarted" for name in cluster.workers.restart_exited()] if cluster else []
        return restarted + supervisor.tick()

    return tick


def _settings(settings: Settings | None, plugin_path: list[str] | None) -> Settings:
    return (settings or Settings.from_env()).with_plugin_path(plugin_path)


def submit(
    config: ConfigLike,
    *,
    settings: Settings | None = None,
    plugin_path: list[str] | None = None,
    worker_slots: WorkerSlots | None = None,
    **overrides: Any,
) -> RunHandle:
    """Validate, enqueue round 1 on the configured broker and return at once.

    `worker_slots`: the workers' slots by hostname where the caller knows them (a cluster it
    started, whose workers may not answer yet); else a submit that sizes packs asks the workers.
    """
    from fedqueue.fl.rounds import submit_run
    from fedqueue.queue.client import open_client

    run_config = load_config(config, overrides)
    settings = _settings(settings, plugin_path)
    if not settings.broker_url:
        raise ConfigError(
            "FEDQUEUE_BROKER_URL: not set (use fedqueue.run(), or submit inside fedqueue.local_cluster())"
        )
    services = open_client(settings, worker_slots)
    try:
        return RunHandle(submit_run(services, run_config), settings)
    finally:
        services.close()


@contextlib.contextmanager
def local_cluster(
    procs: int | None = None,
    slots: int = 1,
    *,
    settings: Settings | None = None,
    plugin_path: list[str] | None = None,
    gpus_per_worker: int = 1,
    procs_per_gpu: int = 1,
    wait: bool = True,
) -> Iterator[LocalCluster]:
    """An embedded Redis (unless a broker is configured) and local workers, for the `with` block.

    With `wait`, the block starts once every worker is up and warm; without, at once (Redis
    answers, the workers start beside the block and take what it queued when they are up).
    """
    from fedqueue.queue.local import LocalCluster
    from fedqueue.queue.workers import detect_gpus, plan_workers

    settings = _settings(settings, plugin_path)
    specs = plan_workers(detect_gpus(), procs, slots, gpus_per_worker, procs_per_gpu)
    cluster = LocalCluster.start(settings, specs) if wait else LocalCluster.launch(settings, specs)
    try:
        yield cluster
    finally:
        cluster.stop()


def run(
    config: ConfigLike,
    *,
    settings: Settings | None = None,
    procs: int | None = None,
    slots: int = 1,
    plugin_path: list[str] | None = None,
    timeout_s: float | None = None,
    **overrides: Any,
) -> RunHandle:
    """Submit and wait. With no broker configured: on the cluster `fedqueue up` left running for
    these settings, else on local workers started here (beside the submit) and stopped afterwards."""
    from fedqueue.core import cluster_file

    run_config = load_config(config, overrides)
    settings = _settings(settings, plugin_path)
    standing = None if settings.broker_url else cluster_file.find(settings)
    if settings.broker_url or standing is not None:
        if standing is not None:
            settings = settings.with_broker(standing.broker_url)
        handle = submit(run_config, settings=settings, worker_slots=standing.slots.copy if standing else None)
        with scheduling(handle) as supervisor:
            handle.wait(timeout_s, tick=keep_running(supervisor))
        return handle
    with local_cluster(procs, slots, settings=settings, wait=False) as cluster:
        handle = submit(run_config, settings=cluster.settings, worker_slots=cluster.workers.slots)
        with scheduling(handle) as supervisor:
            handle.wait(timeout_s, tick=keep_running(supervisor, cluster))
    return handle


def runs(settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every run in the store, oldest first."""
    from fedqueue.report.summary import run_lines
    from fedqueue.store import open_store

    store = open_store((settings or Settings.from_env()).database_url)
    try:
        return run_lines(store, store.list_runs())
    finally:
        store.close()
