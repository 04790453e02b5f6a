"""The Celery application, configured from `Settings`: JSON only, late acks, one task at a time per slot."""

from __future__ import annotations

from celery import Celery

from fedqueue.config import Settings
from fedqueue.core.broker import keys
from fedqueue.core.jobs import CONTROL_QUEUE
from fedqueue.errors import ConfigError
from fedqueue.queue.redis_transport import use_for_redis_urls


def make_app(settings: Settings) -> Celery:
    if not settings.broker_url:
        raise ConfigError("FEDQUEUE_BROKER_URL: not set (workers need the broker's URL)")
    transport_options: dict[str, object] = {
        "visibility_timeout": settings.visibility_timeout_s,
        "global_keyprefix": keys.celery_prefix(settings.key_prefix),
        "socket_connect_timeout": 5,
        # Queues are read in the order a worker lists them, control first: an aggregation
        # never waits behind a long queue of device tasks, only for the next free slot.
        "queue_order_strategy": "priority",
        # A write refused by a Redis at its maxmemory waits this long for room (fedqueue.queue.redis_transport).
        "room_wait_s": settings.broker_wait_s,
    }
    if settings.visibility_timeout_override_s is not None:
        # A short timeout only means something if Redis is swept for expired deliveries as often.
        transport_options.update(unacked_restore_interval=1, unacked_restore_throttle=1)
    # A full Redis is waited out as a lost connection, not an unrecoverable error (fedqueue.queue.redis_transport).
    use_for_redis_urls()
    app = Celery("fedqueue", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        # JSON only: a pickled message from the broker is refused, never loaded.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        # Results go to the SQL store; nothing travels through a result backend.
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # The threads pool ignores Celery's time limits: fedqueue.queue.watchdog enforces them.
        task_default_queue=settings.queue(CONTROL_QUEUE),
        task_create_missing_queues=True,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        # Task events feed the Flower UI.
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        # Envelopes Celery refuses are dead-lettered first (fedqueue.queue.poison); reconnects back off and close
        # what they opened (fedqueue.queue.consumer, which poison's consumer extends).
        worker_consumer="fedqueue.queue.poison:Consumer",
        enable_utc=True,
    )
    return app
