"""A FedAsync run through the commands, with no code of the views' own for it: `fedqueue run` with its bars,
`status`, `report` and TensorBoard's files speak of its versions, one update each, as they speak of FedBuff's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing import event_accumulator

from fedqueue.fl.view.tensorboard import run_folder
from tests.cli.test_cli import cli_env, write_config
from tests.support.cli_runner import fedqueue_cli

pytestmark = pytest.mark.sessions  # `make test-sessions`

FEDASYNC = """
num_devices = 24
local_iters = 3
local_batch_size = 8
seed = 5
mode = "fedasync"
concurrency = 4
max_model_version = 6
eval_every = 2
fedasync_alpha = 0.7
fedasync_staleness = "polynomial"
fedasync_a = 0.5
device_speed = { mean = [0.01, 0.05], std = [0.002, 0.01], share = [0.5, 0.5] }
"""


def cli(*args: str, cwd: Path) -> Any:
    return fedqueue_cli(*args, cwd=cwd, env=cli_env(COLUMNS="200", PATH="/usr/bin:/bin"), timeout=240)


def test_run_status_report_and_tensorboard_show_a_fedasync_run_in_versions(tmp_path: Path) -> None:
    board = tmp_path / "tb"
    ran = cli("run", str(write_config(tmp_path, FEDASYNC)), "--procs", "2", "--tensorboard", str(board), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = re.search(r"run (\w+) submitted", ran.stdout).group(1)  # type: ignore[union-attr]
    assert f"run {run_id} submitted (up to version 6, 4 of 24 devices at once, 1 updates per version)" in ran.stdout
    bars = re.findall(r"^version +(\d+) .* (\d+)/(\d+) updates ", ran.stdout, re.MULTILINE)
    assert bars == [(str(version), "1", "1") for version in range(1, 7)], ran.stdout
    assert "round" not in ran.stdout.lower()

    status = json.loads(cli("status", run_id, "--json", cwd=tmp_path).stdout)
    assert status["state"] == "finished" and status["final_accuracy"] is not None
    shown = cli("status", run_id, cwd=tmp_path).stdout
    assert "round" not in shown.lower() and shown.splitlines()[-1] == f"final accuracy {status['final_accuracy']:.4f}"

    report = cli("report", run_id, "-o", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    assert "<h2>Versions</h2>" in page and "<b>6 of 6 made</b>" in page and "Simulated time" in page
    numbers = json.loads(cli("report", run_id, "--json", cwd=tmp_path).stdout)
    folded = numbers["simulated"]["buffered"]["folded"]
    assert folded == 6 and sum(numbers["simulated"]["buffered"]["staleness"].values()) >= folded

    reader = event_accumulator.EventAccumulator(str(run_folder(board, run_id)))
    reader.Reload()
    steps = {tag: [event.step for event in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}
    assert steps["test/accuracy"] == [2, 4, 6] and steps["aggregation/avg_staleness"] == list(range(1, 7))
