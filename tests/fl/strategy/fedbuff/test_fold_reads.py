"""A fold pass reads the stored results of the trips it may take next, not of every trip in flight."""

from __future__ import annotations

import pytest

from fedqueue.core.services import Services
from fedqueue.fl import scheduler as fl_scheduler
from fedqueue.fl.strategy.fedbuff import fold
from fedqueue.fl.strategy.fedbuff.fold import fold_updates
from fedqueue.fl.strategy.fedbuff.schedule import ScheduleState
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.fl.strategy.fedbuff.test_fold_repair import FEDBUFF, _Deferred, _state, _strategy, _task_of
from tests.support.helpers import small_config


def _fold_after_storing_the_first_trips(
    services: Services, read_ahead: int, monkeypatch: pytest.MonkeyPatch
) -> ScheduleState:
    """A run whose first dispatch's results are all stored, then one fold pass reading `read_ahead` trips ahead."""
    monkeypatch.setattr(fold, "READ_AHEAD", read_ahead)
    config = small_config(**{**FEDBUFF, "concurrency": 6, "buffer_size": 2, "max_model_version": 3})
    run_id = fl_scheduler.submit_run(services, config)
    strategy = _strategy(config)
    for trip in _state(services, run_id).in_flight:
        task = _task_of(services, run_id, config, trip)
        attempt = services.ledger.start_attempt(task.attempt_key, "w1")
        deferred = _Deferred(strategy)
        assert run_device_task(services, WorkerCache(), task, "w1", attempt, deferred) is not None  # type: ignore[arg-type]
    fold_updates(services, WorkerCache(), run_id, "w2", 1, strategy.rule)
    return _state(services, run_id)


def test_a_pass_reads_on_past_its_first_read(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading one trip ahead at a time, a pass takes what it takes reading them all at once."""
    one_by_one = _fold_after_storing_the_first_trips(services, 1, monkeypatch)
    at_once = _fold_after_storing_the_first_trips(services, 64, monkeypatch)
    assert one_by_one.folded + one_by_one.stale + one_by_one.failed >= 3  # past its first read, and the next
    assert one_by_one.to_dict() == at_once.to_dict()
