"""The FL kind's rows of the shared task-timing table: one per device task, one per aggregation."""

from __future__ import annotations

from typing import Any

from fedqueue.fl.messages import KIND_NAME, AggregateTask, DeviceTask
from fedqueue.store.repo import TaskTiming


def task_timing(
    task: DeviceTask | AggregateTask,
    state: str,
    worker: str,
    attempt: int,
    device_used: str,
    started_at: float,
    **phases_and_error: Any,
) -> TaskTiming:
    """A task's timing, finished now; `phases_and_error` sets load/compute/upload ms and error."""
    return TaskTiming(
        run_id=task.run_id,
        kind=KIND_NAME,
        task_type="train" if isinstance(task, DeviceTask) else "aggregate",
        task=task.task_name,
        round_index=task.round_index,
        state=state,
        worker=worker,
        device_used=device_used[:32],
        attempt=attempt,
        enqueued_at=task.enqueued_at,
        started_at=started_at,
        **phases_and_error,
    )
