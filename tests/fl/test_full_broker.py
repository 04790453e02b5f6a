"""A broker with a small memory limit (`--maxmemory 64mb --maxmemory-policy noeviction`) under a CIFAR-shaped
CNN run whose blobs peak well past it: blobs that do not fit go to the store, so Redis never refuses a write
(Celery's included), no device fails, no worker crashes, and the weights are the unfaulted run's.

A Redis of the test's own, a real `fedqueue worker` launcher and `fedqueue run` as a process of its own.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig, config_toml
from fedqueue.fl.store.results import device_tasks
from fedqueue.queue.embedded import EmbeddedRedis
from tests.fl.strategy.fedbuff.test_buffered_async import reference as buffered_reference
from tests.support.cli_inputs import cli_env
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import one_result_per_device, printed_run_id, start_follower, stop_process

# Limits a Redis of its own under real workers, minutes of CNN training: `make test-faults`.
pytestmark = pytest.mark.faults

MAXMEMORY = 64 * 2**20
# The run: 2.2 MB updates, 40 of them a round, so about 90 MB of blobs at the peak.
CNN: dict[str, Any] = {
    "dataset": "synthetic",
    "model": "cnn",
    "num_devices": 60,
    "local_iters": 5,
    "local_batch_size": 32,
    "local_lr": 0.05,
    "pack_size": 4,
    "pack_mode": "sequential",
    "seed": 5,
}
SYNC = RunConfig.from_dict({**CNN, "name": "full-broker-sync", "devices_per_round": 40, "rounds": 3})
# As many updates in flight as the sync run has in a round, folded ten at a time, 120 trainings in all.
FEDBUFF = RunConfig.from_dict(
    {
        **CNN,
        "name": "full-broker-fedbuff",
        "mode": "fedbuff",
        "concurrency": 40,
        "buffer_size": 10,
        "max_model_version": 8,
        "staleness_weight": "polynomial",
        "device_speed": {"mean": [0.002, 0.006], "std": [0.0005, 0.001], "share": [0.5, 0.5]},
        "communication_delay": {"mean": 0.1, "std": 0.02},
    }
)


def run_under_a_full_broker(settings: Settings, config: RunConfig, tmp_path: Path) -> api.RunHandle:
    """`fedqueue run` of `config` on two worker processes against a 64 MB noeviction Redis; checks it ended
    well: exit 0, every device stored done, no worker crash, Redis never at its limit, blobs spilled."""
    from tests.support.reliability_support import launcher

    server = EmbeddedRedis(extra_args=["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]).start()
    # Blobs through Redis (on one host they would skip it for shared memory): its limit is what is tested.
    settings = replace(settings, broker_url=server.url, blob_shm="off")
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = None
    began = time.monotonic()
    try:
        with launcher(settings, procs=2, cwd=tmp_path):
            follower, log = start_follower(tmp_path, cli_env(settings), "run", "run.toml")
            handle = api.RunHandle(printed_run_id(follower, log), settings)
            follower.wait(timeout=600)
        client = redis.Redis.from_url(server.url)
        peak = int(client.info("memory")["used_memory_peak"])
        errors = client.info("errorstats")  # refusals by error code: errorstat_OOM when Redis was full
        client.close()
    finally:
        if follower is not None:
            stop_process(follower)
        server.stop()
    print(f"{config.name}: {time.monotonic() - began:.0f} s, Redis peak {peak / 2**20:.1f} MiB, errors {errors}")
    output = log.read_text()
    assert follower.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert handle.state == "finished", handle.status()["error"]
    tasks = device_tasks(handle.store, handle.id)
    assert tasks and all(task.state == "done" for task in tasks), [t.error for t in tasks if t.state != "done"]
    workers = "".join(path.read_text() for path in tmp_path.glob("launcher-*.log"))
    assert "Unrecoverable error" not in workers and "OOM command not allowed" not in workers, workers[-3000:]
    assert "blobs go to the store" in workers + output  # the run did need the store
    assert peak < MAXMEMORY, f"Redis peaked at {peak} bytes"
    assert "errorstat_OOM" not in errors, errors
    return handle


def test_sync_fedavg_under_a_64_mb_broker_ends_with_the_reference_weights(settings: Settings, tmp_path: Path) -> None:
    handle = run_under_a_full_broker(settings, SYNC, tmp_path)
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(SYNC))


def test_fedbuff_under_a_64_mb_broker_ends_with_the_reference_weights(settings: Settings, tmp_path: Path) -> None:
    handle = run_under_a_full_broker(settings, FEDBUFF, tmp_path)
    reference: dict[str, torch.Tensor] = buffered_reference(FEDBUFF)[1]
    assert_same_weights(handle.final_weights(), reference)
