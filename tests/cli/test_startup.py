"""Start-up: workers that boot beside the submit, a warm-up beside the first tasks, and a cluster `up` leaves running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch

from fedqueue.config import Settings
from fedqueue.errors import ServiceUnavailable
from fedqueue.fl import api
from fedqueue.queue import cluster_file
from fedqueue.queue.local import LocalCluster
from fedqueue.queue.workers import WorkerGroup, plan_workers
from tests.conftest import running_workers
from tests.support.cli_inputs import SMALL, cli_env, write_config
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.own_processes import is_worker_or_embedded_redis
from tests.support.reliability_support import ping_count, wait_until

pytestmark = pytest.mark.sessions  # `make test-sessions`


def test_warm_up_leaves_what_tasks_read_as_it_found_it() -> None:
    """It runs beside tasks: drawing from torch's global generator would change their weights."""
    from fedqueue.fl.ml.warmup import warm_up

    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    warm_up()
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.get_num_threads() == threads


def test_digits_read_from_the_file_equal_scikit_learns_loader() -> None:
    import numpy as np
    from sklearn.datasets import load_digits

    from fedqueue.fl.ml.data import _digits_arrays

    images, target = _digits_arrays()
    bunch = load_digits()
    assert images.dtype == bunch.images.dtype and target.dtype == bunch.target.dtype
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)


def test_round_one_queued_before_the_workers_start_gives_the_reference_weights(
    settings: Settings, tmp_path: Path
) -> None:
    """Every worker's first task runs beside its warm-up; the weights are still those of the reference."""
    config = small_config()
    expected = reference_final_state(config)
    handle = api.submit(config, settings=settings)  # no worker yet: round 1 waits on the queue
    group = WorkerGroup(settings, plan_workers([], 2, 1), log_dir=tmp_path / "logs").start()
    try:
        status = handle.wait(timeout_s=180)
    finally:
        group.stop(timeout_s=30)
    assert status["state"] == "finished"
    assert_same_weights(handle.final_weights(), expected)
    logs = [path.read_text() for path in (tmp_path / "logs").glob("worker-*.log")]
    # At least one worker took a task before its warm-up ended: the overlap really happened.
    assert any(0 <= log.find("fedqueue.train_device") < log.find("warm-up done") for log in logs), logs


def test_workers_are_ready_once_warm_and_their_planned_names_are_celerys(settings: Settings, tmp_path: Path) -> None:
    group = WorkerGroup(settings, plan_workers([], 2, 3), log_dir=tmp_path / "logs").start()
    try:
        group.wait_ready(timeout_s=120)
        logs = [path.read_text() for path in (tmp_path / "logs").glob("worker-*.log")]
        assert len(logs) == 2 and all("warm-up done" in log for log in logs)
        assert ping_count(settings) == 2
        from fedqueue.queue.app import make_app
        from fedqueue.queue.client import worker_slots_of

        app = make_app(settings)
        try:
            assert worker_slots_of(app)() == group.slots() == {name: 3 for name in group.slots()}
        finally:
            app.close()
    finally:
        group.stop(timeout_s=30)


def test_a_worker_that_cannot_start_is_reported_at_once(settings: Settings, tmp_path: Path) -> None:
    broken = replace(settings, threads_per_task=0)  # each worker refuses FEDQUEUE_THREADS_PER_TASK=0 and exits
    group = WorkerGroup(broken, plan_workers([], 1, 1), log_dir=tmp_path / "logs").start()
    try:
        with pytest.raises(ServiceUnavailable, match="exited during start-up"):
            group.wait_ready(timeout_s=120)
    finally:
        group.stop(timeout_s=5)


def test_local_cluster_without_waiting_runs_what_was_submitted_at_once(settings: Settings) -> None:
    config = small_config(rounds=1)
    local = replace(settings, broker_url=None)
    with api.local_cluster(procs=1, settings=local, wait=False) as cluster:
        handle = api.submit(config, settings=cluster.settings, worker_slots=cluster.workers.slots)
        status = handle.wait(timeout_s=180, tick=lambda: cluster.workers.restart_exited())
    assert status["state"] == "finished" and status["tasks_done"] == config.devices_per_round
    assert not cluster.workers.alive()


def _up(tmp_path: Path, env: dict[str, str]) -> int:
    return _up_with_exports(tmp_path, env)[0]


def _up_with_exports(tmp_path: Path, env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """`fedqueue up --detach`: its pid, and the variables it says to export in another shell."""
    result = fedqueue_cli("up", "--detach", "--procs", "1", cwd=tmp_path, env=env, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"local cluster up \(pid (\d+)", result.stdout)
    assert found, result.stdout
    exports = dict(re.findall(r"^export (FEDQUEUE_\w+)=(\S+)$", result.stdout, re.MULTILINE))
    return int(found.group(1)), exports


def _state(run_id: str, cwd: Path, exports: dict[str, str]) -> str:
    status = fedqueue_cli("status", run_id, "--json", cwd=cwd, env={**cli_env(), **exports})
    assert status.returncode == 0, status.stderr
    return str(json.loads(status.stdout)["state"])


def _children(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


def test_run_reuses_the_cluster_up_left_running_and_down_stops_it(tmp_path: Path) -> None:
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}")
    pid, exports = _up_with_exports(tmp_path, env)
    try:
        cluster = _children(pid)
        assert len(cluster) == 2 and all(map(is_worker_or_embedded_redis, cluster))  # one embedded Redis, one worker
        config = write_config(tmp_path, SMALL)
        for _ in range(2):  # the second run finds the same cluster: it was not stopped by the first
            result = fedqueue_cli("run", str(config), cwd=tmp_path, env=env, timeout=180)
            assert result.returncode == 0, result.stdout + result.stderr
            assert f"using the local cluster of fedqueue up (pid {pid}" in result.stdout
            assert "starting embedded Redis" not in result.stdout
            assert _children(pid) == cluster
        runs = json.loads(fedqueue_cli("runs", "--json", cwd=tmp_path, env=env).stdout)
        assert [run["state"] for run in runs] == ["finished", "finished"]
        # What it printed to export is what `submit` from another shell and folder needs to reach it.
        assert exports.keys() == {"FEDQUEUE_BROKER_URL", "FEDQUEUE_DATABASE_URL"}, exports
        assert exports["FEDQUEUE_BROKER_URL"].startswith("redis://127.0.0.1:")
        assert exports["FEDQUEUE_DATABASE_URL"] == env["FEDQUEUE_DATABASE_URL"]
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        submitted = fedqueue_cli("submit", str(config), cwd=elsewhere, env={**cli_env(), **exports})
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        wait_until(lambda: _state(submitted.stdout.strip(), elsewhere, exports) != "running", 120)
        assert _state(submitted.stdout.strip(), elsewhere, exports) == "finished"
        # `up -d` again: what it promises holds (a cluster up and found), so exit 0 and nothing started; `up` in
        # the foreground cannot be that cluster: refused (2), as a second scheduler on a run is.
        again = fedqueue_cli("up", "--detach", cwd=tmp_path, env=env)
        assert again.returncode == 0 and f"already up (pid {pid}, 1 workers)" in again.stdout, again.stderr
        assert _children(pid) == cluster
        foreground = fedqueue_cli("up", cwd=tmp_path, env=env)
        assert foreground.returncode == 2 and foreground.stderr.strip() == (
            f"error: a local cluster for these settings is already up (pid {pid}, 1 workers); fedqueue down stops it"
        )
    finally:
        down = fedqueue_cli("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0 and f"local cluster (pid {pid}) stopped" in down.stdout, down.stdout + down.stderr
    assert not any(cluster_file.pid_alive(child) for child in {pid, *cluster})
    assert not cluster_file.cluster_path(Settings.from_env(env)).exists()
    assert "no local cluster is up" in fedqueue_cli("down", cwd=tmp_path, env=env).stdout


def test_a_run_with_other_settings_starts_its_own_cluster(tmp_path: Path) -> None:
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}")
    pid = _up(tmp_path, env)
    try:
        other = {**env, "FEDQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}"}
        result = fedqueue_cli(
            "run", str(write_config(tmp_path, SMALL)), "--procs", "1", cwd=tmp_path, env=other, timeout=180
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "starting embedded Redis" in result.stdout and "using the local cluster" not in result.stdout
    finally:
        fedqueue_cli("down", cwd=tmp_path, env=env, timeout=120)
    assert not cluster_file.pid_alive(pid)


def test_a_cluster_file_whose_up_is_gone_is_ignored_and_removed(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    info = cluster_file.ClusterInfo(pid=int(gone.stdout), broker_url="redis://127.0.0.1:1/0", slots={}, log_dir="")
    path = cluster_file.write(settings, info)
    assert cluster_file.find(settings) is None
    assert not path.exists()


def test_a_relative_database_names_the_same_cluster_as_its_absolute_path(tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        relative = cluster_file.cluster_path(Settings(database_url="sqlite:///store.db"))
    finally:
        os.chdir(cwd)
    assert relative == cluster_file.cluster_path(Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}"))
    assert relative != cluster_file.cluster_path(Settings(database_url=f"sqlite:///{tmp_path / 'other.db'}"))


def test_cluster_start_waits_and_stops_everything(settings: Settings) -> None:
    before = _children(os.getpid())
    cluster = LocalCluster.start(replace(settings, broker_url=None), plan_workers([], 1, 1))
    try:
        assert ping_count(cluster.settings) == 1
        children = _children(os.getpid()) - before
        assert len(children) == 2  # the embedded Redis and the worker
    finally:
        cluster.stop()
    assert not cluster.workers.alive() and not any(cluster_file.pid_alive(pid) for pid in children)


def test_the_no_worker_warning_answers_to_the_first_worker(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedqueue.cli.common import warn_if_no_workers

    warn_if_no_workers(settings)
    assert "no worker answers" in capsys.readouterr().err
    with running_workers(settings, procs=1):
        warn_if_no_workers(settings)
    assert "no worker answers" not in capsys.readouterr().err


FAST_EXIT_SCRIPT = """
import atexit, sys, threading
from pathlib import Path
from fedqueue.core.process.fast_exit import run_then_exit

folder = Path(sys.argv[1])
atexit.register(lambda: (folder / "atexit").write_text("ran"))

def main():
    started = threading.Event()
    def late():
        started.wait()
        (folder / "thread").write_text("done")
    threading.Thread(target=late).start()  # not a daemon: the exit waits for it
    started.set()
    sys.stdout.write("no newline, still buffered")
    sys.exit(3)

run_then_exit(main)
"""


def test_a_fast_exit_keeps_what_a_normal_exit_does(tmp_path: Path) -> None:
    """Threads joined, atexit handlers run, output flushed, the status kept; only the module teardown is skipped."""
    result = subprocess.run(
        [sys.executable, "-c", FAST_EXIT_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3
    assert result.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


def test_a_cluster_file_in_a_folder_others_can_write_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'store.db'}")
    info = cluster_file.ClusterInfo(pid=os.getpid(), broker_url="redis://127.0.0.1:1/0", slots={}, log_dir="")
    path = cluster_file.write(settings, info)
    assert cluster_file.read(path) == info
    path.parent.chmod(0o777)
    assert cluster_file.read(path) is None and cluster_file.find(settings) is None
    with pytest.raises(ServiceUnavailable, match="not a private folder"):
        cluster_file.write(settings, info)
