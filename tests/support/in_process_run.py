"""A sync run driven in the test's process: its queued tasks run in the order a queue hands them out.

The store is real SQLite; the ledger, the blob store and the queues are in memory. Tests hook the aggregation
step (lose a blob before it, kill it partway) and what happens when nothing is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.broker.memory import RecordingEnqueuer, memory_services
from fedqueue.core.database import open_store
from fedqueue.core.services import Services
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import AggregateTask, DeviceTask
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from fedqueue.store import Store


@dataclass
class InProcessRun:
    store: Store
    services: Services
    run_id: str
    config: RunConfig
    cache: WorkerCache
    sent: RecordingEnqueuer

    def drive(self, aggregate: Callable[[AggregateTask], object], idle: Callable[[], None] | None = None) -> None:
        """Run the queued tasks until the run is no longer running: device tasks as a worker runs them, each
        aggregation through `aggregate`. With nothing queued, `idle` runs (a repair pass, say); without one,
        the run waiting on nothing fails the test."""
        strategy = strategy_for(self.config)
        while self.store.get_run(self.run_id).state == "running":
            waiting = self.sent.take()
            if not waiting:
                assert idle is not None, "the run waits on nothing"
                idle()
                continue
            for message in waiting:
                if isinstance(message, DeviceTask):
                    run_device_task(self.services, self.cache, message, "here", 1, strategy)
                elif isinstance(message, AggregateTask):
                    aggregate(message)


@contextmanager
def in_process_run(tmp_path: Path, settings: Settings, config: RunConfig) -> Iterator[InProcessRun]:
    """A submitted run over a fresh SQLite store in `tmp_path`, closed on the way out."""
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    try:
        services = memory_services(settings, store)
        run_id = submit_run(services, config)
        sent = services.enqueue
        assert isinstance(sent, RecordingEnqueuer)
        yield InProcessRun(store, services, run_id, config, WorkerCache(), sent)
    finally:
        store.close()
