"""Schedulers that die: `fedqueue resume` takes over; a second live scheduler is refused; the store drops out."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.errors import ServiceUnavailable
from fedqueue.fl import api
from fedqueue.fl.config import config_toml
from fedqueue.fl.ml.weights import decode_state
from fedqueue.fl.store.results import count_done, list_rounds, load_checkpoint
from fedqueue.store import Store
from tests.conftest import running_workers
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli, start_fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.own_processes import ProcessMark
from tests.support.reliability_support import (
    PLUGINS,
    one_result_per_device,
    reliable_settings,
    slow_config,
    stop_process,
    wait_until,
)


def embedded_env(tmp_path: Path) -> dict[str, str]:
    # A killed command leaves its blob files behind: cli_env keeps them in the test's own folder.
    return cli_env(
        FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'fedqueue.db'}",
        FEDQUEUE_LEASE_TTL_S="3",
        FEDQUEUE_HEARTBEAT_TTL_S="3",
        FEDQUEUE_PLUGIN_PATH=str(PLUGINS),
    )


def submitted_store(database: str) -> Store | None:
    """The store once the scheduler under test has created it and recorded its run (never migrated here)."""
    try:
        store = open_store(database)
    except ServiceUnavailable:
        return None
    if store.list_runs():
        return store
    store.close()
    return None


def killed_then_resumed(
    tmp_path: Path, kill_when: Callable[[Store, str], bool], wait_s: float = 90
) -> tuple[Store, str, subprocess.CompletedProcess[str]]:
    """`fedqueue run run.toml` in tmp_path, SIGKILLed once `kill_when(store, run_id)` holds (its embedded
    Redis and workers go down with it), then `fedqueue resume` once its lease has run out."""
    env = embedded_env(tmp_path)
    mark = ProcessMark(tmp_path)
    scheduler = start_fedqueue_cli(
        "run",
        "run.toml",
        "--procs",
        "2",
        cwd=tmp_path,
        env=mark.env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    database = env["FEDQUEUE_DATABASE_URL"]
    wait_until(lambda: submitted_store(database) is not None, 60)
    store = submitted_store(database)
    assert store is not None
    run_id = store.list_runs()[0].id
    wait_until(lambda: kill_when(store, run_id), wait_s)
    scheduler.send_signal(signal.SIGKILL)
    scheduler.wait()
    # Its embedded Redis and workers stop with it: nothing is left running.
    wait_until(lambda: mark.alive() == set(), 60)
    assert store.get_run(run_id).state == "running"

    lease_expires_at = store.get_run(run_id).lease_expires_at or 0.0
    wait_until(lambda: time.time() > lease_expires_at, 30)  # the dead scheduler's lease runs out
    resumed = fedqueue_cli("resume", run_id, "--procs", "2", cwd=tmp_path, env=env, timeout=240)
    return store, run_id, resumed


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
@pytest.mark.parametrize("moment", ["between_rounds", "during_round"])
def test_killed_scheduler_is_resumed_to_the_same_weights(tmp_path: Path, moment: str) -> None:
    """SIGKILL `fedqueue run` (embedded Redis and workers go down with it); `fedqueue resume` finishes."""
    config = slow_config(0.15, rounds=3, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    if moment == "between_rounds":
        store, run_id, resumed = killed_then_resumed(
            tmp_path, lambda store, run_id: any(r.state == "done" for r in list_rounds(store, run_id)), 60
        )
    else:
        store, run_id, resumed = killed_then_resumed(
            tmp_path, lambda store, run_id: count_done(store, run_id, 2) >= 1, 60
        )
    database = embedded_env(tmp_path)["FEDQUEUE_DATABASE_URL"]
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "repair:" in resumed.stdout  # it found the lost queue and put the work back
    handle = api.RunHandle(run_id, Settings(database_url=database))
    assert handle.status()["state"] == "finished"
    one_result_per_device(handle)
    checkpoint = load_checkpoint(store, run_id)
    assert checkpoint is not None and checkpoint.version == config.rounds
    assert_same_weights(decode_state(checkpoint.data), reference_final_state(config))


def test_second_scheduler_on_a_live_run_is_refused(settings: Settings, tmp_path: Path) -> None:
    settings = reliable_settings(settings)
    config = small_config(rounds=2, devices_per_round=4, local_iters=4)
    # No worker until the second scheduler has tried: the run cannot finish first, however slowly it starts.
    handle = api.submit(config, settings=settings)
    with api.scheduling(handle) as scheduler:
        scheduler.tick()
        env = cli_env(settings)
        with (tmp_path / "resume.out").open("w+") as out, (tmp_path / "resume.err").open("w+") as err:
            second = start_fedqueue_cli("resume", handle.id, cwd=tmp_path, env=env, stdout=out, stderr=err)
            try:
                # The first scheduler stays live meanwhile: it renews its lease, as one following a run does.
                wait_until(lambda: second.poll() is not None, 120, tick=scheduler.tick)
            finally:
                stop_process(second)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        assert second.returncode == 2, stdout + stderr
        assert stderr.startswith(f"error: run {handle.id} is already scheduled by ")
        with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
            status = handle.wait(120, tick=scheduler.tick)
    assert status["state"] == "finished"


@pytest.mark.faults  # kills or stops what the test started: `make test-faults`
def test_postgres_connections_dropped_mid_run(settings: Settings, postgres_url: str, tmp_path: Path) -> None:
    """Every connection to the store is terminated mid-round; workers reconnect and every row lands."""
    settings = reliable_settings(replace(settings, database_url=postgres_url))
    config = slow_config(0.2, rounds=2, devices_per_round=6, local_iters=4)
    admin = create_engine(postgres_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    database = postgres_url.rsplit("/", 1)[1]
    with running_workers(settings, procs=2, log_dir=tmp_path / "logs"):
        handle = api.submit(config, settings=settings)
        with api.scheduling(handle) as scheduler:
            wait_until(lambda: count_done(handle.store, handle.id, 1) >= 1, 60, scheduler.tick)
            with admin.connect() as connection:
                dropped = connection.execute(
                    text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": database},
                ).scalar()
            assert dropped and dropped >= 2  # the workers' connections, not just ours
            status = handle.wait(120, tick=scheduler.tick)
    admin.dispose()
    assert status["state"] == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))
