"""A broker restarted empty after a round's devices were all stored: the round's global model is gone from it,
and no repair pass republishes it (nothing is left to send). The aggregation reads it from the store's
checkpoint and the run ends with the reference's weights, instead of failing its aggregation three times."""

from __future__ import annotations

from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.broker.memory import RecordingEnqueuer, memory_services
from fedqueue.core.codec import BlobRef
from fedqueue.core.database import open_store
from fedqueue.fl.messages import AggregateTask, DeviceTask
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import get_round
from fedqueue.fl.strategy.common import final_state
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.strategy.sync.rounds import aggregate_round
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.support.helpers import assert_same_weights, reference_final_state, small_config

SETTINGS = Settings(key_prefix="lost-model", heartbeat_ttl_s=30, max_attempts=3, max_lost_attempts=3)


def test_an_aggregation_whose_global_model_left_the_broker_reads_it_from_the_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    try:
        config = small_config(rounds=3, num_devices=12, devices_per_round=4, local_iters=2)
        services = memory_services(SETTINGS, store)
        run_id = submit_run(services, config)
        sent = services.enqueue
        assert isinstance(sent, RecordingEnqueuer)
        cache, strategy = WorkerCache(), strategy_for(config)
        lost = 0
        while store.get_run(run_id).state == "running":
            waiting = sent.take()
            assert waiting, "the run waits on nothing"
            for message in waiting:
                if isinstance(message, DeviceTask):
                    run_device_task(services, cache, message, "here", 1, strategy)
                elif isinstance(message, AggregateTask):
                    row = get_round(store, run_id, message.round_index)
                    assert row is not None and services.blobs.exists(row.model_key)
                    services.blobs.delete([row.model_key])  # the broker restarted empty here
                    lost += 1
                    aggregate_round(services, run_id, message.round_index, "here#1")
        assert store.get_run(run_id).state == "finished"
        assert lost == 3
        assert_same_weights(final_state(store, run_id), reference_final_state(config))
    finally:
        store.close()


def test_the_aggregating_worker_takes_the_round_model_from_its_own_memory(tmp_path: Path) -> None:
    """A worker that trained on the round's model aggregates from the model it holds: the broker is never asked
    for it again, and the run ends with the reference's weights."""
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    try:
        config = small_config(rounds=3, num_devices=12, devices_per_round=4, local_iters=2)
        services = memory_services(SETTINGS, store)
        run_id = submit_run(services, config)
        sent = services.enqueue
        assert isinstance(sent, RecordingEnqueuer)
        cache, strategy = WorkerCache(), strategy_for(config)
        read: list[str] = []
        get = services.blobs.get

        def reading(ref: BlobRef) -> bytes:  # every read of this store, get_many's too, comes here
            read.append(ref.key)
            return get(ref)

        services.blobs.get = reading  # type: ignore[method-assign]
        models = set()
        while store.get_run(run_id).state == "running":
            waiting = sent.take()
            assert waiting, "the run waits on nothing"
            for message in waiting:
                if isinstance(message, DeviceTask):
                    run_device_task(services, cache, message, "here", 1, strategy)
                elif isinstance(message, AggregateTask):
                    row = get_round(store, run_id, message.round_index)
                    assert row is not None
                    models.add(row.model_key)
                    before = read.count(row.model_key)
                    aggregate_round(services, run_id, message.round_index, "here#1", cache)
                    assert read.count(row.model_key) == before
        assert store.get_run(run_id).state == "finished"
        assert len(models) == 3 and all(read.count(key) == 1 for key in models)  # once, by the first device task
        assert_same_weights(final_state(store, run_id), reference_final_state(config))
    finally:
        store.close()
