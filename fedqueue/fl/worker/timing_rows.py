"""The FL kind's rows of the shared task-timing table: one per device task, one per aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedqueue.core.timing import timing_of
from fedqueue.fl.messages import KIND_NAME, AggregateTask, DeviceTask, aggregation_name, device_task_name
from fedqueue.store.repo import TaskTiming


def task_timing(
    task: DeviceTask | AggregateTask,
    device: int | None,
    state: str,
    worker: str,
    attempt: int,
    device_used: str,
    started_at: float,
    **phases_and_error: Any,
) -> TaskTiming:
    """A task's timing, finished now; `phases_and_error` sets load/compute/upload ms and error.

    A device task has one row per device (`device`), naming the pack it was trained in.
    """
    if isinstance(task, AggregateTask):
        return aggregation_timing(
            task.run_id,
            task.round_index,
            task.enqueued_at,
            state,
            worker,
            attempt,
            device_used,
            started_at,
            **phases_and_error,
        )
    assert device is not None
    return timing_of(
        task,
        kind=KIND_NAME,
        task_type="train",
        task=device_task_name(task.round_index, device),
        round_index=task.round_index,
        state=state,
        worker=worker,
        attempt=attempt,
        device_used=device_used,
        started_at=started_at,
        pack=task.pack,
        **phases_and_error,
    )


@dataclass(frozen=True)
class _Asked:
    """What a timing row reads of the request behind it: its run, and when it was asked for."""

    run_id: str
    enqueued_at: float


def aggregation_timing(
    run_id: str,
    round_index: int,
    enqueued_at: float,
    state: str,
    worker: str,
    attempt: int,
    device_used: str,
    started_at: float,
    **phases_and_error: Any,
) -> TaskTiming:
    """A round's aggregation, or a version made by a fold pass (round `round_index`), finished now."""
    return timing_of(
        _Asked(run_id, enqueued_at),
        kind=KIND_NAME,
        task_type="aggregate",
        task=aggregation_name(round_index),
        round_index=round_index,
        state=state,
        worker=worker,
        attempt=attempt,
        device_used=device_used,
        started_at=started_at,
        **phases_and_error,
    )
