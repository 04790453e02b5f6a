"""The repair pass of a buffered run (FedAsync, FedBuff) against the fold's normal flow, on a real Redis.

A device task stores the head's result, then asks for a fold pass; a pass claims the schedule, takes the
request and moves the head. A repair pass running beside them must never take a step of that flow for a
lost pass ("fold pass was not asked for"), and must still ask for a pass when the task that stored the
head died before asking. The interleavings are driven by hand: the flow's next step runs between two of
the repair's reads, at each of its reads in turn.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.broker.ledger import RedisLedger
from fedqueue.core.codec import BlobRef
from fedqueue.core.services import Services
from fedqueue.fl import scheduler as fl_scheduler
from fedqueue.fl.config import RunConfig
from fedqueue.fl.messages import DeviceTask, fold_key
from fedqueue.fl.store import schedule_rows
from fedqueue.fl.store.results import delete_result, get_round
from fedqueue.fl.strategy.fedbuff.fold import dispatch_tasks, fold_updates, publish_head
from fedqueue.fl.strategy.fedbuff.schedule import ScheduleState, Trip
from fedqueue.fl.strategy.fedbuff.strategy import BufferedAsync
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.worker.cache import WorkerCache
from fedqueue.fl.worker.device_task import run_device_task
from tests.support.helpers import small_config

NOT_ASKED = "fold pass was not asked for: asked"

FEDASYNC: dict[str, Any] = {
    "mode": "fedasync",
    "num_devices": 12,
    "concurrency": 3,
    "max_model_version": 4,
    "fedasync_alpha": 0.6,
    "device_speed": {"mean": [0.01, 0.06], "std": [0.002, 0.01], "share": [0.5, 0.5]},
}
FEDBUFF: dict[str, Any] = {
    **{key: value for key, value in FEDASYNC.items() if not key.startswith("fedasync")},
    "mode": "fedbuff",
    "buffer_size": 2,
}

# The repair's reads a step of the fold may come right after.
READS = ["schedule", "results", "running", "requested"]


def _strategy(config: RunConfig) -> BufferedAsync:
    strategy = strategy_for(config)
    assert isinstance(strategy, BufferedAsync)
    return strategy


def _state(services: Services, run_id: str) -> ScheduleState:
    row = schedule_rows.get_schedule(services.store, run_id)
    assert row is not None
    return ScheduleState.from_dict(row.state)


def _head(services: Services, run_id: str) -> Trip:
    return _state(services, run_id).in_flight[0]


def _task_of(services: Services, run_id: str, config: RunConfig, trip: Trip) -> DeviceTask:
    row = get_round(services.store, run_id, trip.round_index)
    assert row is not None
    model = BlobRef(key=row.model_key, sha256=row.model_sha256, nbytes=row.model_nbytes)
    (task,) = dispatch_tasks(run_id, config, trip.round_index, [trip.pack], model, time.time())
    return task


class _Deferred:
    """The run's strategy, but what a stored result asks for waits until the test lets it go."""

    def __init__(self, strategy: BufferedAsync) -> None:
        self.strategy = strategy
        self.asks: list[Callable[[WorkerCache | None], None]] = []

    def on_stored(
        self, services: Services, task: DeviceTask, stored: int, worker: str, cache: WorkerCache | None = None
    ) -> None:
        self.asks.append(lambda cache: self.strategy.on_stored(services, task, stored, worker, cache))


def _store_head(services: Services, run_id: str, config: RunConfig) -> tuple[str, _Deferred]:
    """The head's device task starts (marked running), trains and stores its result; it has not asked for a pass
    yet. Returns its attempt key and the deferred ask."""
    task = _task_of(services, run_id, config, _head(services, run_id))
    attempt = services.ledger.start_attempt(task.attempt_key, "w1")
    deferred = _Deferred(_strategy(config))
    assert run_device_task(services, WorkerCache(), task, "w1", attempt, deferred) == 1  # type: ignore[arg-type]
    assert len(deferred.asks) == 1
    return task.attempt_key, deferred


def _mark_gone(services: Services, task_key: str) -> None:
    """The task ended (or died) a heartbeat ago: its running mark has expired."""
    ledger = services.ledger
    assert isinstance(ledger, RedisLedger)
    ledger.redis.delete(keys.running(services.settings.key_prefix, task_key))


def _between(
    monkeypatch: pytest.MonkeyPatch, services: Services, read: str, step: Callable[[], object]
) -> Callable[[], None]:
    """Run `step` once, right after the repair's first read of `read`; returns what runs it after the repair
    where the repair never made that read."""
    owners: dict[str, tuple[object, str]] = {
        "schedule": (schedule_rows, "get_schedule"),
        "results": (schedule_rows, "stored_results"),
        "running": (services.ledger, "running_of"),
        "requested": (services.ledger, "is_requested"),
    }
    owner, name = owners[read]
    original = getattr(owner, name)
    fired = False

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value = original(*args, **kwargs)
        once()
        return value

    def once() -> None:
        nonlocal fired
        if not fired:
            fired = True  # before the step: the pass's own reads go straight through
            step()

    monkeypatch.setattr(owner, name, wrapped)
    return once


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("flow", ["fold task", "storing worker"])
def test_a_pass_taken_between_the_repairs_reads_is_no_lost_pass(
    settings: Settings, services: Services, monkeypatch: pytest.MonkeyPatch, flow: str, read: str
) -> None:
    """The head is stored and its pass asked for or about to be: a pass run between two of the repair's reads
    (by a fold task, or by the worker that stored the head, right after asking) leaves no repair line."""
    config = small_config(**FEDASYNC)
    strategy = _strategy(config)
    run_id = fl_scheduler.submit_run(services, config)
    head = _head(services, run_id)
    storer, deferred = _store_head(services, run_id, config)
    (ask,) = deferred.asks
    step: Callable[[], object]
    if flow == "fold task":
        ask(None)  # asked as a fold task (the scheduler's way); the task that stored the head is long gone
        _mark_gone(services, storer)
        assert services.ledger.is_requested(fold_key(run_id))
        step = functools.partial(fold_updates, services, WorkerCache(), run_id, "w2", 1, strategy.rule)
    else:
        step = functools.partial(ask, WorkerCache())  # asks, and runs the pass right there

    with monkeypatch.context() as patch:
        after = _between(patch, services, read, step)
        assert NOT_ASKED not in fl_scheduler.reconcile(services, run_id)
    after()
    assert _state(services, run_id).version == 1  # the pass ran, between the reads, and took the head
    assert _head(services, run_id) != head
    assert fl_scheduler.reconcile(services, run_id) == []


def test_a_head_stored_by_a_task_yet_to_ask_waits_for_its_ask(settings: Settings, services: Services) -> None:
    """Between storing the head's result and asking for its pass, the task is at work: no pass is lost yet."""
    config = small_config(**FEDASYNC)
    run_id = fl_scheduler.submit_run(services, config)
    _, deferred = _store_head(services, run_id, config)
    assert fl_scheduler.reconcile(services, run_id) == []
    assert not services.ledger.is_requested(fold_key(run_id))  # the repair left the asking to the task
    deferred.asks[0](WorkerCache())
    assert _state(services, run_id).version == 1
    assert fl_scheduler.reconcile(services, run_id) == []


@pytest.mark.parametrize("mode", [FEDASYNC, FEDBUFF], ids=["fedasync", "fedbuff"])
def test_a_pass_the_storing_task_died_before_asking_for_is_asked_for(
    settings: Settings, services: Services, mode: dict[str, Any]
) -> None:
    """The task stored the head's result and died before asking: once its running mark expired, the repair
    asks for the pass, says so once, and the pass takes the head."""
    config = small_config(**mode)
    run_id = fl_scheduler.submit_run(services, config)
    head = _head(services, run_id)
    storer, _ = _store_head(services, run_id, config)  # its ask never comes
    assert fl_scheduler.reconcile(services, run_id) == []  # its mark still lasts: it may yet ask
    _mark_gone(services, storer)
    assert fl_scheduler.reconcile(services, run_id) == [NOT_ASKED]
    assert services.ledger.is_requested(fold_key(run_id))
    assert services.ledger.queue_length("control") == 1  # the fold task
    assert fl_scheduler.reconcile(services, run_id) == []  # asked once
    fold_updates(services, WorkerCache(), run_id, "w2", 1, _strategy(config).rule)
    assert _head(services, run_id) != head
    assert fl_scheduler.reconcile(services, run_id) == []


def test_a_head_stored_while_the_buffer_waits_for_a_lost_update_is_no_lost_pass(
    settings: Settings, services: Services
) -> None:
    """An update taken into the buffer went with Redis and trains again: nothing moves until it is stored,
    and its own result asks for the pass. A head stored meanwhile is no pass lost, however long it waits."""
    config = small_config(**FEDBUFF)
    run_id = fl_scheduler.submit_run(services, config)
    first = _head(services, run_id)
    _, deferred = _store_head(services, run_id, config)
    deferred.asks[0](WorkerCache())  # its pass takes it into the buffer (of two): no version yet
    assert [arrival.trip for arrival in _state(services, run_id).buffer] == [first]
    # Redis lost the update and the named head; the repair after the restart forgot the result.
    delete_result(services.store, run_id, first.round_index, first.device)
    publish_head(services, run_id, None)
    storer, _ = _store_head(services, run_id, config)  # the next head, whose task died before asking
    _mark_gone(services, storer)
    assert NOT_ASKED not in fl_scheduler.reconcile(services, run_id)
    assert not services.ledger.is_requested(fold_key(run_id))
    # The lost update, trained again, asks for the pass, which makes the version from both.
    retrained = _task_of(services, run_id, config, first)
    attempt = services.ledger.start_attempt(retrained.attempt_key, "w3")
    assert run_device_task(services, WorkerCache(), retrained, "w3", attempt, _strategy(config)) == 1
    assert _state(services, run_id).version == 1
    assert NOT_ASKED not in fl_scheduler.reconcile(services, run_id)
