"""The cluster `fedqueue up -d` leaves: commands that need a broker find it, and `fedqueue logs` shows its workers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.queue import cluster_file
from tests.cli.test_cancel import active_tasks, queued_tasks
from tests.support.cli_inputs import cli_env, write_config
from tests.support.cli_runner import fedqueue_cli, start_fedqueue_cli
from tests.support.reliability_support import wait_until
from tests.support.service_support import free_port, http_get, running_flower

pytestmark = pytest.mark.sessions  # `make test-sessions`

LONG = "num_devices = 30\ndevices_per_round = 6\nrounds = 200\nlocal_iters = 5\nseed = 3\n"


class Lines:
    """What a running command prints on stdout, gathered by a thread as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.text = ""
        self._process = process
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.text += line


def test_submit_status_cancel_and_logs_find_the_cluster_up_left(tmp_path: Path) -> None:
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}")
    settings = Settings.from_env(env)
    nothing = fedqueue_cli("logs", cwd=tmp_path, env=env)
    assert nothing.returncode == 1 and nothing.stderr.startswith("error: no logs in "), nothing.stderr
    up = fedqueue_cli("up", "--detach", "--procs", "1", cwd=tmp_path, env=env, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    folder = cluster_file.log_dir(settings)
    assert folder.is_relative_to(Path(os.environ["XDG_STATE_HOME"]))
    assert f"logs in {folder} (fedqueue logs [--follow] shows them)" in up.stdout, up.stdout
    follower = start_fedqueue_cli(
        "logs", "--follow", "--lines", "0", cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    followed = Lines(follower)
    try:
        # No FEDQUEUE_BROKER_URL: submit finds the broker of the cluster `up` left for these settings.
        submitted = fedqueue_cli("submit", str(write_config(tmp_path, LONG)), cwd=tmp_path, env=env)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        run_id = submitted.stdout.strip()
        wait_until(lambda: "fedqueue.train_device" in followed.text, 60)  # the worker's log, as it writes it
        assert re.search(r"^cpu0 \| .*Task fedqueue\.train_device\[", followed.text, re.MULTILINE), followed.text
        status = fedqueue_cli("status", run_id, cwd=tmp_path, env=env)
        assert status.returncode == 0 and f"run {run_id} (running)" in status.stdout, status.stdout + status.stderr
        cancelled = fedqueue_cli("cancel", run_id, cwd=tmp_path, env=env)
        assert cancelled.returncode == 0 and f"run {run_id} cancelled" in cancelled.stdout, cancelled.stderr
        standing = cluster_file.find(settings)
        assert standing is not None
        on_cluster = settings.with_broker(standing.broker_url)
        wait_until(lambda: active_tasks(on_cluster, run_id) == 0 and queued_tasks(on_cluster, run_id) == 0, 10)
        last = fedqueue_cli("logs", "--lines", "2", cwd=tmp_path, env=env)
        assert last.returncode == 0, last.stderr
        names = [line.split(" | ")[0] for line in last.stdout.splitlines()]
        assert names.count("cpu0") == 2 and names.count("up") == 2, last.stdout
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        assert "Traceback" not in followed.text
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        down = fedqueue_cli("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    refused = fedqueue_cli("submit", str(tmp_path / "run.toml"), cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "error: FEDQUEUE_BROKER_URL: not set and no local cluster is up (start one: fedqueue up -d)"
    ]
    kept = fedqueue_cli("logs", "--lines", "1", cwd=tmp_path, env=env)  # the logs outlive their cluster
    assert kept.returncode == 0 and "\ncpu0 | " in kept.stdout, kept.stdout + kept.stderr


def test_monitor_and_worker_find_the_cluster_up_left(tmp_path: Path) -> None:
    """`monitor` (`flower` is the same command) watches the broker of `up -d`'s cluster, as `submit` and `status`
    use it: once, Flower's own process read no broker and ended in a traceback. `worker` adds workers to that
    cluster, named apart from its own."""
    env = cli_env(FEDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}", FLOWER_BASIC_AUTH="admin:pw")
    settings = Settings.from_env(env)
    alone = fedqueue_cli("monitor", cwd=tmp_path, env=env)
    assert alone.returncode == 2 and alone.stderr.splitlines() == [
        "error: FEDQUEUE_BROKER_URL: not set and no local cluster is up (fedqueue up -d starts one); Flower watches"
        " the broker the workers use"
    ], alone.stderr
    up = fedqueue_cli("up", "--detach", "--procs", "1", cwd=tmp_path, env=env, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    extra = None
    try:
        standing = cluster_file.find(settings)
        assert standing is not None
        port = free_port()
        with running_flower(env, port, tmp_path / "flower.log") as base:
            wait_until(lambda: _flower_workers(base) == ["cpu0"], 60)
            extra = start_fedqueue_cli(
                "worker", "--procs", "1", cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            joined = Lines(extra)
            # Flower sees the worker joining: both on the one broker, the new one named apart.
            wait_until(lambda: _flower_workers(base) == ["cpu0", f"cpu0-{extra.pid}"] or extra.poll() is not None, 90)
            assert extra.poll() is None, joined.text
        assert f"joining the local cluster of fedqueue up (pid {standing.pid})" in joined.text
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(timeout=60) == 0, joined.text
        assert "Traceback" not in joined.text + (tmp_path / "flower.log").read_text()
    finally:
        if extra is not None and extra.poll() is None:
            extra.kill()
            extra.wait()
        down = fedqueue_cli("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr


def _flower_workers(base: str) -> list[str]:
    """The workers Flower knows, by name before '@'."""
    status, workers = http_get(f"{base}/api/workers?refresh=1", auth=("admin", "pw"))
    return sorted(name.split("@")[0] for name in workers) if status == 200 and isinstance(workers, dict) else []
