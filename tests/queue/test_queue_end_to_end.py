"""Rounds through real Redis and real `celery worker` processes, checked against the store."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.fl.scheduler import submit_run
from fedqueue.fl.store.results import count_done, device_tasks, list_rounds
from fedqueue.fl.strategy.common import final_state
from fedqueue.queue.client import open_client_services
from fedqueue.report.summary import run_summary
from tests.conftest import running_workers
from tests.support.helpers import (
    assert_same_weights,
    blob_keys_left,
    held_out_accuracy,
    reference_final_state,
    run_to_end,
    small_config,
    wait_finished,
)

WORKERS = 2  # processes of one slot each


@pytest.fixture(params=["sqlite", "postgres"])
def backend_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "postgres":
        return replace(settings, database_url=request.getfixturevalue("postgres_url"))
    return settings


def test_two_rounds_stored_aggregated_and_evaluated(backend_settings: Settings, tmp_path: Path) -> None:
    config = small_config()
    with running_workers(backend_settings, procs=WORKERS, log_dir=tmp_path / "logs"):
        run_id, services = run_to_end(backend_settings, config)
    store = services.store
    run = store.get_run(run_id)
    assert run.state == "finished"
    rounds = list_rounds(store, run_id)
    assert [row.round_index for row in rounds] == [1, 2]
    assert all(row.state == "done" and row.accuracy is not None for row in rounds)
    tasks = device_tasks(store, run_id)
    assert len(tasks) == 2 * config.devices_per_round
    for row in rounds:
        stored = sorted(task.device for task in tasks if task.round_index == row.round_index)
        assert stored == row.selected
    for task in tasks:
        assert task.state == "done" and task.attempt == 1
        assert task.worker.startswith("cpu") and "@" in task.worker
        assert task.samples > 0 and task.loss is not None
    # Every device task and every round's aggregation has its row in the shared timing table.
    timings = store.task_timings(run_id)
    assert sorted((t.task_type, t.round_index) for t in timings) == sorted(
        [("aggregate", row.round_index) for row in rounds] + [("train", t.round_index) for t in tasks]
    )
    for timing in timings:
        assert (timing.kind, timing.state, timing.device_used) == ("fl", "done", "cpu")
        assert timing.enqueued_at <= timing.started_at <= timing.finished_at
        assert timing.compute_ms > 0
    aggregations = {t.round_index: t for t in timings if t.task_type == "aggregate"}
    for row in rounds:
        trained = [t for t in timings if t.task_type == "train" and t.round_index == row.round_index]
        # The aggregation was asked for once the round was complete or in its tail (no device task left
        # queued: the other worker's is the only one still training), never earlier; it closed the round.
        finished = sorted(t.finished_at for t in trained)
        assert aggregations[row.round_index].enqueued_at >= finished[-WORKERS]
        assert row.aggregated_at is not None and aggregations[row.round_index].finished_at >= row.aggregated_at
    # What the workers aggregated equals the same experiment computed here with no queue.
    expected = reference_final_state(config)
    assert_same_weights(final_state(services.store, run_id), expected)
    # The stored accuracy is that of the aggregated model on the held-out split, and above chance.
    accuracy = rounds[-1].accuracy
    assert accuracy is not None and accuracy > 0.2
    assert accuracy == pytest.approx(held_out_accuracy(config, expected), abs=1e-9)
    summary = run_summary(store, run_id)
    assert summary["rounds_done"] == 2 and summary["tasks_done"] == 16
    # Aggregated updates are deleted; only the final global model stays (until its TTL).
    assert blob_keys_left(services) == [f"{run_id}/global/2"]
    assert len(summary["workers"]) == 2
    services.close()


@pytest.mark.slow
def test_same_seed_same_weights_with_one_or_two_workers(settings: Settings, tmp_path: Path) -> None:
    config = small_config(model="cnn", rounds=2, devices_per_round=6)
    states = []
    for procs in (1, 2):
        with running_workers(settings, procs=procs, log_dir=tmp_path / f"logs{procs}"):
            run_id, services = run_to_end(settings, config)
        assert len(run_summary(services.store, run_id)["workers"]) == procs
        states.append(final_state(services.store, run_id))
        services.close()
    assert_same_weights(states[0], states[1])


def test_round_overlaps_on_two_workers(settings: Settings, tmp_path: Path) -> None:
    config = small_config(model="cnn", rounds=1, devices_per_round=10, local_iters=20)
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        run_id, services = run_to_end(settings, config)
    summary = run_summary(services.store, run_id)
    assert summary["tasks_done"] == 10
    assert summary["max_concurrency"] >= 2
    services.close()


@pytest.mark.faults
def test_task_delivered_twice_is_stored_and_aggregated_once(settings: Settings, tmp_path: Path) -> None:
    config = small_config(rounds=2)
    services = open_client_services(settings)
    publish = services.enqueue
    services.enqueue = lambda tasks: publish(list(tasks) + list(tasks))  # every message sent twice
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        run_id = submit_run(services, config)
        wait_finished(services.store, run_id)
        tasks = device_tasks(services.store, run_id)
        # Both deliveries of every round-1 task reach a worker: the attempt counter sees two.
        # (Later rounds are enqueued by the workers, which send each task once.)
        deadline = time.monotonic() + 30
        while True:
            attempts = {services.ledger.attempts(f"{run_id}:1:{t.device}") for t in tasks if t.round_index == 1}
            if attempts == {2} or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert len(tasks) == 2 * config.devices_per_round
    assert attempts == {2}
    assert_same_weights(final_state(services.store, run_id), reference_final_state(config))
    services.close()


def test_an_aggregation_jumps_a_long_queue_of_device_tasks(settings: Settings, tmp_path: Path) -> None:
    """Aggregations travel on the control queue, read first: one waits for a free slot, not for the queue."""
    from tests.support.reliability_support import reliable_settings, slow_config

    settings = reliable_settings(settings)
    short = small_config(rounds=1, num_devices=4, devices_per_round=2, local_iters=2)
    # 150 device tasks of about 0.1 s each: some 15 s of queue behind the short run's two devices.
    long = slow_config(0.05, rounds=1, num_devices=150, devices_per_round=150, local_iters=2)
    services = open_client_services(settings)
    with running_workers(settings, procs=1, log_dir=tmp_path / "logs"):
        short_id = submit_run(services, short)
        long_id = submit_run(services, long)
        wait_finished(services.store, short_id, 120)
        stored_when_short_ended = count_done(services.store, long_id, 1)
    aggregation = next(t for t in services.store.task_timings(short_id) if t.task_type == "aggregate")
    assert aggregation.state == "done"
    # At most the task in hand and one reserved ahead (prefetch 1) run before it: well under a second.
    assert aggregation.started_at - aggregation.enqueued_at < 1.0
    assert stored_when_short_ended < 100  # the long queue was still there when the aggregation ran
    services.close()


def test_a_submit_learns_the_slots_of_every_worker_that_answers(settings: Settings, tmp_path: Path) -> None:
    """Packs are sized for the workers' slots: each worker's pool size, from a broadcast; nothing (so the
    submit assumes this machine's cores) when none answers."""
    from fedqueue.queue.app import make_app
    from fedqueue.queue.client import worker_slots_of

    app = make_app(settings)
    try:
        assert worker_slots_of(app)() == {}
        with running_workers(settings, procs=WORKERS, slots=2, log_dir=tmp_path / "logs") as group:
            slots = worker_slots_of(app)()
            assert slots == group.slots() and set(slots.values()) == {2}, slots
    finally:
        app.close()


def test_a_run_bounded_by_simulated_time_stops_with_the_references_weights(settings: Settings, tmp_path: Path) -> None:
    """max_sim_time: two workers make the rounds that end before the limit, and the weights of those rounds."""
    from fedqueue.fl.setup import run_clock
    from fedqueue.fl.store.stop_rows import get_stop
    from fedqueue.fl.strategy.sync.rounds import select_devices

    config = small_config(
        rounds=5, device_speed={"mean": [0.01, 0.05], "std": [0.002, 0.01]}, communication_delay={"mean": 0.2}
    )
    clock = run_clock(config)
    ends, at = [], 0.0
    for round_index in (1, 2, 3):
        devices = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
        at += max(clock.trip_seconds(round_index, device) for device in devices)
        ends.append(at)
    bounded = replace(config, max_sim_time=(ends[1] + ends[2]) / 2)  # rounds 1 and 2 end before it
    with running_workers(settings, procs=WORKERS, log_dir=tmp_path / "logs"):
        run_id, services = run_to_end(settings, bounded)
    try:
        assert services.store.get_run(run_id).state == "finished"
        assert [row.round_index for row in list_rounds(services.store, run_id)] == [1, 2]
        stop = get_stop(services.store, run_id)
        assert stop is not None and stop.rule == "max_sim_time" and stop.version == 2
        assert_same_weights(final_state(services.store, run_id), reference_final_state(replace(config, rounds=2)))
    finally:
        services.close()
