"""A broker restarted empty once every device that trains on a FedBuff version was stored: the version is gone
from it before the fold pass that needs it (as the buffer's base, or the current model) runs, and no repair
pass has put it back yet. The fold reads it from the store's kept copy and the run ends with the reference's
weights, instead of failing its fold pass over and over."""

from __future__ import annotations

from pathlib import Path

import torch

from fedqueue.config import Settings
from fedqueue.core.broker.memory import RecordingEnqueuer, memory_services
from fedqueue.core.database import open_store
from fedqueue.fl.messages import DeviceTask, FoldTask, global_key
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.strategy.common import final_state
from fedqueue.fl.strategy.fedbuff.fold import fold_updates
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.fl.strategy.fedbuff.test_buffered_async import buffered_config, reference
from tests.support.helpers import assert_same_weights

SETTINGS = Settings(key_prefix="lost-version", heartbeat_ttl_s=30, max_attempts=3, max_lost_attempts=3)


def test_a_fold_whose_versions_left_the_broker_reads_them_from_the_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    try:
        config = buffered_config(max_model_version=4)
        services = memory_services(SETTINGS, store)
        run_id = submit_run(services, config)
        sent = services.enqueue
        assert isinstance(sent, RecordingEnqueuer)
        strategy = strategy_for(config)
        lost: set[int] = set()
        while store.get_run(run_id).state == "running":
            waiting = sent.take()
            assert waiting, "the run waits on nothing"
            for index, message in enumerate(waiting):
                # The broker restarted empty here: every version no device still to train needs is gone.
                needed = {task.model.key for task in waiting[index:] + sent.waiting if isinstance(task, DeviceTask)}
                for version in range(config.max_model_version or 0):
                    key = global_key(run_id, version)
                    if key not in needed and services.blobs.exists(key):
                        services.blobs.delete([key])
                        lost.add(version)
                # A cache of its own per task, as on another worker process: the fold reads versions it needs.
                if isinstance(message, DeviceTask):
                    run_device_task(services, WorkerCache(), message, "here", 1, strategy)
                elif isinstance(message, FoldTask):
                    fold_updates(services, WorkerCache(), run_id, "here", 1)
        assert store.get_run(run_id).state == "finished", store.get_run(run_id).error
        assert lost, "no version left the broker before a fold needed it"
        expected: dict[str, torch.Tensor] = reference(config)[1]
        assert_same_weights(final_state(store, run_id), expected)
    finally:
        store.close()
