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
from fedqueue.core.infra_errors import infrastructure_fault
from fedqueue.core.services import Enqueue
from fedqueue.core.signing import sign

log = logging.getLogger(__name__)

SIGNATURE_ARG = "signature"  # a task's keyword argument that carries its message's signature

# Messages sent to Redis in one pipeline (kombu's publish batch) instead of a round trip each.
PUBLISH_BATCH = 500
# The first messages of a large enqueue go out in a pipeline of their own: Celery builds a message in
# about 0.4 ms, and idle workers start on these while the rest of a large round is built. A few
# messages (a buffered-async refill) are built in a few ms: one pipeline, one round trip.
FIRST_BATCH = 8
SPLIT_ABOVE = 2 * FIRST_BATCH
RETRY_DELAYS_S = (0.2, 0.7, 1.5)
_BROKER_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError)
FULL_FIRST_PAUSE_S = 0.5  # a publish refused for want of broker memory tries again after this, doubled ...
FULL_MAX_PAUSE_S = 5.0  # ... up to this


def _broker_full(err: BaseException) -> bool:
    return infrastructure_fault(err) == "broker out of memory"


def enqueue_with(app: Celery, settings: Settings) -> Enqueue:
    """An `Enqueue` that publishes each message as JSON to its handler's queue, batched over one connection."""

    def enqueue(messages: Sequence[Any]) -> None:
        if not messages:
            return
        if len(messages) <= SPLIT_ABOVE:
            _publish_retrying(app, settings, messages)
            return
        _publish_retrying(app, settings, messages[:FIRST_BATCH])
        _publish_retrying(app, settings, messages[FIRST_BATCH:])

    return enqueue


def _publish(app: Celery, settings: Settings, messages: Sequence[Any]) -> None:
    with app.producer_or_acquire() as producer:
        try:
            with producer.batch(max_size=PUBLISH_BATCH):
                for message in messages:
                    handler = jobs.handler_for(message)
                    body = message.to_dict()
                    app.send_task(
                        handler.name,
                        args=[body],
                        kwargs=signature_kwargs(settings, handler.name, body),
                        queue=settings.queue(handler.queue),
                        producer=producer,
                        # What Flower shows for the task; also spares Celery a repr of every message.
                        argsrepr=message.label,
                        kwargsrepr="{}",
                    )
        except Exception:
            # A batch the broker refused can leave the pooled connection's channel closed, and the pool
            # (kombu's, shared by the process) would hand it out again: close it, so it connects afresh.
            connection = getattr(producer, "__connection__", None)
            if connection is not None:
                connection.close()
                # kombu keeps a closed connection's channel as its default and would hand that out again.
                connection._default_channel = None
            raise


def signature_kwargs(settings: Settings, task: str, body: Any) -> dict[str, str]:
    """The message's signature, as the task's one keyword argument, where the deployment signs (core.signing)."""
    if settings.message_key is None:
        return {}
    return {SIGNATURE_ARG: sign(settings.message_key, task, body)}


def _publish_retrying(app: Celery, settings: Settings, messages: Sequence[Any]) -> None:
    # A batch cut short by a dropped connection is sent again whole: a task sent twice is stored once.
    for attempt, delay in enumerate(RETRY_DELAYS_S):
        try:
            return _publish(app, settings, messages)
        except Exception as err:
            if _broker_full(err):
                return _publish_when_room(app, settings, messages, err)
            # Past a lost connection, a pooled one that an earlier refusal left with a closed channel fails
            # with kombu's own odd errors: `_publish` closed it, so one more try connects afresh.
            if not isinstance(err, _BROKER_ERRORS) and attempt > 0:
                raise
            log.warning("publishing %d tasks failed (%s); retrying in %.1f s", len(messages), err, delay)
            time.sleep(delay)
    return _publish(app, settings, messages)


def _publish_when_room(app: Celery, settings: Settings, messages: Sequence[Any], first: Exception) -> None:
    """A Redis at its maxmemory frees room as workers take tasks and fold updates: wait for it (up to the
    broker wait), where a lost connection gets its few quick retries and then the follower's own wait."""
    log.warning("publishing %d tasks: %s; waiting for room (up to %d s)", len(messages), first, settings.broker_wait_s)
    deadline = time.monotonic() + settings.broker_wait_s
    delay = FULL_FIRST_PAUSE_S
    while True:
        time.sleep(delay)
        try:
            return _publish(app, settings, messages)
        except Exception as err:
            if not _broker_full(err) or time.monotonic() > deadline:
                raise
        delay = min(delay * 2, FULL_MAX_PAUSE_S)
