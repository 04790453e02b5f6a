"""The broker goes away while `fedqueue run` submits: the command waits as it does later in the run, and ends as an
unfaulted run does (exit 0, the same weights), at every point of the submit.

Once, an outage in those seconds ended the command with exit 1 although the run was stored (and its workers later
finished it): a user could not tell which case they were in. The points are reached by the submit's own code
(tests/fl/cut_submit.py shuts the broker down there), not by timing; the test starts the broker again.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.fl import api
from fedqueue.fl.config import config_toml
from tests.fl.test_scheduler_recovery import embedded_env
from tests.support.cli_runner import interruptible
from tests.support.helpers import assert_same_weights, reference_final_state
from tests.support.reliability_support import (
    BROKER_WENT,
    BrokerOutage,
    broker_outage_fixture,  # noqa: F401 - the broker_outage fixture
    followed_through_the_outage,
    launcher,
    one_result_per_device,
    printed_run_id,
    slow_config,
    stop_process,
    wait_until,
)

# Stops and restarts a Redis of its own under real workers: `make test-faults`.
pytestmark = pytest.mark.faults

CUT_SUBMIT = Path(__file__).with_name("cut_submit.py")


def start_cut(cwd: Path, env: dict[str, str], point: str, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """`fedqueue *args` with its broker shut down at `point` of the submit; its output in one file."""
    log = cwd / f"cut-{point}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(CUT_SUBMIT), point, *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=interruptible,
        )
    return process, log


@pytest.mark.parametrize(
    ("point", "waiting"),
    [
        ("before-row", "nothing of the run is stored yet"),
        ("after-row", "the run is stored, and what its submit did not send is sent when the broker is back"),
        ("mid-publish", "the run is stored, and what its submit did not send is sent when the broker is back"),
    ],
)
def test_run_waits_for_a_broker_lost_while_it_submits(
    broker_outage: BrokerOutage, tmp_path: Path, point: str, waiting: str
) -> None:
    settings = broker_outage.settings
    config = slow_config(0.05, rounds=2, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    with launcher(settings, procs=2, cwd=tmp_path):
        follower, log = broker_outage.follow(point, "run", "run.toml", start=start_cut)
        # The command shuts its broker down itself; once it says it waits, the broker starts again, empty.
        wait_until(lambda: BROKER_WENT in log.read_text() or follower.poll() is not None, 120)
        assert follower.poll() is None, log.read_text()[-3000:]
        broker_outage.broker.stop()
        broker_outage.start_again()
        follower.wait(timeout=180)
    output = followed_through_the_outage(follower, log)
    assert f"broker shut down at {point}" in output
    assert waiting in output, output[-3000:]
    handle = api.RunHandle(printed_run_id(follower, log), settings)
    assert f"run {handle.id} (finished)" in output  # the summary an unfaulted run ends with
    assert [run["id"] for run in api.runs(settings)] == [handle.id]  # one run: nothing half-stored beside it
    one_result_per_device(handle)
    assert_same_weights(handle.final_weights(), reference_final_state(config))


def test_a_broker_that_stays_away_before_the_run_is_stored_leaves_nothing_stored(
    broker_outage: BrokerOutage, tmp_path: Path
) -> None:
    """Past FEDQUEUE_BROKER_WAIT_S with nothing of the run stored: one line saying so (submit again), exit 2 as for
    a broker that does not answer at the start, and no run in the store."""
    broker_outage.settings = settings = replace(broker_outage.settings, broker_wait_s=3)
    (tmp_path / "run.toml").write_text(config_toml(slow_config(0.05, rounds=2, devices_per_round=4)))
    follower, log = broker_outage.follow("before-row", "run", "run.toml", start=start_cut)
    follower.wait(timeout=120)
    output = log.read_text()
    assert follower.returncode == 2, output[-3000:]
    assert output.splitlines()[-1].startswith("error: broker unreachable for "), output[-3000:]
    assert output.splitlines()[-1].endswith(
        "(FEDQUEUE_BROKER_WAIT_S is 3) while the run was submitted: nothing was stored; submit it again once the"
        " broker answers"
    ), output[-3000:]
    assert "Traceback" not in output and " submitted (" not in output, output[-3000:]
    assert api.runs(settings) == []


def test_an_embedded_broker_lost_before_the_run_is_stored_is_started_again(tmp_path: Path) -> None:
    """No broker configured: the embedded Redis `fedqueue run` started exits before the run's row is stored; the
    submit starts it again on its port and goes on, and the run ends as an unfaulted one."""
    env = embedded_env(tmp_path)
    config = slow_config(0.05, rounds=2, devices_per_round=4, local_iters=4)
    (tmp_path / "run.toml").write_text(config_toml(config))
    follower = None
    try:
        follower, log = start_cut(tmp_path, env, "before-row", "run", "run.toml", "--procs", "2")
        follower.wait(timeout=180)
    finally:
        if follower is not None:
            stop_process(follower)
    output = followed_through_the_outage(follower, log)
    assert "nothing of the run is stored yet" in output and "submitting again" in output, output[-3000:]
    handle = api.RunHandle(printed_run_id(follower, log), Settings(database_url=env["FEDQUEUE_DATABASE_URL"]))
    assert handle.state == "finished"
    assert_same_weights(handle.final_weights(), reference_final_state(config))
