"""A broker restarted empty after a round's devices were all stored: the round's global model is gone from it,
and no repair pass republishes it (nothing is left to send). The aggregation reads it from the store's
checkpoint and the run ends with the reference's weights, instead of failing its aggregation three times."""

from __future__ import annotations

from pathlib import Path

from fedqueue.config import Settings
from fedqueue.core.codec import BlobRef
from fedqueue.fl.messages import AggregateTask
from fedqueue.fl.store.results import get_round
from fedqueue.fl.strategy.common import final_state
from fedqueue.fl.strategy.sync.rounds import aggregate_round
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.in_process_run import in_process_run

SETTINGS = Settings(key_prefix="lost-model", heartbeat_ttl_s=30, max_attempts=3, max_lost_attempts=3)


def test_an_aggregation_whose_global_model_left_the_broker_reads_it_from_the_store(tmp_path: Path) -> None:
    config = small_config(rounds=3, num_devices=12, devices_per_round=4, local_iters=2)
    with in_process_run(tmp_path, SETTINGS, config) as run:
        lost = 0

        def aggregate(message: AggregateTask) -> None:
            nonlocal lost
            row = get_round(run.store, run.run_id, message.round_index)
            assert row is not None and run.services.blobs.exists(row.model_key)
            run.services.blobs.delete([row.model_key])  # the broker restarted empty here
            lost += 1
            aggregate_round(run.services, run.run_id, message.round_index, "here#1")

        run.drive(aggregate)
        assert run.store.get_run(run.run_id).state == "finished"
        assert lost == 3
        assert_same_weights(final_state(run.store, run.run_id), reference_final_state(config))


def test_the_aggregating_worker_takes_the_round_model_from_its_own_memory(tmp_path: Path) -> None:
    """A worker that trained on the round's model aggregates from the model it holds: the broker is never asked
    for it again, and the run ends with the reference's weights."""
    config = small_config(rounds=3, num_devices=12, devices_per_round=4, local_iters=2)
    with in_process_run(tmp_path, SETTINGS, config) as run:
        read: list[str] = []
        get = run.services.blobs.get

        def reading(ref: BlobRef) -> bytes:  # every read of this store, get_many's too, comes here
            read.append(ref.key)
            return get(ref)

        run.services.blobs.get = reading  # type: ignore[method-assign]
        models = set()

        def aggregate(message: AggregateTask) -> None:
            row = get_round(run.store, run.run_id, message.round_index)
            assert row is not None
            models.add(row.model_key)
            before = read.count(row.model_key)
            aggregate_round(run.services, run.run_id, message.round_index, "here#1", run.cache)
            assert read.count(row.model_key) == before

        run.drive(aggregate)
        assert run.store.get_run(run.run_id).state == "finished"
        assert len(models) == 3 and all(read.count(key) == 1 for key in models)  # once, by the first device task
        assert_same_weights(final_state(run.store, run.run_id), reference_final_state(config))
