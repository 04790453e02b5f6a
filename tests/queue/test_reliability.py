"""Nothing lost, nothing counted twice: killed workers, redelivery, poison, Redis restarts, lost schedulers.

Every scenario uses real Redis, real `fedqueue worker` / `celery worker` processes and a
real store, provokes the failure for real (signals, restarts), and checks the stored rows
and the final weights against the same experiment computed with no queue at all.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.store.results import count_done, device_tasks, get_round, has_result
from fedqueue.fl.strategy.sync.rounds import select_devices
from fedqueue.queue.embedded import EmbeddedRedis
from tests.conftest import running_workers
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    kill_tree,
    launcher,
    one_result_per_device,
    pid_of_worker,
    reliable_settings,
    slow_config,
    update_blob_keys,
    wait_for_running,
    wait_settled,
    wait_until,
    worker_children,
)


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_worker_process_killed_mid_task(settings: Settings, tmp_path: Path) -> None:
    """SIGKILL one `celery worker` under a launcher: it is restarted and its task redone once."""
    settings = reliable_settings(settings)
    config = slow_config(0.2, rounds=2, devices_per_round=6, local_iters=5)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
        with api.scheduling(handle) as scheduler:
            device, hostname = wait_for_running(handle, 1, selected, scheduler.tick)
            victim = pid_of_worker(workers, hostname)
            signal_kill(victim)
            status = handle.wait(120, tick=scheduler.tick)
        assert victim not in [child.pid for child in worker_children(workers)]
        assert len(worker_children(workers)) == 2  # the launcher started it again
    assert status["state"] == "finished"
    one_result_per_device(handle)
    killed = next(t for t in device_tasks(handle.store, handle.id, 1) if t.device == device)
    assert killed.attempt == 2
    assert_same_weights(handle.final_weights(), reference_final_state(config))


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_whole_worker_host_killed_mid_round(settings: Settings, tmp_path: Path) -> None:
    """SIGKILL a launcher and all its workers at once; a fresh one finishes the run."""
    settings = reliable_settings(settings)
    config = slow_config(0.2, rounds=2, devices_per_round=6, local_iters=5)
    first = launcher(settings, procs=2, cwd=tmp_path)
    workers = first.__enter__()
    handle = api.submit(config, settings=settings)
    with api.scheduling(handle) as scheduler:
        wait_until(lambda: count_done(handle.store, handle.id, 1) >= 1, 60, scheduler.tick)
        kill_tree(workers.pid)
        workers.wait()
        first.__exit__(None, None, None)
        with launcher(settings, procs=2, cwd=tmp_path):
            status = handle.wait(120, tick=scheduler.tick)
    assert status["state"] == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


@pytest.mark.faults
def test_duplicate_delivery_runs_twice_but_counts_once(settings: Settings, tmp_path: Path) -> None:
    """A visibility timeout shorter than the task: Redis hands the task to an idle worker too.

    The duplicate trains to the end beside the first delivery, then finds a result stored: its
    update is dropped (row, round count and blob store untouched) and the run ends with the weights
    of a run that saw each task once.
    """
    settings = reliable_settings(settings, visibility_timeout_override_s=1)
    config = slow_config(1.0, rounds=1, devices_per_round=2, local_iters=4)
    selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
    first_seen: dict[int, tuple[object, ...]] = {}
    overlapped: set[int] = set()
    with running_workers(settings, procs=3, log_dir=tmp_path / "logs"):
        handle = api.submit(config, settings=settings)
        task_keys = [f"{handle.id}:1:{device}" for device in selected]

        def observe() -> bool:
            for device in selected:
                # The count read before the result: a second delivery counted while no result was
                # stored started from the still-published model, so it trains to the end.
                if api_attempts(handle, device) >= 2 and not has_result(handle.store, handle.id, 1, device):
                    overlapped.add(device)
            # Each device's row as it was when it first appeared: whichever delivery stored first.
            for task in device_tasks(handle.store, handle.id, 1):
                first_seen.setdefault(task.device, stored_result(task))
            return bool(overlapped) and len(first_seen) == len(selected)

        wait_until(observe, 60)
        status = handle.wait(120)
        # The run can end while duplicates still train: wait until no delivery of any task is left anywhere.
        wait_settled(settings, task_keys, workers=3)
        attempts = {device: api_attempts(handle, device) for device in selected}
        leftover_updates = update_blob_keys(settings, handle.id)
    assert status["state"] == "finished"
    assert all(attempts[device] >= 2 for device in overlapped)  # the duplicate really ran
    one_result_per_device(handle)
    stored = {task.device: task for task in device_tasks(handle.store, handle.id, 1)}
    # The rows are the first stored deliveries', unchanged by every later delivery.
    assert {device: stored_result(task) for device, task in stored.items()} == first_seen
    assert all(task.state == "done" for task in stored.values())
    # Counted once each: the round's stored count did not grow with the duplicates.
    round_row = get_round(handle.store, handle.id, 1)
    assert round_row is not None and round_row.stored == config.devices_per_round
    # A dropped duplicate deletes the update it uploaded; the aggregation deleted the stored ones.
    assert leftover_updates == []
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def stored_result(task: Any) -> tuple[object, ...]:
    """What identifies the delivery that stored a device's result."""
    return (task.attempt, task.worker, task.update_key, task.update_sha256, task.samples, task.loss)


@pytest.mark.faults
@pytest.mark.parametrize("policy", ["skip", "abort"])
def test_poisoned_device_fails_after_the_attempt_cap(settings: Settings, tmp_path: Path, policy: str) -> None:
    """A device that kills its worker every time: tried max_lost_attempts times, stored as failed, policy applied."""
    # The cap of 2 lost attempts holds for every task, the rounds' aggregations too. A 3 s heartbeat or claim
    # can lapse on a loaded machine while its task still runs: seen lost twice, an aggregation fails the run.
    # 10 s outlasts such stalls; the poisoned device's worker is still lost on each attempt, only seen later.
    settings = reliable_settings(settings, max_lost_attempts=2, heartbeat_ttl_s=10, lease_ttl_s=10)
    base = slow_config(0.0, rounds=2, devices_per_round=5, local_iters=3)
    poisoned = select_devices(base.seed, 1, base.num_devices, base.devices_per_round)[2]
    config = base.with_keys(
        dataset="fq_reliability:poisoned_digits",
        on_failure=policy,
        min_devices_per_round=3,
        plugin={"step_sleep": 0.0, "poison_device": poisoned},
    )
    with launcher(settings, procs=2, cwd=tmp_path):
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            status = handle.wait(180, tick=scheduler.tick)
    assert [(f["round"], f["device"], f["attempts"]) for f in status["failures"]] == [(1, poisoned, 2)]
    assert "worker lost" in status["failures"][0]["error"]
    if policy == "skip":
        assert status["state"] == "finished" and status["rounds_done"] == 2
        assert status["tasks_done"] == 2 * config.devices_per_round - 1
    else:
        assert status["state"] == "failed"
        assert f"device {poisoned} failed" in status["error"] and "abort" in status["error"]


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_redis_restart_loses_the_queue_and_the_run_still_completes(settings: Settings, tmp_path: Path) -> None:
    """Redis restarted mid-round without persistence: queue, blobs and counters are gone."""
    first = EmbeddedRedis().start()
    settings = reliable_settings(replace(settings, broker_url=first.url))
    config = slow_config(0.2, rounds=3, devices_per_round=4, local_iters=4)
    second = None
    try:
        with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
            handle = api.submit(config, settings=settings)
            with api.scheduling(handle) as scheduler:
                wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1, 90, scheduler.tick)
                first.stop()
                second = EmbeddedRedis(port=first.port).start()
                status = handle.wait(180, tick=scheduler.tick)
    finally:
        for server in (first, second):
            if server is not None:
                server.stop()
    assert status["state"] == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_graceful_stop_finishes_the_running_task(settings: Settings, tmp_path: Path) -> None:
    """SIGTERM to `fedqueue worker` during a task: the task completes and is stored, then it exits."""
    settings = reliable_settings(settings)
    config = slow_config(0.6, rounds=1, devices_per_round=3, local_iters=4)
    selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
    with launcher(settings, procs=1, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        found = wait_for_running(handle, 1, selected)
        workers.send_signal(signal.SIGTERM)
        assert workers.wait(timeout=60) == 0
        stored = device_tasks(handle.store, handle.id, 1)
    assert [(task.device, task.attempt) for task in stored] == [(found[0], 1)]


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_second_signal_stops_at_once_and_the_task_is_redelivered(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings)
    config = slow_config(0.6, rounds=1, devices_per_round=2, local_iters=4)
    selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
    with launcher(settings, procs=1, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        found = wait_for_running(handle, 1, selected)
        workers.send_signal(signal.SIGTERM)
        # The second signal only counts as one once the launcher has taken the first.
        wait_until(lambda: any("stopping:" in log.read_text() for log in tmp_path.glob("launcher-*.log")), 30)
        workers.send_signal(signal.SIGTERM)
        started = time.monotonic()
        workers.wait(timeout=30)
        assert time.monotonic() - started < 5  # did not wait for the task
    assert count_done(handle.store, handle.id, 1) == 0
    with launcher(settings, procs=1, cwd=tmp_path), api.scheduling(handle) as scheduler:
        status = handle.wait(120, tick=scheduler.tick)
    assert status["state"] == "finished"
    interrupted = next(t for t in device_tasks(handle.store, handle.id, 1) if t.device == found[0])
    assert interrupted.attempt == 2
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def signal_kill(pid: int) -> None:
    import os

    os.kill(pid, signal.SIGKILL)


def api_attempts(handle: api.RunHandle, device: int) -> int:
    from fedqueue.core.services import connect_redis

    client = connect_redis(handle.settings.broker_url or "")
    try:
        return int(client.get(f"{handle.settings.key_prefix}:attempts:{handle.id}:1:{device}") or 0)
    finally:
        client.close()
