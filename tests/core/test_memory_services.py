"""Scheduling and repair on in-memory services: no broker, no workers, a real SQLite store.

The ledger's contract runs against Redis and against its in-memory twin alike, so the twin is held
to the real one's behaviour; the scheduling and repair tests then run on the twin, with a clock
they move forward instead of waiting for marks to expire.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.core.broker.ledger import RedisLedger, TaskLedger
from fedqueue.core.broker.memory import ManualClock, MemoryLedger, RecordingEnqueuer, memory_services
from fedqueue.core.database import open_store
from fedqueue.core.services import Services, connect_redis
from fedqueue.fl import scheduler as fl_scheduler
from fedqueue.fl.messages import AggregateTask, DeviceTask, FoldTask, aggregate_key, fold_key, global_key
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import claim_round, complete_round, device_tasks, list_rounds
from fedqueue.fl.strategy.common import checkpoint_bytes, checkpoint_version
from fedqueue.fl.strategy.fedbuff.fold import head_key, on_result_stored, publish_head
from fedqueue.fl.strategy.fedbuff.schedule import Trip
from fedqueue.fl.strategy.sync.rounds import aggregate_round, round_key, select_devices
from fedqueue.llm import repair as llm_repair
from fedqueue.llm.job import JobRequest, submit_job
from fedqueue.llm.messages import GenerateBatch
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.wake import stored_key
from fedqueue.store import Store
from tests.support.helpers import small_config

HEARTBEAT_S = 15
MEMORY_SETTINGS = Settings(key_prefix="mem", heartbeat_ttl_s=HEARTBEAT_S, max_attempts=3, max_lost_attempts=3)

# --- The ledger's contract: Redis and its twin, the same calls, the same answers.

Ledger = tuple[TaskLedger, Callable[[float], None]]  # the ledger, and how time moves forward for it


@contextlib.contextmanager
def _redis_ledger(settings: Settings) -> Iterator[Ledger]:
    """A Redis ledger whose time moves on at once: its clock advances and every key's TTL shrinks as much."""
    client = connect_redis(settings.broker_url or "")
    clock = ManualClock(time.time())
    settings = replace(
        settings,
        heartbeat_ttl_s=HEARTBEAT_S,
        task_time_limit_s=MEMORY_SETTINGS.task_time_limit_s,
        max_attempts=MEMORY_SETTINGS.max_attempts,
        max_lost_attempts=MEMORY_SETTINGS.max_lost_attempts,
    )

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        for key in client.scan_iter(match=f"{settings.key_prefix}:*"):
            left_ms = int(client.pttl(key))
            if left_ms < 0:
                continue  # no TTL
            if left_ms <= seconds * 1000:
                client.delete(key)
            else:
                client.pexpire(key, left_ms - int(seconds * 1000))

    try:
        yield RedisLedger(client, settings, clock), advance
    finally:
        client.close()


@pytest.fixture(params=["redis", "memory"])
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    if request.param == "redis":
        with _redis_ledger(request.getfixturevalue("settings")) as real:
            yield real
        return
    clock = ManualClock()
    yield MemoryLedger(MEMORY_SETTINGS, clock), clock.advance


def test_attempts_are_counted_and_outlive_the_running_mark(ledger: Ledger) -> None:
    led, advance = ledger
    assert led.attempts_of(["a", "b"]) == {"a": 0, "b": 0} and led.attempts_of([]) == {}
    assert led.start_attempt("a", "w1") == 1
    assert led.start_attempt("a", "w1") == 2
    assert led.attempts("a") == 2 and led.running_of(["a", "b"]) == {"a": True, "b": False}
    advance(HEARTBEAT_S - 1)
    assert led.running_of(["a"]) == {"a": True}
    advance(2)
    assert led.running_of(["a"]) == {"a": False}  # the worker is gone
    assert led.attempts_of(["a"]) == {"a": 2}  # its attempts are not
    led.take_back_attempt("a")
    assert led.attempts("a") == 1
    led.take_back_attempt("a")
    led.take_back_attempt("a")
    led.take_back_attempt("b")
    assert led.attempts_of(["a", "b"]) == {"a": 0, "b": 0}  # never below zero
    assert led.start_attempt("a", "w2") == 1
    led.reset_attempts("a")
    assert led.attempts("a") == 0


def test_a_running_mark_lasts_a_heartbeat_after_the_block_or_the_hold(ledger: Ledger) -> None:
    led, advance = ledger
    led.start_attempt("a", "w1")
    with led.heartbeat("a", "w1"):
        assert led.running_of(["a"]) == {"a": True}
    assert led.running_of(["a"]) == {"a": True}  # left to expire
    advance(HEARTBEAT_S + 1)
    assert led.running_of(["a"]) == {"a": False}
    led.hold("a", "w1")
    assert led.running_of(["a"]) == {"a": True}
    advance(HEARTBEAT_S + 1)
    assert led.running_of(["a"]) == {"a": False}
    assert led.running_of([]) == {}


def test_a_request_goes_through_once_until_it_expires_or_is_forgotten(ledger: Ledger) -> None:
    led, advance = ledger
    assert led.request_once("agg", within_s=30) and led.is_requested("agg")
    assert not led.request_once("agg", within_s=30)
    advance(20)
    led.renew_request("agg", within_s=30)
    advance(20)
    assert led.is_requested("agg")  # 30 s from the renewal
    advance(11)
    assert not led.is_requested("agg")
    assert led.request_once("agg", within_s=30)
    led.forget_request("agg")
    assert not led.is_requested("agg") and led.request_once("agg", within_s=30)
    led.renew_request("never", within_s=30)
    assert not led.is_requested("never")  # a renewal makes no request
    assert led.request_once("short", within_s=0.2)  # kept a second at least
    advance(0.5)
    assert not led.request_once("short", within_s=0.2)
    advance(0.6)
    assert led.request_once("short", within_s=0.2)


def test_raised_and_lost_attempts_are_counted_apart(ledger: Ledger) -> None:
    """max_attempts caps attempts whose code raised, max_lost_attempts those lost with their worker."""
    led, _ = ledger
    for _ in range(4):
        led.start_attempt("a", "w1")
    assert led.count_raised("a") == 1 and led.raised_of(["a", "b"]) == {"a": 1, "b": 0}
    assert not led.used_up("a", 3)  # one raised, two lost: neither cap reached
    assert led.used_up("a", 4)  # three lost: max_lost_attempts
    assert led.lost_reason("a", 4) == "worker lost during 3 of 4 attempts (crashed or killed); the others failed"
    led.count_raised("a")
    assert not led.used_up("a", 4) and led.count_raised("a") == 3 and led.used_up("a", 4)  # three raised
    led.reset_attempts("a")
    assert led.attempts("a") == 0 and led.raised_of(["a"]) == {"a": 0}


def test_requeue_timeout_and_enqueued_marks(ledger: Ledger) -> None:
    led, _ = ledger
    assert led.requeued_of(["a", "b"]) == {"a": None, "b": None} and led.requeued_of([]) == {}
    led.mark_requeued("a", 2)
    assert led.requeued_of(["a", "b"]) == {"a": 2, "b": None}
    assert led.lost_reason("a", 3) == "worker lost during each of 3 attempts (crashed or killed)"
    led.mark_timed_out("a")
    for _ in range(3):  # the watchdog counts each time-out as the task's own error
        led.count_raised("a")
    assert led.lost_reason("a", 3) == "time limit exceeded (3600 s) on each of 3 attempts"
    assert not led.was_enqueued("run:1")
    led.mark_enqueued("run:1")
    assert led.was_enqueued("run:1") and not led.was_enqueued("run:2")


def test_a_task_is_stranded_once_seen_so_a_heartbeat_apart(ledger: Ledger) -> None:
    led, advance = ledger
    assert not led.stranded_long_enough("a")  # the first sighting
    advance(HEARTBEAT_S - 1)
    assert not led.stranded_long_enough("a")  # a worker may have only just taken it
    advance(2)
    assert led.stranded_long_enough("a")
    assert not led.stranded_long_enough("a")  # reported once: this is a first sighting again
    advance(HEARTBEAT_S * 10 + 1)  # the sighting is forgotten: the next one is a first again
    assert not led.stranded_long_enough("a")


def test_notes_wake_ups_and_the_broker(ledger: Ledger) -> None:
    led, advance = ledger
    note, wake = head_key("p", "run"), stored_key("p", "job")
    assert led.note(note) is None
    led.put_note(note, "3:7")
    assert led.note(note) == "3:7"
    led.drop_note(note)
    assert led.note(note) is None
    led.wake(wake)
    led.wake(wake)
    assert led.wait_for_wake(wake, 1.0)
    began = time.monotonic()
    assert not led.wait_for_wake(wake, 0.1)  # both wake-ups were used up by the one wait
    assert time.monotonic() - began < 1.0
    assert led.broker_id() == led.broker_id() != ""
    assert led.queue_length("nothing-here") == 0


def test_the_twin_holds_the_keys_redis_holds(settings: Settings) -> None:
    twin = MemoryLedger(replace(settings, heartbeat_ttl_s=HEARTBEAT_S), ManualClock())
    with _redis_ledger(settings) as (real, _):
        for led in (real, twin):
            led.start_attempt("run:1:4", "w1")
            led.mark_requeued("run:1:4", 1)
            led.mark_timed_out("run:1:4")
            led.stranded_long_enough("run:1:5")
            led.mark_enqueued("run:1")
            led.request_once("run:agg:1", within_s=30)
            led.put_note(head_key(settings.key_prefix, "run"), "1:4")
        assert isinstance(real, RedisLedger)
        held = sorted(key.decode() for key in real.redis.scan_iter(match=f"{settings.key_prefix}:*"))
    assert held == twin.names()
    assert f"{settings.key_prefix}:attempts:run:1:4" in held


# --- Scheduling and repair on the twins.


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=True)
    yield opened
    opened.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def services(store: Store, clock: ManualClock) -> Services:
    return memory_services(MEMORY_SETTINGS, store, clock)


def _sent(services: Services) -> RecordingEnqueuer:
    assert isinstance(services.enqueue, RecordingEnqueuer)
    return services.enqueue


def _lost_worker(services: Services, clock: ManualClock, task_key: str) -> int:
    """A worker takes the waiting messages, starts the task and dies: its mark expires. Returns the attempt."""
    _sent(services).take()
    attempt = services.ledger.start_attempt(task_key, "w1")
    clock.advance(HEARTBEAT_S + 1)
    return attempt


def test_a_submitted_run_records_round_one_enqueues_its_packs_and_publishes_its_model(services: Services) -> None:
    config = small_config(devices_per_round=4, pack_size=2)
    run_id = submit_run(services, config)
    tasks = _sent(services).of_type(DeviceTask)
    selected = select_devices(config.seed, 1, config.num_devices, 4)
    assert [task.devices for task in tasks] == [tuple(selected[:2]), tuple(selected[2:])]
    assert {task.round_index for task in tasks} == {1} and all(task.round_size == 4 for task in tasks)
    (row,) = list_rounds(services.store, run_id)
    assert row.state == "training" and row.selected == selected
    assert services.blobs.exists(global_key(run_id, 0)) and tasks[0].model.key == global_key(run_id, 0)
    assert services.ledger.was_enqueued(round_key(run_id, 1))
    assert services.store.get_run(run_id).broker_id == services.ledger.broker_id()
    assert services.ledger.queue_length("devices") == 2
    assert fl_scheduler.reconcile(services, run_id) == []  # all is well: waiting on the queue


def test_fl_repair_enqueues_again_a_task_whose_worker_died(services: Services, clock: ManualClock) -> None:
    run_id = submit_run(services, small_config(devices_per_round=3))
    lost, *others = _sent(services).of_type(DeviceTask)
    _sent(services).waiting = list(others)  # the others still wait on the queue
    services.ledger.start_attempt(lost.attempt_key, "w1")
    assert fl_scheduler.reconcile(services, run_id) == []  # running
    clock.advance(HEARTBEAT_S + 1)
    assert fl_scheduler.reconcile(services, run_id) == [f"round 1: enqueued again 1 devices: {lost.devices[0]}"]
    assert [task.attempt_key for task in _sent(services).waiting] == [t.attempt_key for t in others + [lost]]
    assert services.ledger.requeued_of([lost.attempt_key]) == {lost.attempt_key: 1}
    assert fl_scheduler.reconcile(services, run_id) == []  # that delivery is awaited, not sent twice


def test_fl_repair_sends_a_message_stranded_with_a_dead_worker_after_a_heartbeat(
    services: Services, clock: ManualClock
) -> None:
    run_id = submit_run(services, small_config(devices_per_round=1))
    (task,) = _sent(services).take()  # taken by a worker that died before starting it
    assert fl_scheduler.reconcile(services, run_id) == []
    clock.advance(HEARTBEAT_S + 1)
    assert fl_scheduler.reconcile(services, run_id) == [f"round 1: enqueued again 1 devices: {task.devices[0]}"]


def test_fl_repair_fails_a_device_after_its_attempts_and_the_round_then_fails_the_run(
    services: Services, clock: ManualClock
) -> None:
    run_id = submit_run(services, small_config(devices_per_round=1))
    (task,) = _sent(services).of_type(DeviceTask)
    for attempt in (1, 2):
        assert _lost_worker(services, clock, task.attempt_key) == attempt
        assert fl_scheduler.reconcile(services, run_id) == [f"round 1: enqueued again 1 devices: {task.devices[0]}"]
    assert _lost_worker(services, clock, task.attempt_key) == 3
    assert fl_scheduler.reconcile(services, run_id) == [f"round 1: device {task.devices[0]} failed after 3 attempts"]
    (row,) = device_tasks(services.store, run_id, 1)
    assert row.state == "failed" and row.error == "worker lost during each of 3 attempts (crashed or killed)"
    (aggregation,) = _sent(services).take()  # the round is complete: its aggregation was asked for
    assert isinstance(aggregation, AggregateTask) and aggregation.round_index == 1
    assert aggregate_round(services, run_id, 1, "test#1") is not None
    run = services.store.get_run(run_id)
    assert run.state == "failed" and run.error == "round 1: every selected device failed"
    assert not services.blobs.exists(global_key(run_id, 0))  # the failed round's model left with it


def test_fl_repair_after_a_broker_restart_republishes_the_model_and_sends_the_round_again(
    services: Services,
) -> None:
    run_id = submit_run(services, small_config(devices_per_round=3))
    sent = _sent(services)
    first = [task.attempt_key for task in sent.take()]
    assert isinstance(services.ledger, MemoryLedger)
    services.ledger.restart()  # no persistence: queues, marks and blobs gone
    services.blobs.clear()  # type: ignore[attr-defined]
    actions = fl_scheduler.reconcile(services, run_id)
    assert actions[:2] == [
        "broker restarted (its run_id changed): checking the current round",
        "round 1: global model 0 republished",
    ]
    assert actions[2].startswith("round 1: enqueued again 3 devices")
    assert services.blobs.exists(global_key(run_id, 0))
    assert [task.attempt_key for task in sent.waiting] == first
    assert services.store.get_run(run_id).broker_id == services.ledger.broker_id()
    assert fl_scheduler.reconcile(services, run_id) == []


def test_a_fedbuff_result_asks_for_a_fold_pass_only_when_it_holds_the_head(services: Services) -> None:
    model = services.blobs.put(global_key("run", 0), b"weights")

    def result(device: int) -> DeviceTask:
        return DeviceTask(run_id="run", round_index=2, devices=(device,), model=model, enqueued_at=0.0, round_size=1)

    publish_head(services, "run", Trip(arrives=1.0, device=5, round_index=2, dispatched=0.0, pack=(5,)))
    on_result_stored(services, result(4), "w1", None)
    assert _sent(services).sent == []  # behind the head: it waits for the head's pass
    on_result_stored(services, result(5), "w1", None)
    on_result_stored(services, result(5), "w2", None)  # a duplicate delivery
    assert [type(message) for message in _sent(services).take()] == [FoldTask]
    services.ledger.forget_request(fold_key("run"))
    publish_head(services, "run", None)  # no head named: any result asks
    on_result_stored(services, result(4), "w1", None)
    assert [type(message) for message in _sent(services).take()] == [FoldTask]


def _llm_job(services: Services, tmp_path: Path) -> tuple[str, GenerateBatch]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\nsix\n")
    submitted = submit_job(services, JobRequest(input_path=prompts, model="no-such-model", batch_size=8, slots=1))
    (batch,) = _sent(services).of_type(GenerateBatch)
    return submitted.job_id, batch


def test_llm_repair_enqueues_a_lost_batch_again_then_fails_its_prompts(
    services: Services, clock: ManualClock, tmp_path: Path
) -> None:
    job_id, batch = _llm_job(services, tmp_path)
    assert services.ledger.queue_length("llm") == 1
    clock.advance(HEARTBEAT_S * 2)
    assert llm_repair.reconcile(services, job_id) == []  # waiting on the queue
    for attempt in (1, 2):
        assert _lost_worker(services, clock, batch.attempt_key) == attempt
        assert llm_repair.reconcile(services, job_id) == [f"enqueued again 1 batches: {batch.batch}"]
        assert llm_repair.reconcile(services, job_id) == []
    assert _lost_worker(services, clock, batch.attempt_key) == 3
    assert llm_repair.reconcile(services, job_id) == [f"batch {batch.batch} failed after 3 attempts"]
    rows = prompt_rows(services.store, job_id)
    assert [row.state for row in rows] == ["failed"] * 3
    assert {row.error for row in rows} == {"worker lost during each of 3 attempts (crashed or killed)"}
    assert services.store.get_run(job_id).state == "finished"  # every prompt has its outcome
    # Its follower is woken at once.
    assert services.ledger.wait_for_wake(stored_key(MEMORY_SETTINGS.key_prefix, job_id), 0.0)


def test_fl_repair_leaves_the_next_round_to_an_aggregator_still_at_work(services: Services, clock: ManualClock) -> None:
    """A round closed by an aggregator that has yet to record the next one (its model still being put) is not
    reported as never started; once that aggregator is gone, the repair pass starts it."""
    run_id = submit_run(services, small_config(devices_per_round=4))
    services.ledger.start_attempt(aggregate_key(run_id, 1), "w1")  # the aggregator, at work
    assert claim_round(services.store, run_id, 1, "w1#1", stale_before=0)
    checkpoint_version(services, run_id, 1, checkpoint_bytes(services, run_id, 0))
    assert complete_round(services.store, run_id, 1, "w1#1")
    assert fl_scheduler.reconcile(services, run_id) == []
    assert len(list_rounds(services.store, run_id)) == 1
    clock.advance(HEARTBEAT_S + 1)  # it died before starting round 2: its mark expired
    assert fl_scheduler.reconcile(services, run_id) == ["round 2 was never started: started"]
    assert [row.round_index for row in list_rounds(services.store, run_id)] == [1, 2]
