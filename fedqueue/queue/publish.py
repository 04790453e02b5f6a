"""Sending device tasks to the queue."""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from fedqueue.config import Settings
from fedqueue.messages import DeviceTask
from fedqueue.queue.app import TRAIN_DEVICE
from fedqueue.services import Enqueue


def enqueue_with(app: Celery, settings: Settings) -> Enqueue:
    """An `Enqueue` that publishes each task as a JSON message, over one pooled connection."""

    def enqueue(tasks: Sequence[DeviceTask]) -> None:
        with app.producer_or_acquire() as producer:
            for task in tasks:
                app.send_task(
                    TRAIN_DEVICE, args=[task.to_dict()], queue=settings.queue_name, producer=producer,
                    retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                )

    return enqueue
