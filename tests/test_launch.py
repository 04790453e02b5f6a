"""The one launch sequence (fedqueue/launch.py) that `fedqueue.run()` and `fedqueue run` both go through: its
checks in their order, before anything is placed or submitted, and its tick watching `fedqueue up`'s cluster."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from fedqueue import api, launch
from fedqueue.cli.launch import submit_and_follow
from fedqueue.config import Settings
from fedqueue.core.services import Services
from fedqueue.errors import ConfigError, FedqueueError
from fedqueue.fl import api as fl_api
from fedqueue.queue.cluster_file import ClusterInfo
from tests.support.helpers import small_config


@dataclass
class Recorded:
    """A submission that records its steps and refuses at one of them."""

    refuse_at: str
    steps: list[str] = field(default_factory=list)

    def _step(self, name: str) -> None:
        self.steps.append(name)
        if name == self.refuse_at:
            raise ConfigError(f"refused at {name}")

    def check_before_start(self, settings: Settings) -> None:
        self._step("check_before_start")

    def check(self, settings: Settings) -> None:
        self._step("check")

    def submit(self, services: Services) -> str:
        self._step("submit")
        raise AssertionError("a refused submission is never submitted")


def _api(submission: Recorded, settings: Settings) -> object:
    return api.run(submission, settings)


def _command(submission: Recorded, settings: Settings) -> object:
    return submit_and_follow(submission, settings)


FRONT_DOORS = [pytest.param(_api, id="fedqueue.run"), pytest.param(_command, id="fedqueue-run")]


@pytest.mark.parametrize("front_door", FRONT_DOORS)
@pytest.mark.parametrize(
    ("refuse_at", "broker", "steps"),
    [
        # No broker configured, so a placement would start Redis and workers: the quick checks come first.
        ("check_before_start", False, ["check_before_start"]),
        ("check", True, ["check_before_start", "check"]),
    ],
)
def test_both_front_doors_check_in_order_and_submit_nothing_refused(
    front_door: Callable[[Recorded, Settings], object],
    settings: Settings,
    refuse_at: str,
    broker: bool,
    steps: list[str],
) -> None:
    submission = Recorded(refuse_at)
    with pytest.raises(ConfigError, match=f"refused at {refuse_at}"):
        front_door(submission, settings if broker else replace(settings, broker_url=None))
    assert submission.steps == steps


def test_a_tick_on_the_cluster_of_fedqueue_up_fails_once_that_cluster_stopped(settings: Settings) -> None:
    """Nothing would run the run's tasks: its follower (the API's wait, the command's bars) stops saying so."""
    handle = fl_api.submit(small_config(rounds=1, devices_per_round=2), settings=settings)  # no worker: it waits
    gone = subprocess.Popen(["true"])
    gone.wait()
    standing = ClusterInfo(pid=gone.pid, broker_url=settings.broker_url or "", slots={}, log_dir="")
    with (
        launch.scheduled(handle, launch.Placement(settings, standing=standing)) as lease,
        pytest.raises(FedqueueError) as refused,
    ):
        lease.tick()
    assert str(refused.value) == (
        f"the local cluster (fedqueue up, pid {gone.pid}) stopped; fedqueue resume {handle.id} goes on"
    )
    with launch.scheduled(handle, launch.Placement(settings)) as lease:  # workers hoped for on the broker
        lease.tick()
