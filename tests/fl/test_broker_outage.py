"""The broker goes away under `fedqueue run`: it waits, says so in two lines, and ends as an unfaulted run does.

A Redis of the test's own on a free port (so it can be stopped and started again on that port), a real
`fedqueue worker` launcher and `fedqueue run` as a process of its own, as a user runs them.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import config_toml
from fedqueue.fl.store.results import count_done
from tests.fl.test_scheduler_recovery import embedded_env
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    BROKER_BACK,
    BROKER_WENT,
    BrokerOutage,
    broker_outage_fixture,  # noqa: F401 - the broker_outage fixture
    followed_through_the_outage,
    launcher,
    one_result_per_device,
    printed_run_id,
    slow_config,
    start_follower,
    stop_process,
    wait_until,
)

# Stops and restarts a Redis of its own under real workers: `make test-faults`.
pytestmark = pytest.mark.faults


def test_run_waits_for_a_restarted_broker_and_ends_with_the_same_weights(
    broker_outage: BrokerOutage, tmp_path: Path
) -> None:
    """Redis stopped mid-round 2 and started again empty on its port: exit 0, one line each way, same weights."""
    settings = broker_outage.settings
    config = slow_config(0.2, rounds=3, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    with launcher(settings, procs=2, cwd=tmp_path):
        follower, log = broker_outage.follow("run", "run.toml")
        handle = api.RunHandle(printed_run_id(follower, log), settings)
        wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1 or follower.poll() is not None, 90)
        assert follower.poll() is None, log.read_text()[-3000:]
        broker_outage.bounce(follower, log)
        follower.wait(timeout=120)
    output = followed_through_the_outage(follower, log)
    assert "the workers keep their tasks" in output
    assert f"run {handle.id} (finished)" in output  # the summary an unfaulted run ends with
    assert handle.state == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_run_gives_up_after_the_broker_wait_and_names_resume(broker_outage: BrokerOutage, tmp_path: Path) -> None:
    """Redis stopped for good while `fedqueue run` follows: after FEDQUEUE_BROKER_WAIT_S, one line naming
    `fedqueue resume RUN` and a non-zero exit; the run is left running for that resume."""
    broker_outage.settings = settings = replace(broker_outage.settings, broker_wait_s=5)
    config = slow_config(0.2, rounds=2, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    # No workers: the run waits on its queue while the follower holds its lease.
    follower, log = broker_outage.follow("run", "run.toml")
    handle = api.RunHandle(printed_run_id(follower, log), settings)
    wait_until(lambda: handle.store.get_run(handle.id).lease_owner is not None or follower.poll() is not None, 60)
    assert follower.poll() is None, log.read_text()[-3000:]
    broker_outage.broker.stop()
    follower.wait(timeout=60)
    output = log.read_text()
    assert follower.returncode == 2, output[-3000:]
    assert f"run {handle.id} continues when its workers and broker are back: `fedqueue resume {handle.id}`" in output
    assert output.count(BROKER_WENT) == 1, output[-3000:]
    assert BROKER_BACK not in output and "Traceback" not in output, output[-3000:]
    assert handle.state == "running"


def embedded_redis_of(process: psutil.Process) -> psutil.Process | None:
    for child in process.children():
        if "redis-server" in " ".join(child.cmdline()):
            return child
    return None


def test_run_starts_its_embedded_redis_again_when_it_exits(tmp_path: Path) -> None:
    """No broker configured: the embedded Redis of `fedqueue run` is SIGKILLed mid-round 2; the follower
    starts it again (empty) on its port, and the run ends as an unfaulted one, with the same weights."""
    env = embedded_env(tmp_path)
    config = slow_config(0.2, rounds=3, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = None
    try:
        follower, log = start_follower(tmp_path, env, "run", "run.toml", "--procs", "2")
        handle = api.RunHandle(printed_run_id(follower, log), Settings(database_url=env["FEDQUEUE_DATABASE_URL"]))
        wait_until(lambda: count_done(handle.store, handle.id, 2) >= 1 or follower.poll() is not None, 90)
        assert follower.poll() is None, log.read_text()[-3000:]
        server = embedded_redis_of(psutil.Process(follower.pid))
        assert server is not None
        server.send_signal(signal.SIGKILL)
        follower.wait(timeout=120)
    finally:
        if follower is not None:
            stop_process(follower)
    output = log.read_text()
    assert follower.returncode == 0, output[-3000:]
    assert output.count("embedded Redis exited: started again (empty) on its port") == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert handle.state == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_resume_waits_for_a_broker_still_down_and_ends_with_the_same_weights(
    broker_outage: BrokerOutage, tmp_path: Path
) -> None:
    """`fedqueue resume` of a run whose broker is still down waits for it as `run` does (it exited 2 at once):
    one line when it starts, one when the broker is back (empty, on its port), then exit 0 and the same weights."""
    settings = broker_outage.settings
    config = slow_config(0.0, rounds=2, devices_per_round=4, local_iters=3)
    handle = api.submit(config, settings=settings)  # no worker yet: round 1 waits on the queue
    broker_outage.broker.stop()
    follower, log = broker_outage.follow("resume", handle.id)
    wait_until(lambda: BROKER_WENT in log.read_text() or follower.poll() is not None, 60)
    assert follower.poll() is None, log.read_text()[-3000:]
    broker_outage.start_again()
    with launcher(settings, procs=2, cwd=tmp_path):
        follower.wait(timeout=180)
    followed_through_the_outage(follower, log)
    assert handle.state == "finished"
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))
