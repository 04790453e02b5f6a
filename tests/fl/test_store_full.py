"""The store's disk fills under `fedqueue run`: it waits, says so in two lines, and ends as an unfaulted run does.

SQLite on a small tmpfs of the test's own, filled by a file mid-run and freed again; a Redis of the test's
own, a real `fedqueue worker` launcher and `fedqueue run` as a process of its own, as a user runs them.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.fl import api
from fedqueue.fl.config import config_toml
from fedqueue.fl.store.results import count_done
from fedqueue.queue.embedded import EmbeddedRedis
from tests.support.cli_inputs import cli_env
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    launcher,
    one_result_per_device,
    printed_run_id,
    reliable_settings,
    slow_config,
    start_follower,
    stop_process,
    wait_until,
    worker_children,
)

# Fills a disk of its own under real workers: `make test-faults`.
pytestmark = pytest.mark.faults

# What a follower prints when the store's disk is full, and when the store takes writes again.
STORE_FULL = "store: disk full; waiting"
STORE_BACK = "store back after "
# How long the disk stays full once the follower said so: longer than a store call's own retries (7.4 s), and than
# a task's three attempts of them, so a worker that counted store errors as failures would lose a device.
FULL_FOR_S = 30


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder` for the block; the test is skipped where mounting is not allowed."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a small disk needs `mount -t tmpfs` (root): {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def fill(disk: Path) -> Path:
    """A file that takes every free byte of the disk."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:  # unbuffered: nothing left over to fail again at close
        chunk = b"\0" * 65536
        while True:
            try:
                out.write(chunk)
            except OSError:  # ENOSPC: the disk is full (what fit of the last chunk stays written)
                break
    return filler


def store_in_small_pages(database: Path) -> None:
    """The store made in SQLite's default 4 KiB pages, as stores made before 64 KiB pages were: such a file grows
    with every round of a run this small, so the rounds after the disk fills must meet it. A new store's 64 KiB
    pages would hold the rest of this run in the pages its tables were made with, never asking the disk."""
    with contextlib.closing(sqlite3.connect(database)) as made:
        made.execute("PRAGMA page_size=4096")
        made.execute("PRAGMA journal_mode=WAL")
    open_store(f"sqlite:///{database}", migrate=True).engine.dispose()


def integrity(database: Path) -> str:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return str(connection.execute("PRAGMA integrity_check").fetchone()[0])


def test_run_waits_for_a_full_disk_and_ends_with_the_same_weights(settings: Settings, tmp_path: Path) -> None:
    """The store's disk filled mid-round 2, freed seconds later: one line each way, exit 0, same weights, the
    launcher and its workers still up, the database intact."""
    server = EmbeddedRedis().start()
    config = slow_config(0.2, rounds=3, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = None
    with small_disk(tmp_path / "disk", "8m") as disk:
        database = disk / "fedqueue.db"
        store_in_small_pages(database)
        settings = reliable_settings(replace(settings, broker_url=server.url, database_url=f"sqlite:///{database}"))
        try:
            with launcher(settings, procs=2, cwd=tmp_path) as workers:
                follower, log = start_follower(tmp_path, cli_env(settings), "run", "run.toml")
                handle = api.RunHandle(printed_run_id(follower, log), settings)
                wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1 or follower.poll() is not None, 90)
                assert follower.poll() is None, log.read_text()[-3000:]
                filler = fill(disk)
                wait_until(lambda: STORE_FULL in log.read_text() or follower.poll() is not None, 60)
                time.sleep(FULL_FOR_S)  # past the store's own retries: the workers' results wait too
                assert follower.poll() is None, log.read_text()[-3000:]
                filler.unlink()
                follower.wait(timeout=180)
                assert workers.poll() is None, "the launcher exited"
                assert len(worker_children(workers)) == 2
        finally:
            if follower is not None:
                stop_process(follower)
            server.stop()
        output = log.read_text()
        assert follower.returncode == 0, output[-3000:]
        assert output.count(STORE_FULL) == 1 and output.count(STORE_BACK) == 1, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert f"run {handle.id} (finished)" in output
        assert handle.state == "finished"
        one_result_per_device(handle)
        assert_same_weights(handle.final_weights(), reference_final_state(config))
        handle.store.close()
        assert integrity(database) == "ok"


def test_run_gives_up_after_the_store_wait_and_resume_finishes_it(settings: Settings, tmp_path: Path) -> None:
    """The disk stays full past FEDQUEUE_STORE_WAIT_S: `fedqueue run` exits 2 naming `fedqueue resume RUN`, no
    traceback; once the disk is freed, that resume finishes the run with the unfaulted run's weights."""
    server = EmbeddedRedis().start()
    config = slow_config(0.2, rounds=3, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = resumed = None
    with small_disk(tmp_path / "disk", "8m") as disk:
        database = disk / "fedqueue.db"
        store_in_small_pages(database)
        settings = reliable_settings(
            replace(settings, broker_url=server.url, database_url=f"sqlite:///{database}", store_wait_s=5)
        )
        try:
            with launcher(settings, procs=2, cwd=tmp_path) as workers:
                follower, log = start_follower(tmp_path, cli_env(settings), "run", "run.toml")
                handle = api.RunHandle(printed_run_id(follower, log), settings)
                wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1 or follower.poll() is not None, 90)
                assert follower.poll() is None, log.read_text()[-3000:]
                filler = fill(disk)
                follower.wait(timeout=90)
                filler.unlink()
                resumed, resume_log = start_follower(tmp_path, cli_env(settings), "resume", handle.id)
                resumed.wait(timeout=180)
                assert workers.poll() is None, "the launcher exited"
        finally:
            for process in (follower, resumed):
                if process is not None:
                    stop_process(process)
            server.stop()
        output = log.read_text()
        assert follower.returncode == 2, output[-3000:]
        assert output.count(STORE_FULL) == 1 and STORE_BACK not in output, output[-3000:]
        assert f"run {handle.id} continues when its workers and store are back: `fedqueue resume {handle.id}`" in output
        assert "Traceback" not in output, output[-3000:]
        resume_output = resume_log.read_text()
        assert resumed.returncode == 0, resume_output[-3000:]
        assert "Traceback" not in resume_output, resume_output[-3000:]
        assert handle.state == "finished"
        one_result_per_device(handle)
        assert_same_weights(handle.final_weights(), reference_final_state(config))
        handle.store.close()
        assert integrity(database) == "ok"
