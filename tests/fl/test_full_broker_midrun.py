"""A broker that another client fills to its maxmemory in the middle of a run, then frees: the run waits for room
and ends as an unfaulted run does.

The issue's run (a CIFAR-shaped CNN, 60 devices, 40 a round, 3 rounds, packs of 4) under `fedqueue run` and a
`fedqueue worker` launcher of two processes, on a 64 MB noeviction Redis of the test's own. Once round 1 has
stored some devices, another client fills Redis with junk keys and keeps it at its limit a while; tasks finish
into it (their late acks, the next deliveries, the ledger's marks are refused) until the junk is deleted. Before
the fix a refused ack was logged ("Couldn't ack") and dropped: the worker kept the message as held and never
took another task; a refused delivery was lost off its queue until a repair pass sent it again; with both
workers stuck the run stood still forever, with nothing said.

The same fill under FedBuff (as many updates in flight as a sync round has devices): the fold pass's writes
and its next dispatches meet the limit too, and the run ends with the queue-free reference's weights.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis
import torch

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import RunConfig, config_toml
from fedqueue.fl.store.results import device_tasks
from fedqueue.queue.embedded import EmbeddedRedis
from tests.fl.strategy.fedbuff.test_buffered_async import reference as buffered_reference
from tests.fl.test_full_broker import FEDBUFF, MAXMEMORY, SYNC
from tests.queue.test_worker_full_broker import oom_replies
from tests.support.cli_inputs import cli_env
from tests.support.cli_runner import fedqueue_cli
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    launcher,
    one_result_per_device,
    printed_run_id,
    start_follower,
    stop_process,
    wait_until,
)

# A CNN run on two worker processes, then its queue-free reference: about 5 minutes on a loaded 2-core machine,
# past the suite's 300 s default; the test's own waits bound it.
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

FULL_FOR_S = 10.0  # how long the other client keeps Redis at its limit (the fault's length, as in the issue)
# What the follower says when its broker is at its limit, and when it has room again (fedqueue.core.waits.room).
FULL = "broker out of memory ("
ROOM = "broker has room again after "


class Filler(threading.Thread):
    """Another client of the broker: junk keys whenever Redis has room (as the run's own deletes make some),
    so it stays at its limit until `stop`, which deletes them all."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.junk: list[str] = []
        self.refused = 0  # its own writes Redis refused (counted apart from the workers')
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            key = f"junk:{len(self.junk)}"
            try:
                self.client.set(key, b"x" * 65536)
                self.junk.append(key)
            except redis.exceptions.OutOfMemoryError:
                self.refused += 1
                self.done.wait(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join()
        for start in range(0, len(self.junk), 500):
            self.client.delete(*self.junk[start : start + 500])
        self.client.close()


def fill_mid_run(settings: Settings, config: RunConfig, tmp_path: Path) -> api.RunHandle:
    """`fedqueue run` of `config` on two worker processes, its 64 MB noeviction Redis filled by another client
    for a while once some devices are stored, then freed; checks the run waited and ended well."""
    server = EmbeddedRedis(extra_args=["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]).start()
    client = redis.Redis.from_url(server.url)
    settings = replace(settings, broker_url=server.url)
    env = cli_env(settings)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = filler = None
    try:
        with launcher(settings, procs=2, cwd=tmp_path):
            follower, log = start_follower(tmp_path, env, "run", "run.toml")
            handle = api.RunHandle(printed_run_id(follower, log), settings)
            wait_until(lambda: len(device_tasks(handle.store, handle.id)) >= 12 or follower.poll() is not None, 300)
            assert follower.poll() is None, log.read_text()[-3000:]
            refused = oom_replies(client)
            filler = Filler(server.url)
            filled_at = time.monotonic()
            wait_until(lambda: oom_replies(client) > refused, 60)  # at its limit
            status = fedqueue_cli("status", handle.id, env=env, cwd=tmp_path).stdout
            # Full for a while: the workers' own writes meet the limit and the follower says what it waits for.
            wait_until(
                lambda: (
                    time.monotonic() - filled_at >= FULL_FOR_S
                    and oom_replies(client) - filler.refused > refused
                    and FULL in log.read_text()
                ),
                120,
            )
            filler.stop()
            freed_at = time.time()
            follower.wait(timeout=420)
    finally:
        if filler is not None and not filler.done.is_set():
            filler.stop()
        if follower is not None:
            stop_process(follower)
        client.close()
        server.stop()
    output = log.read_text()
    workers = "".join(path.read_text() for path in tmp_path.glob("launcher-*.log"))
    assert "waiting: broker out of memory: maxmemory 64 MB" in status, status
    assert follower.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert output.count(FULL) == 1 and output.count(ROOM) == 1, output[-3000:]
    assert "Couldn't ack" not in workers and "Unrecoverable error" not in workers, workers[-3000:]
    assert "repair:" not in output, output[-3000:]  # no delivery was lost, no round left unstarted
    assert handle.state == "finished", handle.status()["error"]
    # Both workers took tasks again once room was made (before the fix a worker whose ack was refused took none).
    after = {t.worker for t in handle.store.task_timings(handle.id) if t.started_at > freed_at}
    assert len(after) == 2, after
    return handle


def test_a_broker_filled_mid_run_is_waited_out_and_the_run_ends_with_the_reference_weights(
    settings: Settings, tmp_path: Path
) -> None:
    handle = fill_mid_run(settings, SYNC, tmp_path)
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(SYNC))


def test_a_broker_filled_mid_fedbuff_run_is_waited_out_and_the_run_ends_with_the_reference_weights(
    settings: Settings, tmp_path: Path
) -> None:
    handle = fill_mid_run(settings, FEDBUFF, tmp_path)
    reference: dict[str, torch.Tensor] = buffered_reference(FEDBUFF)[1]
    assert_same_weights(handle.final_weights(), reference)
