"""The FL kind's rows of the shared task-timing table: one per device task, one per aggregation."""

from __future__ import annotations

from typing import Any

from fedqueue.core.timing import timing_of
from fedqueue.fl.messages import KIND_NAME, AggregateTask, DeviceTask, device_task_name
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
    if isinstance(task, DeviceTask):
        assert device is not None
        name, task_type, pack = device_task_name(task.round_index, device), "train", task.pack
    else:
        name, task_type, pack = task.task_name, "aggregate", None
    return timing_of(
        task,
        kind=KIND_NAME,
        task_type=task_type,
        task=name,
        round_index=task.round_index,
        state=state,
        worker=worker,
        attempt=attempt,
        device_used=device_used,
        started_at=started_at,
        pack=pack,
        **phases_and_error,
    )
