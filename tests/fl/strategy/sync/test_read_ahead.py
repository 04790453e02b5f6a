"""An aggregation requested in its round's tail reads the stored updates while the last devices train.

Through real worker processes: the aggregator reads ahead what is stored, the run ends on the
reference weights bit for bit, and the aggregation's timing starts when the round is complete.
In this process, on real Redis and a real store: the read-ahead returns once the round is
complete, and gives its slot back (forgetting the request) when work waits on a queue, the run
stops, or the tail outlasts its limit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.core.broker.shm import SPARE, SharedMemoryBlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.core.connect import open_services
from fedqueue.core.jobs import CONTROL_QUEUE
from fedqueue.core.services import Services
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import AggregateTask, DeviceTask, aggregate_key
from fedqueue.fl.ml.weights import decode_state
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import get_round, list_rounds, load_checkpoint, round_outcomes
from fedqueue.fl.strategy.sync import read_ahead, rounds
from fedqueue.fl.strategy.sync.early_fold import EarlyFold
from fedqueue.fl.strategy.sync.read_ahead import ReadAhead, read_round_ahead
from fedqueue.fl.strategy.sync.rounds import aggregate_round
from fedqueue.fl.strategy.sync.strategy import SYNCHRONOUS
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights, broker_redis, reference_final_state, small_config
from tests.support.reliability_support import reliable_settings, slow_config, wait_until


def test_the_aggregator_reads_the_stored_packs_while_the_last_one_trains(settings: Settings, tmp_path: Path) -> None:
    # Packs of 5 and 2 devices on two workers, each device stored as it is trained. The device queue
    # is empty from the first stored result on, so the aggregation is requested then; the slot of the
    # pack of 2 takes it when that pack is done and reads what is stored while the pack of 5 trains on.
    config = slow_config(0.1, devices_per_round=7, rounds=2, local_iters=4).with_keys(pack_size=5)
    settings = reliable_settings(settings)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = api.submit(config, settings=settings)
        status = handle.wait(timeout_s=180)
    assert status["state"] == "finished", status
    assert_same_weights(handle.final_weights(), reference_final_state(config))
    for round_row in list_rounds(handle.store, handle.id):
        # At least the pack of 2 and never the round's last device (read once the round was complete).
        assert round_row.read_ahead is not None and 2 <= round_row.read_ahead <= 6, round_row.read_ahead
        timings = handle.store.task_timings(handle.id, round_row.round_index)
        last_stored = max(row.finished_at for row in timings if row.task_type == "train")
        (aggregation,) = [row for row in timings if row.task_type == "aggregate"]
        # Timed from the round's completion, not from when the aggregator began waiting.
        assert aggregation.started_at >= last_stored


Tail = tuple[Services, str, list[DeviceTask], list[Any]]


@pytest.fixture
def tail(settings: Settings) -> Iterator[Tail]:
    """A round of 3 devices submitted with no workers: 2 results stored in this process, 1 missing.

    Yields the services, the run, its device tasks and every message sent so far.
    """
    sent: list[Any] = []
    services = open_services(settings, sent.extend, migrate=True)
    try:
        run_id = submit_run(services, small_config(devices_per_round=3, rounds=1, local_iters=2))
        devices = [message for message in sent if isinstance(message, DeviceTask)]
        assert len(devices) == 3
        cache = WorkerCache()
        for task in devices[:2]:
            run_device_task(services, cache, task, "test@host", 1, SYNCHRONOUS)
        yield services, run_id, devices, sent
    finally:
        services.close()


def _aggregations(sent: list[Any]) -> list[AggregateTask]:
    return [message for message in sent if isinstance(message, AggregateTask)]


def test_a_result_stored_with_an_empty_device_queue_requests_the_aggregation_once(tail: Tail) -> None:
    services, run_id, devices, sent = tail
    # Nothing waits on the device queue here: the first stored result already asked for it.
    assert [task.round_index for task in _aggregations(sent)] == [1]
    run_device_task(services, WorkerCache(), devices[2], "test@host", 1, SYNCHRONOUS)
    assert len(_aggregations(sent)) == 1  # the request stands: the round's last result does not repeat it


def test_the_read_ahead_holds_the_stored_updates_when_the_round_completes(tail: Tail) -> None:
    services, run_id, devices, _ = tail
    ahead = ReadAhead()
    outcome: list[ReadAhead | None] = []
    reader = threading.Thread(target=lambda: outcome.append(read_round_ahead(services, run_id, 1, 3, into=ahead)))
    reader.start()
    try:
        wait_until(lambda: ahead.count == 2 or not reader.is_alive(), 30)
        run_device_task(services, WorkerCache(), devices[2], "test@host", 1, SYNCHRONOUS)
    finally:
        reader.join(timeout=60)
    assert outcome == [ahead]
    stored = {row.device: row for row in round_outcomes(services.store, run_id, 1)}
    first_two = [stored[device] for task in devices[:2] for device in task.devices]
    # The two stored before the round completed were read; the last one is left to the aggregation.
    assert ahead.count == 2 and set(ahead.states) == {row.update_key for row in first_two}
    for row in first_two:
        held = ahead.take(row.update_key)
        assert held is not None
        ref = BlobRef(key=row.update_key, sha256=row.update_sha256, nbytes=row.update_nbytes)
        assert_same_weights(held, decode_state(services.blobs.get(ref)))
    assert ahead.take(first_two[0].update_key) is None  # handed over once


def test_work_waiting_on_a_queue_takes_the_slot_back(tail: Tail) -> None:
    services, run_id, _, _ = tail
    queue = f"{services.settings.key_prefix}:{services.settings.queue(CONTROL_QUEUE)}"
    broker_redis(services).lpush(queue, "another run's aggregation")
    try:
        assert read_round_ahead(services, run_id, 1, 3) is None
    finally:
        broker_redis(services).delete(queue)
    # The request is forgotten, so the round's last result requests the aggregation again.
    assert services.ledger.request_once(aggregate_key(run_id, 1), within_s=30)


def test_a_stopped_run_takes_the_slot_back(tail: Tail) -> None:
    services, run_id, _, _ = tail
    services.store.finish_run(run_id, "cancelled")
    assert read_round_ahead(services, run_id, 1, 3) is None


def test_a_tail_longer_than_its_limit_takes_the_slot_back(tail: Tail, monkeypatch: pytest.MonkeyPatch) -> None:
    services, run_id, _, _ = tail
    monkeypatch.setattr(read_ahead, "TAIL_MARGIN_S", 0.3)
    assert read_round_ahead(services, run_id, 1, 3) is None
    assert services.ledger.request_once(aggregate_key(run_id, 1), within_s=30)


def test_an_aggregation_in_the_tail_folds_the_leading_updates_and_ends_on_the_reference(
    tail: Tail, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedAvg's sum is begun while the round's last device trains (the two stored updates lead in device order);
    the version is bit for bit the one folded from nothing."""
    services, run_id, devices, _ = tail
    made: list[EarlyFold] = []

    class Watched(EarlyFold):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(rounds, "EarlyFold", Watched)
    began: list[float | None] = []
    aggregator = threading.Thread(target=lambda: began.append(aggregate_round(services, run_id, 1, "test@host")))
    aggregator.start()
    try:
        wait_until(lambda: (bool(made) and len(made[0].folded) == 2) or not aggregator.is_alive(), 30)
        run_device_task(services, WorkerCache(), devices[2], "test@host", 1, SYNCHRONOUS)
    finally:
        aggregator.join(timeout=60)
    assert len(began) == 1 and began[0] is not None
    assert [update.device for update in made[0].folded] == [device for task in devices[:2] for device in task.devices]
    checkpoint = load_checkpoint(services.store, run_id)
    assert checkpoint is not None
    config = RunConfig.from_stored(services.store.get_run(run_id).config)
    assert_same_weights(decode_state(checkpoint.data), reference_final_state(config))


def test_a_closed_rounds_model_file_is_kept_to_be_written_over(settings: Settings) -> None:
    """Once the round after it closes, a round's model leaves the blob store as its updates do: its file kept
    as a spare that the next state is written into, pages in place."""
    sent: list[Any] = []
    services = open_services(settings, sent.extend, migrate=True)
    try:
        blobs = services.blobs
        assert isinstance(blobs, SharedMemoryBlobStore) and blobs.one_host
        run_id = submit_run(services, small_config(devices_per_round=2, rounds=3, local_iters=2))
        cache = WorkerCache()

        def train_and_aggregate(round_index: int) -> None:
            for task in sent:
                if isinstance(task, DeviceTask) and task.round_index == round_index:
                    run_device_task(services, cache, task, "test@host", 1, SYNCHRONOUS)
            assert aggregate_round(services, run_id, round_index, "test@host") is not None

        train_and_aggregate(1)
        row = get_round(services.store, run_id, 2)
        assert row is not None
        model = blobs.local_path(BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes))
        assert model is not None
        inode = model.stat().st_ino
        train_and_aggregate(2)
        assert not blobs.exists(row.model_key)
        assert inode in {spare.stat().st_ino for spare in (blobs.root / SPARE).iterdir()}
    finally:
        services.close()
