"""Sending device tasks to the queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from fedqueue.config import Settings
from fedqueue.messages import DeviceTask
from fedqueue.queue.app import TRAIN_DEVICE
from fedqueue.services import Enqueue

log = logging.getLogger(__name__)

# Messages sent to Redis in one pipeline (kombu's publish batch) instead of a round trip each.
PUBLISH_BATCH = 500
RETRY_DELAYS_S = (0.2, 0.7, 1.5)
_BROKER_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError)


def enqueue_with(app: Celery, settings: Settings) -> Enqueue:
    """An `Enqueue` that publishes each task as a JSON message, batched over one pooled connection."""

    def publish(tasks: Sequence[DeviceTask]) -> None:
        with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for task in tasks:
                app.send_task(
                    TRAIN_DEVICE, args=[task.to_dict()], queue=settings.queue_name, producer=producer,
                    # What Flower shows for the task; also spares Celery a repr of every message.
                    argsrepr=f"run {task.run_id} round {task.round_index} device {task.device}", kwargsrepr="{}",
                )

    def enqueue(tasks: Sequence[DeviceTask]) -> None:
        # A batch cut short by a dropped connection is sent again whole: a task sent twice is stored once.
        for delay in RETRY_DELAYS_S:
            try:
                return publish(tasks)
            except _BROKER_ERRORS as err:
                log.warning("publishing %d tasks failed (%s); retrying in %.1f s", len(tasks), err, delay)
                time.sleep(delay)
        return publish(tasks)

    return enqueue
