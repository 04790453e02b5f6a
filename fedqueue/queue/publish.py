"""Sending task messages of any job kind to their queues."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from fedqueue.config import Settings
from fedqueue.core import jobs
from fedqueue.core.services import Enqueue

log = logging.getLogger(__name__)

# Messages sent to Redis in one pipeline (kombu's publish batch) instead of a round trip each.
PUBLISH_BATCH = 500
# The first messages of a large enqueue go out in a pipeline of their own: Celery builds a message in
# about 0.4 ms, and idle workers start on these while the rest of a large round is built. A few
# messages (a buffered-async refill) are built in a few ms: one pipeline, one round trip.
FIRST_BATCH = 8
SPLIT_ABOVE = 2 * FIRST_BATCH
RETRY_DELAYS_S = (0.2, 0.7, 1.5)
_BROKER_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError)


def enqueue_with(app: Celery, settings: Settings) -> Enqueue:
    """An `Enqueue` that publishes each message as JSON to its handler's queue, batched over one connection."""

    def publish(messages: Sequence[Any]) -> None:
        with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for message in messages:
                handler = jobs.handler_for(message)
                app.send_task(
                    handler.name,
                    args=[message.to_dict()],
                    queue=settings.queue(handler.queue),
                    producer=producer,
                    # What Flower shows for the task; also spares Celery a repr of every message.
                    argsrepr=message.label,
                    kwargsrepr="{}",
                )

    def publish_retrying(messages: Sequence[Any]) -> None:
        # A batch cut short by a dropped connection is sent again whole: a task sent twice is stored once.
        for delay in RETRY_DELAYS_S:
            try:
                return publish(messages)
            except _BROKER_ERRORS as err:
                log.warning("publishing %d tasks failed (%s); retrying in %.1f s", len(messages), err, delay)
                time.sleep(delay)
        return publish(messages)

    def enqueue(messages: Sequence[Any]) -> None:
        if not messages:
            return
        if len(messages) <= SPLIT_ABOVE:
            publish_retrying(messages)
            return
        publish_retrying(messages[:FIRST_BATCH])
        publish_retrying(messages[FIRST_BATCH:])

    return enqueue
