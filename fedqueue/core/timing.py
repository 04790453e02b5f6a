"""A task's row of the shared timing table, built the same way for every job kind's worker."""

from __future__ import annotations

import time
from typing import Protocol

from fedqueue.core.process.utilization import DEVICE_LABEL_MAX
from fedqueue.store.repo import TaskTiming


class TimedMessage(Protocol):
    """What a timing row takes from a task's message, whatever its kind: its run, and when it was sent."""

    @property
    def run_id(self) -> str: ...

    @property
    def enqueued_at(self) -> float: ...


def timing_of(
    message: TimedMessage,
    *,
    kind: str,
    task_type: str,
    task: str,
    round_index: int | None,
    state: str,
    worker: str,
    attempt: int,
    device_used: str,
    started_at: float,
    finished_at: float | None = None,
    load_ms: float = 0.0,
    compute_ms: float = 0.0,
    upload_ms: float = 0.0,
    error: str | None = None,
    pack: str | None = None,
) -> TaskTiming:
    """How the task of `message` ran, finished now unless `finished_at` says when.

    The device label is cut to the column's width: a long one (a GPU's UUID) must not fail the task's row.
    """
    return TaskTiming(
        run_id=message.run_id,
        kind=kind,
        task_type=task_type,
        task=task,
        round_index=round_index,
        state=state,
        worker=worker,
        device_used=device_used[:DEVICE_LABEL_MAX],
        attempt=attempt,
        enqueued_at=message.enqueued_at,
        started_at=started_at,
        finished_at=time.time() if finished_at is None else finished_at,
        load_ms=load_ms,
        compute_ms=compute_ms,
        upload_ms=upload_ms,
        error=error,
        pack=pack,
    )
