"""`fedqueue run` on a broker no worker reads: it says so once, and goes on when a launcher starts.

A Redis of the test's own with no workers, `fedqueue run` as a process of its own, then a real
`fedqueue worker` launcher started late; the run ends as an unfaulted one, with the same weights.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import config_toml
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
)

# Runs a follower for many seconds with no worker, then a launcher: `make test-faults`.
pytestmark = pytest.mark.faults

NO_WORKER = "no worker reads queue"
READ_AGAIN = "a worker reads queue"


def test_run_says_no_worker_reads_its_queue_then_finishes_once_a_launcher_starts(
    settings: Settings, tmp_path: Path
) -> None:
    server = EmbeddedRedis().start()
    settings = reliable_settings(replace(settings, broker_url=server.url, no_worker_s=3))
    config = slow_config(0.0, rounds=2, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = None
    try:
        follower, log = start_follower(tmp_path, cli_env(settings), "run", "run.toml")
        handle = api.RunHandle(printed_run_id(follower, log), settings)
        wait_until(lambda: NO_WORKER in log.read_text() or follower.poll() is not None, 60)
        assert follower.poll() is None, log.read_text()[-3000:]
        line = next(text for text in log.read_text().splitlines() if NO_WORKER in text)
        assert line.strip().startswith(f"no worker reads queue {settings.queue('')}"), line
        assert line.strip().endswith(": start `fedqueue worker`"), line
        with launcher(settings, procs=2, cwd=tmp_path):
            follower.wait(timeout=120)
    finally:
        if follower is not None:
            stop_process(follower)
        server.stop()
    output = log.read_text()
    assert follower.returncode == 0, output[-3000:]
    assert output.count(NO_WORKER) == 1 and output.count(READ_AGAIN) == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert handle.state == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))
