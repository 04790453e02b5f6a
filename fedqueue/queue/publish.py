"""Sending device tasks to the queue."""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery

from fedqueue.config import Settings
from fedqueue.messages import DeviceTask
from fedqueue.queue.app import TRAIN_DEVICE
from fedqueue.services import Enqueue

# Messages sent to Redis in one pipeline (kombu's publish batch); one round trip each.
PUBLISH_BATCH = 500


def enqueue_with(app: Celery, settings: Settings) -> Enqueue:
    """An `Enqueue` that publishes each task as a JSON message, batched over one pooled connection."""

    def enqueue(tasks: Sequence[DeviceTask]) -> None:
        with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for task in tasks:
                app.send_task(
                    TRAIN_DEVICE, args=[task.to_dict()], queue=settings.queue_name, producer=producer,
                    # What Flower shows for the task; also spares Celery a repr of every message.
                    argsrepr=f"run {task.run_id} round {task.round_index} device {task.device}", kwargsrepr="{}",
                )

    return enqueue
