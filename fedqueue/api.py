"""The Python API's kind-neutral part: where a run's workers are, submitting, scheduling and waiting.

Every job kind builds its own front door on this; FL's is `fedqueue.run(config)` (fedqueue.fl.api),
LLM batch jobs' `fedqueue.llm.run(prompts, model)` (fedqueue.llm.api):

import fedqueue
handle = fedqueue.run("examples/digits_fedavg.toml", rounds=3)
print(handle.status()["final_accuracy"])

The steps live in fedqueue.launch (placing, checking, submitting, scheduling a run) and fedqueue.handle
(a run once submitted: read, waited for, cancelled); `run` here is their sequence with a handle to show for it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from fedqueue.config import DEFAULT_GPUS_PER_WORKER, DEFAULT_WORKER_SLOTS, Settings
from fedqueue.handle import Cancellation, RunHandle, cancel, drop_queued_tasks
from fedqueue.launch import (
    LocalWorkers,
    Placement,
    Submission,
    check,
    check_before_start,
    keep_running,
    launched,
    local_cluster,
    placement,
    scheduled,
    scheduling,
    submit,
    submit_through_outage,
    with_plugins,
)

if TYPE_CHECKING:
    from fedqueue.core.services import Services

__all__ = [
    "Cancellation",
    "Placement",
    "RunHandle",
    "Submission",
    "cancel",
    "check",
    "check_before_start",
    "drop_queued_tasks",
    "keep_running",
    "local_cluster",
    "placement",
    "run",
    "runs",
    "scheduling",
    "submit",
    "submit_through_outage",
    "with_plugins",
]

log = logging.getLogger(__name__)

# A wait between the follower's polls that a kind's workers may cut short (the LLM kind's wake-up on every batch
# stored): made from the launch's services and the run's id.
Pause = Callable[["Services", str], Callable[[float], object]]

# What a kind keeps up to date while its run is waited for (FL: TensorBoard scalars): opened on the submitted
# run, its callable called on every poll, closed (and so finished) when the run ends.
Follower = Callable[[RunHandle], AbstractContextManager[Callable[[], object]]]


def run(
    submission: Submission,
    settings: Settings,
    *,
    procs: int | None = None,
    slots: int = DEFAULT_WORKER_SLOTS,
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER,
    wait_for_workers: bool = False,
    timeout_s: float | None = None,
    follower: Follower | None = None,
    pause: Pause | None = None,
) -> RunHandle:
    """Check, submit and wait, scheduling the run meanwhile: on the configured broker, the cluster
    `fedqueue up` left running for these settings, else local workers started here (beside the submit,
    or before it with `wait_for_workers`). `follower`: what the kind keeps up to date on each poll; `pause`: the
    kind's wait between polls (a sleep where it has none)."""
    with (
        launched(submission, settings, LocalWorkers(procs, slots, gpus_per_worker, wait_for_workers)) as launch,
        scheduled(launch.handle, launch.place, launch.services) as lease,
        (follower or _no_follower)(launch.handle) as also,
    ):

        def poll() -> None:
            lease.tick()
            also()

        between = time.sleep if pause is None else _or_sleep(pause(launch.services, launch.handle.id))
        launch.handle.wait(timeout_s, tick=poll, store_watch=lease.supervisor.store_watch, pause=between)
    return launch.handle


@contextlib.contextmanager
def _no_follower(_handle: RunHandle) -> Iterator[Callable[[], object]]:
    yield _nothing


def _nothing() -> None:
    pass


def _or_sleep(wait: Callable[[float], object]) -> Callable[[float], object]:
    """The kind's wait, or a plain sleep where it fails: it only wakes; a broker that is away is the tick's to wait
    for, and the polls go on meanwhile."""

    def pause(seconds: float) -> None:
        try:
            wait(seconds)
        except Exception:  # noqa: BLE001 - any failure of a wake-up only costs the wait it would have saved
            log.debug("the run's wake-up failed; polling by the clock", exc_info=True)
            time.sleep(seconds)

    return pause


def runs(settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every run in the store, oldest first: what `fedqueue runs` shows (`stalled`: running, but nothing
    schedules it)."""
    from fedqueue.core.database import open_store
    from fedqueue.report.summary import run_lines

    settings = settings or Settings.from_env()
    store = open_store(settings.database_url)
    try:
        return run_lines(store, store.list_runs(), lease_ttl_s=settings.lease_ttl_s)
    finally:
        store.close()
