"""Workers killed while they aggregate are lost work, not a failing aggregation: the run goes on to the same weights.

Each test SIGKILLs the worker process that holds a fresh claim (a round's aggregation, a FedBuff fold pass),
again and again, as pre-emption or the OOM killer would, under a real `fedqueue worker` launcher that starts
killed workers again. Past `max_lost_attempts` lost attempts a run fails, and `fedqueue resume RUN --retry`
finishes it from its last stored state.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig
from fedqueue.fl.store.results import list_rounds
from fedqueue.fl.store.schedule_rows import SCHEDULES
from tests.fl.strategy.fedbuff.test_buffered_async import buffered_config, reference
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import launcher, pid_of_worker, reliable_settings, slow_config, wait_until

# Kills workers again and again, each time waiting out a claim: `make test-faults`.
pytestmark = pytest.mark.faults

KILLS = 3


def _round_claim(handle: api.RunHandle) -> str | None:
    for row in list_rounds(handle.store, handle.id):
        if row.state == "aggregating" and row.claim_owner:
            return row.claim_owner
    return None


def _fold_claim(handle: api.RunHandle) -> str | None:
    with handle.store.engine.connect() as connection:
        owner = connection.execute(
            SCHEDULES.select().with_only_columns(SCHEDULES.c.claim_owner).where(SCHEDULES.c.run_id == handle.id)
        ).scalar()
    return str(owner) if owner else None


def _kill_claim_holders(
    handle: api.RunHandle,
    workers: subprocess.Popen[str],
    claim_of: Callable[[api.RunHandle], str | None],
    kills: int,
    tick: Callable[[], object] | None = None,
) -> list[str]:
    """SIGKILL the worker holding each new claim, `kills` times; the claims killed, in order."""
    killed: list[str] = []
    for _ in range(kills):
        wait_until(lambda: (claim_of(handle) or "") not in ("", *killed), 120, tick)
        owner = claim_of(handle) or ""
        os.kill(pid_of_worker(workers, owner.split("#")[0]), signal.SIGKILL)
        killed.append(owner)
    return killed


def _sync_config() -> RunConfig:
    """Rounds whose aggregation pauses 3 s: long enough to kill the worker that holds the round."""
    config = slow_config(0.0, rounds=2, devices_per_round=4, local_iters=3, aggregate="fq_reliability:slow_rule")
    return replace(config, plugin={**config.plugin, "aggregate_sleep": 3.0})


def test_a_round_s_aggregator_killed_three_times_still_ends_with_the_reference_weights(
    settings: Settings, tmp_path: Path
) -> None:
    settings = reliable_settings(settings)
    config = _sync_config()
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            killed = _kill_claim_holders(handle, workers, _round_claim, KILLS, scheduler.tick)
            status = handle.wait(300, tick=scheduler.tick)
    assert len(set(killed)) == KILLS
    assert status["state"] == "finished", status
    assert status["failures"] == []
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_a_run_failed_on_lost_aggregators_is_finished_by_resume_retry(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings, max_lost_attempts=2)
    config = _sync_config()
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            _kill_claim_holders(handle, workers, _round_claim, 2, scheduler.tick)
            wait_until(lambda: handle.state != "running", 120, scheduler.tick)
        run = handle.store.get_run(handle.id)
        assert run.state == "failed" and "worker lost during each of 2 attempts" in (run.error or ""), run.error
        refused = fedqueue_cli("resume", handle.id, cwd=tmp_path, env=cli_env(settings), timeout=120)
        assert refused.returncode == 1 and f"fedqueue resume {handle.id} --retry" in refused.stdout
        retried = fedqueue_cli("resume", handle.id, "--retry", cwd=tmp_path, env=cli_env(settings), timeout=300)
    assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
    assert "trying again from its last stored state" in retried.stdout
    assert "Traceback" not in retried.stdout + retried.stderr
    assert handle.state == "finished"
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_a_fold_pass_killed_three_times_still_makes_the_reference_versions(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings)
    config = buffered_config(
        model="fq_reliability:slow_eval_mlp", plugin={"eval_sleep": 1.0}, eval_every=1, max_model_version=6
    )
    with launcher(settings, procs=2, cwd=tmp_path) as workers:
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            killed = _kill_claim_holders(handle, workers, _fold_claim, KILLS, scheduler.tick)
            status = handle.wait(300, tick=scheduler.tick)
    assert len(set(killed)) == KILLS
    assert status["state"] == "finished", status
    _, expected = reference(config)
    final: dict[str, torch.Tensor] = handle.final_weights()
    assert_same_weights(final, expected)
