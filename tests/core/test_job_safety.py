"""Runs that end, whatever goes wrong, with nobody following them: only `fedqueue worker` launchers run.

A raising aggregation rule fails the run with its traceback; a hanging local step is
stopped at the time limit and stored as failed; a killed worker's task is sent again
by the launcher that adopted the run.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.store.results import device_tasks, get_round, list_rounds
from fedqueue.fl.strategy.sync.rounds import select_devices
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.reliability_support import (
    SLOW_STEP,
    launcher,
    one_result_per_device,
    pid_of_worker,
    reliable_settings,
    slow_config,
    wait_for_running,
    wait_until,
)


def _ended(handle: api.RunHandle) -> bool:
    return handle.store.get_run(handle.id).state != "running"


def test_a_raising_aggregation_fails_a_plain_submit_with_its_traceback(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings, max_attempts=2)
    config = small_config(aggregate="fq_reliability:raising_rule", rounds=2)
    with launcher(settings, procs=2, cwd=tmp_path):
        handle = api.submit(config, settings=settings)  # returns at once: nobody follows the run
        wait_until(lambda: _ended(handle), 90)
    run = handle.store.get_run(handle.id)
    assert run.state == "failed"
    assert run.error is not None and "round 1: aggregation failed after 2 attempts" in run.error
    assert "RuntimeError: this rule fails on purpose" in run.error
    assert len(list_rounds(handle.store, handle.id)) == 1  # round 2 never started
    shown = fedqueue_cli("status", handle.id, cwd=tmp_path, env=cli_env(settings), timeout=60)
    assert "aggregation failed after 2 attempts" in shown.stdout
    assert "this rule fails on purpose" in shown.stdout


@pytest.mark.faults
def test_a_hanging_step_is_stopped_at_the_time_limit(settings: Settings, tmp_path: Path) -> None:
    """The hung device is tried twice, each stopped at 4 s, then stored failed; its round closes without it."""
    limit_s = 4
    settings = reliable_settings(settings, task_time_limit_s=limit_s, max_attempts=2)
    seed, num_devices, per_round = 7, 30, 6
    poisoned = select_devices(seed, 1, num_devices, per_round)[0]
    config = small_config(
        local_step=SLOW_STEP,
        dataset="fq_reliability:poisoned_digits",
        rounds=1,
        devices_per_round=per_round,
        seed=seed,
        num_devices=num_devices,
        plugin={"poison_device": poisoned, "poison_mode": "hang"},
    )
    with launcher(settings, procs=2, cwd=tmp_path):
        began = time.time()
        handle = api.submit(config, settings=settings)
        wait_until(lambda: _ended(handle), 120)
    run = handle.store.get_run(handle.id)
    assert run.state == "finished", run.error
    hung = next(task for task in device_tasks(handle.store, handle.id, 1) if task.device == poisoned)
    assert hung.state == "failed" and hung.attempt == 2
    assert hung.error is not None and f"time limit exceeded ({limit_s} s)" in hung.error
    others = [task for task in device_tasks(handle.store, handle.id, 1) if task.device != poisoned]
    assert len(others) == per_round - 1 and all(task.state == "done" for task in others)
    # Two attempts of 4 s each, a heartbeat (3 s) for the lost one to be noticed, a worker restart:
    # well under the two hours a hung task used to hold its round.
    round_row = get_round(handle.store, handle.id, 1)
    assert round_row is not None and round_row.aggregated_at is not None
    assert round_row.aggregated_at - began < 2 * limit_s + 45


@pytest.mark.faults
def test_a_killed_worker_is_repaired_by_the_launcher_with_no_follower(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings)
    config = slow_config(0.3, rounds=2, devices_per_round=6, local_iters=5)
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        selected = select_devices(config.seed, 1, config.num_devices, config.devices_per_round)
        device, hostname = wait_for_running(handle, 1, selected)
        victim = pid_of_worker(workers, hostname)
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        wait_until(lambda: _ended(handle), 120)
        adopted_by = handle.store.get_run(handle.id).lease_owner
    assert handle.store.get_run(handle.id).state == "finished"
    assert adopted_by is None or adopted_by.startswith("worker launcher")
    one_result_per_device(handle)
    killed = next(task for task in device_tasks(handle.store, handle.id, 1) if task.device == device)
    assert killed.attempt == 2
    assert_same_weights(handle.final_weights(), reference_final_state(config))
