"""Synchronous FedAvg's control task: a round's aggregation, as the kind registers it."""

from __future__ import annotations

import time
import uuid

from fedqueue.core.jobs import CONTROL_QUEUE, TaskContext, TaskHandler
from fedqueue.fl.messages import AggregateTask
from fedqueue.fl.strategy.sync.rounds import aggregate_round, fail_aggregation
from fedqueue.fl.worker.timing_rows import task_timing

AGGREGATE_ROUND = "fedqueue.aggregate_round"


def _device_label() -> str:
    # torch: the kind is loaded by every command; only a worker's tasks load torch.
    from fedqueue.fl.ml.torch_device import device_label

    return device_label()


def _aggregate(context: TaskContext, task: AggregateTask) -> None:
    # A claim names this delivery, so a worker that lost its claim can never finish the round.
    owner = f"{context.worker}#{uuid.uuid4().hex[:8]}"
    # Timed from the round's completion: a wait through the round's tail (reading ahead) is not aggregating.
    started_at = aggregate_round(context.services, task.run_id, task.round_index, owner, context.cache)
    if started_at is None:
        # Nothing attempted (the round was taken, or its tail gave the slot back): attempts count
        # failed and lost aggregations, not requests that found nothing to do.
        context.services.ledger.take_back_attempt(task.attempt_key)
    else:
        took_ms = (time.time() - started_at) * 1000
        timing = task_timing(
            task, None, "done", context.worker, context.attempt, _device_label(), started_at, compute_ms=took_ms
        )
        context.services.store.record_timing(timing)


def _aggregation_failed(context: TaskContext, task: AggregateTask, attempts: int, error: str) -> None:
    fail_aggregation(context.services, task.run_id, task.round_index, attempts, error)
    now = time.time()
    timing = task_timing(task, None, "failed", context.worker, attempts, _device_label(), now, error=error[-4000:])
    context.services.store.record_timing(timing)


AGGREGATE = TaskHandler(AGGREGATE_ROUND, CONTROL_QUEUE, AggregateTask, _aggregate, _aggregation_failed)
