"""The FL job kind, as the core sees it: its two tasks, its repair pass, its per-task process settings."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from fedqueue.config import Settings
from fedqueue.core.jobs import CONTROL_QUEUE, JobKind, TaskContext, TaskHandler
from fedqueue.fl.device_task import WorkerCache, record_failure, run_device_task
from fedqueue.fl.messages import AggregateTask, DeviceTask
from fedqueue.fl.repair import reconcile
from fedqueue.fl.rounds import aggregate_round, fail_aggregation

TRAIN_DEVICE = "fedqueue.train_device"
AGGREGATE_ROUND = "fedqueue.aggregate_round"
DEVICES_QUEUE = "devices"


def _train(context: TaskContext, task: DeviceTask) -> None:
    run_device_task(context.services, context.cache, task, context.worker, context.attempt)


def _device_failed(context: TaskContext, task: DeviceTask, attempts: int, error: str) -> None:
    from fedqueue.fl.devices import device_label

    record_failure(context.services, task, context.worker, attempts, error, device_label())


def _aggregate(context: TaskContext, task: AggregateTask) -> None:
    # A claim names this delivery, so a worker that lost its claim can never finish the round.
    owner = f"{context.worker}#{uuid.uuid4().hex[:8]}"
    aggregate_round(context.services, task.run_id, task.round_index, owner)


def _aggregation_failed(context: TaskContext, task: AggregateTask, attempts: int, error: str) -> None:
    fail_aggregation(context.services, task.run_id, task.round_index, attempts, error)


@contextlib.contextmanager
def _deterministic(settings: Settings) -> Iterator[None]:
    """FL tasks run with a fixed thread count and, on a GPU, deterministic kernels; other kinds get theirs back."""
    import torch

    from fedqueue.fl.devices import configure_determinism

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    configure_determinism(settings.threads_per_task)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _warm_up(settings: Settings) -> None:
    from fedqueue.fl.devices import configure_determinism
    from fedqueue.fl.warmup import warm_up

    configure_determinism(settings.threads_per_task)
    warm_up()


KIND = JobKind(
    name="fl",
    handlers=(
        TaskHandler(TRAIN_DEVICE, DEVICES_QUEUE, DeviceTask, _train, _device_failed),
        TaskHandler(AGGREGATE_ROUND, CONTROL_QUEUE, AggregateTask, _aggregate, _aggregation_failed),
    ),
    repair=reconcile,
    new_cache=WorkerCache,
    task_scope=_deterministic,
    warm_up=_warm_up,
)
