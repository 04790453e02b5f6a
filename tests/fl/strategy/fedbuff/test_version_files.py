"""A buffered run's versions in shared memory: one no trip needs any more leaves the blob store with its file kept
as a spare, which the next state is written into, pages in place (as a sync round's model and updates)."""

from __future__ import annotations

from fedqueue.core.broker.shm import SPARE, SharedMemoryBlobStore
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.fl import scheduler as fl_scheduler
from fedqueue.fl.store.results import get_round
from fedqueue.fl.strategy.fedbuff.fold import fold_updates, oldest_needed
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.fl.strategy.fedbuff.test_fold_repair import FEDBUFF, _Deferred, _state, _strategy, _task_of
from tests.support.helpers import small_config


def test_a_version_no_trip_needs_is_kept_to_be_written_over(services: Services) -> None:
    blobs = services.blobs
    assert isinstance(blobs, SharedMemoryBlobStore) and blobs.one_host
    config = small_config(**{**FEDBUFF, "concurrency": 4, "buffer_size": 2, "max_model_version": 8})
    run_id = fl_scheduler.submit_run(services, config)
    first = get_round(services.store, run_id, 1)  # its devices train on version 0
    assert first is not None
    path = blobs.local_path(BlobRef(key=first.model_key, sha256=first.model_sha256, nbytes=first.model_nbytes))
    assert path is not None
    inode = path.stat().st_ino
    strategy = _strategy(config)
    trained: set[tuple[int, int]] = set()
    state = _state(services, run_id)
    # Each arrival sends a refill on the version of its time: passes until no trip trains on version 0.
    for _ in range(20):
        if oldest_needed(state) >= 1 or state.done:
            break
        for trip in state.in_flight:
            if (trip.round_index, trip.device) in trained:
                continue
            task = _task_of(services, run_id, config, trip)
            attempt = services.ledger.start_attempt(task.attempt_key, "w1")
            assert run_device_task(services, WorkerCache(), task, "w1", attempt, _Deferred(strategy)) == 1  # type: ignore[arg-type]
            trained.add((trip.round_index, trip.device))
        fold_updates(services, WorkerCache(), run_id, "w2", 1, strategy.rule)
        state = _state(services, run_id)

    assert state.version >= 1 and oldest_needed(state) >= 1 and not state.done
    assert not blobs.exists(first.model_key)
    assert inode in {spare.stat().st_ino for spare in (blobs.root / SPARE).iterdir()}
