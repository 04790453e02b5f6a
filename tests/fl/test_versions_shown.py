"""A buffered-async run is shown in versions, never rounds: its submit line, bars, status and report; and `report`
counts device tasks as `status` does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from fedqueue.core.database import open_store
from fedqueue.fl.store.results import add_round, claim_round, complete_round
from fedqueue.fl.store.schedule_rows import create_schedule
from fedqueue.fl.store.schema import RoundRow
from fedqueue.fl.strategy.fedbuff.schedule import Arrival, ScheduleState, Trip
from fedqueue.fl.view.bars import RoundProgress
from fedqueue.store import Store
from tests.support.cli_inputs import cli_env, write_config
from tests.support.cli_runner import fedqueue_cli

pytestmark = pytest.mark.sessions  # `make test-sessions`

FEDBUFF = """
num_devices = 24
local_iters = 3
local_batch_size = 8
seed = 5
mode = "fedbuff"
concurrency = 6
buffer_size = 3
max_model_version = 4
pack_size = 2
pack_mode = "vmap"
device_speed = { mean = [0.01, 0.05], std = [0.002, 0.01], share = [0.6, 0.4] }
"""
BUFFERED = {"mode": "fedbuff", "concurrency": 6, "buffer_size": 3, "num_devices": 24, "dataset": "digits"}


def cli(*args: str, cwd: Path) -> Any:
    # No `fedqueue` on PATH: the run names the one it is by its path.
    return fedqueue_cli(*args, cwd=cwd, env=cli_env(COLUMNS="200", PATH="/usr/bin:/bin"), timeout=240)


def test_a_buffered_run_speaks_of_versions_from_submit_to_report(tmp_path: Path) -> None:
    ran = cli("run", str(write_config(tmp_path, FEDBUFF)), "--procs", "2", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = re.search(r"run (\w+) submitted", ran.stdout).group(1)  # type: ignore[union-attr]
    assert f"run {run_id} submitted (up to version 4, 6 of 24 devices at once, 3 updates per version)" in ran.stdout
    # A bar per version: the updates folded into it, of the 3 that make it; the last one full, as every one.
    bars = re.findall(r"^version +(\d+) .* (\d+)/(\d+) updates ", ran.stdout, re.MULTILINE)
    assert bars == [(str(version), "3", "3") for version in range(1, 5)], ran.stdout
    assert "round" not in ran.stdout.lower()
    # It ends saying where its results are and what shows them, as this shell types it.
    command = str(Path(sys.executable).with_name("fedqueue"))
    assert ran.stdout.splitlines()[-2:] == [
        "results: in the store fedqueue.db (FEDQUEUE_DATABASE_URL sets it)",
        f"next: {command} report {run_id} · {command} status {run_id} · {command} runs",
    ]

    status = json.loads(cli("status", run_id, "--json", cwd=tmp_path).stdout)
    shown = cli("status", run_id, cwd=tmp_path).stdout
    assert f"{status['tasks_done']} device tasks (0 failed)" in shown and "round" not in shown.lower()
    assert shown.splitlines()[-1] == f"final accuracy {status['final_accuracy']:.4f}"

    report = cli("report", run_id, "-o", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    line, meaning, written = report.stdout.splitlines()
    # The device tasks status counts, and the packs of two that trained some of them (vmapped: one timed task
    # each); a slot refilled alone sends its device alone.
    counted = json.loads(cli("report", run_id, "--json", cwd=tmp_path).stdout)["tasks_counted"]
    assert counted["done"] == status["tasks_done"] and counted["packed"] == 2 * counted["packs"] > 0
    assert counted["packed"] < counted["done"]
    assert line.endswith(
        f" · {status['tasks_done']} device tasks (0 failed), {counted['packed']} of them in {counted['packs']} packs"
    )
    assert meaning.startswith("parallel efficiency = task busy time / (wall time x slots)")
    page = (tmp_path / "report" / "report.html").read_text()
    assert "<h2>Versions</h2>" in page and "<b>4 of 4 made</b>" in page and "<th>version</th>" in page
    assert "<h2>Rounds</h2>" not in page and "per round" not in page


def hand_made_run(path: Path, buffered: bool, ended: bool = False) -> tuple[Store, str]:
    """A run still going, or ended early, written by hand: rounds 1 and 2 made (evaluated), round 3 open, two
    updates buffered for it."""
    store = open_store(f"sqlite:///{path}", migrate=True)
    config = BUFFERED if buffered else {"dataset": "digits", "num_devices": 24, "devices_per_round": 6}
    store.create_run("hand", "", config, 5, kind="fl")
    for index in (1, 2, 3):
        add_round(
            store,
            RoundRow(
                run_id="hand",
                round_index=index,
                version=index - 1,
                state="training",
                selected=list(range(6)),
                model_key="k",
                model_sha256="0" * 64,
                model_nbytes=1,
                enqueued_at=float(index),
            ),
        )
        if index < 3:
            assert claim_round(store, "hand", index, "agg", stale_before=0.0)
            complete_round(store, "hand", index, "agg", accuracy=0.5 + index / 10, loss=1.0, sim_time=index * 2.0)
    if buffered:
        state = ScheduleState(version=2)
        state.buffer = [Arrival(Trip(5.0, device, 3, 4.0, (device,)), "folded", 0, 1.0, 3) for device in (1, 4)]
        create_schedule(store, "hand", state.to_dict(), 2)
    if ended:
        store.finish_run("hand", "finished")
    return store, "hand"


def test_status_of_a_running_run_says_accuracy_so_far_naming_its_version(tmp_path: Path) -> None:
    for buffered, word in ((True, "version"), (False, "round")):
        database = tmp_path / f"{word}.db"
        hand_made_run(database, buffered)[0].close()
        env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{database}", COLUMNS="200")
        shown = fedqueue_cli("status", "hand", cwd=tmp_path, env=env).stdout
        assert shown.splitlines()[-1] == f"accuracy so far 0.7000 ({word} 2)", shown
        assert "final accuracy" not in shown


def test_the_version_in_the_making_counts_its_buffered_updates(tmp_path: Path) -> None:
    store, run_id = hand_made_run(tmp_path / "running.db", buffered=True)
    bars = RoundProgress(store, run_id).bars()
    assert [(bar.label, bar.completed, bar.total, bar.unit, bar.finished) for bar in bars] == [
        ("version   1", 3, 3, "updates", True),
        ("version   2", 3, 3, "updates", True),
        ("version   3", 2, 3, "updates", False),
    ]
    assert bars[1].note.endswith("sim      4.0 s  accuracy 0.700") and bars[2].note == ""
    # Ended before version 3 was made (a stop rule on simulated time): said so, not left looking stuck.
    ended, run_id = hand_made_run(tmp_path / "ended.db", buffered=True, ended=True)
    assert RoundProgress(ended, run_id).bars()[-1].note == "not made: the run ended first"
