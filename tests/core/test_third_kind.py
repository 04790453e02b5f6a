"""A third job kind, written in the tests (plugin_modules/fq_toy_kind.py) and installed as a package
would be (an entry point in the `fedqueue.jobs` group): it registers, runs through real workers, and
shows in `fedqueue status`, `runs` and `report`, though no line of fedqueue names it."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.store.migrate import SchemaBranch, head_revision, schema_revision
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.reliability_support import launcher

PLUGINS = Path(__file__).resolve().parents[1] / "support" / "plugin_modules"
PACKAGE = Path(__file__).resolve().parents[2] / "fedqueue"
COUNT = 16


def install_toy_kind(folder: Path) -> Path:
    """A folder that, on the Python path, holds the kind as an installed distribution: its module and entry point."""
    dist = folder / "fedqueue_toy-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fedqueue-toy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[fedqueue.jobs]\ntoy = fq_toy_kind:KIND\n")
    (folder / "fq_toy_kind.py").write_text((PLUGINS / "fq_toy_kind.py").read_text())
    shutil.copytree(PLUGINS / "fq_toy_migrations", folder / "fq_toy_migrations")
    return folder


def test_no_line_of_fedqueue_names_the_toy_kind() -> None:
    assert not [path for path in PACKAGE.rglob("*.py") if "toy" in path.read_text().lower()]


@pytest.mark.slow
def test_a_third_kind_runs_through_real_workers_and_shows_in_status_runs_and_report(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = install_toy_kind(tmp_path / "site")
    # Workers and commands started from here find the kind as they would find an installed package.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(installed), os.environ.get("PYTHONPATH", "")]))
    env = cli_env(settings)
    assert "toy" in fedqueue_cli("--help", env=env, cwd=tmp_path, timeout=180).stdout  # its commands joined `fedqueue`

    with launcher(settings, procs=2, cwd=tmp_path):  # `fedqueue worker`, which finds the kind's queue as a user's would
        done = fedqueue_cli(
            "toy", "run", "--count", str(COUNT), "--sleep-ms", "150", env=env, cwd=tmp_path, timeout=180
        )
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"toy job (toy-\w+) submitted", done.stdout)
    assert found is not None, done.stdout
    run_id = found.group(1)
    assert f"run {run_id} (finished)" in done.stdout  # the core's summary of a kind that shows none of its own

    sys.path.insert(0, str(installed))
    try:
        from fq_toy_kind import squares
    finally:
        sys.path.remove(str(installed))
    store = open_store(settings.database_url)
    try:
        assert squares(store, run_id) == {number: number**2 for number in range(COUNT)}
        # Its table came from its own schema branch, recorded beside the core's by the processes that had it.
        toy_branch = SchemaBranch("toy", installed / "fq_toy_migrations")
        assert schema_revision(store.engine, toy_branch) == head_revision(toy_branch) == "toy_0001"
    finally:
        store.close()

    status = json.loads(fedqueue_cli("status", run_id, "--json", env=env, cwd=tmp_path, timeout=180).stdout)
    assert status["state"] == "finished" and status["error"] is None
    assert status["tasks_done"] == COUNT and status["tasks_failed"] == 0
    assert len(status["workers"]) == 2  # both workers took squares: the kind's queue reached every worker

    listed = json.loads(fedqueue_cli("runs", "--json", env=env, cwd=tmp_path, timeout=180).stdout)
    assert [(line["id"], line["state"]) for line in listed] == [(run_id, "finished")]

    report = fedqueue_cli("report", run_id, "--out", str(tmp_path / "report"), env=env, cwd=tmp_path, timeout=180)
    assert report.returncode == 0, report.stdout + report.stderr
    numbers = json.loads(fedqueue_cli("report", run_id, "--json", env=env, cwd=tmp_path, timeout=180).stdout)
    assert numbers["tasks_done"] == COUNT and numbers["tasks_failed"] == 0
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "timeline.png").exists()
